// GET /api/stream: the cluster's state pushed to the dashboards as server-sent events, when it changes
// (at most every STREAM_STATE_MIN_GAP_MS) and every STREAM_STATE_EVERY_MS; one state built per push
// for every stream, and a bounded number of streams.
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Cluster } from "./cluster.js";
import { sendJson } from "./http-reply.js";
import { ApiError } from "./openai.js";

const STREAM_STATE_EVERY_MS = 2000;
const STREAM_STATE_MIN_GAP_MS = 250;
const MAX_STATE_STREAMS = 32;

export class StateStreams {
  private readonly streams = new Set<ServerResponse>();
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

  constructor(private readonly cluster: Cluster) {
    cluster.on("change", this.onChange);
  }

  open(req: IncomingMessage, res: ServerResponse): void {
    if (this.streams.size >= MAX_STATE_STREAMS) {
      sendJson(res, 503, new ApiError(503, `too many state streams open (${MAX_STATE_STREAMS})`, "server_error", "too_many_streams").body(), { "Retry-After": "5" });
      return;
    }
    res.writeHead(200, { "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-store", Connection: "keep-alive" });
    res.write(`event: state\ndata: ${JSON.stringify(this.cluster.state())}\n\n`);
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

  close(): void {
    this.cluster.off("change", this.onChange);
    clearInterval(this.everyTimer);
    clearTimeout(this.pushTimer);
    for (const s of this.streams) s.end();
    this.streams.clear();
  }

  private pushState(): void {
    this.lastPush = Date.now();
    const data = `event: state\ndata: ${JSON.stringify(this.cluster.state())}\n\n`;
    for (const s of this.streams) s.write(data);
  }
}
