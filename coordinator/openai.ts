// The OpenAI API's requests, as the `openai` client and llama-server's users send them: checked field
// by field (a wrong type or an unsupported feature is a 400 with an OpenAI-style error object naming
// the field) into the one ParsedRequest every dialect's generation uses. Replies: openai-reply.ts.
import type { ChatMessage } from "../model/index.js";
import { Sampler, SamplerError, type SamplerOptions } from "../engine/index.js";
import { SchemaError, checkSchema } from "../grammar/index.js";
import type { ToolChoice, ToolDef } from "../tools/index.js";
import { parseChatOptions, type ChatOptions } from "./chat-options.js";

export class ApiError extends Error {
  override name = "ApiError";
  constructor(
    readonly status: number,
    message: string,
    readonly type = "invalid_request_error",
    readonly code: string | null = null,
    readonly param: string | null = null,
  ) {
    super(message);
  }

  body(): { error: { message: string; type: string; param: string | null; code: string | null } } {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

export interface ParsedRequest {
  readonly kind: "chat" | "completion";
  readonly messages?: ChatMessage[];
  readonly prompt?: string;
  /** Undefined: until the context is full. */
  readonly maxTokens?: number;
  readonly sampler: SamplerOptions;
  readonly stop: readonly string[];
  readonly stream: boolean;
  readonly includeUsage: boolean;
  readonly model?: string;
  /** response_format: JSON mode or a JSON Schema (its schema already checked). */
  readonly responseFormat?: { readonly kind: "json-object" } | { readonly kind: "json-schema"; readonly name: string; readonly schema: unknown };
  /** Chat only: the functions the model may call, and how. */
  readonly tools?: readonly ToolDef[];
  readonly toolChoice?: ToolChoice;
  readonly parallelToolCalls?: boolean;
  /** Chat only: the template's variables and the reasoning split (chat-options.ts). */
  readonly templateVars?: ChatOptions["templateVars"];
  readonly reasoningFormat?: ChatOptions["reasoningFormat"];
  /** Log probabilities asked for: how many alternatives per token (chat: logprobs with top_logprobs;
   * completions: logprobs N). Undefined: none. */
  readonly logprobs?: number;
  /** Past the context (serve's context shift): llama.cpp's n_keep (-1: the whole prompt) and
   * n_discard (0: half); undefined: serve's --keep, and half. */
  readonly nKeep?: number;
  readonly nDiscard?: number;
}

/** What checking a request needs to know about the served model. */
export interface RequestLimits {
  /** Tokens in the vocabulary: logit_bias names ids below it. */
  readonly nVocab?: number;
}

const MAX_STOP = 16;
const MAX_LOGIT_BIAS = 1024;
/** OpenAI's limits: top_logprobs (chat) up to 20, a completion's logprobs up to 5. */
const MAX_TOP_LOGPROBS = 20;
const MAX_COMPLETION_LOGPROBS = 5;
const MAX_TOOLS = 128;
const FUNCTION_NAME = /^[a-zA-Z0-9_.-]{1,64}$/;
const ROLES = new Set(["system", "developer", "user", "assistant", "tool"]);

type Json = Record<string, unknown>;

export function bad(param: string, message: string): ApiError {
  return new ApiError(400, `${param}: ${message}`, "invalid_request_error", "invalid_value", param);
}

export function optNumber(b: Json, key: string, min: number, max: number): number | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isFinite(v)) throw bad(key, `must be a number (got ${typeof v})`);
  if (v < min || v > max) throw bad(key, `must be from ${min} to ${max} (got ${v})`);
  return v;
}

export function optInt(b: Json, key: string, min: number, max: number): number | undefined {
  const v = optNumber(b, key, min, max);
  if (v !== undefined && !Number.isInteger(v)) throw bad(key, `must be a whole number (got ${v})`);
  return v;
}

export function optBool(b: Json, key: string): boolean | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "boolean") throw bad(key, `must be true or false (got ${typeof v})`);
  return v;
}

/** Features this server does not have are refused by name rather than ignored. */
function refuseUnsupported(b: Json): void {
  const n = b.n;
  if (n !== undefined && n !== null && n !== 1) throw new ApiError(400, "n: only one choice per request is supported (n = 1)", "invalid_request_error", "unsupported_value", "n");
  const f = b.functions;
  if (f !== undefined && f !== null && !(Array.isArray(f) && f.length === 0)) {
    throw new ApiError(400, "functions: the deprecated functions field is not supported; use tools", "invalid_request_error", "unsupported_parameter", "functions");
  }
  // Fields that would change the answer, which this server does not do: refused by name, never
  // silently ignored.
  const unsupported: [string, string][] = [
    ["grammar", "llama-server's top-level grammar is not read; send response_format (JSON Schema) instead"],
    ["json_schema", "llama-server's top-level json_schema is not read; send response_format: {type: \"json_schema\", json_schema: {schema}}"],
  ];
  for (const [key, why] of unsupported) {
    if (b[key] !== undefined && b[key] !== null) throw new ApiError(400, `${key}: ${why}`, "invalid_request_error", "unsupported_parameter", key);
  }
  // llama-server's probabilities after its sampling chain: this server reports the model's own.
  if (b.post_sampling_probs === true) {
    throw new ApiError(400, "post_sampling_probs: log probabilities are the model's distribution (before temperature, penalties, logit_bias and grammar), not after the sampling chain",
      "invalid_request_error", "unsupported_parameter", "post_sampling_probs");
  }
}

/** logit_bias: {"token id": bias}, as OpenAI sends it; each id in the vocabulary, each bias a number
 * from -100 to 100. */
function parseLogitBias(b: Json, nVocab: number | undefined): Map<number, number> | undefined {
  const raw = b.logit_bias;
  if (raw === undefined || raw === null) return undefined;
  if (typeof raw !== "object" || Array.isArray(raw)) throw bad("logit_bias", "must be an object of token ids to biases, e.g. {\"50256\": -100}");
  const entries = Object.entries(raw as Json);
  if (entries.length > MAX_LOGIT_BIAS) throw bad("logit_bias", `at most ${MAX_LOGIT_BIAS} tokens (got ${entries.length})`);
  const bias = new Map<number, number>();
  for (const [key, v] of entries) {
    const shown = JSON.stringify(key.length > 40 ? `${key.slice(0, 40)}...` : key);
    if (!/^(0|[1-9][0-9]{0,9})$/.test(key)) throw bad("logit_bias", `key ${shown} is not a token id (a whole number, as a string)`);
    const id = Number(key);
    if (nVocab !== undefined && id >= nVocab) throw bad("logit_bias", `key ${shown}: token id ${id} is out of range (the vocabulary has ${nVocab} tokens)`);
    if (typeof v !== "number" || !Number.isFinite(v)) throw bad("logit_bias", `key ${shown}: the bias must be a number (got ${v === null ? "null" : typeof v})`);
    if (v < -100 || v > 100) throw bad("logit_bias", `key ${shown}: the bias must be from -100 to 100 (got ${v})`);
    bias.set(id, v);
  }
  return bias;
}

/** How many alternatives per token the request asks log probabilities for; undefined: none.
 * Chat: logprobs true with top_logprobs 0..20; completions: logprobs 0..5 (the legacy format);
 * either: llama-server's n_probs 0..20 when logprobs is not given. */
function parseLogprobs(b: Json, kind: "chat" | "completion"): number | undefined {
  const given = b.logprobs !== undefined && b.logprobs !== null;
  const nProbs = optInt(b, "n_probs", 0, MAX_TOP_LOGPROBS);
  if (kind === "completion") {
    if (given && typeof b.logprobs !== "number") throw bad("logprobs", `must be a whole number from 0 to ${MAX_COMPLETION_LOGPROBS} (got ${typeof b.logprobs})`);
    return given ? optInt(b, "logprobs", 0, MAX_COMPLETION_LOGPROBS) : nProbs || undefined;
  }
  const on = optBool(b, "logprobs");
  const top = optInt(b, "top_logprobs", 0, MAX_TOP_LOGPROBS);
  if (on) return top ?? 0;
  if (!given && nProbs) return nProbs;
  if (top) throw bad("top_logprobs", "needs logprobs: true");
  return undefined;
}

/** An error from these checks, naming a dialect's own field for the OpenAI one it was read as
 * (Ollama's options.num_predict for max_tokens); any other error passes unchanged. */
export function renameParam(e: unknown, names: Readonly<Record<string, string>>): never {
  throw e instanceof ApiError ? renamedParam(e, names) : e;
}

export function renamedParam(e: ApiError, names: Readonly<Record<string, string>>): ApiError {
  if (!e.param || !Object.hasOwn(names, e.param) || !e.message.startsWith(e.param)) return e;
  const name = names[e.param];
  return new ApiError(e.status, name + e.message.slice(e.param.length), e.type, e.code, name);
}

/** A schema refused by name: a 400 whose param is where it came from. */
function schemaRefused(param: string, e: unknown): never {
  if (e instanceof SchemaError) throw new ApiError(400, `${param}: ${e.message}`, "invalid_request_error", "unsupported_schema", param);
  throw e;
}

function parseResponseFormat(b: Json): ParsedRequest["responseFormat"] {
  const rf = b.response_format;
  if (rf === undefined || rf === null) return undefined;
  if (typeof rf !== "object" || Array.isArray(rf)) throw bad("response_format", "must be an object with a type");
  const r = rf as Json;
  if (r.type === "text") return undefined;
  if (r.type === "json_object") return { kind: "json-object" };
  if (r.type !== "json_schema") throw bad("response_format.type", "must be \"text\", \"json_object\" or \"json_schema\"");
  const js = r.json_schema as Json | undefined;
  if (typeof js !== "object" || js === null || Array.isArray(js)) throw bad("response_format.json_schema", "must be an object with name and schema");
  if (js.name !== undefined && typeof js.name !== "string") throw bad("response_format.json_schema.name", "must be a string");
  const schema = js.schema ?? {};
  try {
    checkSchema(schema);
  } catch (e) {
    schemaRefused("response_format.json_schema.schema", e);
  }
  return { kind: "json-schema", name: (js.name as string | undefined) ?? "response", schema };
}

function parseTools(b: Json): Pick<ParsedRequest, "tools" | "toolChoice" | "parallelToolCalls"> {
  const raw = b.tools;
  const choiceRaw = b.tool_choice;
  if (raw === undefined || raw === null || (Array.isArray(raw) && raw.length === 0)) {
    if (choiceRaw !== undefined && choiceRaw !== null && choiceRaw !== "none" && choiceRaw !== "auto") throw bad("tool_choice", "needs tools");
    return {};
  }
  if (!Array.isArray(raw)) throw bad("tools", "must be an array of {type: \"function\", function: {name, parameters}}");
  if (raw.length > MAX_TOOLS) throw bad("tools", `at most ${MAX_TOOLS} tools`);
  const tools = raw.map((t, i): ToolDef => {
    const tool = t as Json;
    if (typeof tool !== "object" || tool === null || tool.type !== "function") throw bad(`tools[${i}]`, "must be {type: \"function\", function: {...}}");
    const fn = tool.function as Json;
    if (typeof fn !== "object" || fn === null) throw bad(`tools[${i}].function`, "must be an object");
    if (typeof fn.name !== "string" || !FUNCTION_NAME.test(fn.name)) throw bad(`tools[${i}].function.name`, "must be 1 to 64 letters, digits, _ . or -");
    if (fn.description !== undefined && fn.description !== null && typeof fn.description !== "string") throw bad(`tools[${i}].function.description`, "must be a string");
    const parameters = fn.parameters ?? { type: "object", properties: {} };
    try {
      checkSchema(parameters);
    } catch (e) {
      schemaRefused(`tools[${i}].function.parameters`, e);
    }
    return { name: fn.name, description: (fn.description as string | undefined) ?? undefined, parameters };
  });
  const names = new Set(tools.map((t) => t.name));
  if (names.size !== tools.length) throw bad("tools", "function names must be distinct");
  let toolChoice: ToolChoice = "auto";
  if (choiceRaw === "none" || choiceRaw === "auto" || choiceRaw === "required") toolChoice = choiceRaw;
  else if (typeof choiceRaw === "object" && choiceRaw !== null) {
    const name = ((choiceRaw as Json).function as Json | undefined)?.name;
    if ((choiceRaw as Json).type !== "function" || typeof name !== "string") throw bad("tool_choice", "must be \"none\", \"auto\", \"required\" or {type: \"function\", function: {name}}");
    if (!names.has(name)) throw bad("tool_choice", `names a function that is not in tools: ${JSON.stringify(name).slice(0, 80)}`);
    toolChoice = { name };
  } else if (choiceRaw !== undefined && choiceRaw !== null) throw bad("tool_choice", "must be \"none\", \"auto\", \"required\" or {type: \"function\", function: {name}}");
  return { tools, toolChoice, parallelToolCalls: optBool(b, "parallel_tool_calls") ?? true };
}

function common(b: Json, kind: "chat" | "completion", limits: RequestLimits): Omit<ParsedRequest, "messages" | "prompt"> {
  refuseUnsupported(b);
  if (b.model !== undefined && b.model !== null && typeof b.model !== "string") throw bad("model", "must be a string");
  const maxTokens = optInt(b, "max_completion_tokens", 0, 1e9) ?? optInt(b, "max_tokens", 0, 1e9);
  const stopRaw = b.stop;
  let stop: string[] = [];
  if (typeof stopRaw === "string") stop = [stopRaw];
  else if (Array.isArray(stopRaw)) {
    if (stopRaw.length > MAX_STOP) throw bad("stop", `at most ${MAX_STOP} stop strings`);
    if (!stopRaw.every((s) => typeof s === "string")) throw bad("stop", "must be a string or an array of strings");
    stop = stopRaw as string[];
  } else if (stopRaw !== undefined && stopRaw !== null) throw bad("stop", "must be a string or an array of strings");
  stop = stop.filter((s) => s.length > 0);
  const streamOptions = b.stream_options;
  if (streamOptions !== undefined && streamOptions !== null && (typeof streamOptions !== "object" || Array.isArray(streamOptions))) {
    throw bad("stream_options", "must be an object");
  }
  const repetition = optNumber(b, "repetition_penalty", 0.01, 10) ?? optNumber(b, "repeat_penalty", 0.01, 10);
  // llama.cpp's repeat_last_n: -1 means the whole context (the sampler's history never holds more).
  const lastN = optInt(b, "repeat_last_n", -1, 1e9);
  const sampler: SamplerOptions = {
    temperature: optNumber(b, "temperature", 0, 2),
    topP: optNumber(b, "top_p", 0, 1),
    topK: optInt(b, "top_k", 0, 1e6),
    minP: optNumber(b, "min_p", 0, 1),
    seed: optInt(b, "seed", -(2 ** 53), 2 ** 53),
    frequencyPenalty: optNumber(b, "frequency_penalty", -2, 2),
    presencePenalty: optNumber(b, "presence_penalty", -2, 2),
    repeatPenalty: repetition,
    repeatLastN: lastN === -1 ? 2 ** 31 - 1 : lastN,
    logitBias: parseLogitBias(b, limits.nVocab),
  };
  // The seed reaches a 32-bit generator: fold it, keeping negative seeds distinct.
  const s = sampler as { seed?: number };
  if (s.seed !== undefined) s.seed = Number(BigInt.asUintN(32, BigInt(s.seed)));
  for (const k of Object.keys(sampler) as (keyof SamplerOptions)[]) if (sampler[k] === undefined) delete (sampler as Record<string, unknown>)[k];
  checkSampling(sampler, b);
  return {
    kind, maxTokens, sampler, stop, stream: optBool(b, "stream") ?? false,
    includeUsage: streamOptions ? optBool(streamOptions as Json, "include_usage") ?? false : false,
    model: (b.model ?? undefined) as string | undefined,
    responseFormat: parseResponseFormat(b),
    logprobs: parseLogprobs(b, kind),
    nKeep: optInt(b, "n_keep", -1, 1e9),
    nDiscard: optInt(b, "n_discard", 0, 1e9),
  };
}

/** The API's names of the sampler's options. */
const SAMPLING_PARAMS: Readonly<Record<keyof SamplerOptions, string>> = {
  temperature: "temperature", topP: "top_p", topK: "top_k", minP: "min_p", seed: "seed", frequencyPenalty: "frequency_penalty",
  presencePenalty: "presence_penalty", repeatPenalty: "repetition_penalty", repeatLastN: "repeat_last_n",
  constraint: "response_format", closeAfter: "max_tokens", logitBias: "logit_bias", logprobs: "top_logprobs",
};

/** The sampler's own ranges (engine/sampler.ts, one rule for the CLI and the API), as a 400 naming the
 * field: a value the sampler would refuse must not pass here and fail later as a 503. */
function checkSampling(sampler: SamplerOptions, b: Json): void {
  try {
    new Sampler(sampler);
  } catch (e) {
    if (!(e instanceof SamplerError)) throw e;
    const param = e.option === "repeatPenalty" && b.repetition_penalty === undefined ? "repeat_penalty" : SAMPLING_PARAMS[e.option];
    throw bad(param, e.message);
  }
}

export function asObject(body: unknown): Json {
  if (typeof body !== "object" || body === null || Array.isArray(body)) throw new ApiError(400, "the request body must be a JSON object");
  return body as Json;
}

/** A message's content: a string, or text parts ({type: "text", text}); other parts are refused. */
function contentText(c: unknown, i: number): string {
  if (typeof c === "string") return c;
  if (c === null || c === undefined) return "";
  if (Array.isArray(c)) {
    // Joined with a newline between non-empty text, as llama-server joins them.
    let text = "";
    c.forEach((p, j) => {
      const part = p as Json;
      if (typeof part !== "object" || part === null || part.type !== "text" || typeof part.text !== "string") {
        throw new ApiError(400, `messages[${i}].content[${j}]: only text parts are supported`, "invalid_request_error", "unsupported_value", `messages[${i}].content`);
      }
      text += (text ? "\n" : "") + part.text;
    });
    return text;
  }
  throw bad(`messages[${i}].content`, "must be a string or an array of text parts");
}

export function parseChatRequest(body: unknown, limits: RequestLimits = {}): ParsedRequest {
  const b = asObject(body);
  const m = b.messages;
  if (!Array.isArray(m) || m.length === 0) throw bad("messages", "must be a non-empty array of {role, content}");
  const messages = m.map((raw, i) => {
    const msg = raw as Json;
    if (typeof msg !== "object" || msg === null) throw bad(`messages[${i}]`, "must be an object");
    if (typeof msg.role !== "string" || !ROLES.has(msg.role)) throw bad(`messages[${i}].role`, `must be one of ${[...ROLES].join(", ")}`);
    const out: ChatMessage & { tool_calls?: unknown; tool_call_id?: string; name?: string; reasoning_content?: string } = { role: msg.role, content: contentText(msg.content, i) };
    if (msg.role === "assistant" && msg.tool_calls !== undefined && msg.tool_calls !== null) out.tool_calls = messageToolCalls(msg.tool_calls, i);
    // An earlier reply's reasoning, as this server (and llama-server) gave it: templates that keep it read it.
    if (msg.role === "assistant" && msg.reasoning_content !== undefined && msg.reasoning_content !== null) {
      if (typeof msg.reasoning_content !== "string") throw bad(`messages[${i}].reasoning_content`, "must be a string");
      out.reasoning_content = msg.reasoning_content;
    }
    if (msg.role === "tool") {
      if (msg.tool_call_id !== undefined && typeof msg.tool_call_id !== "string") throw bad(`messages[${i}].tool_call_id`, "must be a string");
      if (typeof msg.tool_call_id === "string") out.tool_call_id = msg.tool_call_id;
    }
    if (typeof msg.name === "string") out.name = msg.name;
    return out;
  });
  const parsed = { ...common(b, "chat", limits), messages, ...parseTools(b), ...parseChatOptions(b) };
  if (parsed.tools && parsed.toolChoice !== "none" && parsed.responseFormat) {
    throw new ApiError(400, "response_format: cannot be combined with tools (use tool_choice \"none\", or leave one out)", "invalid_request_error", "unsupported_value", "response_format");
  }
  return parsed;
}

/** An assistant turn's earlier calls, as templates take them: arguments as an object when they parse. */
function messageToolCalls(raw: unknown, i: number): unknown[] {
  if (!Array.isArray(raw)) throw bad(`messages[${i}].tool_calls`, "must be an array");
  return raw.map((c, j) => {
    const call = c as Json;
    const fn = (call?.function ?? {}) as Json;
    if (typeof call !== "object" || call === null || typeof fn.name !== "string") throw bad(`messages[${i}].tool_calls[${j}]`, "must be {id, type: \"function\", function: {name, arguments}}");
    if (fn.arguments !== undefined && typeof fn.arguments !== "string") throw bad(`messages[${i}].tool_calls[${j}].function.arguments`, "must be a JSON string");
    let args: unknown = fn.arguments ?? "{}";
    try {
      args = JSON.parse(args as string);
    } catch {
      // kept as the string the client sent
    }
    return { id: typeof call.id === "string" ? call.id : undefined, type: "function", function: { name: fn.name, arguments: args } };
  });
}

export function parseCompletionRequest(body: unknown, limits: RequestLimits = {}): ParsedRequest {
  const b = asObject(body);
  let prompt = b.prompt;
  if (Array.isArray(prompt)) {
    if (prompt.length !== 1 || typeof prompt[0] !== "string") throw new ApiError(400, "prompt: one prompt string per request is supported", "invalid_request_error", "unsupported_value", "prompt");
    prompt = prompt[0];
  }
  if (typeof prompt !== "string") throw bad("prompt", "must be a string");
  if (b.echo === true) throw new ApiError(400, "echo: not supported", "invalid_request_error", "unsupported_parameter", "echo");
  if (b.suffix !== undefined && b.suffix !== null) throw new ApiError(400, "suffix: not supported", "invalid_request_error", "unsupported_parameter", "suffix");
  return { ...common(b, "completion", limits), prompt };
}
