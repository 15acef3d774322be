// Liveness of one link: is the peer still there and still reading? A TCP connection to a hung
// process (stopped, deadlocked, swapping to death) stays up for minutes, so the link asks itself:
//   - ping: every tick without an unanswered ping, unless the peer was heard within half a tick, send
//     one; once it has left this process (its write callback fired), the peer has deadAfterMs to
//     answer. Any byte from the peer counts as an answer (a long incoming frame on a slow link is not
//     silence), and so does one of our own writes completing (our ping may wait in the kernel behind
//     a long outgoing frame; while the peer's kernel keeps taking our bytes, a late pong is explained).
//   - reading: while this side has bytes waiting to be written, a write must complete at least every
//     deadAfterMs (frames go out in fragments, see link.ts, so a slow link still shows progress). A
//     frozen peer's receive buffer fills and our writes stop: this rule then reports it.
// With tick = timeout/8 and deadAfter = timeout/2, a peer that goes silent is reported after at most
// a tick and a half until a ping leaves (none goes while the peer was heard within half a tick),
// deadAfter, and a tick until the check runs: 13/16 of the timeout, which leaves the rest for timer
// delays on a busy machine. native/src/lane.c applies the same rules to links a worker has handed to
// its native lane, with the timings livenessRules() gives it (ring/lane.ts passes them at start).
import type { Socket } from "node:net";
import type WebSocket from "ws";

export const DEFAULT_LIVENESS_TIMEOUT_MS = 2000;

/** The timings of the rules above for a timeout: how often to check, how long a peer may be silent
 * before it is pinged, and how long a ping (or a stalled write) may wait before the peer is dead. */
export interface LivenessRules {
  readonly tickMs: number;
  readonly quietMs: number;
  readonly deadAfterMs: number;
}

export function livenessRules(timeoutMs: number): LivenessRules {
  const tickMs = Math.max(1, timeoutMs / 8);
  return { tickMs, quietMs: tickMs / 2, deadAfterMs: timeoutMs / 2 };
}

export class LivenessWatch {
  private readonly tickMs: number;
  private readonly quietMs: number;
  private readonly deadAfterMs: number;
  private timer: NodeJS.Timeout | null = null;
  private pingOutstanding = false;
  private pingSeq = 0;
  /** When the outstanding ping left this process, or null while it is still queued. */
  private pingFlushedAt: number | null = null;
  private lastHeardAt = performance.now();
  /** When one of our writes last completed. */
  private lastWriteAt = performance.now();
  /** When bytes started waiting to be written (sampled each tick), or null while nothing waits. */
  private bufferedSince: number | null = null;
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
    ({ tickMs: this.tickMs, quietMs: this.quietMs, deadAfterMs: this.deadAfterMs } = livenessRules(timeoutMs));
  }

  start(): void {
    if (this.timer) return;
    this.ws.on("pong", this.onPong);
    this.socket.on("data", this.onData);
    this.lastHeardAt = this.lastWriteAt = performance.now();
    this.bufferedSince = null;
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
    this.lastWriteAt = performance.now();
  }

  private dead(reason: string): void {
    this.stop();
    this.onDead(reason);
  }

  private tick(): void {
    const now = performance.now();
    if (this.pingOutstanding && this.pingFlushedAt !== null) {
      const silentMs = now - Math.max(this.pingFlushedAt, this.lastHeardAt, this.lastWriteAt);
      if (silentMs > this.deadAfterMs) {
        this.dead(`no answer to a ping for ${Math.round(now - this.pingFlushedAt)} ms: the peer is dead, hung or unreachable`);
        return;
      }
    }
    const buffered = this.ws.bufferedAmount;
    if (buffered === 0) this.bufferedSince = null;
    else {
      this.bufferedSince ??= now;
      const stalledMs = now - Math.max(this.lastWriteAt, this.bufferedSince);
      if (stalledMs > this.deadAfterMs) {
        this.dead(`the peer stopped reading: ${buffered} bytes unsent and no write completed for ${Math.round(stalledMs)} ms`);
        return;
      }
    }
    // A peer heard from within the last half tick (a predecessor streaming frames) needs no ping: each
    // ping and pong wakes both processes, which on a busy device lands in someone's compute.
    if (!this.pingOutstanding && now - this.lastHeardAt >= this.quietMs && this.ws.readyState === this.ws.OPEN) {
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
