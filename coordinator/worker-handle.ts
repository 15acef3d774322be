// One joined worker as the coordinator sees it: its session's messages, the requests it must answer
// within a limit (an assignment, a status), how late its messages come lately, and its loss, named
// with the reason. The registry (registry.ts) makes one per Join and declares it lost.
import {
  ASSIGN_SILENCE_MS, STATUS_TIMEOUT_MS, type Assignment, type CoordinatorMessage, type Join, type KvCommand, type Ready, type SessionStream,
  type Status, type WorkerMessage,
} from "../control/index.js";
import { isIP } from "node:net";
import { printable } from "../discovery/index.js";
import { PLAUSIBLE } from "../profiler/index.js";

/** How much a gap between a worker's messages still counts after one more message: it halves in
 * about 35 messages (10 s of heartbeats). */
const GAP_DECAY = 0.98;

/** Longest text a worker's failure report keeps in logs and errors. */
const MAX_REPORT_CHARS = 1000;

export class WorkerLostError extends Error {
  override name = "WorkerLostError";
  constructor(readonly worker: WorkerHandle, readonly reason: string) {
    super(`device ${worker.label} failed: ${reason}`);
  }
}

interface Waiter {
  kind: "ready" | "status";
  resolve: (v: never) => void;
  reject: (e: Error) => void;
  onProgress?: (f: number, stage: string) => void;
  /** The assignment a "ready" waiter waits for. */
  ringId?: string;
  /** Starts (again) the time the worker has to answer. */
  arm: () => void;
  timer?: NodeJS.Timeout;
}

/** One joined worker, as the coordinator sees it. */
export class WorkerHandle {
  lastSeenMs = Date.now();
  /** The longest gap between its messages lately (each older gap counts a little less with every
   * message): what its heartbeat limit allows for (control/limits.ts heartbeatLimit). */
  recentGapMs = 0;
  lost: string | null = null;
  /** The last failure the worker reported (escaped), so a worker that leaves after one is named with it. */
  lastFailure: string | null = null;
  /** Called when the worker leaves a request unanswered past its limit (the registry loses it). */
  onUnresponsive: ((reason: string) => void) | undefined;
  private waiters: Waiter[] = [];

  constructor(readonly id: string, readonly join: Join, readonly peerHost: string, private readonly stream: SessionStream, readonly trustGeneration = 0) {}

  /** `w1 "name" (host)` for messages; the worker's strings escaped (control characters, length). */
  get label(): string {
    return `${this.id} "${printable(this.join.deviceName, 64)}" (${printable(this.dataHost, 64)})`;
  }

  /** Where the ring dials this worker: the address it connected from (registry.joinProblem allows
   * another only when the operator said so). */
  get dataHost(): string {
    return this.join.dataHost ? normalHost(this.join.dataHost) : this.peerHost;
  }

  get dataUrl(): string {
    const h = this.dataHost.includes(":") ? `[${this.dataHost}]` : this.dataHost;
    return `ws://${h}:${this.join.dataPort}`;
  }

  send(m: CoordinatorMessage): void {
    if (!this.lost) this.stream.write(m);
  }

  /** Sends the assignment; resolves when the worker reports Ready. Every progress report gives the
   * worker another ASSIGN_SILENCE_MS; silence for that long loses it. */
  assign(a: Assignment, onProgress?: (fraction: number, stage: string) => void, silenceMs = ASSIGN_SILENCE_MS): Promise<Ready> {
    // The worker drops an assignment a newer one reaches while it is set up (it answers only the
    // newest): an earlier one still waited for is over (a ring given up on after another device failed).
    for (const w of this.waiters.filter((x) => x.kind === "ready")) this.take(this.waiters.indexOf(w)).reject(new Error(`device ${this.label}: its assignment was replaced by a newer one`));
    const p = this.wait<Ready>("ready", silenceMs, `sent no progress on its assignment for ${seconds(silenceMs)}`, onProgress, a.ringId);
    this.send({ assignment: a });
    return p;
  }

  /** The worker's status; no answer within timeoutMs loses it. With `timePass`, the worker times its
   * one-token pass first and answers with that profile too (Status.profileJson). */
  status(timeoutMs = STATUS_TIMEOUT_MS, timePass = false): Promise<Status> {
    const p = this.wait<Status>("status", timeoutMs, `did not answer a status request within ${seconds(timeoutMs)}`);
    this.send({ statusRequest: { timePass } });
    if (!timePass) return p;
    this.timingPass++;
    const done = () => { this.timingPass--; };
    p.then(done, done);
    return p;
  }

  /** Statuses asked with a timed pass and not answered yet: the worker times its pass in JS, and a
   * slow device (a quarter of a CPU) sends no heartbeat for seconds meanwhile; the request's own limit
   * bounds that silence instead. */
  private timingPass = 0;

  /** Whether the worker is timing its pass at this coordinator's request (its silence is expected). */
  get measuring(): boolean {
    return this.timingPass > 0;
  }

  kv(cmd: KvCommand): void {
    this.send({ kv: cmd });
  }

  shutdown(reason: string): void {
    this.send({ shutdown: { reason } });
    if (!this.lost) this.stream.end();
  }

  private wait<T>(kind: "ready" | "status", limitMs: number, silence: string, onProgress?: (f: number, stage: string) => void, ringId?: string): Promise<T> {
    if (this.lost) return Promise.reject(new WorkerLostError(this, this.lost));
    return new Promise<T>((resolve, reject) => {
      const w: Waiter = {
        kind, resolve: resolve as (v: never) => void, reject, onProgress, ringId,
        arm: () => {
          clearTimeout(w.timer);
          w.timer = setTimeout(() => this.unanswered(w, silence), limitMs);
        },
      };
      w.arm();
      this.waiters.push(w);
    });
  }

  private unanswered(w: Waiter, reason: string): void {
    const i = this.waiters.indexOf(w);
    if (i < 0) return;
    if (this.onUnresponsive) {
      this.onUnresponsive(reason); // loses the worker: every waiter rejects with the reason
      if (!this.waiters.includes(w)) return;
    }
    this.waiters.splice(this.waiters.indexOf(w), 1);
    w.reject(new WorkerLostError(this, reason));
  }

  private take(i: number): Waiter {
    const w = this.waiters.splice(i, 1)[0];
    clearTimeout(w.timer);
    return w;
  }

  /** Routes a message from the worker; returns a failure text if the worker reported one. */
  receive(m: WorkerMessage): string | null {
    const now = Date.now();
    // A silence the coordinator asked for (a timed pass) says nothing about the device's lateness.
    if (!this.measuring) this.recentGapMs = Math.max(now - this.lastSeenMs, this.recentGapMs * GAP_DECAY);
    this.lastSeenMs = now;
    switch (m.msg) {
      case "progress":
        for (const w of this.waiters) {
          if (w.kind !== "ready") continue;
          w.arm();
          w.onProgress?.(m.progress.fraction, printable(m.progress.stage));
        }
        return null;
      case "ready": {
        // The answer to the assignment it names (a worker of an older version names none: the oldest).
        const i = this.waiters.findIndex((w) => w.kind === "ready" && (!m.ready.ringId || w.ringId === m.ready.ringId));
        if (i >= 0) this.take(i).resolve(m.ready as never);
        return null;
      }
      case "status": {
        // Placement plans with the memory a status reports: a device that claims more than it has is let go.
        const bad = statusProblem(m.status);
        if (bad) {
          this.onUnresponsive?.(`its status is not plausible: ${bad}`);
          return null;
        }
        this.settle("status", m.status);
        return null;
      }
      case "failure": {
        // A failure while the coordinator waits for an assignment is its answer; a status request is
        // answered by a status, or by a failure that says it is that answer. A neighbour's broken link,
        // reported while the coordinator asks who still answers, must not leave this device out too.
        const message = printable(m.failure.message, MAX_REPORT_CHARS);
        this.lastFailure = message;
        const err = new Error(`device ${this.label}: ${message}`);
        const answered = m.failure.answersStatus ? this.waiters.filter((w) => w.kind === "status").slice(0, 1) : this.waiters.filter((w) => w.kind === "ready");
        for (const w of answered) this.take(this.waiters.indexOf(w)).reject(err);
        return message;
      }
      default:
        return null;
    }
  }

  private settle(kind: "ready" | "status", value: Ready | Status): void {
    const i = this.waiters.findIndex((w) => w.kind === kind);
    if (i >= 0) this.take(i).resolve(value as never);
  }

  markLost(reason: string): void {
    if (this.lost) return;
    this.lost = reason;
    const err = new WorkerLostError(this, reason);
    while (this.waiters.length) this.take(0).reject(err);
    try {
      this.stream.end();
    } catch {
      // the stream may already be gone
    }
  }
}

/** What no real device's Status says (null: plausible). */
export function statusProblem(st: Status): string | null {
  const nums: [string, number][] = [
    ["memTotalBytes", Number(st.memTotalBytes)], ["memAvailableBytes", Number(st.memAvailableBytes)], ["anonRssBytes", Number(st.anonRssBytes)],
    ["layerRoomBytes", Number(st.layerRoomBytes ?? 0)], ["readBytes", Number(st.readBytes ?? 0)],
    ["waitMs", st.waitMs], ["sendMs", st.sendMs], ["descheduledMs", st.descheduledMs ?? 0], ["memPressure", st.memPressure],
  ];
  for (const [k, v] of nums) if (!Number.isFinite(v) || v < 0) return `${k} = ${v}`;
  if (Number(st.memTotalBytes) > PLAUSIBLE.ramBytes) return `memTotalBytes = ${st.memTotalBytes} is more than any device has`;
  if (Number(st.memAvailableBytes) > Number(st.memTotalBytes)) return `memAvailableBytes (${st.memAvailableBytes}) is more than memTotalBytes (${st.memTotalBytes})`;
  if (Number(st.layerRoomBytes ?? 0) > Number(st.memTotalBytes)) return `layerRoomBytes (${st.layerRoomBytes}) is more than memTotalBytes (${st.memTotalBytes})`;
  return null;
}

export function seconds(ms: number): string {
  return `${+(ms / 1000).toFixed(1)} s`;
}

/** The address as the coordinator compares it (an IPv4-mapped IPv6 address is the IPv4 one). */
export function normalHost(host: string): string {
  const h = host.replace(/^\[(.*)\]$/, "$1").toLowerCase();
  return h.startsWith("::ffff:") && isIP(h.slice(7)) === 4 ? h.slice(7) : h;
}
