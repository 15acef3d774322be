// The one escaping helper lives in model/ (GGUF strings need it too, and model/ imports nothing).
export { printable } from "../model/escape.js";
