// A fake worker for control-plane tests: a real gRPC session (control/'s client and messages) that
// joins and then does only what the test asks: heartbeats or not, progress or not, and never runs
// anything. It records what the coordinator sends.
import { PROTOCOL_VERSION, coordinatorClient, type CoordinatorMessage, type WorkerMessage } from "../../control/index.js";

export interface FakeWorkerOptions {
  readonly address: string;
  readonly name: string;
  readonly fingerprint: string;
  /** Send nothing at all, not even the join (a stream that never says who it is). */
  readonly silent?: boolean;
  /** Send heartbeats every 300 ms (default true): alive, but answering nothing. */
  readonly heartbeats?: boolean;
}

export interface FakeWorker {
  readonly received: CoordinatorMessage[];
  send(m: WorkerMessage): void;
  /** Resolves with the first message of this kind (rejects after timeoutMs). */
  next(kind: CoordinatorMessage["msg"], timeoutMs?: number): Promise<CoordinatorMessage>;
  /** Resolves when the coordinator ends the stream (or it breaks), with how. */
  readonly ended: Promise<string>;
  close(): void;
}

export function fakeWorker(o: FakeWorkerOptions): FakeWorker {
  const client = coordinatorClient(o.address);
  const stream = client.session();
  const received: CoordinatorMessage[] = [];
  const waiters: { kind: string; resolve: (m: CoordinatorMessage) => void }[] = [];
  let beat: NodeJS.Timeout | undefined;
  const ended = new Promise<string>((resolve) => {
    stream.on("end", () => resolve("end"));
    stream.on("error", (e: Error) => resolve(`error: ${e.message}`));
  });
  void ended.then(() => clearInterval(beat));
  stream.on("data", (m: CoordinatorMessage) => {
    received.push(m);
    for (let i = waiters.length - 1; i >= 0; i--) if (waiters[i].kind === m.msg) waiters.splice(i, 1)[0].resolve(m);
  });
  const send = (m: WorkerMessage) => {
    try {
      stream.write(m);
    } catch {
      // ended
    }
  };
  if (!o.silent) {
    send({
      join: {
        protocolVersion: PROTOCOL_VERSION, deviceName: o.name, hardwareId: "fake", dataHost: "", dataPort: 9, modelFingerprint: o.fingerprint,
        modelPath: "fake.gguf", profileJson: "",
      },
    });
    if (o.heartbeats ?? true) beat = setInterval(() => send({ heartbeat: { sentUnixMs: Date.now() } }), 300);
  }
  return {
    received,
    send,
    ended,
    next(kind, timeoutMs = 10_000) {
      const seen = received.find((m) => m.msg === kind);
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve, reject) => {
        waiters.push({ kind: kind as string, resolve });
        setTimeout(() => reject(new Error(`no ${String(kind)} within ${timeoutMs} ms`)), timeoutMs).unref();
      });
    },
    close() {
      clearInterval(beat);
      try {
        stream.cancel();
      } catch {
        // closed
      }
      client.close();
    },
  };
}
