// tools/: function calling. How each model family writes its calls (format.ts: detection from the chat
// template, the grammar that keeps the calls valid, the generic format for templates without tools)
// and reading them back out of the reply as it streams (parse.ts).
export { FORMATS, detectFormat, toolGrammar, genericToolPrompt, GENERIC_RESPONSE_BEGIN } from "./format.js";
export type { CallFormat, FormatName, ToolChoice, ToolDef } from "./format.js";
export { ToolCallParser, type ToolCall, type ReplyEvent } from "./parse.js";
