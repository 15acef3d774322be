// transfer/wire.ts's receiver: TLS decrypts each record straight into the chunk's buffer. The bytes
// must come out exactly as sent however the records fall across headers and chunks, and also when
// every buffer is taken (the socket paused, records already decrypted kept aside and placed later).
import { randomBytes } from "node:crypto";
import type { AddressInfo } from "node:net";
import { connect, createServer, type Server, type TLSSocket } from "node:tls";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ChunkReceiver, chunkDigest, encodeChunkHeader, encodeEnd, encodeError } from "../../transfer/index.js";
import { createIdentity } from "../../trust/index.js";

const CHUNK = 1 << 20;
/** Chunk i: pseudo-random bytes (a misplaced record shows), the last one shorter. */
const chunks = Array.from({ length: 12 }, (_, i) => randomBytes(i === 11 ? 300_001 : CHUNK));

let server: Server;
let port: number;

beforeAll(async () => {
  const id = await createIdentity();
  server = createServer({ key: id.keyPem, cert: id.certPem, minVersion: "TLSv1.3" }, (s) => {
    // The first byte says what to send: 1 = every chunk then END, 2 = three chunks then an ERROR.
    s.once("data", async (d: Buffer) => {
      const n = d[0] === 2 ? 3 : chunks.length;
      for (let i = 0; i < n; i++) {
        s.write(encodeChunkHeader(i, chunks[i].length, chunkDigest(chunks[i])));
        if (!s.write(chunks[i])) await new Promise((r) => s.once("drain", r));
      }
      s.end(d[0] === 2 ? encodeError("the model file changed") : encodeEnd());
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  port = (server.address() as AddressInfo).port;
});
afterAll(() => server.close());

async function receive(what: number, releaseAfterMs: number): Promise<{ got: Map<number, Buffer>; error?: string }> {
  const rx = new ChunkReceiver(CHUNK, 10_000);
  const socket: TLSSocket = connect({ port, host: "127.0.0.1", rejectUnauthorized: false, onread: rx.onread } as Parameters<typeof connect>[0]);
  await new Promise((r) => socket.once("secureConnect", r));
  rx.attach(socket);
  socket.write(Buffer.from([what]));
  const got = new Map<number, Buffer>();
  try {
    for await (const c of rx.chunks()) {
      got.set(c.index, Buffer.from(c.data)); // a copy: the buffer goes back to the receiver
      expect(c.digest).toBe(chunkDigest(chunks[c.index]));
      // Held buffers: the receiver runs out of them and must pause and keep what TLS still delivers.
      if (releaseAfterMs > 0) setTimeout(() => c.release!(), releaseAfterMs);
      else c.release!();
    }
    return { got };
  } catch (e) {
    return { got, error: (e as Error).message };
  } finally {
    socket.destroy();
  }
}

describe("chunk stream receiver", () => {
  it("delivers every chunk byte for byte, released at once or late (every buffer taken)", async () => {
    for (const delay of [0, 20]) {
      const { got, error } = await receive(1, delay);
      expect(error).toBeUndefined();
      expect(got.size).toBe(chunks.length);
      for (const [i, d] of got) expect(d.equals(chunks[i]), `chunk ${i}, release after ${delay} ms`).toBe(true);
    }
  });

  it("an ERROR from the coordinator ends the stream with its message, after the chunks before it", async () => {
    const { got, error } = await receive(2, 5);
    expect(error).toBe("the model file changed");
    expect([...got.keys()]).toEqual([0, 1, 2]);
  });
});
