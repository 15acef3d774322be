// serve's embeddings in the three dialects: OpenAI's POST /v1/embeddings, Ollama's POST /api/embed (and
// the older /api/embeddings) and llama-server's POST /embedding and /embeddings. Each input is one
// request on the queue (or a sequence slot with --parallel), like a generation that stops after its
// prompt: its pass runs from position 0 on whatever devices hold the layers, and the final rows are
// pooled as llama.cpp pools them (engine/embedding.ts). Shapes follow llama.cpp's tools/server
// (server-context.cpp handle_embeddings_impl, server-common.cpp format_embeddings_response_oaicompat)
// and Ollama's api types; every field not listed is refused by name.
import type { ServerResponse } from "node:http";
import { EmbeddingError, Sampler, embeddingPooling, normalizeEmbedding, poolRows, type Pooling } from "../engine/index.js";
import { printable, type Tokenizer } from "../model/index.js";
import { CancelledError, QueueFullError } from "./queue.js";
import { ns, sendJson, type Served } from "./http-reply.js";
import { llamaErrorBody, tokenizeMixed } from "./llama-server.js";
import { LOAD_OPTIONS, NEUTRAL_OPTIONS, SAMPLING_OPTIONS, ollamaErrorBody } from "./ollama.js";
import { ApiError, asObject, bad, optBool, optInt } from "./openai.js";

type Json = Record<string, unknown>;

/** The embedding endpoints and their dialects. */
export const EMBEDDING_PATHS: Readonly<Record<string, "openai" | "ollama" | "ollama-legacy" | "llama">> = {
  "/v1/embeddings": "openai", "/api/embed": "ollama", "/api/embeddings": "ollama-legacy", "/embedding": "llama", "/embeddings": "llama",
};

/** OpenAI's limit on inputs in one request. */
const MAX_INPUTS = 2048;

export interface EmbeddingServed extends Served {
  /** serve --pooling; undefined: the file's, else last (engine/embedding.ts). */
  readonly pooling?: Pooling;
  readonly log: (line: string) => void;
}

interface EmbeddingAsk {
  /** Each input's tokens (checked: not empty, within the context). */
  readonly inputs: Int32Array[];
  /** common_embd_normalize's p: 2 (L2) by default, -1 none. */
  readonly normalize: number;
  readonly base64: boolean;
  /** The model the client named (answers echo it, as llama-server's and Ollama's do). */
  readonly model?: string;
}

/** The pooling of the served model, or why it has no embeddings (found once per model). */
const poolingOf = new WeakMap<object, { pooling: Pooling; source: string } | EmbeddingError>();
function pooling(s: EmbeddingServed): { pooling: Pooling; source: string } {
  let p = poolingOf.get(s.cluster.model);
  if (!p) {
    try {
      p = embeddingPooling(s.cluster.model.gguf, s.cluster.model.desc, s.pooling);
    } catch (e) {
      if (!(e instanceof EmbeddingError)) throw e;
      p = e;
    }
    poolingOf.set(s.cluster.model, p);
  }
  if (p instanceof EmbeddingError) throw new ApiError(400, `this model gives no embeddings: ${p.message}`, "invalid_request_error", "not_supported");
  return p;
}

function refuseUnknown(b: Json, known: readonly string[]): void {
  for (const k of Object.keys(b)) {
    if (!known.includes(k)) throw new ApiError(400, `${printable(k, 60)}: not supported by this server's embeddings`, "invalid_request_error", "unsupported_parameter", printable(k, 60));
  }
}

/** llama.cpp's tokenize_input_prompts: an array holding no number is a list of prompts, anything else
 * one prompt (a string, token ids, or both mixed); text gets BOS (and EOS) as the model adds them. */
function promptsOf(tok: Tokenizer, raw: unknown, param: string): Int32Array[] {
  if (raw === undefined || raw === null) throw bad(param, "is required");
  if (Array.isArray(raw) && !raw.some((x) => typeof x === "number")) {
    if (raw.length === 0) throw bad(param, "must not be empty");
    if (raw.length > MAX_INPUTS) throw bad(param, `at most ${MAX_INPUTS} inputs (got ${raw.length})`);
    return raw.map((p, i) => promptOf(tok, p, `${param}[${i}]`));
  }
  return [promptOf(tok, raw, param)];
}

function promptOf(tok: Tokenizer, p: unknown, param: string): Int32Array {
  if (typeof p !== "string" && !Array.isArray(p)) throw bad(param, "must be a string, token ids, or a list of them");
  return tokenizeMixed(tok, p, true, true, param);
}

/** Each input within the context (a pass from position 0 holds at most ctx tokens) and not empty. */
function checkLengths(inputs: Int32Array[], ctx: number, param: string): void {
  inputs.forEach((t, i) => {
    const where = inputs.length > 1 ? `${param}[${i}]` : param;
    if (t.length === 0) throw bad(where, "has no tokens (the model adds no BOS to an empty text)");
    if (t.length > ctx) throw bad(where, `is too large to process: ${t.length} tokens, more than the context of ${ctx} (serve --ctx)`);
  });
}

function encodingFormat(b: Json): boolean {
  const f = b.encoding_format;
  if (f === undefined || f === null || f === "float") return false;
  if (f === "base64") return true;
  throw bad("encoding_format", "must be \"float\" or \"base64\"");
}

function dimensions(b: Json, nEmbd: number): void {
  const d = optInt(b, "dimensions", 1, 1 << 20);
  if (d !== undefined && d !== nEmbd) {
    throw new ApiError(400, `dimensions: this model's embeddings have ${nEmbd} dimensions; other sizes are not supported (got ${d})`, "invalid_request_error", "unsupported_parameter", "dimensions");
  }
}

/** llama-server's embd_normalize: -1 none, 0 max absolute, 1 taxicab, 2 Euclidean, p > 2 a p-norm. */
function embdNormalize(b: Json): number {
  return optInt(b, "embd_normalize", -1, 64) ?? 2;
}

function modelName(b: Json): string | undefined {
  const m = b.model;
  if (m !== undefined && m !== null && typeof m !== "string") throw bad("model", "must be a string");
  return m ?? undefined;
}

/** Ollama's options: all of its names are accepted (none changes an embedding), num_ctx within serve's
 * --ctx truncates as Ollama's context would; the limit of an input's tokens. */
function ollamaLimit(b: Json, ctx: number): number {
  const o = b.options;
  if (o === undefined || o === null) return ctx;
  if (typeof o !== "object" || Array.isArray(o)) throw bad("options", "must be an object");
  let limit = ctx;
  for (const [k, v] of Object.entries(o as Json)) {
    if (k === "num_ctx" && v !== null) {
      if (typeof v !== "number" || !Number.isInteger(v) || v < 1) throw bad("options.num_ctx", "must be a whole number >= 1");
      if (v > ctx) throw bad("options.num_ctx", `${v} is more than this server's context of ${ctx} tokens (serve --ctx)`);
      limit = v;
    } else if (!Object.hasOwn(SAMPLING_OPTIONS, k) && !LOAD_OPTIONS.has(k) && !Object.hasOwn(NEUTRAL_OPTIONS, k) && k !== "num_ctx") {
      throw new ApiError(400, `options.${printable(k, 60)}: not supported by this server`, "invalid_request_error", "unsupported_parameter", `options.${printable(k, 60)}`);
    }
  }
  return limit;
}

/** Ollama's truncate (default true): inputs longer than the context keep their first tokens. */
function truncated(inputs: Int32Array[], limit: number, truncate: boolean): Int32Array[] {
  return inputs.map((t, i) => {
    if (t.length <= limit) return t;
    if (!truncate) throw bad(inputs.length > 1 ? `input[${i}]` : "input", `has ${t.length} tokens, more than the context of ${limit}, and truncate is false`);
    return t.subarray(0, limit);
  });
}

function keepAlive(b: Json): void {
  const ka = b.keep_alive;
  if (ka !== undefined && ka !== null && typeof ka !== "string" && typeof ka !== "number") throw bad("keep_alive", "must be a duration such as \"5m\" or a number of seconds");
}

/** Reads a request of the path's dialect; throws ApiError naming the field. */
export function parseEmbeddingRequest(s: EmbeddingServed, path: string, body: unknown): EmbeddingAsk {
  const b = asObject(body);
  const { tok } = s;
  const ctx = s.cluster.o.ctx, E = s.cluster.model.nEmbd;
  const dialect = EMBEDDING_PATHS[path];
  const p = pooling(s).pooling;
  if (dialect === "openai") {
    refuseUnknown(b, ["input", "model", "encoding_format", "dimensions", "user", "embd_normalize"]);
    if (p === "none") throw new ApiError(400, "pooling none gives one vector per token, which /v1/embeddings cannot carry: serve --pooling mean, cls or last (or llama-server's /embedding)", "invalid_request_error", "not_supported");
    if (b.user !== undefined && b.user !== null && typeof b.user !== "string") throw bad("user", "must be a string");
    dimensions(b, E);
    const base64 = encodingFormat(b), normalize = embdNormalize(b);
    const inputs = promptsOf(tok, b.input, "input");
    checkLengths(inputs, ctx, "input");
    return { inputs, normalize, base64, model: modelName(b) };
  }
  if (dialect === "llama") {
    refuseUnknown(b, ["input", "content", "model", "encoding_format", "embd_normalize"]);
    const normalize = embdNormalize(b);
    encodingFormat(b); // read and checked as llama-server does; its non-OpenAI answer is floats
    const param = b.input !== undefined ? "input" : "content";
    if (b.input === undefined && b.content === undefined) throw bad("input", "\"input\" or \"content\" must be provided");
    const inputs = promptsOf(tok, b[param], param);
    checkLengths(inputs, ctx, param);
    return { inputs, normalize, base64: false, model: modelName(b) };
  }
  if (p === "none") throw new ApiError(400, "pooling none gives one vector per token, which Ollama's embeddings cannot carry: serve --pooling mean, cls or last", "invalid_request_error", "not_supported");
  keepAlive(b);
  const limit = ollamaLimit(b, ctx);
  if (dialect === "ollama-legacy") {
    refuseUnknown(b, ["model", "prompt", "options", "keep_alive"]);
    if (b.prompt !== undefined && b.prompt !== null && typeof b.prompt !== "string") throw bad("prompt", "must be a string");
    const text = (b.prompt as string | undefined) ?? "";
    const inputs = text === "" ? [] : [tok.encode(text, { addSpecial: true, parseSpecial: true })];
    checkLengths(inputs, limit, "prompt");
    // Ollama's older endpoint answers the vector as the model gives it, not normalized
    return { inputs, normalize: -1, base64: false, model: modelName(b) };
  }
  refuseUnknown(b, ["model", "input", "truncate", "options", "keep_alive", "dimensions"]);
  dimensions(b, E);
  const raw = b.input;
  let texts: string[];
  if (raw === undefined || raw === null || raw === "") texts = [];
  else if (typeof raw === "string") texts = [raw];
  else if (Array.isArray(raw) && raw.every((x) => typeof x === "string")) texts = raw as string[];
  else throw bad("input", "must be a string or an array of strings");
  if (texts.length > MAX_INPUTS) throw bad("input", `at most ${MAX_INPUTS} inputs (got ${texts.length})`);
  const inputs = truncated(texts.map((t) => tok.encode(t, { addSpecial: true, parseSpecial: true })), limit, optBool(b, "truncate") ?? true);
  checkLengths(inputs, limit, "input");
  return { inputs, normalize: 2, base64: false, model: modelName(b) };
}

/** An error's body in the path's dialect. */
export function embeddingErrorBody(path: string, e: ApiError): unknown {
  const d = EMBEDDING_PATHS[path];
  return d === "openai" ? e.body() : d === "llama" ? llamaErrorBody(e) : ollamaErrorBody(e);
}

/** Float32 values as little-endian bytes in base64 (OpenAI's and llama-server's encoding_format). */
export function base64Floats(v: Float32Array): string {
  const b = Buffer.alloc(v.length * 4);
  v.forEach((x, i) => b.writeFloatLE(x, i * 4));
  return b.toString("base64");
}

let embeddingSeq = 0;

/** One input through the layers (a request on the queue that stops after its prompt), pooled. */
async function embedOne(s: EmbeddingServed, tokens: Int32Array, pool: Pooling, signal: AbortSignal): Promise<Float32Array[]> {
  let vectors: Float32Array[] | undefined;
  await s.cluster.generate({
    kind: "completion", prompt: tokens, maxTokens: 1, sampler: new Sampler({ temperature: 0 }), isEnd: () => true, onToken: () => false, signal,
    // a scope of its own: no earlier prompt's cache is continued (every row is needed), and no later
    // client's prompt continues this one's
    cacheScope: `embedding ${++embeddingSeq}`,
    onPrompt: (rows, fromPos) => {
      if (fromPos !== 0) throw new Error(`an embedding's pass began at position ${fromPos}, not 0`);
      vectors = poolRows(s.cluster.model, rows, tokens.length, pool);
    },
  });
  if (!vectors) throw new Error("the pass gave no rows");
  return vectors;
}

/** Checks, queues and answers one embedding request; `outcome` counts it as the generations are. */
export async function serveEmbeddings(s: EmbeddingServed, path: string, res: ServerResponse, body: unknown,
  outcome: (o: "ok" | "invalid" | "rejected" | "cancelled" | "error") => void): Promise<void> {
  const fail = (e: ApiError, headers: Record<string, string> = {}) => sendJson(res, e.status, embeddingErrorBody(path, e), headers);
  const ready = s.cluster.readiness();
  if (!ready.ok) {
    outcome("rejected");
    fail(new ApiError(503, `the cluster cannot serve yet: ${ready.status}`, "server_error", "not_ready"), { "Retry-After": "5" });
    return;
  }
  let ask: EmbeddingAsk;
  try {
    ask = parseEmbeddingRequest(s, path, body);
  } catch (e) {
    if (!(e instanceof ApiError)) throw e;
    outcome("invalid");
    fail(e);
    return;
  }
  const abort = new AbortController();
  let done = false;
  res.on("close", () => {
    if (!done) abort.abort();
  });
  const started = performance.now();
  const pool = pooling(s).pooling;
  const vectors: Float32Array[][] = [];
  try {
    // one input at a time: other clients' requests take their turns between them
    for (const t of ask.inputs) vectors.push(await embedOne(s, t, pool, abort.signal));
  } catch (e) {
    done = true;
    if (e instanceof QueueFullError) {
      outcome("rejected");
      fail(new ApiError(503, e.message, "server_error", "queue_full"), { "Retry-After": "2" });
    } else if (e instanceof CancelledError || abort.signal.aborted) {
      outcome("cancelled");
      res.end();
    } else {
      outcome("error");
      s.log(`embeddings failed: ${(e as Error).message}`);
      fail(new ApiError(503, `embeddings failed: ${(e as Error).message}`, "server_error", "embeddings_failed"), { "Retry-After": "2" });
    }
    return;
  }
  done = true;
  const tokens = ask.inputs.reduce((a, t) => a + t.length, 0);
  const ms = performance.now() - started;
  outcome("ok");
  s.log(`embeddings: ${ask.inputs.length} input${ask.inputs.length === 1 ? "" : "s"}, ${tokens} tokens in ${Math.round(ms)} ms`);
  // llama-server scales only pooled vectors; pooling none gives each token's row as it is
  const scaled = vectors.map((vs) => (pool === "none" ? vs : vs.map((v) => normalizeEmbedding(v, ask.normalize))));
  const floats = (v: Float32Array) => Array.from(v);
  switch (EMBEDDING_PATHS[path]) {
    case "openai":
      sendJson(res, 200, {
        object: "list", model: ask.model ?? s.modelId, usage: { prompt_tokens: tokens, total_tokens: tokens },
        data: scaled.map((vs, index) => ({ object: "embedding", index, embedding: ask.base64 ? base64Floats(vs[0]) : floats(vs[0]) })),
      });
      return;
    case "llama":
      sendJson(res, 200, scaled.map((vs, index) => ({ index, embedding: vs.map(floats) })));
      return;
    case "ollama":
      sendJson(res, 200, { model: ask.model ?? s.modelId, embeddings: scaled.map((vs) => floats(vs[0])), total_duration: ns(ms), load_duration: 0, prompt_eval_count: tokens });
      return;
    case "ollama-legacy":
      sendJson(res, 200, { embedding: scaled.length ? floats(scaled[0][0]) : [] });
      return;
  }
}
