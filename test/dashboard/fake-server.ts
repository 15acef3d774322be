// A stand-in for `prima-coord serve`'s HTTP side, with the contract the dashboard relies on: the
// static files through serveDashboardAsset, GET /api/state, the SSE stream (event: state on every
// change and at least every 2 s), /v1/models, a streaming /v1/chat/completions, and the API key rule
// (everything but /health and the static files answers 401 with an OpenAI-style error).
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { serveDashboardAsset } from "../../dashboard/index.js";
import type { ClusterState } from "../../coordinator/state.js";

export interface FakeServerOptions {
  state: ClusterState;
  apiKey?: string;
  /** 0 = any free port. */
  port?: number;
  /** Text the fake model streams back, in pieces. */
  answer?: string[];
  /** How often the stream repeats the state (serve: at least every 2 s); 0: only on setState. */
  tickMs?: number;
}

export class FakeServer {
  private server: Server | null = null;
  private streams = new Set<ServerResponse>();
  private ticker: NodeJS.Timeout | null = null;
  state: ClusterState;
  port: number;
  /** Requests seen, for assertions ("GET /api/state 401"). */
  readonly log: string[] = [];

  constructor(private readonly opts: FakeServerOptions) {
    this.state = opts.state;
    this.port = opts.port ?? 0;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  async start(): Promise<this> {
    const server = createServer((req, res) => this.handle(req, res));
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.port, "127.0.0.1", () => resolve());
    });
    this.server = server;
    this.port = (server.address() as AddressInfo).port;
    const tick = this.opts.tickMs ?? 1000;
    if (tick > 0) this.ticker = setInterval(() => this.push(), tick);
    return this;
  }

  /** Stops listening and cuts every open connection (the page's stream included), like a dead server. */
  async stop(): Promise<void> {
    if (this.ticker) clearInterval(this.ticker);
    this.ticker = null;
    const server = this.server;
    this.server = null;
    if (!server) return;
    for (const s of this.streams) s.destroy();
    this.streams.clear();
    const closed = new Promise<void>((resolve) => server.close(() => resolve()));
    server.closeAllConnections();
    await closed;
  }

  setState(state: ClusterState): void {
    this.state = state;
    this.push();
  }

  private push(): void {
    this.state = { ...this.state, server: { ...this.state.server, nowUnixMs: Date.now() } };
    const msg = `event: state\ndata: ${JSON.stringify(this.state)}\n\n`;
    for (const s of this.streams) s.write(msg);
  }

  private authorized(req: IncomingMessage): boolean {
    return !this.opts.apiKey || req.headers.authorization === `Bearer ${this.opts.apiKey}`;
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const path = (req.url ?? "/").split("?")[0];
    if (serveDashboardAsset(req, res)) {
      this.log.push(`${req.method} ${path} 200`);
      return;
    }
    if (path === "/health") return this.json(req, res, 200, { ok: true });
    if (!this.authorized(req)) {
      return this.json(req, res, 401, { error: { message: "missing or wrong API key", type: "invalid_request_error", code: "invalid_api_key" } });
    }
    if (req.method === "GET" && path === "/api/state") return this.json(req, res, 200, this.state);
    if (req.method === "GET" && path === "/api/stream") {
      this.log.push(`GET ${path} 200`);
      res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache", Connection: "keep-alive" });
      this.streams.add(res);
      res.on("close", () => this.streams.delete(res));
      res.write(`event: state\ndata: ${JSON.stringify(this.state)}\n\n`);
      return;
    }
    if (req.method === "GET" && path === "/v1/models") {
      return this.json(req, res, 200, { object: "list", data: [{ id: this.state.model.name, object: "model", created: 0, owned_by: "prima" }] });
    }
    if (req.method === "POST" && path === "/v1/chat/completions") {
      let body = "";
      req.on("data", (d: Buffer) => { body += d.toString(); });
      req.on("end", () => this.chat(req, res, body));
      return;
    }
    this.json(req, res, 404, { error: { message: `no route ${req.method} ${path}`, type: "invalid_request_error", code: "not_found" } });
  }

  private chat(req: IncomingMessage, res: ServerResponse, body: string): void {
    const request = JSON.parse(body) as { stream?: boolean; model?: string };
    const pieces = this.opts.answer ?? ["Once", " upon", " a", " time", "."];
    this.log.push(`POST /v1/chat/completions ${body}`);
    res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache" });
    const chunk = (delta: object, finish: string | null) =>
      `data: ${JSON.stringify({ id: "chatcmpl-1", object: "chat.completion.chunk", created: 0, model: request.model, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
    let i = 0;
    const next = () => {
      if (res.destroyed) return;
      if (i < pieces.length) {
        res.write(chunk(i === 0 ? { role: "assistant", content: pieces[i] } : { content: pieces[i] }, null));
        i++;
        setTimeout(next, 30);
      } else {
        res.end(`${chunk({}, "stop")}data: [DONE]\n\n`);
      }
    };
    next();
    void req;
  }

  private json(req: IncomingMessage, res: ServerResponse, status: number, body: unknown): void {
    this.log.push(`${req.method} ${(req.url ?? "/").split("?")[0]} ${status}`);
    const text = JSON.stringify(body);
    res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(text) });
    res.end(text);
  }
}
