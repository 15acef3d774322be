// tools/: function calling and the parts of a chat reply. How each model family writes its calls
// (format.ts: detection from the chat template, the grammar that keeps the calls valid, the generic
// format for templates without tools), reading them back out of the reply as it streams (parse.ts),
// gpt-oss's harmony messages (harmony.ts) and the model's reasoning apart from its answer (reasoning.ts).
export { FORMATS, detectFormat, toolGrammar, answerGrammar, genericToolPrompt, GENERIC_RESPONSE_BEGIN, HARMONY_FINAL_JSON } from "./format.js";
export type { CallFormat, FormatName, ToolChoice, ToolDef } from "./format.js";
export { ToolCallParser, type ToolCall, type ReplyEvent, type ReplyParser } from "./parse.js";
export { HarmonyParser } from "./harmony.js";
export { ThinkParser, detectReasoning, openedThink, replyParser, REASONING_FORMATS } from "./reasoning.js";
export type { ReasoningFormat, ReasoningStyle, ReplyParserOptions } from "./reasoning.js";
