// The coordinator's side of the control plane: a gRPC server that workers dial, one session per
// worker, heartbeats both ways, and a clear "lost" event naming the device when a session dies.
// Every wait has a limit (control/limits.ts): a stream that never joins is dropped, a status request
// or an assignment left unanswered loses the worker, and close() cuts calls that do not end.
// Who may join (issue #18): the cluster port speaks only TLS with the cluster's certificate (trust/);
// every session opens with a Challenge, and a Join without the token's proof over it is refused with
// words that say nothing about the cluster. Everything a peer can make the coordinator hold is bounded:
// connections (in all, per address, and those that have not proven the token, which are closed after
// a few seconds: slots.ts), streams per connection, message and profile sizes, sessions waiting for a
// Join, joins per second per address, joined workers; lost workers are forgotten.
import * as grpc from "@grpc/grpc-js";
import { randomBytes } from "node:crypto";
import { EventEmitter } from "node:events";
import { createServer, isIP, type AddressInfo, type Server as NetServer, type Socket } from "node:net";
import type { TLSSocket } from "node:tls";
import {
  ASSIGN_SILENCE_MS, HEARTBEAT_INTERVAL_MS, HEARTBEAT_TIMEOUT_MS, JOINS_PER_S, heartbeatLimit, checkAfterStall, stallNote, JOIN_BURST, JOIN_TIMEOUT_MS, MAX_MESSAGE_BYTES, MAX_PENDING_SESSIONS, MAX_PROFILE_BYTES, MAX_STREAMS_PER_CONNECTION, MAX_WORKERS,
  PROTOCOL_VERSION, SHUTDOWN_GRACE_MS, STATUS_TIMEOUT_MS, coordinatorService, type Assignment, type CoordinatorMessage, type Join,
  type KvCommand, type Ready, type SessionStream, type Status, type WorkerMessage,
} from "../control/index.js";
import { printable } from "../discovery/index.js";
import { PLAUSIBLE, parseDeviceReport, type DeviceReport } from "../profiler/index.js";
import { STREAM_MAGIC, TICKET_BYTES } from "../transfer/index.js";
import { ALPN_CHUNKS, ALPN_GRPC, TlsGate, joinProof, proofMatches, type ClusterKeys, type JoinToken } from "../trust/index.js";
import { ConnectionSlots, peerOf, type SlotLimits } from "./slots.js";

export { HEARTBEAT_INTERVAL_MS, HEARTBEAT_TIMEOUT_MS };

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
    const p = this.wait<Ready>("ready", silenceMs, `sent no progress on its assignment for ${seconds(silenceMs)}`, onProgress);
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

  private wait<T>(kind: "ready" | "status", limitMs: number, silence: string, onProgress?: (f: number, stage: string) => void): Promise<T> {
    if (this.lost) return Promise.reject(new WorkerLostError(this, this.lost));
    return new Promise<T>((resolve, reject) => {
      const w: Waiter = {
        kind, resolve: resolve as (v: never) => void, reject, onProgress,
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
      case "ready":
        this.settle("ready", m.ready);
        return null;
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

/** The cluster's key, certificate and token (trust/'s TrustStore, or a fixed identity in tests). */
export interface RegistryTrust {
  readonly identity: ClusterKeys & { readonly token: JoinToken };
  /** Counts rotations; a change of identity (refresh() true) ends the sessions of older ones. */
  readonly generation?: number;
  refresh?(): boolean;
}

/** The model store on the cluster port (coordinator/model-store.ts). */
export interface ChunkService {
  /** A chunk request: a TLS connection that chose ALPN_CHUNKS; `proven` once it proved the token. */
  request(socket: TLSSocket, token: JoinToken, proven: () => void): void;
  /** A keyed stream that a request opened, named by its ticket; `proven` once the ticket is known. */
  stream(socket: Socket, ticket: Buffer, proven: () => void): void;
}

export interface RegistryOptions {
  /** The fingerprint of the coordinator's model: workers with another model are turned away. */
  readonly modelFingerprint: string;
  readonly trust: RegistryTrust;
  readonly log?: (line: string) => void;
  /** Serves chunk requests (a TLS connection that chose ALPN_CHUNKS) and the keyed streams they open
   * (transfer/wire.ts); both closed at once without. */
  readonly chunks?: ChunkService;
  /** Accept a worker's data host (--advertise) other than the address it connects from. Off: the
   * coordinator never dials an address a joiner merely names. */
  readonly allowAdvertise?: boolean;
  /** The cluster port's connection limits (slots.ts's SLOT_LIMITS unless a test sets others). */
  readonly slotLimits?: SlotLimits;
}

/** What a joiner without the token hears: nothing about the cluster, its model or its ring. */
export const TOKEN_REFUSAL = "the join token is not this cluster's (on the coordinator, `prima-coord token` prints the right one)";

/** The address as the coordinator compares it (an IPv4-mapped IPv6 address is the IPv4 one). */
export function normalHost(host: string): string {
  const h = host.replace(/^\[(.*)\]$/, "$1").toLowerCase();
  return h.startsWith("::ffff:") && isIP(h.slice(7)) === 4 ? h.slice(7) : h;
}

/**
 * Events: "joined" (WorkerHandle), "lost" (WorkerHandle, reason), "failure" (WorkerHandle, message).
 */
export class WorkerRegistry extends EventEmitter {
  readonly workers: WorkerHandle[] = [];
  private server = new grpc.Server({
    "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
    "grpc.max_concurrent_streams": MAX_STREAMS_PER_CONNECTION,
    // Connections whose peer vanished without a word (a frozen or unplugged device) are closed.
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
  });
  private nextId = 1;
  private timer: NodeJS.Timeout | undefined;
  /** Every open session stream, joined or not: close() ends them. */
  private readonly calls = new Set<SessionStream>();
  /** Refusals already logged (host and reason): a refused worker retries, the log says it once. */
  private readonly refusalsLogged = new Set<string>();
  private closed = false;
  private tcp: NetServer | undefined;
  /** Every accepted connection, cut by close(). */
  private readonly slots: ConnectionSlots;
  /** While close() waits: called when the last open call has ended. */
  private drained: (() => void) | undefined;
  private gate: TlsGate | undefined;
  /** Sessions open without a Join yet. */
  private pending = 0;
  /** Per address: join allowance left (a token bucket) and when it was last topped up. */
  private readonly joinBudget = new Map<string, { left: number; atMs: number }>();
  private lastTrustCheckMs = 0;
  private lastTickMs = Date.now();
  private trustGeneration = 0;

  constructor(private readonly o: RegistryOptions) {
    super();
    this.slots = new ConnectionSlots((host, reason) => this.refusedOnce(host, reason, "closed a connection from"), o.slotLimits);
    this.server.addService(coordinatorService(), { session: (call: SessionStream) => this.session(call) });
  }

  /** Listens on host:port (port 0 = any free port); resolves with the port. The registry accepts the
   * TCP connections itself and hands them to gRPC, so that close() can cut every one of them: gRPC's
   * own shutdown leaves the connection of a frozen peer open, and with it the process. */
  listen(port: number, host = "0.0.0.0"): Promise<number> {
    // TLS ends here, on each accepted socket; gRPC gets the decrypted connection (hence its insecure
    // credentials), and ALPN tells gRPC from a chunk stream, so both share the one port.
    const injector = this.server.createConnectionInjector(grpc.ServerCredentials.createInsecure());
    const chunks = this.o.chunks;
    this.gate = new TlsGate(this.o.trust.identity, JOIN_TIMEOUT_MS, (tls, alpn) => {
      if (this.closed) tls.destroy();
      else if (alpn === ALPN_GRPC) injector.injectConnection(tls);
      else if (alpn === ALPN_CHUNKS && chunks) chunks.request(tls, this.o.trust.identity.token, () => this.slots.proven(peerOf(tls)));
      else tls.destroy();
    }, chunks && {
      magic: STREAM_MAGIC, headBytes: STREAM_MAGIC.length + TICKET_BYTES,
      onStream: (socket, head) => (this.closed ? socket.destroy() : chunks.stream(socket, head.subarray(STREAM_MAGIC.length), () => this.slots.proven(peerOf(socket)))),
    });
    const tcp = createServer((socket) => {
      socket.on("error", () => socket.destroy());
      if (this.closed) return void socket.destroy();
      const from = normalHost(socket.remoteAddress ?? "");
      const full = this.slots.admit(socket, from);
      if (full) {
        this.refusedOnce(from, full);
        socket.destroy();
        return;
      }
      this.gate!.accept(socket);
    });
    return new Promise((resolve, reject) => {
      tcp.once("error", (err) => reject(new Error(`cannot listen on ${host}:${port}: ${err.message}`)));
      tcp.listen(port, host.replace(/^\[(.*)\]$/, "$1"), () => {
        tcp.on("error", (err) => this.log(`control plane: ${err.message}`));
        this.tcp = tcp;
        this.timer = setInterval(() => this.tick(), 250);
        this.timer.unref();
        resolve((tcp.address() as AddressInfo).port);
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

  /** Ends every session and stops the server: calls that have not ended after SHUTDOWN_GRACE_MS (a
   * frozen worker never answers the end of its stream) are cut. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.timer);
    for (const w of this.workers) w.markLost("coordinator stopped");
    for (const call of this.calls) endQuietly(call);
    // Peers that answer end their calls at once; a frozen one never does. Not tryShutdown: its graceful
    // close of a frozen peer's connection keeps the socket (and so the process) alive for good, even
    // after forceShutdown, which cuts a connection only if it was not closed gracefully first.
    if (this.calls.size > 0) {
      await new Promise<void>((resolve) => {
        const grace = setTimeout(resolve, SHUTDOWN_GRACE_MS);
        this.drained = () => {
          clearTimeout(grace);
          resolve();
        };
      });
    }
    this.drained = undefined;
    this.server.forceShutdown();
    this.slots.destroyAll();
    this.calls.clear();
    await new Promise<void>((resolve) => (this.tcp ? this.tcp.close(() => resolve()) : resolve()));
  }

  private log(line: string): void {
    this.o.log?.(line);
  }

  private tick(): void {
    const now = Date.now();
    // A rotated token (prima-coord token --rotate): new handshakes use the new certificate, and every
    // session that proved the old token ends (those workers need the new one).
    if (this.o.trust.refresh && now - this.lastTrustCheckMs > 2000) {
      this.lastTrustCheckMs = now;
      if (this.o.trust.refresh()) {
        this.trustGeneration++;
        this.gate?.setKeys(this.o.trust.identity);
        this.log("the cluster's join token was rotated: workers that joined with the old one are let go");
        for (const w of this.live()) if (w.trustGeneration < this.trustGeneration) this.lose(w, "the cluster's join token was rotated");
      }
    }
    const stalled = checkAfterStall(this.lastTickMs, now);
    if (stalled) this.log(stallNote(this.lastTickMs, now));
    this.lastTickMs = now;
    for (const w of this.live()) {
      if (!stalled && !w.measuring && now - w.lastSeenMs > heartbeatLimit(w.recentGapMs)) this.lose(w, `no heartbeat for ${((now - w.lastSeenMs) / 1000).toFixed(1)} s`);
      else w.send({ heartbeat: { sentUnixMs: now } });
    }
  }

  private lose(w: WorkerHandle, reason: string): void {
    if (w.lost) return;
    w.markLost(reason);
    // Forgotten here (its Join, profile included, goes with it); the cluster keeps what it shows.
    const i = this.workers.indexOf(w);
    if (i >= 0) this.workers.splice(i, 1);
    this.log(`device ${w.label} lost: ${reason}`);
    this.emit("lost", w, reason);
  }

  private session(call: SessionStream): void {
    if (this.closed) {
      endQuietly(call);
      return;
    }
    this.calls.add(call);
    let worker: WorkerHandle | undefined;
    let refused = false;
    let waiting = true; // counted in this.pending until it joins or ends
    const settle = () => {
      if (waiting) this.pending--;
      waiting = false;
    };
    this.pending++;
    const peer = call.getPeer();
    const from = normalHost(peerHost(peer));
    const refuse = (reason: string) => {
      if (refused) return;
      refused = true;
      settle();
      clearTimeout(joinTimer);
      const key = `${peerHost(peer)}\n${reason}`;
      if (!this.refusalsLogged.has(key)) {
        if (this.refusalsLogged.size >= 1000) this.refusalsLogged.clear();
        this.refusalsLogged.add(key);
        this.log(`refused a worker from ${peer}: ${reason} (said once: it may keep trying)`);
      }
      try {
        call.write({ shutdown: { reason } });
      } catch {
        // the stream is already gone
      }
      endQuietly(call);
    };
    // A stream that never says who it is would hold the server open forever.
    const joinTimer = setTimeout(() => refuse(`no join within ${seconds(JOIN_TIMEOUT_MS)}`), JOIN_TIMEOUT_MS);
    const gone = (reason: string) => {
      settle();
      clearTimeout(joinTimer);
      this.calls.delete(call);
      if (this.calls.size === 0) this.drained?.();
      if (worker) this.lose(worker, worker.lastFailure ? `${reason} after reporting: ${worker.lastFailure}` : reason);
    };
    const nonce = randomBytes(32);
    const generation = this.trustGeneration;
    const token = this.o.trust.identity.token;
    call.on("data", (m: WorkerMessage) => {
      if (refused) return;
      if (!worker) {
        if (m.msg !== "join") return refuse("the first message must be a join");
        const j = m.join;
        // The proof first: whoever lacks the token learns nothing else (no version, model or ring).
        if (!proofMatches(j.proof, joinProof(token, nonce))) return refuse(TOKEN_REFUSAL);
        const why = this.joinProblem(j, from);
        if (why) return refuse(why);
        clearTimeout(joinTimer);
        settle();
        this.slots.proven(peer);
        const w = new WorkerHandle(`w${this.nextId++}`, { ...j, proof: undefined }, from, call, generation);
        w.onUnresponsive = (reason) => this.lose(w, reason);
        worker = w;
        this.workers.push(w);
        call.write({ welcome: { deviceId: w.id } });
        this.log(`device ${w.label} joined (data plane ${printable(w.dataUrl)})`);
        this.emit("joined", w);
        return;
      }
      const failure = worker.receive(m);
      if (failure !== null) {
        this.log(`device ${worker.label} reports: ${failure}`);
        this.emit("failure", worker, failure);
      }
    });
    call.on("error", (e: Error) => gone(`connection error: ${printable(e.message)}`));
    call.on("cancelled", () => gone("its session was cancelled"));
    call.on("end", () => {
      gone("it ended its session");
      endQuietly(call);
    });
    // Before anything else: how many sessions may wait, and how often one address may try.
    if (this.pending > MAX_PENDING_SESSIONS) return refuse("the coordinator has too many joins under way: try again in a few seconds");
    if (!this.takeJoinBudget(from)) return refuse("too many joins from this address: try again in a few seconds");
    call.write({ challenge: { nonce } });
  }

  /** Why a Join that proved the token is still refused (null: accepted). Named, since the worker
   * holds the token: version, model, data address, profile size and plausibility, room. */
  private joinProblem(j: Join, from: string): string | null {
    if (j.protocolVersion !== PROTOCOL_VERSION) return `protocol version ${j.protocolVersion}, coordinator speaks ${PROTOCOL_VERSION}`;
    if (j.modelFingerprint !== this.o.modelFingerprint) {
      return `model mismatch: the worker's ${printable(j.modelPath || "model")} (${printable(j.modelFingerprint.slice(0, 12))}) is not the coordinator's (${this.o.modelFingerprint.slice(0, 12)})`;
    }
    if (!Number.isInteger(j.dataPort) || j.dataPort < 1 || j.dataPort > 65535) return `data port ${j.dataPort} is invalid`;
    // The coordinator (and the ring) dial only the address the worker connects from, unless the
    // operator allows otherwise: a joiner must not make it dial a third party.
    if (j.dataHost && normalHost(j.dataHost) !== from && !this.o.allowAdvertise) {
      return `its data host ${printable(j.dataHost, 64)} is not the address it connects from (${from}); leave out --advertise, or start the coordinator with --allow-advertise`;
    }
    if (j.profileJson) {
      try {
        checkedProfile(j.profileJson);
      } catch (e) {
        return `device "${printable(j.deviceName, 64)}": ${(e as Error).message}`;
      }
    }
    if (this.live().length >= MAX_WORKERS) return `the cluster already has ${MAX_WORKERS} devices`;
    return null;
  }

  /** Takes one join from the address's allowance: JOIN_BURST at once, JOINS_PER_S after that. */
  private takeJoinBudget(from: string): boolean {
    const now = Date.now();
    const b = this.joinBudget.get(from) ?? { left: JOIN_BURST, atMs: now };
    b.left = Math.min(JOIN_BURST, b.left + ((now - b.atMs) / 1000) * JOINS_PER_S);
    b.atMs = now;
    if (this.joinBudget.size > 4096) this.joinBudget.clear(); // many addresses: forget the old ones
    this.joinBudget.set(from, b);
    if (b.left < 1) return false;
    b.left--;
    return true;
  }

  /** Logs a refusal before any session (connection limits) once per address and reason. */
  private refusedOnce(from: string, reason: string, what = "refused a connection from"): void {
    const key = `${from}\n${reason}`;
    if (this.refusalsLogged.has(key)) return;
    if (this.refusalsLogged.size >= 1000) this.refusalsLogged.clear();
    this.refusalsLogged.add(key);
    this.log(`${what} ${printable(from, 64)}: ${reason} (said once)`);
  }
}

/** A device's profile as it sent it (in its Join, or in a Status that timed its pass): at most
 * MAX_PROFILE_BYTES and plausible, or an Error saying what is wrong with it. */
export function checkedProfile(json: string): DeviceReport {
  if (json.length > MAX_PROFILE_BYTES) throw new Error(`its profile is ${json.length} bytes, over the limit of ${MAX_PROFILE_BYTES}`);
  try {
    return parseDeviceReport(json);
  } catch (e) {
    throw new Error(`its profile is refused: ${printable((e as Error).message, 300)}`);
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

function seconds(ms: number): string {
  return `${+(ms / 1000).toFixed(1)} s`;
}

/** Ends a server stream that may already be closed or broken. */
function endQuietly(call: SessionStream): void {
  try {
    call.end();
  } catch {
    // already ended
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
