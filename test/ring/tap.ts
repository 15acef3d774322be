// A TCP tap for the data-plane tests: it sits between a dialer and a listener, forwards both ways,
// keeps every byte it saw, and can inject bytes towards the listener (a replay).
import { createServer, connect, type AddressInfo, type Server, type Socket } from "node:net";

export interface Tap {
  readonly port: number;
  readonly url: string;
  /** Every byte the dialer sent towards the listener, in order (all connections). */
  upstream(): Buffer;
  /** Every byte the listener sent back. */
  downstream(): Buffer;
  /** Writes bytes into the last connection towards the listener, as if the dialer sent them. */
  inject(bytes: Uint8Array): void;
  close(): Promise<void>;
}

export async function startTap(targetPort: number): Promise<Tap> {
  const up: Buffer[] = [];
  const down: Buffer[] = [];
  const sockets = new Set<Socket>();
  let lastUpstream: Socket | null = null;
  const server: Server = createServer((client) => {
    const target = connect(targetPort, "127.0.0.1");
    lastUpstream = target;
    for (const s of [client, target]) {
      sockets.add(s);
      s.setNoDelay(true);
      s.on("error", () => {});
      s.on("close", () => {
        client.destroy();
        target.destroy();
      });
    }
    client.on("data", (d: Buffer) => {
      up.push(Buffer.from(d));
      target.write(d);
    });
    target.on("data", (d: Buffer) => {
      down.push(Buffer.from(d));
      client.write(d);
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  const port = (server.address() as AddressInfo).port;
  return {
    port,
    url: `ws://127.0.0.1:${port}`,
    upstream: () => Buffer.concat(up),
    downstream: () => Buffer.concat(down),
    inject(bytes) {
      if (!lastUpstream) throw new Error("tap: no connection to inject into");
      lastUpstream.write(bytes);
    },
    close: () => {
      for (const s of sockets) s.destroy();
      return new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/** Whether `hay` holds any `window`-byte run of `needle` (rows leak even when cut into pieces). */
export function holdsAnyRun(hay: Buffer, needle: Uint8Array, window = 16): boolean {
  for (let i = 0; i + window <= needle.length; i += window) {
    if (hay.indexOf(Buffer.from(needle.buffer, needle.byteOffset + i, window)) >= 0) return true;
  }
  return false;
}
