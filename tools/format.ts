// How tool calls look in a model's output, per chat-template family, and the grammar that makes the
// model write them validly. Each format is one call per tagged block: a begin text that names the
// function, the arguments as JSON, an end text. The family is read from the template's source, as
// llama.cpp's common/chat.cpp does; a template with no tool support gets the generic format, a JSON
// reply described to the model in a system message.
import { randomBytes } from "node:crypto";

export type FormatName = "hermes" | "llama3" | "mistral" | "harmony" | "generic";

export interface ToolDef {
  readonly name: string;
  readonly description?: string;
  /** JSON Schema of the arguments (an object schema; {} when the tool takes none). */
  readonly parameters: unknown;
}

/** auto: the model may answer in text (the grammar applies from the format's trigger); required: at
 * least one call, from the first token; a name: that function only; none: no call. */
export type ToolChoice = "auto" | "none" | "required" | { readonly name: string };

export interface CallFormat {
  readonly name: FormatName;
  /** Text that starts a call; what comes before it is the reply's content. */
  readonly trigger: string;
  /** The text before a call's arguments. */
  begin(fn: string): string;
  /** The text after them. */
  readonly end: string;
  /** Between calls when calls come first (required). */
  readonly separator: string;
  /** More than one call per reply. */
  readonly parallel: boolean;
  /** A new call id. */
  newId(): string;
}

const ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
function alnum(n: number): string {
  const b = randomBytes(n);
  return Array.from(b, (x) => ALNUM[x % ALNUM.length]).join("");
}
const openAiId = () => `call_${alnum(24)}`;

export const FORMATS: Readonly<Record<FormatName, CallFormat>> = {
  // Hermes 2 Pro, Qwen 2.5/3 and others: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
  hermes: {
    name: "hermes", trigger: "<tool_call>", begin: (fn) => `<tool_call>\n{"name": ${JSON.stringify(fn)}, "arguments": `, end: "}\n</tool_call>",
    separator: "\n", parallel: true, newId: openAiId,
  },
  // Llama 3.1-3.3: a bare JSON object with "parameters", one call per reply.
  llama3: {
    name: "llama3", trigger: "{\"name\": ", begin: (fn) => `{"name": ${JSON.stringify(fn)}, "parameters": `, end: "}",
    separator: "", parallel: false, newId: openAiId,
  },
  // Mistral Nemo and later: [TOOL_CALLS][{"name": ..., "arguments": {...}}], one call per reply here;
  // its templates want 9-character ids.
  mistral: {
    name: "mistral", trigger: "[TOOL_CALLS]", begin: (fn) => `[TOOL_CALLS][{"name": ${JSON.stringify(fn)}, "arguments": `, end: "}]",
    separator: "", parallel: false, newId: () => alnum(9),
  },
  // gpt-oss (OpenAI's harmony format): a message to a function on the commentary channel, its arguments
  // JSON, ended by <|call|> (an end-of-generation token, so no text of its own); one call per reply, as
  // the template renders them. The model may also name the function in the role header instead; the
  // parser (harmony.ts) reads both, the grammar writes this one.
  harmony: {
    name: "harmony", trigger: "<|channel|>commentary to=functions.", begin: (fn) => `<|channel|>commentary to=functions.${fn} <|constrain|>json<|message|>`, end: "",
    separator: "", parallel: false, newId: openAiId,
  },
  // Templates with no tool support: {"tool_call": {"name": ..., "arguments": {...}}} per line, or {"response": "..."}.
  generic: {
    name: "generic", trigger: "{\"tool_call\": ", begin: (fn) => `{"tool_call": {"name": ${JSON.stringify(fn)}, "arguments": `, end: "}}",
    separator: "\n", parallel: true, newId: openAiId,
  },
};

/** The format a chat template's model writes its calls in. */
export function detectFormat(templateSource: string | undefined): CallFormat {
  const s = templateSource ?? "";
  // gpt-oss's template describes its tools in its own way; its channels are its mark (as chat.cpp finds it).
  if (s.includes("<|channel|>")) return FORMATS.harmony;
  if (!/\btools\b/.test(s)) return FORMATS.generic;
  if (s.includes("<tool_call>")) return FORMATS.hermes;
  if (s.includes("[TOOL_CALLS]")) return FORMATS.mistral;
  if (s.includes("<|python_tag|>") || (s.includes("<|start_header_id|>") && s.includes("\"parameters\""))) return FORMATS.llama3;
  return FORMATS.generic;
}

/** The generic format's reply to text: {"response": "..."}. */
export const GENERIC_RESPONSE_BEGIN = "{\"response\": ";

/** XGrammar's structural tag for the calls the choice allows (undefined: no constraint). */
export function toolGrammar(f: CallFormat, tools: readonly ToolDef[], choice: ToolChoice, parallel: boolean): unknown {
  if (choice === "none") return undefined;
  const chosen = typeof choice === "object" ? tools.filter((t) => t.name === choice.name) : tools;
  const tags = chosen.map((t) => ({ type: "tag", begin: f.begin(t.name), content: { type: "json_schema", json_schema: t.parameters }, end: f.end }));
  const stopAfterFirst = !(parallel && f.parallel);
  // One call: any one of the tags (XGrammar takes no empty separator).
  const calls = stopAfterFirst
    ? { type: "or", elements: tags }
    : { type: "tags_with_separator", tags, separator: f.separator, at_least_one: true, stop_after_first: false };
  if (choice !== "auto") return { type: "structural_tag", format: calls };
  if (f.name === "generic") {
    // The reply is JSON from the first token: calls, or {"response": "..."} (XGrammar takes no "or"
    // around tags_with_separator, so the text reply is one more tag among the calls).
    const text = { type: "tag", begin: GENERIC_RESPONSE_BEGIN, content: { type: "json_schema", json_schema: { type: "string" } }, end: "}" };
    return { type: "structural_tag", format: { type: "tags_with_separator", tags: [...tags, text], separator: f.separator, at_least_one: true, stop_after_first: stopAfterFirst } };
  }
  return { type: "structural_tag", format: { type: "triggered_tags", triggers: [f.trigger], tags, at_least_one: false, stop_after_first: stopAfterFirst } };
}

/** gpt-oss's structured answer: a final message constrained to JSON, as its template's models write
 * one (llama.cpp's gpt-oss response-format rule, without the analysis before it). */
export const HARMONY_FINAL_JSON = "<|channel|>final <|constrain|>json<|message|>";

/** XGrammar's structural tag for a JSON answer in the format's own message (undefined: the bare JSON). */
export function answerGrammar(f: CallFormat, schema: unknown): unknown {
  if (f.name !== "harmony") return undefined;
  return { type: "structural_tag", format: { type: "tag", begin: HARMONY_FINAL_JSON, content: { type: "json_schema", json_schema: schema }, end: "" } };
}

/** The system message that describes the tools and the generic format to a model whose template cannot. */
export function genericToolPrompt(tools: readonly ToolDef[], choice: ToolChoice): string {
  const list = tools.map((t) => JSON.stringify({ name: t.name, description: t.description ?? "", parameters: t.parameters })).join("\n");
  const reply = choice === "auto" ? " Or, to answer in text, reply {\"response\": \"your answer\"}." : "";
  return `You can call these tools:\n${list}\nTo call a tool, reply with one line per call: {"tool_call": {"name": "tool name", "arguments": {...}}}.${reply}`;
}
