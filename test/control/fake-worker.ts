// A fake worker for control-plane tests: a real gRPC session (control/'s client and messages, TLS
// pinned by the join token, the Join answering the coordinator's Challenge) that joins and then does
// only what the test asks: heartbeats or not, progress or not, and never runs anything. It records
// what the coordinator sends. `proof: "wrong"` joins with a token the cluster does not hold.
import { randomBytes } from "node:crypto";
import { PROTOCOL_VERSION, coordinatorClient, type ClientSessionStream, type CoordinatorMessage, type Join, type WorkerMessage } from "../../control/index.js";
import { clusterCredentials, joinProof, type JoinToken } from "../../trust/index.js";

export interface FakeWorkerOptions {
  readonly address: string;
  readonly name: string;
  readonly fingerprint: string;
  readonly token: JoinToken;
  /** Send nothing at all, not even the join (a stream that never says who it is). */
  readonly silent?: boolean;
  /** Send heartbeats every 300 ms (default true): alive, but answering nothing. */
  readonly heartbeats?: boolean;
  /** Prove a secret that is not the cluster's (the certificate pin is right). */
  readonly proof?: "wrong";
  /** Fields of the Join to set (a forged profile, an advertised data host). */
  readonly join?: Partial<Join>;
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
  const received: CoordinatorMessage[] = [];
  const waiters: { kind: string; resolve: (m: CoordinatorMessage) => void }[] = [];
  let beat: NodeJS.Timeout | undefined;
  let stream: ClientSessionStream | undefined;
  let closed = false;
  let closeClient = () => {};
  const queued: WorkerMessage[] = [];
  const send = (m: WorkerMessage) => {
    if (!stream) return void queued.push(m);
    try {
      stream.write(m);
    } catch {
      // ended
    }
  };
  const token = o.proof === "wrong" ? { pin: o.token.pin, secret: randomBytes(32) } : o.token;
  const ended = (async () => {
    const client = coordinatorClient(o.address, await clusterCredentials(o.address, o.token, 5000));
    closeClient = () => client.close();
    const s = client.session();
    stream = s;
    if (closed) s.cancel();
    for (const m of queued.splice(0)) send(m);
    s.on("data", (m: CoordinatorMessage) => {
      received.push(m);
      if (m.msg === "challenge" && !o.silent) {
        send({
          join: {
            protocolVersion: PROTOCOL_VERSION, deviceName: o.name, hardwareId: "fake", dataHost: "", dataPort: 9, modelFingerprint: o.fingerprint,
            modelPath: "fake.gguf", profileJson: "", ...o.join, proof: joinProof(token, m.challenge.nonce),
          },
        });
        if (o.heartbeats ?? true) beat = setInterval(() => send({ heartbeat: { sentUnixMs: Date.now() } }), 300);
      }
      for (let i = waiters.length - 1; i >= 0; i--) if (waiters[i].kind === m.msg) waiters.splice(i, 1)[0].resolve(m);
    });
    return new Promise<string>((resolve) => {
      s.on("end", () => resolve("end"));
      s.on("error", (e: Error) => resolve(`error: ${e.message}`));
    });
  })().catch((e: Error) => `error: ${e.message}`);
  void ended.then(() => clearInterval(beat));
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
      closed = true;
      clearInterval(beat);
      try {
        stream?.cancel();
      } catch {
        // closed
      }
      closeClient();
    },
  };
}
