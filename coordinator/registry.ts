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
import { createServer, type AddressInfo, type Server as NetServer, type Socket } from "node:net";
import type { TLSSocket } from "node:tls";
import {
  HEARTBEAT_INTERVAL_MS, HEARTBEAT_TIMEOUT_MS, JOINS_PER_S, heartbeatLimit, checkAfterStall, stallNote, JOIN_BURST, JOIN_TIMEOUT_MS, MAX_MESSAGE_BYTES, MAX_PENDING_SESSIONS, MAX_PROFILE_BYTES, MAX_STREAMS_PER_CONNECTION, MAX_WORKERS,
  PROTOCOL_VERSION, SHUTDOWN_GRACE_MS, coordinatorService, type Join,
  type SessionStream, type WorkerMessage,
} from "../control/index.js";
import { printable } from "../discovery/index.js";
import { parseDeviceReport, type DeviceReport } from "../profiler/index.js";
import { STREAM_MAGIC, TICKET_BYTES } from "../transfer/index.js";
import { ALPN_CHUNKS, ALPN_GRPC, TlsGate, joinProof, proofMatches, type ClusterKeys, type JoinToken } from "../trust/index.js";
import { ConnectionSlots, peerOf, type SlotLimits } from "./slots.js";
import { WorkerHandle, normalHost, seconds } from "./worker-handle.js";

export { WorkerLostError, WorkerHandle, normalHost } from "./worker-handle.js";

export { HEARTBEAT_INTERVAL_MS, HEARTBEAT_TIMEOUT_MS };

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
  /** When the last tick ran; set as the ticks start (listen), so the time before is no stall. */
  private lastTickMs = 0;
  private trustGeneration = 0;

  constructor(private readonly o: RegistryOptions) {
    super();
    this.slots = new ConnectionSlots((host, reason) => this.refusedOnce(host, reason, `closed a connection from ${printable(host, 64)}: ${reason} (said once)`), o.slotLimits);
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
        this.refusedOnce(from, full, `refused a connection from ${printable(from, 64)}: ${full} (said once)`);
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
        this.lastTickMs = Date.now(); // the head's first profile, awaited before listen, is no stall
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
      this.refusedOnce(peerHost(peer), reason, `refused a worker from ${peer}: ${reason} (said once: it may keep trying)`);
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

  /** Logs a refusal (`line`) once per address and reason: a refused peer may keep trying. */
  private refusedOnce(host: string, reason: string, line: string): void {
    const key = `${host}\n${reason}`;
    if (this.refusalsLogged.has(key)) return;
    if (this.refusalsLogged.size >= 1000) this.refusalsLogged.clear();
    this.refusalsLogged.add(key);
    this.log(line);
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
