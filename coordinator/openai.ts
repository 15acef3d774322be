// The OpenAI API's request and response shapes, as the `openai` client and llama-server's users expect
// them: requests checked field by field (a wrong type or an unsupported feature is a 400 with an
// OpenAI-style error object naming the field), responses and stream chunks built in one place, and
// stop strings found across token boundaries.
import type { ChatMessage } from "../model/index.js";
import { Sampler, SamplerError, type SamplerOptions, type StepLogprobs } from "../engine/index.js";
import { SchemaError, checkSchema } from "../grammar/index.js";
import type { ReplyEvent, ToolCall, ToolChoice, ToolDef } from "../tools/index.js";
import type { ServerResponse } from "node:http";
import { parseChatOptions, type ChatOptions } from "./chat-options.js";
import { sendJson, type Dialect, type Finished, type GenerationAsk, type ReplyWriter, type Served } from "./http-reply.js";

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

export type FinishReason = "stop" | "length" | "tool_calls";

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}

export function usage(promptTokens: number, completionTokens: number, cachedTokens: number): Usage {
  return { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens, prompt_tokens_details: { cached_tokens: cachedTokens } };
}

/** A generated token's log probabilities, and where its text starts in the reply (UTF-16 units). */
export interface TokenLogprobs extends StepLogprobs {
  readonly offset: number;
}

/** A token's piece: its bytes as the tokenizer renders it (a piece may be part of a UTF-8 character). */
export type PieceOf = (id: number) => Uint8Array;

/** A piece as text: bytes that are not whole UTF-8 become U+FFFD, as in the streamed text. */
const pieceText = (bytes: Uint8Array): string => new TextDecoder().decode(bytes);

/** Log probabilities as OpenAI reports them: chat's {content: [{token, logprob, bytes, top_logprobs}]},
 * or the completions' legacy {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}
 * (offsets from the start of the completion's text). Null when none were asked for. */
export function formatLogprobs(kind: "chat" | "completion", entries: readonly TokenLogprobs[] | undefined, piece: PieceOf) {
  if (!entries) return null;
  if (kind === "chat") {
    const one = (id: number, logprob: number) => {
      const bytes = piece(id);
      return { token: pieceText(bytes), logprob, bytes: Array.from(bytes) };
    };
    return { content: entries.map((e) => ({ ...one(e.id, e.logprob), top_logprobs: e.top.map((t) => one(t.id, t.logprob)) })), refusal: null };
  }
  return {
    tokens: entries.map((e) => pieceText(piece(e.id))),
    token_logprobs: entries.map((e) => e.logprob),
    top_logprobs: entries.map((e) => {
      // Two tokens with the same text (partial UTF-8) share a key: the more likely one stays. No
      // prototype, so a token "__proto__" is a key like any other.
      const top = Object.create(null) as Record<string, number>;
      for (const t of e.top) {
        const key = pieceText(piece(t.id));
        if (!(key in top)) top[key] = t.logprob;
      }
      return top;
    }),
    text_offset: entries.map((e) => e.offset),
  };
}

type Logprobs = ReturnType<typeof formatLogprobs>;

/** Builds the response objects of one request (ids and timestamps shared by its chunks). */
export class ResponseShaper {
  readonly id: string;
  readonly created = Math.floor(Date.now() / 1000);

  constructor(readonly kind: "chat" | "completion", readonly model: string, id: string) {
    this.id = `${kind === "chat" ? "chatcmpl" : "cmpl"}-${id}`;
  }

  private base(object: string) {
    return { id: this.id, object, created: this.created, model: this.model, system_fingerprint: "prima" };
  }

  full(text: string | null, finish: FinishReason, u: Usage, toolCalls: readonly ToolCall[] = [], logprobs: Logprobs = null, reasoning: string | null = null) {
    const calls = toolCalls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
    // The reasoning as llama-server gives it (reasoning_content), only when there is some.
    const message = { role: "assistant", content: text, ...(reasoning ? { reasoning_content: reasoning } : {}), ...(calls.length ? { tool_calls: calls } : {}) };
    return this.kind === "chat"
      ? { ...this.base("chat.completion"), choices: [{ index: 0, message, logprobs, finish_reason: finish }], usage: u }
      : { ...this.base("text_completion"), choices: [{ index: 0, text, logprobs, finish_reason: finish }], usage: u };
  }

  /** A stream chunk: text (the first chat chunk also carries the role), or the finish reason; with the
   * log probabilities of the tokens it carries. */
  chunk(text: string | null, finish: FinishReason | null, first = false, logprobs: Logprobs = null, field: "content" | "reasoning_content" = "content") {
    if (this.kind === "chat") {
      const delta = text === null ? {} : first ? { role: "assistant", [field]: text } : { [field]: text };
      return { ...this.base("chat.completion.chunk"), choices: [{ index: 0, delta, logprobs, finish_reason: finish }] };
    }
    return { ...this.base("text_completion"), choices: [{ index: 0, text: text ?? "", logprobs, finish_reason: finish }] };
  }

  /** A chat stream chunk with a tool call's start (id and name) or a piece of its arguments. */
  toolChunk(index: number, call: { id: string; name: string } | { arguments: string }, first = false, logprobs: Logprobs = null) {
    const fn = "id" in call ? { index, id: call.id, type: "function", function: { name: call.name, arguments: "" } } : { index, function: { arguments: call.arguments } };
    const delta = first ? { role: "assistant", content: null, tool_calls: [fn] } : { tool_calls: [fn] };
    return { ...this.base("chat.completion.chunk"), choices: [{ index: 0, delta, logprobs, finish_reason: null }] };
  }

  usageChunk(u: Usage) {
    return { ...this.base(this.kind === "chat" ? "chat.completion.chunk" : "text_completion"), choices: [], usage: u };
  }
}

/**
 * Finds stop strings in generated text that arrives piece by piece: text that could still be the
 * start of a stop string is held back until the next piece decides.
 */
export class StopMatcher {
  private held = "";
  stopped = false;
  /** The stop string that ended the text ("" while none has). */
  word = "";

  constructor(private readonly stops: readonly string[]) {}

  /** Adds a piece; returns the text that is now safe to send. */
  push(piece: string): string {
    if (this.stopped) return "";
    const buf = this.held + piece;
    let at = -1;
    for (const s of this.stops) {
      const i = buf.indexOf(s);
      if (i >= 0 && (at < 0 || i < at)) {
        at = i;
        this.word = s;
      }
    }
    if (at >= 0) {
      this.stopped = true;
      this.held = "";
      return buf.slice(0, at);
    }
    let hold = 0;
    for (const s of this.stops) {
      for (let n = Math.min(s.length - 1, buf.length); n > hold; n--) {
        if (buf.endsWith(s.slice(0, n))) {
          hold = n;
          break;
        }
      }
    }
    this.held = buf.slice(buf.length - hold);
    return buf.slice(0, buf.length - hold);
  }

  /** The end of generation: whatever was held back is text after all. */
  flush(): string {
    const t = this.stopped ? "" : this.held;
    this.held = "";
    return t;
  }
}

/** The OpenAI dialect: /v1/chat/completions and /v1/completions, streamed as server-sent events. */
export function openAiDialect(kind: "chat" | "completion", s: Served): Dialect {
  const limits: RequestLimits = { nVocab: s.tok.nVocab };
  const piece: PieceOf = (id) => s.tok.tokenPiece(id, { special: true });
  return {
    errorBody: (e) => e.body(),
    parse: (body) => ({ request: kind === "chat" ? parseChatRequest(body, limits) : parseCompletionRequest(body, limits) }),
    writer: (res, ask, _prompt, id) => new OpenAiWriter(res, ask, new ResponseShaper(kind, s.modelId, id), piece),
  };
}

class OpenAiWriter implements ReplyWriter {
  private first = true;
  private readonly p: ParsedRequest;
  readonly id: string;
  /** Log-probability entries a stream has sent. */
  private sent = 0;

  constructor(private readonly res: ServerResponse, ask: GenerationAsk, private readonly shaper: ResponseShaper, private readonly piece: PieceOf) {
    this.p = ask.request;
    this.id = shaper.id;
  }

  /** Entries as this request's kind reports them; null when there are none to send. */
  private format(entries: readonly TokenLogprobs[] | undefined) {
    if (!entries || entries.length === 0) return null;
    this.sent += entries.length;
    return formatLogprobs(this.p.kind, entries, this.piece);
  }

  private write(chunk: unknown): void {
    this.res.write(`data: ${JSON.stringify(chunk)}\n\n`);
    this.first = false;
  }

  start(): void {
    if (!this.p.stream) return;
    this.res.writeHead(200, { "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-store", Connection: "keep-alive" });
    // As OpenAI streams a chat: the role alone first, then the content (or the calls) in pieces.
    if (this.p.kind === "chat") this.write(this.shaper.chunk("", null, true));
  }

  /** Each piece as a chunk; the tokens' log probabilities ride with the first. */
  events(events: readonly ReplyEvent[], _ids: readonly number[], logprobs?: readonly TokenLogprobs[]): void {
    if (!this.p.stream) return;
    let lp = this.format(logprobs);
    for (const e of events) {
      if (e.kind === "content" || e.kind === "reasoning") this.write(this.shaper.chunk(e.text, null, this.first, lp, e.kind === "content" ? "content" : "reasoning_content"));
      else this.write(this.shaper.toolChunk(e.index, e.kind === "call" ? e : { arguments: e.text }, this.first, lp));
      lp = null;
    }
  }

  finish(f: Finished): void {
    if (!this.p.stream) {
      sendJson(this.res, 200, this.shaper.full(f.content, f.finish, f.usage, f.calls, f.logprobs ? formatLogprobs(this.p.kind, f.logprobs, this.piece) : null, f.reasoning));
      return;
    }
    if (this.first && this.p.kind === "chat") this.write(this.shaper.chunk("", null, true));
    // Tokens whose text is not out yet (empty pieces, a character still incomplete): their entries
    // in a chunk of no text before the finish.
    const rest = this.format(f.logprobs?.slice(this.sent));
    if (rest) this.write(this.shaper.chunk("", null, false, rest));
    this.write(this.shaper.chunk(null, f.finish));
    if (this.p.includeUsage) this.write(this.shaper.usageChunk(f.usage));
    this.res.end("data: [DONE]\n\n");
  }

  fail(e: ApiError, headers: Record<string, string> = {}): void {
    if (this.res.headersSent) this.res.end(`data: ${JSON.stringify(e.body())}\n\n`);
    else sendJson(this.res, e.status, e.body(), headers);
  }
}
