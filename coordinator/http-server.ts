// serve's HTTP port: the OpenAI API (/v1/...), Ollama's (ollama.ts) and llama-server's (llama-server.ts),
// /health, /metrics, the cluster's state (/api/state and its push stream /api/stream) and the
// dashboard's files. Every request is checked before it reaches the ring (first who may ask at all,
// http-guard.ts: Host, Origin, API key); the dialects share one generation path (http-reply.ts), so
// they share the queue, the prompt cache, the limits and the metrics. Whatever a client sends, the
// answer is a status code with an error in the dialect's shape and the server stays up.
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { packageRoot } from "../base/index.js";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { Sampler } from "../engine/index.js";
import { StreamingDecoder, printable, type Tokenizer } from "../model/index.js";
import { contextShiftFor } from "./args.js";
import { CancelledError, QueueFullError, type Cluster } from "./cluster.js";
import { formatMetrics, newRequestOutcomes, type RequestOutcomes } from "./metrics.js";
import { ApiError, StopMatcher, openAiDialect, renamedParam, usage, type FinishReason, type TokenLogprobs } from "./openai.js";
import { sendJson, type Dialect, type GenerationAsk, type ReplyWriter, type Served } from "./http-reply.js";
import { ollamaDialect, ollamaErrorBody, ps, show, tags } from "./ollama.js";
import { detokenize, llamaCompletionDialect, llamaErrorBody, props, slots, tokenize } from "./llama-server.js";
import { ConversationTokens, type PromptRenderer } from "./prompt.js";
import { RequestGuard, type GuardOptions } from "./http-guard.js";
import { Constraints, planStructured, type StructuredPlan } from "./structured.js";
import { closingStart, type GrammarConstraint } from "../grammar/index.js";
import type { ReasoningFormat, ReplyEvent } from "../tools/index.js";
import type { Pooling } from "../engine/index.js";
import { EMBEDDING_PATHS, embeddingErrorBody, serveEmbeddings } from "./embeddings.js";

export interface ApiServerOptions extends GuardOptions, Served {
  readonly cluster: Cluster;
  readonly tok: Tokenizer;
  readonly prompts: PromptRenderer;
  /** The id /v1/models lists and responses carry. A request may name any model: the server runs one,
   * and clients send names of their own (LangChain's default, an Ollama tag), as llama-server allows. */
  readonly modelId: string;
  /** Tokens a request generates when it names no max_tokens, and the most it may name (serve
   * --n-predict); undefined: until the context is full. */
  readonly nPredict?: number;
  /** serve --pooling (embeddings.ts); undefined: the model file's, else last. */
  readonly pooling?: Pooling;
  /** serve --reasoning-format: the model's reasoning apart from its answer (auto, the default) or left in it (none). */
  readonly reasoningFormat?: ReasoningFormat;
  /** Past the context: shift it (serve --keep, --no-context-shift). */
  readonly contextShift?: boolean;
  readonly nKeep?: number;
  readonly maxBodyBytes?: number;
  readonly log: (line: string) => void;
  /** Serves the dashboard's files; returns false when the path is not one of them. */
  readonly staticFiles?: (req: IncomingMessage, res: ServerResponse) => boolean;
}

const DEFAULT_MAX_BODY_BYTES = 4 << 20;
const STREAM_STATE_EVERY_MS = 2000;
const STREAM_STATE_MIN_GAP_MS = 250;
const MAX_STATE_STREAMS = 32;

/** The version /api/version and /props report: prima's own. */
const VERSION = (JSON.parse(readFileSync(join(packageRoot(), "package.json"), "utf8")) as { version: string }).version;

/** Ollama's endpoints (beside prima's own /api/state and /api/stream) and llama-server's. */
const OLLAMA_PATHS = new Set(["/api/chat", "/api/generate", "/api/tags", "/api/show", "/api/version", "/api/ps"]);
const LLAMA_PATHS = new Set(["/completion", "/tokenize", "/detokenize", "/props", "/slots", "/embedding", "/embeddings"]);

/** Ollama's endpoints that manage models: serve runs the one model it was started with. */
const OLLAMA_MODEL_MANAGEMENT = new Set(["/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete", "/api/blobs"]);

/** An error's body as the dialect of the path it answers (any /api/ path but prima's own is Ollama's). */
function errorBodyFor(path: string, e: ApiError): unknown {
  const ollama = OLLAMA_PATHS.has(path) || (path.startsWith("/api/") && path !== "/api/state" && path !== "/api/stream");
  return ollama ? ollamaErrorBody(e) : LLAMA_PATHS.has(path) ? llamaErrorBody(e) : e.body();
}

/** The body as text, at most `limit` bytes (413 beyond), within a time limit set on the server. */
function readBody(req: IncomingMessage, limit: number): Promise<string> {
  return new Promise((resolve, reject) => {
    // Past the limit the rest is read and dropped (within the server's request timeout), so the client
    // gets its 413 instead of a broken pipe.
    const tooLarge = (what: string) => {
      req.removeAllListeners("data");
      req.resume();
      reject(new ApiError(413, `the request body is ${what} than the limit of ${limit} bytes`, "invalid_request_error", "request_too_large"));
    };
    const declared = Number(req.headers["content-length"] ?? 0);
    if (declared > limit) {
      tooLarge(`${declared} bytes, more`);
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (c: Buffer) => {
      size += c.length;
      if (size > limit) tooLarge("more");
      else chunks.push(c);
    });
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", (e) => reject(new ApiError(400, `reading the request failed: ${e.message}`)));
  });
}

export class ApiServer {
  private readonly server: Server;
  private readonly guard: RequestGuard;
  private readonly streams = new Set<ServerResponse>();
  /** Each client's last exchange as tokens, so its next turn keeps the reply as generated. */
  private readonly conversations: ConversationTokens;
  readonly outcomes: RequestOutcomes = newRequestOutcomes();
  /** Generation requests that reached the queue, numbering them in their order there (FIFO). */
  private received = 0;
  private readonly constraints: Constraints;

  constructor(private readonly o: ApiServerOptions) {
    this.conversations = new ConversationTokens(o.prompts);
    this.guard = new RequestGuard(o);
    this.constraints = new Constraints(o.tok);
    this.server = createServer((req, res) => {
      this.handle(req, res).catch((e: unknown) => {
        o.log(`internal error on ${req.method} ${safePath(req.url)}: ${(e as Error).message}`);
        const path = new URL(req.url ?? "/", "http://localhost").pathname;
        const err = new ApiError(500, `internal error: ${(e as Error).message}`, "server_error");
        sendJson(res, err.status, errorBodyFor(path, err));
      });
    });
    // Slow or half-open clients: the headers within 10 s, the whole request within 30 s; a stream's
    // response may then take as long as generation does.
    this.server.headersTimeout = 10_000;
    this.server.requestTimeout = 30_000;
    // An idle keep-alive connection stays a minute (Node's default is 5 s). A client reuses its idle
    // sockets until the server's Keep-Alive hint less a second; on a busy machine a request sent on one
    // just as the server closed it failed as "Connection error" (the `openai` client, undici), and
    // POSTs are not retried by every client.
    this.server.keepAliveTimeout = 65_000;
    this.server.on("clientError", (err, socket) => {
      if (socket.writable) socket.end("HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
      else socket.destroy();
    });
    o.cluster.on("change", this.onChange);
  }

  listen(port: number, host: string): Promise<number> {
    return new Promise((resolve, reject) => {
      const onError = (e: Error) => reject(new Error(`cannot listen on ${host}:${port}: ${e.message}`));
      this.server.once("error", onError);
      this.guard.bind(host);
      this.server.listen(port, host, () => {
        this.server.off("error", onError);
        this.server.on("error", (e) => this.o.log(`HTTP server error: ${e.message}`));
        resolve((this.server.address() as AddressInfo).port);
      });
    });
  }

  async close(): Promise<void> {
    this.o.cluster.off("change", this.onChange);
    clearInterval(this.everyTimer);
    clearTimeout(this.pushTimer);
    for (const s of this.streams) s.end();
    this.streams.clear();
    await new Promise<void>((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections();
    });
  }

  /** /health: the ring can serve (the model is loaded, this device measured, enough workers joined). */
  private healthy(): { ok: boolean; status: string } {
    const r = this.o.cluster.readiness();
    return r.ok ? { ok: true, status: "ok" } : r;
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? "/", "http://localhost");
    const path = url.pathname.replace(/\/+$/, "") || "/";
    const method = req.method ?? "GET";
    const sendError = (r: ServerResponse, e: ApiError, headers: Record<string, string> = {}) => sendJson(r, e.status, errorBodyFor(path, e), headers);
    const admitted = this.guard.admit(req);
    if ("status" in admitted) {
      req.resume();
      sendError(res, new ApiError(admitted.status, admitted.message, "invalid_request_error", admitted.code));
      return;
    }
    const cors = admitted.corsOrigin;
    if (method === "OPTIONS") {
      // A CORS preflight from an allowed origin; any other OPTIONS only learns the methods.
      res.writeHead(204, cors ? RequestGuard.preflightHeaders(cors, req) : { Allow: "GET, POST, OPTIONS" });
      res.end();
      return;
    }
    if (cors) for (const [k, v] of Object.entries(RequestGuard.corsHeaders(cors))) res.setHeader(k, v);
    if (path === "/health" && (method === "GET" || method === "HEAD")) {
      const h = this.healthy();
      sendJson(res, h.ok ? 200 : 503, { status: h.status });
      return;
    }
    if (method === "GET" && this.o.staticFiles?.(req, res)) return;
    const key = this.guard.keyIndex(req);
    if (key === -1) {
      req.resume();
      sendError(res, new ApiError(401, req.headers.authorization ? "the API key is wrong" : "this server needs an API key: send Authorization: Bearer KEY",
        "invalid_request_error", "invalid_api_key"), { "WWW-Authenticate": "Bearer" });
      return;
    }
    const route = `${method} ${path}`;
    switch (route) {
      case "GET /v1/models":
        sendJson(res, 200, { object: "list", data: [{ id: this.o.modelId, object: "model", created: Math.floor(this.o.cluster.startedUnixMs / 1000), owned_by: "prima" }] });
        return;
      case "GET /metrics":
        res.writeHead(200, { "Content-Type": "text/plain; version=0.0.4; charset=utf-8" });
        res.end(formatMetrics(this.o.cluster.state(), this.outcomes, this.o.cluster.counters, this.constraints));
        return;
      case "GET /api/state":
        sendJson(res, 200, this.o.cluster.state(), { "Cache-Control": "no-store" });
        return;
      case "GET /api/stream":
        this.stateStream(req, res);
        return;
      case "POST /v1/chat/completions":
      case "POST /v1/completions": {
        const kind = path.endsWith("chat/completions") ? "chat" : "completion";
        await this.generation(req, res, openAiDialect(kind, this.o), cacheScope(req, key));
        return;
      }
      case "POST /api/chat":
      case "POST /api/generate":
        await this.generation(req, res, ollamaDialect(path === "/api/chat" ? "chat" : "generate", this.o), cacheScope(req, key));
        return;
      case "POST /completion":
        await this.generation(req, res, llamaCompletionDialect(this.o), cacheScope(req, key));
        return;
      case "GET /api/tags":
        sendJson(res, 200, tags(this.o));
        return;
      case "GET /api/ps":
        sendJson(res, 200, ps(this.o));
        return;
      case "GET /api/version":
        sendJson(res, 200, { version: VERSION });
        return;
      case "GET /props":
        sendJson(res, 200, props(this.o, this.templateSource(), VERSION));
        return;
      case "GET /slots":
        sendJson(res, 200, slots(this.o));
        return;
      case "POST /v1/embeddings":
      case "POST /api/embed":
      case "POST /api/embeddings":
      case "POST /embedding":
      case "POST /embeddings": {
        const body = await this.readJson(req, res, (e) => sendJson(res, e.status, embeddingErrorBody(path, e)), (b) => ({ b }));
        if (body !== undefined) await serveEmbeddings(this.o, path, res, (body as { b: unknown }).b, (o) => this.outcomes[o]++);
        return;
      }
      case "POST /api/show":
      case "POST /tokenize":
      case "POST /detokenize": {
        const answer = await this.readJson(req, res, (e) => sendError(res, e), (body) =>
          path === "/api/show" ? show(this.o, body, this.templateSource()) : path === "/tokenize" ? tokenize(this.o.tok, body) : detokenize(this.o.tok, body));
        if (answer !== undefined) sendJson(res, 200, answer);
        return;
      }
    }
    const managed = OLLAMA_MODEL_MANAGEMENT.has(path) || path.startsWith("/api/blobs/");
    if (managed) {
      req.resume();
      sendError(res, new ApiError(501, `${safePath(path)}: not supported: this server runs the one model it was started with (prima-coord serve model.gguf)`, "invalid_request_error", "not_supported"));
      return;
    }
    const posts = ["/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate", "/api/show", "/completion", "/tokenize", "/detokenize", ...Object.keys(EMBEDDING_PATHS)];
    const gets = ["/v1/models", "/metrics", "/api/state", "/api/stream", "/api/tags", "/api/ps", "/api/version", "/props", "/slots"];
    if (posts.includes(path) || gets.includes(path)) sendError(res, new ApiError(405, `${method} is not allowed on ${path}`, "invalid_request_error", "method_not_allowed"), { Allow: posts.includes(path) ? "POST" : "GET" });
    else sendError(res, new ApiError(404, `no such endpoint: ${method} ${safePath(path)}`, "invalid_request_error", "not_found"));
  }

  // ---- the push stream of the state ------------------------------------------------------------

  private lastPush = 0;
  private everyTimer: NodeJS.Timeout | undefined;
  private pushTimer: NodeJS.Timeout | undefined;

  private readonly onChange = () => {
    if (this.streams.size === 0 || this.pushTimer) return;
    const wait = Math.max(0, this.lastPush + STREAM_STATE_MIN_GAP_MS - Date.now());
    this.pushTimer = setTimeout(() => {
      this.pushTimer = undefined;
      this.pushState();
    }, wait);
    this.pushTimer.unref();
  };

  private pushState(): void {
    this.lastPush = Date.now();
    const data = `event: state\ndata: ${JSON.stringify(this.o.cluster.state())}\n\n`;
    for (const s of this.streams) s.write(data);
  }

  private stateStream(req: IncomingMessage, res: ServerResponse): void {
    if (this.streams.size >= MAX_STATE_STREAMS) {
      sendJson(res, 503, new ApiError(503, `too many state streams open (${MAX_STATE_STREAMS})`, "server_error", "too_many_streams").body(), { "Retry-After": "5" });
      return;
    }
    res.writeHead(200, { "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-store", Connection: "keep-alive" });
    res.write(`event: state\ndata: ${JSON.stringify(this.o.cluster.state())}\n\n`);
    this.streams.add(res);
    // One timer for every stream: each tick builds the state once and sends it to all.
    if (!this.everyTimer) {
      this.everyTimer = setInterval(() => this.pushState(), STREAM_STATE_EVERY_MS);
      this.everyTimer.unref();
    }
    const end = () => {
      this.streams.delete(res);
      if (this.streams.size === 0) {
        clearInterval(this.everyTimer);
        this.everyTimer = undefined;
      }
    };
    req.on("close", end);
    res.on("close", end);
  }

  /** The chat template's source, or undefined when the model has none (a fallback is used). */
  private templateSource(): string | undefined {
    try {
      const t = this.o.prompts.chat;
      return t.isFallback ? undefined : t.source;
    } catch {
      return undefined;
    }
  }

  /** The request's body parsed as JSON (bounded by maxBodyBytes); a 400 naming the parse error. */
  private async jsonBody(req: IncomingMessage): Promise<unknown> {
    const text = await readBody(req, this.o.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES);
    try {
      return JSON.parse(text) as unknown;
    } catch (e) {
      throw new ApiError(400, `the request body is not valid JSON: ${(e as Error).message}`, "invalid_request_error", "invalid_json");
    }
  }

  /** A small JSON request (not a generation): its body through `answer`, or undefined once an error
   * was sent. Content-Type must be JSON, as for generations (a web page's form cannot send it). */
  private async readJson(req: IncomingMessage, res: ServerResponse, fail: (e: ApiError) => void, answer: (body: unknown) => unknown): Promise<unknown> {
    const type = (req.headers["content-type"] ?? "").split(";")[0].trim().toLowerCase();
    try {
      if (type !== "application/json") {
        req.resume();
        throw new ApiError(415, "the request body must be JSON sent as Content-Type: application/json", "invalid_request_error", "unsupported_media_type");
      }
      const body = await this.jsonBody(req);
      return answer(body);
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      fail(e);
      return undefined;
    }
  }

  // ---- generation, in any dialect ----------------------------------------------------------------

  /** A generation request in dialect `d`: checked, queued, generated, answered in its shape. */
  private async generation(req: IncomingMessage, res: ServerResponse, d: Dialect, scope: string): Promise<void> {
    const fail = (e: ApiError, headers: Record<string, string> = {}) => sendJson(res, e.status, d.errorBody(renamedParam(e, d.params ?? {})), headers);
    // Only JSON is parsed as JSON: a text/plain form or a no-cors fetch from a web page cannot send it.
    const type = (req.headers["content-type"] ?? "").split(";")[0].trim().toLowerCase();
    if (type !== "application/json") {
      req.resume();
      this.outcomes.invalid++;
      const got = type === "" ? "no Content-Type" : `Content-Type ${printable(type, 80)}`;
      fail(new ApiError(415, `the request body must be JSON sent as Content-Type: application/json (got ${got}; with curl: -H 'Content-Type: application/json')`,
        "invalid_request_error", "unsupported_media_type"));
      return;
    }
    const health = this.healthy();
    if (!health.ok) {
      req.resume();
      this.outcomes.rejected++;
      fail(new ApiError(503, `the cluster cannot serve yet: ${health.status}`, "server_error", "not_ready"), { "Retry-After": "5" });
      return;
    }
    let ask: GenerationAsk;
    let ids: Int32Array;
    let promptText: string | undefined;
    let plan: StructuredPlan;
    let constraint: GrammarConstraint | undefined;
    try {
      const body = await this.jsonBody(req);
      const parsed = d.parse(body);
      if ("answer" in parsed) {
        sendJson(res, 200, parsed.answer);
        return;
      }
      ask = parsed;
      const p = ask.request;
      const chat = p.kind === "chat";
      const template = chat ? this.templateSource() : undefined;
      plan = planStructured(p, template, template === undefined, p.reasoningFormat ?? this.o.reasoningFormat);
      if (ask.promptIds) ids = ask.promptIds;
      else {
        try {
          promptText = chat ? this.o.prompts.chatText(plan.messages, plan.templateTools, p.templateVars) : p.prompt!;
          ids = this.conversations.ids(scope, promptText).ids;
        } catch (e) {
          throw new ApiError(400, `the prompt could not be rendered: ${(e as Error).message}`, "invalid_request_error", "invalid_prompt");
        }
      }
      const ctx = this.o.cluster.o.ctx;
      if (ids.length === 0) throw new ApiError(400, "the prompt is empty", "invalid_request_error", "invalid_prompt", chat ? "messages" : "prompt");
      if (ids.length >= ctx) {
        throw new ApiError(400, `the prompt has ${ids.length} tokens; the context holds ${ctx}, and at least one must be left to generate`, "invalid_request_error", "context_length_exceeded", chat ? "messages" : "prompt");
      }
      if (plan.spec) constraint = await this.constraints.start(plan.spec, plan.param);
    } catch (e) {
      this.outcomes.invalid++;
      if (e instanceof ApiError) {
        fail(e);
        return;
      }
      throw e;
    }
    try {
      await this.generate(res, ask, d.writer(res, ask, ids, randomUUID().replace(/-/g, "").slice(0, 24)), promptText, ids, scope, plan, constraint);
    } finally {
      if (constraint) this.constraints.done(constraint);
    }
  }

  private async generate(res: ServerResponse, ask: GenerationAsk, w: ReplyWriter, promptText: string | undefined, ids: Int32Array, cacheScope: string,
    plan: StructuredPlan, constraint?: GrammarConstraint): Promise<void> {
    const { cluster, tok } = this.o;
    const p = ask.request;
    const abort = new AbortController();
    let done = false;
    res.on("close", () => {
      if (!done) abort.abort();
    });
    const decoder = new StreamingDecoder(tok);
    const stops = new StopMatcher(p.stop);
    let text = "";
    const parser = plan.parser(promptText);
    // Tokens generated since the last piece was handed on (a piece held back for a stop string or a
    // split character waits for the next token).
    let pending: number[] = [];
    // Log probabilities (when asked for): one entry per generated token, with where its text starts
    // among the decoded text. A token belongs to the reply unless a stop string cut the text before it;
    // a piece handed on carries the entries of the tokens whose text it reaches.
    const entries: TokenLogprobs[] | undefined = p.logprobs === undefined ? undefined : [];
    let decodedLength = 0;
    let entriesSent = 0;
    /** The entries not handed on yet whose text starts before `end`. */
    const due = (end: number): TokenLogprobs[] | undefined => {
      if (!entries) return undefined;
      let j = entriesSent;
      while (j < entries.length && entries[j].offset < end) j++;
      const out = entries.slice(entriesSent, j);
      entriesSent = j;
      return out;
    };
    const send = (events: ReplyEvent[]) => {
      if (events.length === 0) return;
      w.events(events, pending, due(text.length));
      pending = [];
    };
    const decoded = (t: string) => {
      decodedLength += t.length;
      return t;
    };
    const emit = (t: string) => {
      if (!t) return;
      text += t;
      send(parser ? parser.push(t) : [{ kind: "content", text: t }]);
    };
    // A request that names no max_tokens fills the context (or takes --n-predict); shifting the context,
    // one may name more, up to --n-predict.
    const room = cluster.o.ctx - ids.length;
    const shift = contextShiftFor({ contextShift: this.o.contextShift ?? false, nKeep: this.o.nKeep ?? 0 }, ids.length, tok.addBos, cluster.o.ctx, p.nKeep, p.nDiscard);
    const maxTokens = shift ? Math.min(p.maxTokens ?? this.o.nPredict ?? room, this.o.nPredict ?? Infinity)
      : Math.min(p.maxTokens ?? room, this.o.nPredict ?? room, room);
    const sampler = new Sampler({ ...p.sampler, constraint, closeAfter: closingStart(maxTokens), logprobs: p.logprobs });
    // Numbered as it is queued (cluster.generate queues synchronously), so the log shows the order.
    const tag = `request ${++this.received} (${w.id})`;
    const startedAt = performance.now();
    try {
      const out = await cluster.generate({
        kind: p.kind, prompt: ids, maxTokens, sampler, isEnd: (id) => tok.isEog(id),
        signal: abort.signal, cacheScope, contextShift: shift,
        onStart: () => w.start(),
        onToken: (id) => {
          pending.push(id);
          if (entries && sampler.last) entries.push({ ...sampler.last, offset: decodedLength });
          emit(stops.push(decoded(decoder.push(id))));
          return !stops.stopped;
        },
      });
      emit(stops.push(decoded(decoder.flush())));
      emit(stops.flush());
      // The reply's tokens: all but those a stop string cut off.
      if (entries && stops.stopped) entries.length = entries.filter((e) => e.offset < text.length).length;
      done = true;
      const r = out.result;
      if (abort.signal.aborted) {
        this.outcomes.cancelled++;
        this.o.log(`${tag} cancelled by the client after ${r.ids.length} tokens`);
        res.end();
        return;
      }
      const reply = parser?.finish();
      if (reply) send(reply.events);
      const calls = parser?.calls ?? [];
      const ended = r.stopReason === "end" || stops.stopped;
      const finish: FinishReason = ended ? (calls.length > 0 ? "tool_calls" : "stop") : "length";
      // The client's next turn continues this one's text: keep its tokens as generated (a reply cut by
      // a stop string, or one that called tools, no longer stands for its tokens as text).
      if (promptText !== undefined && !stops.stopped && calls.length === 0) this.conversations.remember(cacheScope, promptText, ids, text, r.ids);
      const u = usage(ids.length, r.ids.length, out.cachedTokens);
      this.outcomes.ok++;
      const total = performance.now() - startedAt;
      const promptMs = out.firstTokenMs ?? total - out.queueMs;
      const speed = (out.meanDecodeMs > 0 ? `, ${(1000 / out.meanDecodeMs).toFixed(1)} tok/s` : "") +
        (constraint && constraint.steps > 0 ? `, the constraint ${(constraint.ms / constraint.steps).toFixed(2)} ms/token` : "");
      this.o.log(`${tag}: ${ids.length} prompt tokens (${out.cachedTokens} cached) + ${r.ids.length} generated (${finish}) in ${Math.round(total)} ms, ${Math.round(out.queueMs)} of them queued${speed}`);
      w.finish({
        content: reply ? reply.content : text, reasoning: reply?.reasoning ?? null, calls, finish,
        stopType: stops.stopped ? "word" : r.stopReason === "end" ? "eos" : "limit", stoppingWord: stops.word,
        prompt: ids, generated: r.ids, usage: u, logprobs: entries,
        ms: { queue: out.queueMs, prompt: promptMs, eval: Math.max(0, total - out.queueMs - promptMs), total },
      });
    } catch (e) {
      done = true;
      if (e instanceof QueueFullError) {
        this.outcomes.rejected++;
        w.fail(new ApiError(503, e.message, "server_error", "queue_full"), { "Retry-After": "2" });
        return;
      }
      if (e instanceof CancelledError) {
        this.outcomes.cancelled++;
        res.end();
        return;
      }
      this.outcomes.error++;
      this.o.log(`${tag} failed: ${(e as Error).message}`);
      w.fail(new ApiError(503, `generation failed: ${(e as Error).message}`, "server_error", "generation_failed"), { "Retry-After": "2" });
    }
  }
}

/**
 * Whose prefix cache a request may reuse: its API key's (each key is one client; two keys never see
 * each other's prompts through usage.prompt_tokens_details.cached_tokens or through timing), or
 * without keys its client's address (programs on one machine share one).
 */
function cacheScope(req: IncomingMessage, keyIndex: number | undefined): string {
  return keyIndex !== undefined ? `key ${keyIndex}` : `address ${req.socket.remoteAddress ?? "?"}`;
}

/** A request path as it may appear in a log line or an error: printable ASCII only, bounded. */
function safePath(p: string | undefined): string {
  return (p ?? "").slice(0, 200).replace(/[^\x20-\x7e]/g, "?");
}
