// The worker's side of the control plane: dial the coordinator, join, keep heartbeats going, obey
// assignments and commands. A daemon: when the coordinator goes away (or ends its run) the worker
// drops its windows and dials again until it is stopped. The address is fixed (--join host:port) or
// looked up again before every attempt (mDNS discovery: the coordinator may come back elsewhere).
// Every wait has a limit: the answer to a join, the coordinator's heartbeats, and the end of a session
// the worker leaves. Being refused (another model, another protocol) is not the end either: the
// coordinator may be restarted with this worker's model, so the worker says so once and asks again.
// The connection is TLS pinned to the certificate the join token names (an impostor is refused before
// a byte is sent), and the Join proves the token over the coordinator's Challenge (trust/).
import {
  ASSIGN_PROGRESS_INTERVAL_MS, COORDINATOR_SILENCE_MS, HEARTBEAT_INTERVAL_MS, HEARTBEAT_TIMEOUT_MS, JOIN_REPLY_TIMEOUT_MS, PROTOCOL_VERSION, checkAfterStall, stallNote,
  coordinatorClient, type Assignment, type ClientSessionStream, type CoordinatorMessage, type Join, type KvCommand, type Status,
  type StatusRequest, type WorkerMessage,
} from "../control/index.js";
import { printable } from "../discovery/index.js";
import { settleMemory } from "../profiler/index.js";
import { PinMismatchError, clusterCredentials, joinProof, type JoinToken } from "../trust/index.js";
import type { WorkerExit } from "./exit.js";

export { HEARTBEAT_INTERVAL_MS, HEARTBEAT_TIMEOUT_MS };

/** A refused worker asks again this often. */
export const REFUSED_RETRY_MS = 2000;
/** A session this worker ends (stop, leave) is cut if the coordinator has not closed it by then. */
const LEAVE_GRACE_MS = 500;
/** Dropping windows and links after a session (closing handshakes with neighbours that may be gone)
 * gets this long; the worker goes on (or ends) after it either way. */
const RESET_LIMIT_MS = 2000;

/** What the session asks of the device while it is joined. */
export interface SessionHandler {
  /** Sets up the assigned windows and links; reports load progress; resolves with anonymous bytes.
   * `dropped` aborts when a newer assignment arrives: this one then stops at its next step (and
   * leaves the device to the newer one); what it resolves or rejects with is not reported. */
  assign(a: Assignment, progress: (fraction: number, stage: string) => void, deviceId: string, dropped: AbortSignal): Promise<number>;
  kv(cmd: KvCommand): void;
  /** With request.timePass: times the one-token pass first, where the device holds no windows. */
  status(request?: StatusRequest): Status | Promise<Status>;
  /** Drops windows and links (the run ended or the coordinator is gone). */
  reset(reason: string): Promise<void>;
}

/** Finds the coordinator's host:port for one attempt (may wait); rejects to end run(). */
export type CoordinatorLookup = (signal: AbortSignal) => Promise<string>;

export interface SessionOptions {
  /** host:port, or a lookup called before every attempt. */
  readonly coordinator: string | CoordinatorLookup;
  readonly join: Omit<Join, "protocolVersion" | "proof">;
  /** The cluster's join token (trust/): pins the coordinator's certificate, proves this worker. */
  readonly token: JoinToken;
  readonly log: (line: string) => void;
  /** Stop after the first session instead of dialling again (tests, one-shot runs). */
  readonly once?: boolean;
  /** Between attempts while the coordinator is away (default 1 s). */
  readonly retryMs?: number;
  /** Asked before every join and after every failure: a reason this worker must end (its model file
   * changed), or null. The worker then leaves its session and run() rejects with it. */
  readonly check?: () => WorkerExit | null;
  /** Awaited before every attempt (after `check`): what the join says brought up to date. */
  readonly beforeJoin?: () => Promise<void>;
}

interface Outcome {
  joined: boolean;
  reason: string;
  /** The coordinator turned the join away (the reason says why). */
  refused?: boolean;
}

export class WorkerSession {
  private stopped = false;
  private stream: ClientSessionStream | undefined;
  private deviceId = "";
  /** The last status answer on its way (see handle's statusRequest). */
  private statusAnswers: Promise<unknown> = Promise.resolve();
  /** The address of the current attempt. */
  private address = "";
  private readonly stopping = new AbortController();
  /** Set by leave(): run() rejects with it. */
  private exit: WorkerExit | null = null;
  /** Aborted when a newer assignment arrives (or the session ends): the one being set up is dropped. */
  private assignment: AbortController | undefined;

  constructor(private readonly o: SessionOptions, private readonly handler: SessionHandler) {}

  /** Runs sessions until stop(); resolves when stopped (or after one session with `once`); rejects
   * with the WorkerExit given to leave() or found by `check`. */
  async run(): Promise<void> {
    // What the log last said about not being joined: said once, again only when it changes.
    let notice = "";
    const lookup = this.o.coordinator;
    while (!this.stopped) {
      const exit = this.o.check?.();
      if (exit) throw exit;
      await this.o.beforeJoin?.();
      try {
        this.address = typeof lookup === "string" ? lookup : await lookup(this.stopping.signal);
      } catch (e) {
        if (this.stopped) break;
        throw e;
      }
      if (this.stopped) break;
      const outcome = await this.session();
      await this.reset(outcome.reason);
      if (this.exit) throw this.exit;
      if (this.stopped) break;
      if (this.o.once) {
        if (!outcome.joined) this.o.log(`could not join ${this.address}: ${outcome.reason}`);
        return;
      }
      const again = typeof lookup === "string" ? `dialling ${this.address} again` : "looking for the coordinator again";
      let delayMs = this.o.retryMs ?? 1000;
      if (outcome.joined) {
        this.o.log(`session ended: ${outcome.reason}; ${again}`);
        notice = "";
      } else if (outcome.refused) {
        delayMs = Math.max(delayMs, REFUSED_RETRY_MS);
        if (notice !== `refused ${outcome.reason}`) {
          this.o.log(`the coordinator at ${this.address} refused this worker: ${outcome.reason}; asking again every ${delayMs / 1000} s (it may be restarted with this worker's model), without repeating this`);
          notice = `refused ${outcome.reason}`;
        }
      } else if (notice !== "away") {
        this.o.log(`waiting for the coordinator at ${this.address} (${outcome.reason}); trying again every ${delayMs / 1000} s`);
        notice = "away";
      }
      await this.pause(delayMs);
    }
    if (this.exit) throw this.exit;
  }

  /** Ends the session (the coordinator hears it at once) and then run(). */
  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    this.stopping.abort();
    this.endStream();
  }

  /** This worker cannot go on (exit says why): ends its session after what it has reported, and run()
   * rejects with exit. */
  leave(exit: WorkerExit): void {
    if (this.exit) return;
    this.exit = exit;
    this.stop();
  }

  private endStream(): void {
    const stream = this.stream;
    if (!stream) return;
    this.stream = undefined; // nothing more is written to it
    try {
      stream.end(); // after the messages already written: a failure report arrives before the end
    } catch {
      // already closed
    }
    setTimeout(() => {
      try {
        stream.cancel();
      } catch {
        // already closed
      }
    }, LEAVE_GRACE_MS).unref();
  }

  private async reset(reason: string): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((r) => { timer = setTimeout(() => r("late"), RESET_LIMIT_MS); });
    const done = this.handler.reset(reason).then(() => "done" as const, (e: unknown) => {
      this.o.log(`dropping the session's windows and links failed: ${e instanceof Error ? e.message : String(e)}`);
      return "done" as const;
    });
    if ((await Promise.race([done, late])) === "late") this.o.log(`dropping the session's windows and links took over ${RESET_LIMIT_MS / 1000} s: going on without waiting`);
    clearTimeout(timer);
  }

  /** Waits ms, or less if stopped meanwhile. */
  private pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      if (this.stopping.signal.aborted) return resolve();
      const done = () => {
        clearTimeout(timer);
        this.stopping.signal.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.stopping.signal.addEventListener("abort", done);
    });
  }

  private send(m: WorkerMessage): void {
    this.stream?.write(m);
  }

  /** One session: resolves when it ends, with why. */
  private async session(): Promise<Outcome> {
    let secure: Awaited<ReturnType<typeof clusterCredentials>>;
    try {
      secure = await clusterCredentials(this.address, this.o.token, JOIN_REPLY_TIMEOUT_MS);
    } catch (e) {
      // Another certificate: an impostor, or a rotated token. Refused like a refusal: said once, asked again.
      if (e instanceof PinMismatchError) return { joined: false, reason: e.message, refused: true };
      const code = (e as NodeJS.ErrnoException).code;
      return { joined: false, reason: code === "ECONNREFUSED" || code === "EHOSTUNREACH" || code === "ENETUNREACH" ? "coordinator unreachable" : printable((e as Error).message) };
    }
    if (this.stopped) return { joined: false, reason: "stopped" };
    return this.sessionOn(secure);
  }

  private sessionOn(secure: Awaited<ReturnType<typeof clusterCredentials>>): Promise<Outcome> {
    return new Promise((resolve) => {
      const client = coordinatorClient(this.address, secure);
      const stream = client.session();
      this.stream = stream;
      let joined = false;
      let lastSeen = Date.now();
      let done = false;
      let keepAlive: NodeJS.Timeout | undefined;
      const finish = (reason: string, refused = false) => {
        if (done) return;
        done = true;
        clearInterval(beat);
        clearTimeout(joinTimer);
        clearInterval(keepAlive);
        if (this.stream === stream) this.stream = undefined;
        try {
          stream.cancel();
        } catch {
          // already closed
        }
        client.close();
        resolve({ joined, reason, refused });
      };
      // A coordinator that takes the connection but never answers (frozen) must not hold the worker.
      const joinTimer = setTimeout(() => finish(`no answer to the join within ${JOIN_REPLY_TIMEOUT_MS / 1000} s`), JOIN_REPLY_TIMEOUT_MS);
      let lastBeat = Date.now();
      const beat = setInterval(() => {
        const stalled = checkAfterStall(lastBeat, Date.now());
        if (stalled) this.o.log(stallNote(lastBeat, Date.now()));
        lastBeat = Date.now();
        if (joined && !stalled && Date.now() - lastSeen > COORDINATOR_SILENCE_MS) {
          finish(`no heartbeat from the coordinator for ${((Date.now() - lastSeen) / 1000).toFixed(1)} s`);
          return;
        }
        // Not before the join: the coordinator takes a first message that is not a join as a refusal, and a
        // slow device (an aarch64 worker under qemu) could still be answering the challenge here.
        if (joined) this.send({ heartbeat: { sentUnixMs: Date.now() } });
      }, HEARTBEAT_INTERVAL_MS);

      const session: SessionControl = {
        finish,
        joined: () => {
          joined = true;
          clearTimeout(joinTimer);
        },
        isJoined: () => joined,
        // The coordinator gives an assignment a few seconds of silence: while this device works on
        // one, its latest progress goes out again at least every ASSIGN_PROGRESS_INTERVAL_MS.
        assigning: (busy, last) => {
          clearInterval(keepAlive);
          if (busy) keepAlive = setInterval(() => this.send({ progress: last() }), ASSIGN_PROGRESS_INTERVAL_MS);
        },
      };
      stream.on("data", (m: CoordinatorMessage) => {
        lastSeen = Date.now();
        try {
          this.handle(m, session);
        } catch (e) {
          this.fail(e);
        }
      });
      stream.on("error", (e: Error & { code?: number }) => finish(e.code === 14 ? "coordinator unreachable" : `connection error: ${printable(e.message)}`));
      stream.on("end", () => finish("the coordinator closed the session"));
      // The Join goes out in answer to the coordinator's Challenge (handle()).
    });
  }

  private handle(m: CoordinatorMessage, session: SessionControl): void {
    switch (m.msg) {
      case "challenge":
        if (session.isJoined()) return;
        this.send({ join: { ...this.o.join, protocolVersion: PROTOCOL_VERSION, proof: joinProof(this.o.token, m.challenge.nonce) } });
        return;
      case "welcome":
        this.deviceId = m.welcome.deviceId;
        session.joined();
        this.o.log(`joined ${this.address} as ${printable(this.deviceId)}`);
        // The join's handshakes are garbage now; the coordinator reads this device's memory next.
        setImmediate(settleMemory);
        return;
      case "assignment": {
        const a = m.assignment;
        const layers = a.windows.map((w) => `${w.firstLayer}-${w.endLayer - 1}`).join(", ");
        this.o.log(`assigned layers ${layers} (${a.cycles} cycle${a.cycles === 1 ? "" : "s"}), successor ${printable(a.successorUrl)}`);
        // Only the newest assignment is set up and answered: the coordinator gave up on an older one
        // (another device of its ring failed while it was wired) and waits for this one alone.
        this.assignment?.abort();
        const dropped = new AbortController();
        this.assignment = dropped;
        let last = { fraction: 0, stage: "received the assignment" };
        const progress = (fraction: number, stage: string) => {
          last = { fraction, stage };
          if (!dropped.signal.aborted) this.send({ progress: last });
        };
        progress(0, last.stage);
        session.assigning(true, () => last);
        this.handler
          .assign(a, progress, this.deviceId, dropped.signal)
          .then((anonBytes) => {
            if (!dropped.signal.aborted) this.send({ ready: { anonBytes, ringId: a.ringId } });
          })
          .catch((e: unknown) => {
            if (dropped.signal.aborted) this.o.log(`dropped the assignment of layers ${layers}: a newer one came`);
            else this.fail(e);
          })
          .finally(() => {
            if (this.assignment === dropped) session.assigning(false, () => last);
          });
        return;
      }
      case "kv":
        this.handler.kv(m.kv);
        return;
      case "statusRequest": {
        // Answered in the order asked (the coordinator matches answers to requests by order), though
        // one that times the pass first takes a while; the answer goes to the stream that asked.
        const stream = this.stream;
        const request = m.statusRequest;
        this.statusAnswers = this.statusAnswers
          .then(() => this.handler.status(request))
          .then((status) => stream?.write({ status }), (e: unknown) => this.fail(e, true));
        return;
      }
      case "shutdown":
        // Before the welcome this is a refusal (another model, another protocol): not the end, since
        // the coordinator may be restarted with this worker's model.
        session.finish(printable(m.shutdown.reason, 500), !session.isJoined());
        return;
      case "heartbeat":
        return;
    }
  }

  /** Reports a failure to the coordinator (it ends the run and names this device); leaves when the
   * failure means this worker cannot go on (`check`). */
  fail(e: unknown, answersStatus = false): void {
    const message = e instanceof Error ? e.message : String(e);
    this.o.log(`error: ${message}`);
    this.send({ failure: { message, answersStatus } });
    const exit = e instanceof Error && e.name === "WorkerExit" ? (e as WorkerExit) : this.o.check?.();
    if (exit) this.leave(exit);
  }
}

/** What handle() may do to the session it belongs to. */
interface SessionControl {
  finish(reason: string, refused?: boolean): void;
  joined(): void;
  isJoined(): boolean;
  assigning(busy: boolean, last: () => { fraction: number; stage: string }): void;
}
