// base/: the ground floor. Small helpers every folder may use, importing nothing of ours: where the
// package is (the addon, the dashboard's files and the oracle's harness are found from it) and the
// escaping every string from a file or the network gets before it reaches a terminal, a log or a page.
export { printable } from "./escape.js";
export { packageRoot } from "./package-root.js";
