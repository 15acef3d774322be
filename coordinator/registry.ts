// The coordinator's side of the control plane: a gRPC server that workers dial, one session per
// worker, heartbeats both ways, and a clear "lost" event naming the device when a session dies.
import * as grpc from "@grpc/grpc-js";
import { EventEmitter } from "node:events";
import {
  PROTOCOL_VERSION, coordinatorService, type Assignment, type CoordinatorMessage, type Join, type KvCommand,
  type Ready, type SessionStream, type Status, type WorkerMessage,
} from "../control/index.js";

export const HEARTBEAT_INTERVAL_MS = 300;
/** A worker silent this long is lost; with the check interval, detection stays under 2 s. */
export const HEARTBEAT_TIMEOUT_MS = 1500;

export class WorkerLostError extends Error {
  override name = "WorkerLostError";
  constructor(readonly worker: WorkerHandle, readonly reason: string) {
    super(`device ${worker.label} failed: ${reason}`);
  }
}

/** One joined worker, as the coordinator sees it. */
export class WorkerHandle {
  lastSeenMs = Date.now();
  lost: string | null = null;
  private waiters: { kind: "ready" | "status"; resolve: (v: never) => void; reject: (e: Error) => void; onProgress?: (f: number, stage: string) => void }[] = [];

  constructor(readonly id: string, readonly join: Join, readonly peerHost: string, private readonly stream: SessionStream) {}

  /** "name (host)" for messages. */
  get label(): string {
    return `${this.id} "${this.join.deviceName}" (${this.dataHost})`;
  }

  get dataHost(): string {
    return this.join.dataHost || this.peerHost;
  }

  get dataUrl(): string {
    const h = this.dataHost.includes(":") ? `[${this.dataHost}]` : this.dataHost;
    return `ws://${h}:${this.join.dataPort}`;
  }

  send(m: CoordinatorMessage): void {
    if (!this.lost) this.stream.write(m);
  }

  /** Sends the assignment; resolves when the worker reports Ready. */
  assign(a: Assignment, onProgress?: (fraction: number, stage: string) => void): Promise<Ready> {
    const p = this.wait<Ready>("ready", onProgress);
    this.send({ assignment: a });
    return p;
  }

  status(): Promise<Status> {
    const p = this.wait<Status>("status");
    this.send({ statusRequest: {} });
    return p;
  }

  kv(cmd: KvCommand): void {
    this.send({ kv: cmd });
  }

  shutdown(reason: string): void {
    this.send({ shutdown: { reason } });
    if (!this.lost) this.stream.end();
  }

  private wait<T>(kind: "ready" | "status", onProgress?: (f: number, stage: string) => void): Promise<T> {
    if (this.lost) return Promise.reject(new WorkerLostError(this, this.lost));
    return new Promise<T>((resolve, reject) => this.waiters.push({ kind, resolve: resolve as (v: never) => void, reject, onProgress }));
  }

  /** Routes a message from the worker; returns a failure text if the worker reported one. */
  receive(m: WorkerMessage): string | null {
    this.lastSeenMs = Date.now();
    switch (m.msg) {
      case "progress":
        for (const w of this.waiters) if (w.kind === "ready") w.onProgress?.(m.progress.fraction, m.progress.stage);
        return null;
      case "ready":
        this.settle("ready", m.ready);
        return null;
      case "status":
        this.settle("status", m.status);
        return null;
      case "failure": {
        // A failure while the coordinator waits for an answer is that answer.
        const err = new Error(`device ${this.label}: ${m.failure.message}`);
        for (const w of this.waiters.splice(0)) w.reject(err);
        return m.failure.message;
      }
      default:
        return null;
    }
  }

  private settle(kind: "ready" | "status", value: Ready | Status): void {
    const i = this.waiters.findIndex((w) => w.kind === kind);
    if (i >= 0) this.waiters.splice(i, 1)[0].resolve(value as never);
  }

  markLost(reason: string): void {
    if (this.lost) return;
    this.lost = reason;
    const err = new WorkerLostError(this, reason);
    for (const w of this.waiters.splice(0)) w.reject(err);
    try {
      this.stream.end();
    } catch {
      // the stream may already be gone
    }
  }
}

export interface RegistryOptions {
  /** The fingerprint of the coordinator's model: workers with another model are turned away. */
  readonly modelFingerprint: string;
  readonly log?: (line: string) => void;
}

/**
 * Events: "joined" (WorkerHandle), "lost" (WorkerHandle, reason), "failure" (WorkerHandle, message).
 */
export class WorkerRegistry extends EventEmitter {
  readonly workers: WorkerHandle[] = [];
  private server = new grpc.Server({ "grpc.max_receive_message_length": 64 << 20 });
  private nextId = 1;
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly o: RegistryOptions) {
    super();
    this.server.addService(coordinatorService(), { session: (call: SessionStream) => this.session(call) });
  }

  /** Listens on host:port (port 0 = any free port); resolves with the port. */
  listen(port: number, host = "0.0.0.0"): Promise<number> {
    return new Promise((resolve, reject) => {
      this.server.bindAsync(`${host}:${port}`, grpc.ServerCredentials.createInsecure(), (err, bound) => {
        if (err) {
          reject(new Error(`cannot listen on ${host}:${port}: ${err.message}`));
          return;
        }
        this.timer = setInterval(() => this.tick(), 250);
        this.timer.unref();
        resolve(bound);
      });
    });
  }

  /** Live workers in join order. */
  live(): WorkerHandle[] {
    return this.workers.filter((w) => !w.lost);
  }

  /** Resolves once n workers are live; rejects with a clear message after timeoutMs. */
  waitFor(n: number, timeoutMs: number): Promise<WorkerHandle[]> {
    if (this.live().length >= n) return Promise.resolve(this.live().slice(0, n));
    return new Promise((resolve, reject) => {
      const onJoin = () => {
        if (this.live().length >= n) {
          cleanup();
          resolve(this.live().slice(0, n));
        }
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(new Error(`only ${this.live().length} of ${n} workers joined within ${Math.round(timeoutMs / 1000)} s; start more with \`prima-worker --join <this host>:<port>\` or lower --min-workers`));
      }, timeoutMs);
      const cleanup = () => {
        clearTimeout(timer);
        this.off("joined", onJoin);
      };
      this.on("joined", onJoin);
    });
  }

  async close(): Promise<void> {
    clearInterval(this.timer);
    for (const w of this.workers) w.markLost("coordinator stopped");
    await new Promise<void>((resolve) => this.server.tryShutdown(() => resolve()));
    this.server.forceShutdown();
  }

  private log(line: string): void {
    this.o.log?.(line);
  }

  private tick(): void {
    const now = Date.now();
    for (const w of this.live()) {
      if (now - w.lastSeenMs > HEARTBEAT_TIMEOUT_MS) this.lose(w, `no heartbeat for ${((now - w.lastSeenMs) / 1000).toFixed(1)} s`);
      else w.send({ heartbeat: { sentUnixMs: now } });
    }
  }

  private lose(w: WorkerHandle, reason: string): void {
    if (w.lost) return;
    w.markLost(reason);
    this.log(`device ${w.label} lost: ${reason}`);
    this.emit("lost", w, reason);
  }

  private session(call: SessionStream): void {
    let worker: WorkerHandle | undefined;
    const refuse = (reason: string) => {
      this.log(`refused a worker from ${call.getPeer()}: ${reason}`);
      call.write({ shutdown: { reason } });
      call.end();
    };
    call.on("data", (m: WorkerMessage) => {
      if (!worker) {
        if (m.msg !== "join") return refuse("the first message must be a join");
        const j = m.join;
        if (j.protocolVersion !== PROTOCOL_VERSION) return refuse(`protocol version ${j.protocolVersion}, coordinator speaks ${PROTOCOL_VERSION}`);
        if (j.modelFingerprint !== this.o.modelFingerprint) {
          return refuse(`model mismatch: the worker's ${j.modelPath || "model"} (${j.modelFingerprint.slice(0, 12)}) is not the coordinator's (${this.o.modelFingerprint.slice(0, 12)})`);
        }
        if (!Number.isInteger(j.dataPort) || j.dataPort < 1 || j.dataPort > 65535) return refuse(`data port ${j.dataPort} is invalid`);
        worker = new WorkerHandle(`w${this.nextId++}`, j, peerHost(call.getPeer()), call);
        this.workers.push(worker);
        call.write({ welcome: { deviceId: worker.id } });
        this.log(`device ${worker.label} joined (data plane ${worker.dataUrl})`);
        this.emit("joined", worker);
        return;
      }
      const failure = worker.receive(m);
      if (failure !== null) {
        this.log(`device ${worker.label} reports: ${failure}`);
        this.emit("failure", worker, failure);
      }
    });
    call.on("error", (e: Error) => {
      if (worker) this.lose(worker, `connection error: ${e.message}`);
    });
    call.on("end", () => {
      if (worker) this.lose(worker, "disconnected");
      call.end();
    });
  }
}

/** "ipv4:1.2.3.4:5678", "[::1]:5678", "ipv6:[::1]:5678" -> host. */
export function peerHost(peer: string): string {
  const p = peer.replace(/^ipv[46]:/, "");
  const v6 = p.match(/^\[([^\]]+)\]:\d+$/);
  if (v6) return v6[1];
  const i = p.lastIndexOf(":");
  return i > 0 ? p.slice(0, i) : p;
}
