// The worker's side of the control plane: dial the coordinator, join, keep heartbeats going, obey
// assignments and commands. A daemon: when the coordinator goes away (or ends its run) the worker
// drops its windows and dials again until it is stopped. The address is fixed (--join host:port) or
// looked up again before every attempt (mDNS discovery: the coordinator may come back elsewhere).
import {
  PROTOCOL_VERSION, coordinatorClient, type Assignment, type ClientSessionStream, type CoordinatorMessage, type Join,
  type KvCommand, type Status, type WorkerMessage,
} from "../control/index.js";

export const HEARTBEAT_INTERVAL_MS = 300;
export const HEARTBEAT_TIMEOUT_MS = 1500;

/** What the session asks of the device while it is joined. */
export interface SessionHandler {
  /** Sets up the assigned windows and links; reports load progress; resolves with anonymous bytes. */
  assign(a: Assignment, progress: (fraction: number, stage: string) => void, deviceId: string): Promise<number>;
  kv(cmd: KvCommand): void;
  status(): Status;
  /** Drops windows and links (the run ended or the coordinator is gone). */
  reset(reason: string): Promise<void>;
}

/** Finds the coordinator's host:port for one attempt (may wait); rejects to end run(). */
export type CoordinatorLookup = (signal: AbortSignal) => Promise<string>;

export interface SessionOptions {
  /** host:port, or a lookup called before every attempt. */
  readonly coordinator: string | CoordinatorLookup;
  readonly join: Omit<Join, "protocolVersion">;
  readonly log: (line: string) => void;
  /** Stop after the first session instead of dialling again (tests, one-shot runs). */
  readonly once?: boolean;
  readonly retryMs?: number;
}

export class WorkerSession {
  private stopped = false;
  private stream: ClientSessionStream | undefined;
  private deviceId = "";
  /** The address of the current attempt. */
  private address = "";
  private readonly stopping = new AbortController();

  constructor(private readonly o: SessionOptions, private readonly handler: SessionHandler) {}

  /** Runs sessions until stop(); resolves when stopped (or after one session with `once`). */
  async run(): Promise<void> {
    let waitingLogged = false;
    const lookup = this.o.coordinator;
    while (!this.stopped) {
      try {
        this.address = typeof lookup === "string" ? lookup : await lookup(this.stopping.signal);
      } catch (e) {
        if (this.stopped) return;
        throw e;
      }
      const outcome = await this.session();
      await this.handler.reset(outcome.reason);
      if (this.o.once || this.stopped) return;
      const again = typeof lookup === "string" ? `dialling ${this.address} again` : "looking for the coordinator again";
      if (outcome.joined) {
        this.o.log(`session ended: ${outcome.reason}; ${again}`);
        waitingLogged = false;
      } else if (!waitingLogged) {
        this.o.log(`waiting for the coordinator at ${this.address} (${outcome.reason})`);
        waitingLogged = true;
      }
      if (outcome.fatal) throw new Error(outcome.reason);
      await new Promise((r) => setTimeout(r, this.o.retryMs ?? 1000));
    }
  }

  stop(): void {
    this.stopped = true;
    this.stopping.abort();
    this.stream?.cancel();
  }

  private send(m: WorkerMessage): void {
    this.stream?.write(m);
  }

  /** One session: resolves when it ends, with why. */
  private session(): Promise<{ joined: boolean; reason: string; fatal?: boolean }> {
    return new Promise((resolve) => {
      const client = coordinatorClient(this.address);
      const stream = client.session();
      this.stream = stream;
      let joined = false;
      let lastSeen = Date.now();
      let done = false;
      const finish = (reason: string, fatal = false) => {
        if (done) return;
        done = true;
        clearInterval(beat);
        this.stream = undefined;
        try {
          stream.cancel();
        } catch {
          // already closed
        }
        client.close();
        resolve({ joined, reason, fatal });
      };
      const beat = setInterval(() => {
        if (joined && Date.now() - lastSeen > HEARTBEAT_TIMEOUT_MS) {
          finish(`no heartbeat from the coordinator for ${((Date.now() - lastSeen) / 1000).toFixed(1)} s`);
          return;
        }
        this.send({ heartbeat: { sentUnixMs: Date.now() } });
      }, HEARTBEAT_INTERVAL_MS);

      stream.on("data", (m: CoordinatorMessage) => {
        lastSeen = Date.now();
        this.handle(m, finish, () => {
          joined = true;
        });
      });
      stream.on("error", (e: Error & { code?: number }) => finish(e.code === 14 ? "coordinator unreachable" : `connection error: ${e.message}`));
      stream.on("end", () => finish("the coordinator closed the session"));
      this.send({ join: { ...this.o.join, protocolVersion: PROTOCOL_VERSION } });
    });
  }

  private handle(m: CoordinatorMessage, finish: (reason: string, fatal?: boolean) => void, onJoined: () => void): void {
    switch (m.msg) {
      case "welcome":
        this.deviceId = m.welcome.deviceId;
        onJoined();
        this.o.log(`joined ${this.address} as ${this.deviceId}`);
        return;
      case "assignment": {
        const a = m.assignment;
        const layers = a.windows.map((w) => `${w.firstLayer}-${w.endLayer - 1}`).join(", ");
        this.o.log(`assigned layers ${layers} (${a.cycles} cycle${a.cycles === 1 ? "" : "s"}), successor ${a.successorUrl}`);
        this.handler
          .assign(a, (fraction, stage) => this.send({ progress: { fraction, stage } }), this.deviceId)
          .then((anonBytes) => this.send({ ready: { anonBytes } }))
          .catch((e: unknown) => this.fail(e));
        return;
      }
      case "kv":
        try {
          this.handler.kv(m.kv);
        } catch (e) {
          this.fail(e);
        }
        return;
      case "statusRequest":
        this.send({ status: this.handler.status() });
        return;
      case "shutdown":
        // A refused join (model mismatch, protocol) is fatal for a daemon that would only be refused again.
        finish(m.shutdown.reason, !this.deviceId && /mismatch|protocol/.test(m.shutdown.reason));
        return;
      case "heartbeat":
        return;
    }
  }

  /** Reports a failure to the coordinator (it ends the run and names this device). */
  fail(e: unknown): void {
    const message = e instanceof Error ? e.message : String(e);
    this.o.log(`error: ${message}`);
    this.send({ failure: { message } });
  }
}
