// Liveness of one link: is the peer still there and still reading? A TCP connection to a hung
// process (stopped, deadlocked, swapping to death) stays up for minutes, so the link asks itself:
//   - ping: every tick without an unanswered ping, send one; once it has left this process (its
//     write callback fired), the peer has deadAfterMs to answer. Any byte from the peer also counts
//     as an answer, so a long incoming frame on a slow link is not mistaken for silence.
//   - reading: while this side has bytes waiting to be written, a write must complete at least every
//     deadAfterMs (frames are written in fragments, see link.ts, so a slow link still shows progress).
// With tick = timeout/8 and deadAfter = timeout - 3 ticks, a peer that goes silent is reported
// within timeoutMs: at most a tick until a ping leaves, deadAfter, and a tick until the check runs.
import type { Socket } from "node:net";
import type WebSocket from "ws";

export const DEFAULT_LIVENESS_TIMEOUT_MS = 2000;

export class LivenessWatch {
  private readonly tickMs: number;
  private readonly deadAfterMs: number;
  private timer: NodeJS.Timeout | null = null;
  private pingOutstanding = false;
  private pingSeq = 0;
  /** When the outstanding ping left this process, or null while it is still queued. */
  private pingFlushedAt: number | null = null;
  private lastHeardAt = performance.now();
  private lastWriteProgressAt = performance.now();
  private readonly onPong = () => {
    this.pingOutstanding = false;
    this.pingFlushedAt = null;
    this.lastHeardAt = performance.now();
  };
  private readonly onData = () => {
    this.lastHeardAt = performance.now();
  };

  constructor(
    private readonly ws: WebSocket,
    private readonly socket: Socket,
    timeoutMs: number,
    private readonly onDead: (reason: string) => void,
  ) {
    this.tickMs = Math.max(1, timeoutMs / 8);
    this.deadAfterMs = timeoutMs - 3 * this.tickMs;
  }

  start(): void {
    if (this.timer) return;
    this.ws.on("pong", this.onPong);
    this.socket.on("data", this.onData);
    this.lastHeardAt = this.lastWriteProgressAt = performance.now();
    this.timer = setInterval(() => this.tick(), this.tickMs);
    this.timer.unref(); // a link never keeps the process alive by itself
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    this.ws.off("pong", this.onPong);
    this.socket.off("data", this.onData);
  }

  /** The link calls this whenever one of its writes completes. */
  noteWriteProgress(): void {
    this.lastWriteProgressAt = performance.now();
  }

  private dead(reason: string): void {
    this.stop();
    this.onDead(reason);
  }

  private tick(): void {
    const now = performance.now();
    if (this.pingOutstanding && this.pingFlushedAt !== null) {
      const silentMs = now - Math.max(this.pingFlushedAt, this.lastHeardAt);
      if (silentMs > this.deadAfterMs) {
        this.dead(`no answer to a ping for ${Math.round(silentMs)} ms: the peer is dead, hung or unreachable`);
        return;
      }
    }
    if (this.ws.bufferedAmount === 0) this.lastWriteProgressAt = now;
    else if (now - this.lastWriteProgressAt > this.deadAfterMs) {
      this.dead(`the peer stopped reading: ${this.ws.bufferedAmount} bytes unsent and no write completed for ` +
        `${Math.round(now - this.lastWriteProgressAt)} ms`);
      return;
    }
    if (!this.pingOutstanding && this.ws.readyState === this.ws.OPEN) {
      this.pingOutstanding = true;
      this.pingFlushedAt = null;
      const seq = ++this.pingSeq;
      try {
        this.ws.ping(undefined, undefined, (err) => {
          if (!err && this.pingOutstanding && seq === this.pingSeq) this.pingFlushedAt = performance.now();
        });
      } catch {
        // The socket is closing; the link's close handler reports that.
      }
    }
  }
}
