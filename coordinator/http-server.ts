// serve's HTTP port: the OpenAI API (/v1/...), Ollama's (ollama.ts) and llama-server's (llama-server.ts),
// /health, /metrics, the cluster's state (/api/state, and its push stream /api/stream: state-stream.ts) and the
// dashboard's files. Every request is checked before it reaches the ring (first who may ask at all,
// http-guard.ts: Host, Origin, API key); the dialects share one generation path (generation.ts), so
// they share the queue, the prompt cache, the limits and the metrics. Whatever a client sends, the
// answer is a status code with an error in the dialect's shape and the server stays up.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { packageRoot } from "../base/index.js";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Tokenizer } from "../model/index.js";
import type { Cluster } from "./cluster.js";
import { formatMetrics, newRequestOutcomes, type RequestOutcomes } from "./metrics.js";
import { ApiError } from "./openai.js";
import { openAiDialect } from "./openai-reply.js";
import { StateStreams } from "./state-stream.js";
import { Generations } from "./generation.js";
import { sendJson, type Served } from "./http-reply.js";
import { ollamaDialect, ollamaErrorBody, ps, show, tags } from "./ollama.js";
import { detokenize, llamaCompletionDialect, llamaErrorBody, props, slots, tokenize } from "./llama-server.js";
import { ConversationTokens, type PromptRenderer } from "./prompt.js";
import { RequestGuard, bodyTypeRefusal, type GuardOptions } from "./http-guard.js";
import { Constraints } from "./structured.js";
import type { ReasoningFormat } from "../tools/index.js";
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
  /** serve --kv-evict h2o --kv-budget F: past the context, evict by H2O keeping this fraction of it. */
  readonly h2oBudget?: number;
  readonly maxBodyBytes?: number;
  readonly log: (line: string) => void;
  /** Serves the dashboard's files; returns false when the path is not one of them. */
  readonly staticFiles?: (req: IncomingMessage, res: ServerResponse) => boolean;
}

const DEFAULT_MAX_BODY_BYTES = 4 << 20;

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
  /** Each client's last exchange as tokens, so its next turn keeps the reply as generated. */
  private readonly conversations: ConversationTokens;
  readonly outcomes: RequestOutcomes = newRequestOutcomes();
  private readonly constraints: Constraints;
  private readonly stateStreams: StateStreams;
  private readonly generations: Generations;

  constructor(private readonly o: ApiServerOptions) {
    this.conversations = new ConversationTokens(o.prompts);
    this.guard = new RequestGuard(o);
    this.constraints = new Constraints(o.tok);
    this.generations = new Generations({
      o, outcomes: this.outcomes, conversations: this.conversations, constraints: this.constraints,
      healthy: () => this.healthy(), jsonBody: (req) => this.jsonBody(req), templateSource: () => this.templateSource(),
    });
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
    this.stateStreams = new StateStreams(o.cluster);
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
    this.stateStreams.close();
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
    if (await this.route(req, res, `${method} ${path}`, cacheScope(req, key), (e) => sendError(res, e))) return;
    this.unknown(req, res, method, path, sendError);
  }

  /** The endpoints, by `METHOD /path`; false for one there is none of. */
  private async route(req: IncomingMessage, res: ServerResponse, route: string, scope: string, fail: (e: ApiError) => void): Promise<boolean> {
    const path = route.slice(route.indexOf(" ") + 1);
    switch (route) {
      case "GET /v1/models":
        sendJson(res, 200, { object: "list", data: [{ id: this.o.modelId, object: "model", created: Math.floor(this.o.cluster.startedUnixMs / 1000), owned_by: "prima" }] });
        return true;
      case "GET /metrics":
        res.writeHead(200, { "Content-Type": "text/plain; version=0.0.4; charset=utf-8" });
        res.end(formatMetrics(this.o.cluster.state(), this.outcomes, this.o.cluster.counters, this.constraints));
        return true;
      case "GET /api/state":
        sendJson(res, 200, this.o.cluster.state(), { "Cache-Control": "no-store" });
        return true;
      case "GET /api/stream":
        this.stateStreams.open(req, res);
        return true;
      case "POST /v1/chat/completions":
      case "POST /v1/completions": {
        const kind = path.endsWith("chat/completions") ? "chat" : "completion";
        await this.generations.generation(req, res, openAiDialect(kind, this.o), scope);
        return true;
      }
      case "POST /api/chat":
      case "POST /api/generate":
        await this.generations.generation(req, res, ollamaDialect(path === "/api/chat" ? "chat" : "generate", this.o), scope);
        return true;
      case "POST /completion":
        await this.generations.generation(req, res, llamaCompletionDialect(this.o), scope);
        return true;
      case "GET /api/tags":
        sendJson(res, 200, tags(this.o));
        return true;
      case "GET /api/ps":
        sendJson(res, 200, ps(this.o));
        return true;
      case "GET /api/version":
        sendJson(res, 200, { version: VERSION });
        return true;
      case "GET /props":
        sendJson(res, 200, props(this.o, this.templateSource(), VERSION));
        return true;
      case "GET /slots":
        sendJson(res, 200, slots(this.o));
        return true;
      case "POST /v1/embeddings":
      case "POST /api/embed":
      case "POST /api/embeddings":
      case "POST /embedding":
      case "POST /embeddings": {
        const body = await this.readJson(req, res, (e) => sendJson(res, e.status, embeddingErrorBody(path, e)), (b) => ({ b }));
        if (body !== undefined) await serveEmbeddings(this.o, path, res, (body as { b: unknown }).b, (o) => this.outcomes[o]++);
        return true;
      }
      case "POST /api/show":
      case "POST /tokenize":
      case "POST /detokenize": {
        const answer = await this.readJson(req, res, fail, (body) =>
          path === "/api/show" ? show(this.o, body, this.templateSource()) : path === "/tokenize" ? tokenize(this.o.tok, body) : detokenize(this.o.tok, body));
        if (answer !== undefined) sendJson(res, 200, answer);
        return true;
      }
    }
    return false;
  }

  /** No such endpoint: one that is refused by name (501), a method the path does not take (405), or 404. */
  private unknown(req: IncomingMessage, res: ServerResponse, method: string, path: string, sendError: (r: ServerResponse, e: ApiError, headers?: Record<string, string>) => void): void {
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
   * was sent. A web page must send it as JSON, as for generations (http-guard.ts). */
  private async readJson(req: IncomingMessage, res: ServerResponse, fail: (e: ApiError) => void, answer: (body: unknown) => unknown): Promise<unknown> {
    const refusal = bodyTypeRefusal(req);
    try {
      if (refusal) {
        req.resume();
        throw new ApiError(415, refusal, "invalid_request_error", "unsupported_media_type");
      }
      const body = await this.jsonBody(req);
      return answer(body);
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      fail(e);
      return undefined;
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
