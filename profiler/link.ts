// The cost of a hop between two devices, measured over the ring's own data plane (ring/: WebSocket
// links, HELLO, the frame codec): the round trip of one token's activations and the throughput of a
// prompt batch. A raw TCP echo would leave out what a hop really costs here (framing, checks, the
// event loop on both ends), which on a fast network is most of it. Each worker runs an echo (a
// listener announced in its profile); the coordinator measures its hop to every worker before
// planning. In a home network every hop crosses the same router, so the coordinator's hop to a
// device stands for that device's hop to its ring successor.
import { randomBytes } from "node:crypto";
import { settleMemory } from "./memory.js";
import { descheduledMs, threadClock } from "../native/index.js";
import { RingListener, dialSuccessor, type ActivationsFrame, type RingLink, type RingLinkOptions } from "../ring/index.js";

/** The probe's ring: links to it are refused by real rings and vice versa. */
const PROBE_RING = "prima-link-probe";

export interface ProbeIdentity {
  readonly deviceId: string;
  readonly modelFingerprint: string;
  /** The model's hidden size: one token's activations are this many floats. */
  readonly hiddenSize: number;
}

/** Echoes activation frames back to whoever sent them. */
export class LinkProbeServer {
  private constructor(private readonly listener: RingListener) {}

  get port(): number {
    return this.listener.port;
  }

  /** With `linkKey` (sent to the coordinator over the control plane in the device's profile) the probe
   * speaks only to whoever holds it, as ring links do: anyone else learns nothing, not even its id. */
  static async listen(identity: ProbeIdentity, o: { port?: number; host?: string; maxTokens?: number; log?: (line: string) => void; linkKey?: Uint8Array } = {}): Promise<LinkProbeServer> {
    const listener = await RingListener.listen({
      port: o.port ?? 0, host: o.host, identity: { ...identity, ringId: PROBE_RING }, maxTokensPerFrame: o.maxTokens ?? 512,
      log: o.log ?? (() => {}), ...(o.linkKey ? { linkKey: o.linkKey } : {}),
    });
    listener.on("link", (link: RingLink) => {
      link.on("frame", (f) => {
        if (f.type === "activations") link.send(f).catch(() => link.close("probe echo failed"));
      });
      // The probe's prompt-sized frames are garbage now; the planner reads this device's room next.
      link.on("close", () => setImmediate(settleMemory));
    });
    return new LinkProbeServer(listener);
  }

  close(): Promise<void> {
    return this.listener.close();
  }
}

export interface LinkMeasurement {
  /** Median round trip of one token's activations (ms). */
  readonly rttMs: number;
  readonly messageBytes: number;
  /** Throughput of a prompt batch, one way (B/s). */
  readonly bytesPerS: number;
  readonly bulkBytes: number;
  /** One way time of one token's activations: Halda's linkLatencyMs (ξ). */
  readonly linkLatencyMs: number;
}

export interface LinkOptions {
  /** The measuring device (its fingerprint and hidden size must match the probe's). */
  readonly identity: ProbeIdentity;
  /** Tokens in the bandwidth message (a prompt batch). */
  readonly bulkTokens: number;
  readonly rounds?: number;
  readonly timeoutMs?: number;
  /** The probe's key, from the device's profile. */
  readonly linkKey?: Uint8Array;
}

/** Measures the hop to a LinkProbeServer at url (ws://host:port). Rejects with a clear message on failure. */
export async function measureLink(url: string, o: LinkOptions): Promise<LinkMeasurement> {
  const rounds = o.rounds ?? 20;
  const E = o.identity.hiddenSize;
  if (!Number.isInteger(o.bulkTokens) || o.bulkTokens < 1 || o.bulkTokens > 512) throw new Error(`link probe: bulk of ${o.bulkTokens} tokens must be 1..512`);
  const options: RingLinkOptions = {
    identity: { ...o.identity, ringId: PROBE_RING }, maxTokensPerFrame: Math.max(1, o.bulkTokens), handshakeTimeoutMs: o.timeoutMs ?? 5000, log: () => {},
    ...(o.linkKey ? { linkKey: o.linkKey } : {}),
  };
  let link: RingLink;
  try {
    link = await dialSuccessor(url, options);
  } catch (e) {
    throw new Error(`link probe to ${url}: ${(e as Error).message}`);
  }
  const timeoutMs = o.timeoutMs ?? 5000;
  try {
    const echo = (nTokens: number, requestId: number): Promise<number> =>
      new Promise((resolve, reject) => {
        const frame: ActivationsFrame = {
          type: "activations", requestId, firstTokenPosition: 0, nTokens, cycle: 0, rowWidth: E, dtype: "f32",
          activations: new Float32Array(nTokens * E).fill(0.5),
        };
        const timer = setTimeout(() => done(new Error(`link probe to ${url}: no echo within ${timeoutMs} ms`)), timeoutMs);
        const onFrame = (f: { type: string; requestId?: number }) => {
          if (f.type === "activations" && f.requestId === requestId) done(null);
        };
        const onClose = () => done(new Error(`link probe to ${url}: the link closed`));
        const t0 = performance.now();
        const done = (err: Error | null) => {
          clearTimeout(timer);
          link.off("frame", onFrame);
          link.off("close", onClose);
          if (err) reject(err);
          else resolve(performance.now() - t0);
        };
        link.on("frame", onFrame);
        link.on("close", onClose);
        link.send(frame).catch((e: Error) => done(new Error(`link probe to ${url}: ${e.message}`)));
      });
    let id = 1;
    for (let i = 0; i < 3; i++) await echo(1, id++); // warm-up: JIT, buffers, TCP windows
    const small: number[] = [];
    for (let i = 0; i < rounds; i++) small.push(await echo(1, id++));
    const bulk: number[] = [];
    for (let i = 0; i < 3; i++) bulk.push(await echo(o.bulkTokens, id++));
    small.sort((a, b) => a - b);
    const rttMs = small[Math.floor(small.length / 2)];
    const bulkRtt = Math.min(...bulk);
    // The bulk round trip carries the bytes twice; what the small message costs is latency.
    const oneWayS = Math.max(bulkRtt - small[0], bulkRtt / 4) / 2 / 1000;
    const bulkBytes = o.bulkTokens * E * 4;
    return { rttMs, messageBytes: E * 4, bytesPerS: bulkBytes / oneWayS, bulkBytes, linkLatencyMs: rttMs / 2 };
  } finally {
    await link.close("probe done");
  }
}

/** The longest one of timeHandOff's loopback writes may take to complete. */
const HAND_OFF_WRITE_LIMIT_MS = 5000;

export interface HandOffOptions {
  /** One token's activations are this many floats. */
  readonly hiddenSize: number;
  /** Runs a one-token pass at position `pos` (through the output layer, as the head's last window does). */
  readonly pass: (pos: number) => void;
  /** Stops the compute threads' spinning, as a ring device does before it sends (RingNode.send). */
  readonly relax: () => void;
  readonly rounds: number;
  /** Idle time before each pass, as a ring device waits for its next input. */
  readonly gapMs: number;
}

/**
 * The head's hand-off, as its ring node makes it (RingNode.send, whose time its counters report): right
 * after a pass, the compute threads relaxed and one token's activations encoded, sealed and written to a
 * keyed link (here one over loopback, to a sink in this process). Timed up to the socket write, less the
 * time the thread was preempted, as the ring's counter is: the times of the rounds after the first
 * three, in ms. After a pass the send's code and data are out of the caches, and it costs several times what
 * the link probe's back-to-back sends do (BENCHMARKS.md, "handoff"): the probe's round trip holds little
 * of it.
 * Workers hand off in C on their native lane, which is not timed here.
 */
export async function timeHandOff(o: HandOffOptions): Promise<number[]> {
  const identity = { deviceId: "hand-off", modelFingerprint: "hand-off", hiddenSize: o.hiddenSize, ringId: PROBE_RING };
  const linkKey = randomBytes(32);
  const listener = await RingListener.listen({ port: 0, host: "127.0.0.1", identity, maxTokensPerFrame: 1, log: () => {}, linkKey });
  listener.on("link", (l: RingLink) => l.on("frame", () => {}));
  let link: RingLink | undefined;
  try {
    link = await dialSuccessor(`ws://127.0.0.1:${listener.port}`, { identity, maxTokensPerFrame: 1, handshakeTimeoutMs: 5000, log: () => {}, linkKey });
    const acts = new Float32Array(o.hiddenSize);
    const ms: number[] = [];
    for (let pos = 0; pos < o.rounds + 3; pos++) {
      await new Promise((r) => setTimeout(r, o.gapMs));
      o.pass(pos);
      const c0 = threadClock(), t0 = performance.now();
      o.relax();
      const sent = link.send({ type: "activations", requestId: 1, firstTokenPosition: pos, nTokens: 1, cycle: 0, rowWidth: o.hiddenSize, dtype: "f32", activations: acts });
      const c1 = threadClock(), t = performance.now() - t0;
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([sent, new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`a loopback send did not complete within ${HAND_OFF_WRITE_LIMIT_MS} ms`)), HAND_OFF_WRITE_LIMIT_MS);
      })]).finally(() => clearTimeout(timer));
      if (pos >= 3) ms.push(t - descheduledMs(c0, c1, t));
    }
    return ms;
  } finally {
    await link?.close("hand-off timed");
    await listener.close();
  }
}
