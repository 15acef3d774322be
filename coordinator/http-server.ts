// serve's HTTP port: the OpenAI API (/v1/...), /health, /metrics, the cluster's state (/api/state and
// its push stream /api/stream) and the dashboard's files. Every request is checked before it reaches
// the ring (first who may ask at all, http-guard.ts: Host, Origin, API key); whatever a client sends,
// the answer is a status code with an OpenAI-style error object and the server stays up.
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { Sampler } from "../engine/index.js";
import { StreamingDecoder, printable, type Tokenizer } from "../model/index.js";
import { CancelledError, QueueFullError, type Cluster } from "./cluster.js";
import { formatMetrics, newRequestOutcomes, type RequestOutcomes } from "./metrics.js";
import {
  ApiError, ResponseShaper, StopMatcher, formatLogprobs, parseChatRequest, parseCompletionRequest, usage, type FinishReason, type ParsedRequest,
  type TokenLogprobs,
} from "./openai.js";
import { ConversationTokens, type PromptRenderer } from "./prompt.js";
import { RequestGuard, type GuardOptions } from "./http-guard.js";
import { Constraints, planStructured, type StructuredPlan } from "./structured.js";
import { closingStart, type GrammarConstraint } from "../grammar/index.js";
import type { ReplyEvent } from "../tools/index.js";

export interface ApiServerOptions extends GuardOptions {
  readonly cluster: Cluster;
  readonly tok: Tokenizer;
  readonly prompts: PromptRenderer;
  /** The id /v1/models lists and responses carry. A request may name any model: the server runs one,
   * and clients send names of their own (LangChain's default, an Ollama tag), as llama-server allows. */
  readonly modelId: string;
  /** Tokens a request generates when it names no max_tokens, and the most it may name (serve
   * --n-predict); undefined: until the context is full. */
  readonly nPredict?: number;
  readonly maxBodyBytes?: number;
  readonly log: (line: string) => void;
  /** Serves the dashboard's files; returns false when the path is not one of them. */
  readonly staticFiles?: (req: IncomingMessage, res: ServerResponse) => boolean;
}

const DEFAULT_MAX_BODY_BYTES = 4 << 20;
const STREAM_STATE_EVERY_MS = 2000;
const STREAM_STATE_MIN_GAP_MS = 250;
const MAX_STATE_STREAMS = 32;

function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  const text = JSON.stringify(body);
  res.writeHead(status, { "Content-Type": "application/json; charset=utf-8", "Content-Length": Buffer.byteLength(text), ...headers });
  res.end(text);
}

function sendError(res: ServerResponse, e: ApiError, headers: Record<string, string> = {}): void {
  sendJson(res, e.status, e.body(), headers);
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
        sendError(res, new ApiError(500, `internal error: ${(e as Error).message}`, "server_error"));
      });
    });
    // Slow or half-open clients: the headers within 10 s, the whole request within 30 s; a stream's
    // response may then take as long as generation does.
    this.server.headersTimeout = 10_000;
    this.server.requestTimeout = 30_000;
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
      case "GET /slots": {
        // llama-server's /slots, in its spirit: each sequence slot and what it holds (serve --parallel)
        const slots = this.o.cluster.slotStates();
        if (!slots) sendError(res, new ApiError(501, "this server has no sequence slots: start it with --parallel N (N > 1)", "invalid_request_error", "not_supported"));
        else sendJson(res, 200, slots.map((x) => ({ id: x.id, state: x.state, is_processing: x.state === "processing", n_ctx: x.nCtx, cached_tokens: x.cachedTokens, request: x.request })), { "Cache-Control": "no-store" });
        return;
      }
      case "GET /api/state":
        sendJson(res, 200, this.o.cluster.state(), { "Cache-Control": "no-store" });
        return;
      case "GET /api/stream":
        this.stateStream(req, res);
        return;
      case "POST /v1/chat/completions":
      case "POST /v1/completions":
        await this.completion(req, res, path.endsWith("chat/completions") ? "chat" : "completion", cacheScope(req, key));
        return;
    }
    const known = ["/v1/models", "/metrics", "/slots", "/api/state", "/api/stream", "/v1/chat/completions", "/v1/completions"];
    if (known.includes(path)) sendError(res, new ApiError(405, `${method} is not allowed on ${path}`, "invalid_request_error", "method_not_allowed"), { Allow: path.startsWith("/v1/c") ? "POST" : "GET" });
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
      sendError(res, new ApiError(503, `too many state streams open (${MAX_STATE_STREAMS})`, "server_error", "too_many_streams"), { "Retry-After": "5" });
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

  // ---- completions -----------------------------------------------------------------------------

  private async completion(req: IncomingMessage, res: ServerResponse, kind: "chat" | "completion", scope: string): Promise<void> {
    let parsed: ParsedRequest;
    let ids: Int32Array;
    let promptText: string;
    // Only JSON is parsed as JSON: a text/plain form or a no-cors fetch from a web page cannot send it.
    const type = (req.headers["content-type"] ?? "").split(";")[0].trim().toLowerCase();
    if (type !== "application/json") {
      req.resume();
      this.outcomes.invalid++;
      const got = type === "" ? "no Content-Type" : `Content-Type ${printable(type, 80)}`;
      sendError(res, new ApiError(415, `the request body must be JSON sent as Content-Type: application/json (got ${got}; with curl: -H 'Content-Type: application/json')`,
        "invalid_request_error", "unsupported_media_type"));
      return;
    }
    let plan: StructuredPlan;
    let constraint: GrammarConstraint | undefined;
    const health = this.healthy();
    if (!health.ok) {
      req.resume();
      this.outcomes.rejected++;
      sendError(res, new ApiError(503, `the cluster cannot serve yet: ${health.status}`, "server_error", "not_ready"), { "Retry-After": "5" });
      return;
    }
    try {
      const text = await readBody(req, this.o.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES);
      let body: unknown;
      try {
        body = JSON.parse(text);
      } catch (e) {
        throw new ApiError(400, `the request body is not valid JSON: ${(e as Error).message}`, "invalid_request_error", "invalid_json");
      }
      const limits = { nVocab: this.o.tok.nVocab };
      parsed = kind === "chat" ? parseChatRequest(body, limits) : parseCompletionRequest(body, limits);
      const template = kind === "chat" && parsed.tools ? this.o.prompts.chat : undefined;
      plan = planStructured(parsed, template?.source, template?.isFallback ?? false);
      try {
        promptText = kind === "chat" ? this.o.prompts.chatText(plan.messages, plan.templateTools) : parsed.prompt!;
        ids = this.conversations.ids(scope, promptText).ids;
      } catch (e) {
        throw new ApiError(400, `the prompt could not be rendered: ${(e as Error).message}`, "invalid_request_error", "invalid_prompt");
      }
      const ctx = this.o.cluster.o.ctx;
      if (ids.length === 0) throw new ApiError(400, "the prompt is empty", "invalid_request_error", "invalid_prompt", kind === "chat" ? "messages" : "prompt");
      if (ids.length >= ctx) {
        throw new ApiError(400, `the prompt has ${ids.length} tokens; the context holds ${ctx}, and at least one must be left to generate`, "invalid_request_error", "context_length_exceeded", kind === "chat" ? "messages" : "prompt");
      }
      if (plan.spec) constraint = await this.constraints.start(plan.spec);
    } catch (e) {
      this.outcomes.invalid++;
      if (e instanceof ApiError) {
        sendError(res, e);
        return;
      }
      throw e;
    }
    try {
      await this.generate(req, res, parsed, promptText, ids, scope, plan, constraint);
    } finally {
      if (constraint) this.constraints.done(constraint);
    }
  }

  private async generate(req: IncomingMessage, res: ServerResponse, p: ParsedRequest, promptText: string, ids: Int32Array, cacheScope: string,
    plan: StructuredPlan, constraint?: GrammarConstraint): Promise<void> {
    const { cluster, tok } = this.o;
    const shaper = new ResponseShaper(p.kind, this.o.modelId, randomUUID().replace(/-/g, "").slice(0, 24));
    const abort = new AbortController();
    let done = false;
    res.on("close", () => {
      if (!done) abort.abort();
    });
    const decoder = new StreamingDecoder(tok);
    const stops = new StopMatcher(p.stop);
    let text = "";
    let first = true;
    const parser = plan.parser();
    // Log probabilities (when asked for): one entry per generated token, with where its text starts
    // among the decoded text. A token belongs to the reply unless a stop string cut the text before it;
    // a stream sends each token's entry with the chunk whose text reaches it.
    const entries: TokenLogprobs[] | undefined = p.logprobs === undefined ? undefined : [];
    let decodedLength = 0;
    let entriesSent = 0;
    const piece = (id: number) => tok.tokenPiece(id, { special: true });
    /** The entries not sent yet whose text starts before `end` (all of them: Infinity). */
    const due = (end: number) => {
      if (!entries) return null;
      let j = entriesSent;
      while (j < entries.length && entries[j].offset < end) j++;
      const out = entries.slice(entriesSent, j);
      entriesSent = j;
      return out.length > 0 ? formatLogprobs(p.kind, out, piece) : null;
    };
    const write = (chunk: unknown) => {
      res.write(`data: ${JSON.stringify(chunk)}\n\n`);
      first = false;
    };
    const send = (events: ReplyEvent[]) => {
      if (!p.stream) return;
      for (const e of events) {
        if (e.kind === "content") write(shaper.chunk(e.text, null, first, due(text.length)));
        else write(shaper.toolChunk(e.index, e.kind === "call" ? e : { arguments: e.text }, first, due(text.length)));
      }
    };
    const emit = (t: string) => {
      if (!t) return;
      text += t;
      if (parser) send(parser.push(t));
      else if (p.stream) write(shaper.chunk(t, null, first, due(text.length)));
    };
    const decoded = (t: string) => {
      decodedLength += t.length;
      return t;
    };
    const room = cluster.o.ctx - ids.length;
    const maxTokens = Math.min(p.maxTokens ?? room, this.o.nPredict ?? room, room);
    const sampler = new Sampler({ ...p.sampler, constraint, closeAfter: closingStart(maxTokens), logprobs: p.logprobs });
    // Numbered as it is queued (cluster.generate queues synchronously), so the log shows the order.
    const tag = `request ${++this.received} (${shaper.id})`;
    const startedAt = performance.now();
    try {
      const out = await cluster.generate({
        kind: p.kind, prompt: ids, maxTokens, sampler, isEnd: (id) => tok.isEog(id),
        signal: abort.signal, cacheScope,
        onStart: () => {
          if (!p.stream) return;
          res.writeHead(200, { "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-store", Connection: "keep-alive" });
          // As OpenAI streams a chat: the role alone first, then the content (or the calls) in pieces.
          if (p.kind === "chat") write(shaper.chunk("", null, true));
        },
        onToken: (id) => {
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
      if (!stops.stopped && calls.length === 0) this.conversations.remember(cacheScope, promptText, ids, text, r.ids);
      const u = usage(ids.length, r.ids.length, out.cachedTokens);
      this.outcomes.ok++;
      const speed = (out.meanDecodeMs > 0 ? `, ${(1000 / out.meanDecodeMs).toFixed(1)} tok/s` : "") +
        (constraint && constraint.steps > 0 ? `, the constraint ${(constraint.ms / constraint.steps).toFixed(2)} ms/token` : "");
      this.o.log(`${tag}: ${ids.length} prompt tokens (${out.cachedTokens} cached) + ${r.ids.length} generated (${finish}) in ${Math.round(performance.now() - startedAt)} ms, ${Math.round(out.queueMs)} of them queued${speed}`);
      if (p.stream) {
        if (first && p.kind === "chat") res.write(`data: ${JSON.stringify(shaper.chunk("", null, true))}\n\n`);
        // Tokens whose text is not out yet (empty pieces, a character still incomplete): their entries
        // in a chunk of no text before the finish.
        const rest = due(Infinity);
        if (rest) write(shaper.chunk("", null, false, rest));
        res.write(`data: ${JSON.stringify(shaper.chunk(null, finish))}\n\n`);
        if (p.includeUsage) res.write(`data: ${JSON.stringify(shaper.usageChunk(u))}\n\n`);
        res.end("data: [DONE]\n\n");
      } else sendJson(res, 200, shaper.full(reply ? reply.content : text, finish, u, calls, formatLogprobs(p.kind, entries, piece)));
    } catch (e) {
      done = true;
      if (e instanceof QueueFullError) {
        this.outcomes.rejected++;
        sendError(res, new ApiError(503, e.message, "server_error", "queue_full"), { "Retry-After": "2" });
        return;
      }
      if (e instanceof CancelledError) {
        this.outcomes.cancelled++;
        res.end();
        return;
      }
      this.outcomes.error++;
      const err = new ApiError(503, `generation failed: ${(e as Error).message}`, "server_error", "generation_failed");
      this.o.log(`${tag} failed: ${(e as Error).message}`);
      if (res.headersSent) res.end(`data: ${JSON.stringify(err.body())}\n\n`);
      else sendError(res, err, { "Retry-After": "2" });
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
