// Ollama's API beside the OpenAI one, for the apps that speak only it: POST /api/chat and /api/generate
// (streamed as NDJSON by default, one object a line, the last with done: true and the timings in
// nanoseconds), GET /api/tags, /api/ps, /api/version and POST /api/show. A request is translated into
// the OpenAI path's fields and checked there, so sampling, limits, format (structured output) and tools
// behave the same; an error names Ollama's field and comes as Ollama's {"error": "..."}.
import type { ServerResponse } from "node:http";
import { printable, type Tokenizer } from "../model/index.js";
import type { ReplyEvent, ToolCall } from "../tools/index.js";
import { ns, sendJson, type Dialect, type Finished, type GenerationAsk, type ReplyWriter, type Served } from "./http-reply.js";
import { ApiError, asObject, bad, optBool, optInt, parseChatRequest, parseCompletionRequest, renameParam, type ParsedRequest } from "./openai.js";
import type { TokenLogprobs } from "./openai-reply.js";

type Json = Record<string, unknown>;

const CHAT_FIELDS = new Set(["model", "messages", "tools", "format", "options", "stream", "keep_alive", "think", "logprobs", "top_logprobs"]);
const GENERATE_FIELDS = new Set([
  "model", "prompt", "system", "raw", "format", "options", "stream", "keep_alive", "think", "images", "suffix", "template", "context", "logprobs", "top_logprobs",
]);

/** Ollama's limit on top_logprobs. */
const MAX_TOP_LOGPROBS = 20;

/** logprobs (true/false) and top_logprobs (0..20, with logprobs): how many alternatives per token; undefined: none. */
function parseLogprobs(b: Json): number | undefined {
  const on = optBool(b, "logprobs") ?? false;
  const top = optInt(b, "top_logprobs", 0, MAX_TOP_LOGPROBS);
  if (!on && top) throw bad("top_logprobs", "needs logprobs: true");
  return on ? top ?? 0 : undefined;
}

/** Log probabilities as Ollama gives them: per token its text and log probability, and (top_logprobs)
 * the most likely alternatives alike. */
function ollamaLogprobs(tok: Tokenizer, entries: readonly TokenLogprobs[]): unknown[] {
  const text = (id: number) => new TextDecoder().decode(tok.tokenPiece(id, { special: true }));
  return entries.map((e) => ({
    token: text(e.id), logprob: e.logprob,
    ...(e.top.length > 0 ? { top_logprobs: e.top.map((t) => ({ token: text(t.id), logprob: t.logprob })) } : {}),
  }));
}

/** options read into the sampler and limits, under the OpenAI path's names. */
export const SAMPLING_OPTIONS: Readonly<Record<string, string>> = {
  temperature: "temperature", top_k: "top_k", top_p: "top_p", min_p: "min_p", seed: "seed", num_predict: "max_tokens", stop: "stop",
  repeat_penalty: "repeat_penalty", repeat_last_n: "repeat_last_n", presence_penalty: "presence_penalty", frequency_penalty: "frequency_penalty",
  num_keep: "n_keep",
};
/** options about how Ollama loads and runs a model: serve's own flags decide those, and the answer is the
 * same either way, so they are accepted and have no effect. */
export const LOAD_OPTIONS = new Set(["num_batch", "num_thread", "num_gpu", "main_gpu", "use_mmap", "use_mlock", "numa", "low_vram"]);
/** Samplers this server does not have: accepted only at the value that turns them off. */
export const NEUTRAL_OPTIONS: Readonly<Record<string, unknown>> = { typical_p: 1, mirostat: 0, tfs_z: 1, penalize_newline: false };

/** The OpenAI path's parameter names as Ollama's, for its error messages. */
const OLLAMA_NAMES: Readonly<Record<string, string>> = {
  ...Object.fromEntries(Object.entries(SAMPLING_OPTIONS).map(([o, a]) => [a, `options.${o}`])),
  repetition_penalty: "options.repeat_penalty", response_format: "format", "response_format.json_schema.schema": "format", max_completion_tokens: "options.num_predict",
};

function errorBody(e: ApiError): unknown {
  return { error: e.message };
}

function refuseUnknown(b: Json, known: Set<string>, where: string): void {
  for (const k of Object.keys(b)) {
    if (!known.has(k)) throw new ApiError(400, `${printable(k, 60)}: not supported by this server's ${where}`, "invalid_request_error", "unsupported_parameter", printable(k, 60));
  }
}

/** The fields every generation shares (options, format, think, keep_alive) as OpenAI-path fields. */
function commonFields(b: Json, ctx: number): Json {
  const out: Json = { model: b.model, stream: optBool(b, "stream") ?? true };
  // think: true or a level (gpt-oss's reasoning effort) gives the thinking apart from the content
  // (message.thinking); false asks the template not to think (enable_thinking); unset: serve's
  // --reasoning-format decides.
  const think = b.think;
  if (think === false) out.chat_template_kwargs = { enable_thinking: false };
  else if (think === true || think === "low" || think === "medium" || think === "high") {
    out.reasoning_format = "auto";
    if (think !== true) out.reasoning_effort = think;
  } else if (think !== undefined && think !== null) throw bad("think", "must be true, false, \"low\", \"medium\" or \"high\"");
  // keep_alive: the model stays loaded for as long as serve runs, whatever a client asks.
  const ka = b.keep_alive;
  if (ka !== undefined && ka !== null && typeof ka !== "string" && typeof ka !== "number") throw bad("keep_alive", "must be a duration such as \"5m\" or a number of seconds");
  const o = b.options;
  if (o !== undefined && o !== null) {
    if (typeof o !== "object" || Array.isArray(o)) throw bad("options", "must be an object");
    for (const [k, v] of Object.entries(o as Json)) {
      if (v === null || v === undefined) continue;
      if (Object.hasOwn(SAMPLING_OPTIONS, k)) out[SAMPLING_OPTIONS[k]] = v;
      else if (k === "num_ctx") {
        if (typeof v !== "number" || !Number.isInteger(v) || v < 1) throw bad("options.num_ctx", "must be a whole number >= 1");
        if (v > ctx) throw bad("options.num_ctx", `${v} is more than this server's context of ${ctx} tokens (serve --ctx)`);
        // Smaller: the context stays serve's. A prompt that fits num_ctx fits it too; only a reply
        // longer than num_ctx allows could differ (it shifts later, or not at all).
      } else if (LOAD_OPTIONS.has(k)) continue;
      else if (Object.hasOwn(NEUTRAL_OPTIONS, k)) {
        if (v !== NEUTRAL_OPTIONS[k]) throw new ApiError(400, `options.${k}: not supported (only ${JSON.stringify(NEUTRAL_OPTIONS[k])}, which turns it off)`, "invalid_request_error", "unsupported_parameter", `options.${k}`);
      } else throw new ApiError(400, `options.${printable(k, 60)}: not supported by this server`, "invalid_request_error", "unsupported_parameter", `options.${printable(k, 60)}`);
    }
  }
  // num_predict -1 (no limit) and -2 (fill the context): until the context is full, the default.
  if (out.max_tokens === -1 || out.max_tokens === -2) delete out.max_tokens;
  const f = b.format;
  if (f === "json") out.response_format = { type: "json_object" };
  else if (typeof f === "object" && f !== null && !Array.isArray(f)) out.response_format = { type: "json_schema", json_schema: { name: "format", schema: f } };
  else if (f !== undefined && f !== null && f !== "") throw bad("format", "must be \"json\" or a JSON schema");
  return out;
}

/** An earlier turn's calls as the OpenAI path takes them (arguments as a JSON string). */
function toolCallsIn(raw: unknown, i: number): { id: string }[] | undefined {
  if (raw === undefined || raw === null) return undefined;
  if (!Array.isArray(raw)) throw bad(`messages[${i}].tool_calls`, "must be an array");
  return raw.map((c, j) => {
    const fn = ((c ?? {}) as Json).function as Json | undefined;
    if (!fn || typeof fn.name !== "string") throw bad(`messages[${i}].tool_calls[${j}]`, "must be {function: {name, arguments}}");
    return { id: `call_${i}_${j}`, type: "function", function: { name: fn.name, arguments: typeof fn.arguments === "string" ? fn.arguments : JSON.stringify(fn.arguments ?? {}) } };
  });
}

/** Ollama's messages as the OpenAI path's. Ollama's calls carry no ids and its tool results name no
 * call: the results after an assistant turn answer its calls in order, so they get those calls' ids
 * (templates that pair a result with its call read tool_call_id). */
function chatMessages(raw: unknown): unknown[] {
  if (!Array.isArray(raw)) throw bad("messages", "must be an array of {role, content}");
  let callIds: string[] = [];
  let answered = 0;
  return raw.map((m, i) => {
    const msg = m as Json;
    if (typeof msg !== "object" || msg === null) throw bad(`messages[${i}]`, "must be an object");
    if (Array.isArray(msg.images) && msg.images.length > 0) {
      throw new ApiError(400, `messages[${i}].images: images are not supported (the model reads text)`, "invalid_request_error", "unsupported_parameter", `messages[${i}].images`);
    }
    if (msg.content !== undefined && msg.content !== null && typeof msg.content !== "string") throw bad(`messages[${i}].content`, "must be a string");
    const calls = toolCallsIn(msg.tool_calls, i);
    if (msg.role === "assistant") {
      callIds = calls?.map((c) => c.id) ?? [];
      answered = 0;
    }
    const callId = msg.role === "tool" ? callIds[answered++] : undefined;
    // An earlier reply's `thinking` goes to the templates that keep it (gpt-oss's beside a call, Qwen3's in a tool loop).
    const thinking = msg.role === "assistant" && typeof msg.thinking === "string" && msg.thinking ? { reasoning_content: msg.thinking } : {};
    return {
      role: msg.role, content: msg.content ?? "", tool_calls: calls, ...thinking,
      ...(typeof msg.tool_name === "string" ? { name: msg.tool_name } : {}),
      ...(callId ? { tool_call_id: callId } : {}),
    };
  });
}

/** What /api/chat and /api/generate answer when given nothing to generate: the model is "loaded". */
function loaded(s: Served, kind: "chat" | "generate"): unknown {
  const base = { model: s.modelId, created_at: new Date().toISOString(), done: true, done_reason: "load" };
  return kind === "chat" ? { ...base, message: { role: "assistant", content: "" } } : { ...base, response: "" };
}

export function ollamaDialect(kind: "chat" | "generate", s: Served): Dialect {
  const ctx = s.cluster.o.ctx;
  return {
    errorBody,
    params: OLLAMA_NAMES,
    parse: (body) => {
      const b = asObject(body);
      refuseUnknown(b, kind === "chat" ? CHAT_FIELDS : GENERATE_FIELDS, `/api/${kind}`);
      if (b.model !== undefined && b.model !== null && typeof b.model !== "string") throw bad("model", "must be a string");
      let request: ParsedRequest;
      const logprobs = parseLogprobs(b);
      try {
        const common = commonFields(b, ctx);
        if (kind === "chat") {
          if (b.messages === undefined || b.messages === null || (Array.isArray(b.messages) && b.messages.length === 0)) return { answer: loaded(s, kind) };
          request = parseChatRequest({ ...common, messages: chatMessages(b.messages), tools: b.tools });
        } else {
          for (const k of ["suffix", "template"] as const) {
            if (b[k] !== undefined && b[k] !== null && b[k] !== "") throw new ApiError(400, `${k}: not supported by this server`, "invalid_request_error", "unsupported_parameter", k);
          }
          for (const k of ["images", "context"] as const) {
            if (Array.isArray(b[k]) && (b[k] as unknown[]).length > 0) throw new ApiError(400, `${k}: not supported by this server`, "invalid_request_error", "unsupported_parameter", k);
          }
          if (b.prompt !== undefined && b.prompt !== null && typeof b.prompt !== "string") throw bad("prompt", "must be a string");
          if (b.system !== undefined && b.system !== null && typeof b.system !== "string") throw bad("system", "must be a string");
          const prompt = (b.prompt as string | undefined) ?? "";
          if (prompt === "") return { answer: loaded(s, kind) };
          // raw: the prompt as it is; otherwise it is a user turn (after `system`) in the chat template.
          if (optBool(b, "raw")) request = parseCompletionRequest({ ...common, prompt });
          else {
            const messages = [...(b.system ? [{ role: "system", content: b.system }] : []), { role: "user", content: prompt }];
            request = parseChatRequest({ ...common, messages });
          }
        }
      } catch (e) {
        renameParam(e, OLLAMA_NAMES);
      }
      return { request: logprobs === undefined ? request : { ...request, logprobs } };
    },
    writer: (res, ask, _prompt, id) => new OllamaWriter(res, ask, kind, s.modelId, `ollama-${id}`, s.tok),
  };
}

class OllamaWriter implements ReplyWriter {
  private readonly p: ParsedRequest;
  /** Log-probability entries events() was given, and those of them not sent yet (a call's tokens). */
  private received = 0;
  private held: TokenLogprobs[] = [];

  constructor(private readonly res: ServerResponse, ask: GenerationAsk, private readonly kind: "chat" | "generate", private readonly model: string,
    readonly id: string, private readonly tok: Tokenizer) {
    this.p = ask.request;
  }

  /** The logprobs field of an object carrying these entries (none: no field). */
  private logprobs(entries: readonly TokenLogprobs[] | undefined): Json {
    if (!entries || entries.length === 0) return {};
    return { logprobs: ollamaLogprobs(this.tok, entries) };
  }

  private object(text: string, done: boolean, calls: readonly { name: string; arguments: string }[] = [], thinking = ""): Json {
    const base = { model: this.model, created_at: new Date().toISOString() };
    // The model's thinking as Ollama gives it: message.thinking (/api/chat), thinking (/api/generate).
    const thought = thinking ? { thinking } : {};
    if (this.kind === "generate") return { ...base, response: text, ...thought, done };
    const message = { role: "assistant", content: text, ...thought, ...(calls.length ? { tool_calls: calls.map(callOut) } : {}) };
    return { ...base, message, done };
  }

  private line(o: unknown): void {
    this.res.write(`${JSON.stringify(o)}\n`);
  }

  start(): void {
    if (this.p.stream) this.res.writeHead(200, { "Content-Type": "application/x-ndjson", "Cache-Control": "no-store" });
  }

  /** Text as it comes; calls wait for finish() and come whole in the last object before done, as
   * Ollama streams a call (at once, its arguments an object), never in pieces. */
  events(events: readonly ReplyEvent[], _ids: readonly number[], logprobs?: readonly TokenLogprobs[]): void {
    if (!this.p.stream) return;
    const text = events.map((e) => (e.kind === "content" ? e.text : "")).join("");
    const thinking = events.map((e) => (e.kind === "reasoning" ? e.text : "")).join("");
    this.received += logprobs?.length ?? 0;
    this.held.push(...(logprobs ?? []));
    // Tokens of a call's text: their entries wait for the next line.
    if (text || thinking) {
      this.line({ ...this.object(text, false, [], thinking), ...this.logprobs(this.held) });
      this.held = [];
    }
  }

  finish(f: Finished): void {
    // Rounded once each, the parts never add up to more than the whole (the rest is the queue's).
    const total = ns(f.ms.total);
    const prompt = ns(f.ms.prompt);
    const end = {
      done_reason: f.finish === "length" ? "length" : "stop",
      total_duration: total,
      // The model stays loaded: no request waits for it to load.
      load_duration: 0,
      prompt_eval_count: f.prompt.length, prompt_eval_duration: prompt,
      eval_count: f.generated.length, eval_duration: Math.max(0, total - ns(f.ms.queue) - prompt),
      ...(this.kind === "generate" ? { context: [...f.prompt, ...f.generated] } : {}),
    };
    const calls: readonly ToolCall[] = f.calls;
    if (!this.p.stream) {
      sendJson(this.res, 200, { ...this.object(f.content ?? "", true, calls, f.reasoning ?? ""), ...end, ...this.logprobs(f.logprobs) });
      return;
    }
    // Entries not sent with text yet (a call's tokens, a character still incomplete) ride with the
    // calls, or else with the last line.
    const rest = this.logprobs([...this.held, ...(f.logprobs?.slice(this.received) ?? [])]);
    if (calls.length) this.line({ ...this.object("", false, calls), ...rest });
    this.res.end(`${JSON.stringify({ ...this.object("", true), ...end, ...(calls.length ? {} : rest) })}\n`);
  }

  fail(e: ApiError, headers: Record<string, string> = {}): void {
    if (this.res.headersSent) this.res.end(`${JSON.stringify(errorBody(e))}\n`);
    else sendJson(this.res, e.status, errorBody(e), headers);
  }
}

/** A call as Ollama gives it: arguments as an object. */
function callOut(c: { name: string; arguments: string }): unknown {
  let args: unknown;
  try {
    args = JSON.parse(c.arguments);
  } catch {
    args = c.arguments;
  }
  return { function: { name: c.name, arguments: args } };
}

export { errorBody as ollamaErrorBody };

/** The model as /api/tags, /api/ps and /api/show describe it. */
function modelEntry(s: Served): Json {
  const m = s.cluster.state().model;
  return {
    name: s.modelId, model: s.modelId, modified_at: new Date(s.cluster.startedUnixMs).toISOString(), size: m.sizeBytes, digest: m.fingerprint,
    details: { parent_model: "", format: "gguf", family: m.architecture, families: [m.architecture], parameter_size: parameterSize(s), quantization_level: m.quantization },
  };
}

/** The model's weights counted once per served model (every tensor's elements). */
const parameters = new WeakMap<object, number>();
function parameterCount(s: Served): number {
  const gguf = s.cluster.o.model.gguf;
  let n = parameters.get(gguf);
  if (n === undefined) parameters.set(gguf, (n = gguf.tensors.reduce((sum, t) => sum + t.dims.reduce((a, b) => a * Number(b), 1), 0)));
  return n;
}

function parameterSize(s: Served): string {
  const n = parameterCount(s);
  return n >= 1e9 ? `${(n / 1e9).toFixed(1)}B` : n >= 1e6 ? `${(n / 1e6).toFixed(1)}M` : `${(n / 1e3).toFixed(1)}K`;
}

export function tags(s: Served): unknown {
  return { models: [modelEntry(s)] };
}

/** /api/ps: the one model, loaded for as long as serve runs (expires_at far ahead, as Ollama's keep_alive -1). */
export function ps(s: Served): unknown {
  const m = s.cluster.state().model;
  return { models: [{ ...modelEntry(s), expires_at: "2318-01-01T00:00:00Z", size_vram: 0, context_length: s.cluster.o.ctx, size: m.sizeBytes }] };
}

export function show(s: Served, body: unknown, chatTemplate: string | undefined): unknown {
  const b = asObject(body);
  for (const k of ["model", "name"]) if (b[k] !== undefined && b[k] !== null && typeof b[k] !== "string") throw bad(k, "must be a string");
  const e = modelEntry(s);
  const arch = s.cluster.state().model.architecture;
  return {
    license: "", modelfile: "", parameters: "", template: chatTemplate ?? "", details: e.details,
    model_info: { "general.architecture": arch, "general.parameter_count": parameterCount(s), [`${arch}.context_length`]: s.cluster.o.ctx },
    capabilities: ["completion", ...(chatTemplate ? ["tools"] : [])], modified_at: e.modified_at,
  };
}
