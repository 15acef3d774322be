// The cost of a hop between two devices: round trip of an activation-sized message and bandwidth of
// a prompt-batch-sized one, over TCP like the ring's data plane. Each worker runs a small echo server
// (announced in its profile); the coordinator measures its hop to every worker before planning. In a
// home network every hop crosses the same router, so the coordinator's hop to a device stands for
// that device's hop to its ring successor.
import { createServer, connect, type Server, type Socket } from "node:net";

/** Largest message the echo server takes: a 64-token batch of a 128k-wide model is 32 MiB. */
const MAX_MESSAGE_BYTES = 64 << 20;

/** Echoes length-prefixed messages (u32 little-endian length, then the bytes). */
export class LinkProbeServer {
  private constructor(private readonly server: Server, readonly port: number) {}

  static listen(port = 0, host = "0.0.0.0"): Promise<LinkProbeServer> {
    const server = createServer((s) => echo(s));
    return new Promise((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, host, () => {
        server.off("error", reject);
        const a = server.address();
        resolve(new LinkProbeServer(server, typeof a === "object" && a ? a.port : port));
      });
    });
  }

  close(): Promise<void> {
    return new Promise((resolve) => this.server.close(() => resolve()));
  }

  /** Lets the process exit while the server is still listening. */
  unref(): this {
    this.server.unref();
    return this;
  }
}

function echo(s: Socket): void {
  s.setNoDelay(true);
  let buf: Buffer = Buffer.alloc(0);
  s.on("data", (d: Buffer) => {
    buf = buf.length ? Buffer.concat([buf, d]) : d;
    while (buf.length >= 4) {
      const n = buf.readUInt32LE(0);
      if (n > MAX_MESSAGE_BYTES) {
        s.destroy(); // not a probe: drop the peer
        return;
      }
      if (buf.length < 4 + n) break;
      s.write(buf.subarray(0, 4 + n));
      buf = buf.subarray(4 + n);
    }
  });
  s.on("error", () => s.destroy());
  s.setTimeout(30_000, () => s.destroy());
}

export interface LinkMeasurement {
  /** Median round trip of one activation message (ms). */
  readonly rttMs: number;
  readonly messageBytes: number;
  /** Throughput of the bulk message, one way (B/s). */
  readonly bytesPerS: number;
  readonly bulkBytes: number;
  /** One way time of one token's activations: Halda's linkLatencyMs (ξ). */
  readonly linkLatencyMs: number;
}

export interface LinkOptions {
  /** One token's activations: nEmbd x 4 bytes. */
  readonly messageBytes: number;
  /** A prompt batch's activations, for the bandwidth. */
  readonly bulkBytes: number;
  readonly rounds?: number;
  readonly timeoutMs?: number;
}

/** Measures the hop to a LinkProbeServer at host:port. Rejects with a clear message on failure. */
export function measureLink(host: string, port: number, o: LinkOptions): Promise<LinkMeasurement> {
  const rounds = o.rounds ?? 20;
  if (!(o.messageBytes >= 1 && o.messageBytes <= MAX_MESSAGE_BYTES) || !(o.bulkBytes >= 1 && o.bulkBytes <= MAX_MESSAGE_BYTES)) {
    return Promise.reject(new Error(`link probe message sizes must be 1..${MAX_MESSAGE_BYTES} bytes`));
  }
  return new Promise((resolve, reject) => {
    const s = connect({ host, port });
    s.setNoDelay(true);
    const timer = setTimeout(() => finish(new Error(`link probe to ${host}:${port} timed out after ${o.timeoutMs ?? 5000} ms`)), o.timeoutMs ?? 5000);
    let done = false;
    const finish = (err: Error | null, m?: LinkMeasurement) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      s.destroy();
      if (err) reject(err);
      else resolve(m!);
    };
    s.on("error", (e) => finish(new Error(`link probe to ${host}:${port}: ${e.message}`)));
    s.on("close", () => finish(new Error(`link probe to ${host}:${port}: connection closed`)));

    const message = (n: number) => {
      const b = Buffer.alloc(4 + n);
      b.writeUInt32LE(n, 0);
      for (let i = 4; i < b.length; i += 4096) b[i] = i & 0xff;
      return b;
    };
    const small = message(o.messageBytes), bulk = message(o.bulkBytes);
    const plan: Buffer[] = [small, small, ...Array(rounds).fill(small), bulk, bulk, bulk];
    const times: number[] = [];
    let expect = 0, got = 0, t0 = 0;
    const next = () => {
      const i = times.length;
      if (i === plan.length) {
        const smallRtt = times.slice(2, 2 + rounds).sort((a, b) => a - b);
        const rttMs = smallRtt[Math.floor(smallRtt.length / 2)];
        const bulkRtt = Math.min(...times.slice(2 + rounds));
        // The bulk round trip carries the bytes twice; what the small message costs is latency.
        const oneWayS = Math.max(bulkRtt - smallRtt[0], bulkRtt / 4) / 2 / 1000;
        finish(null, { rttMs, messageBytes: o.messageBytes, bytesPerS: o.bulkBytes / oneWayS, bulkBytes: o.bulkBytes, linkLatencyMs: rttMs / 2 });
        return;
      }
      expect = plan[i].length;
      got = 0;
      t0 = performance.now();
      s.write(plan[i]);
    };
    s.on("data", (d: Buffer) => {
      got += d.length;
      if (got > expect) return finish(new Error(`link probe to ${host}:${port}: the peer sent more than it was sent`));
      if (got === expect) {
        times.push(performance.now() - t0);
        next();
      }
    });
    s.on("connect", next);
  });
}
