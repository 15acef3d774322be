// transfer/wire.ts's keyed stream receiver: each read lands straight in the chunk's buffer and each
// record is opened in place. The bytes must come out exactly as sent however the reads fall across
// headers, bodies and tags, also when every buffer is taken (the socket paused, reads already made
// kept aside and placed later); a record changed in transit, or a stream cut before its END, fails.
import { randomBytes } from "node:crypto";
import { connect, createServer, type AddressInfo, type Server, type Socket } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { streamSeal } from "../../native/index.js";
import { ChunkReceiver, chunkDigest, encodeRecordHeader, sealEnd, sealError, sealRecord } from "../../transfer/index.js";

const CHUNK = 1 << 20;
/** Chunk i: pseudo-random bytes (a misplaced read shows), the last one shorter. */
const chunks = Array.from({ length: 12 }, (_, i) => randomBytes(i === 11 ? 300_001 : CHUNK));
const key = randomBytes(32);

let server: Server;
let port: number;

/** What the test server sends, by the first byte the client writes. */
const ALL = 1, THEN_ERROR = 2, TAMPERED = 3, CUT = 4, OVERSIZED = 5;

beforeAll(async () => {
  server = createServer((s: Socket) => {
    s.on("error", () => s.destroy()); // the client hangs up on the failing cases
    s.once("data", async (d: Buffer) => {
      const what = d[0];
      const seal = streamSeal(key, true);
      const send = async (parts: Buffer[]) => {
        for (const p of parts) if (!s.write(p)) await new Promise((r) => s.once("drain", r));
      };
      if (what === OVERSIZED) {
        // A header announcing more than a chunk (not even sealed): refused before any byte lands.
        await send([encodeRecordHeader(0, CHUNK + 1), Buffer.alloc(64 << 10)]);
        s.end();
        return seal.close();
      }
      const n = what === ALL || what === TAMPERED ? chunks.length : 3;
      for (let i = 0; i < n; i++) {
        const parts = sealRecord(seal, i, Buffer.from(chunks[i]), chunkDigest(chunks[i]));
        if (what === TAMPERED && i === 5) parts[1][1000] ^= 1; // one bit of the sealed body
        await send(parts);
      }
      if (what === THEN_ERROR) await send(sealError(seal, "the model file changed"));
      if (what !== CUT) await send(sealEnd(seal));
      s.end();
      seal.close();
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  port = (server.address() as AddressInfo).port;
});
afterAll(() => server.close());

async function receive(what: number, releaseAfterMs: number): Promise<{ got: Map<number, Buffer>; error?: string }> {
  const rx = new ChunkReceiver(CHUNK, 10_000, streamSeal(key, false));
  const socket = connect({ port, host: "127.0.0.1", onread: rx.onread });
  rx.attach(socket);
  socket.write(Buffer.from([what]));
  const got = new Map<number, Buffer>();
  try {
    for await (const c of rx.chunks()) {
      got.set(c.index, Buffer.from(c.data)); // a copy: the buffer goes back to the receiver
      expect(c.digest).toBe(chunkDigest(chunks[c.index]));
      // Held buffers: the receiver runs out of them and must pause and keep what was still read.
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

describe("keyed chunk stream receiver", () => {
  it("delivers every chunk byte for byte, released at once or late (every buffer taken)", async () => {
    for (const delay of [0, 20]) {
      const { got, error } = await receive(ALL, delay);
      expect(error).toBeUndefined();
      expect(got.size).toBe(chunks.length);
      for (const [i, d] of got) expect(d.equals(chunks[i]), `chunk ${i}, release after ${delay} ms`).toBe(true);
    }
  });

  it("an ERROR from the coordinator ends the stream with its message, after the chunks before it", async () => {
    const { got, error } = await receive(THEN_ERROR, 5);
    expect(error).toBe("the model file changed");
    expect([...got.keys()]).toEqual([0, 1, 2]);
  });

  it("a record changed in transit fails authentication, after the chunks before it", async () => {
    const { got, error } = await receive(TAMPERED, 0);
    expect(error).toMatch(/failed authentication/);
    expect([...got.keys()]).toEqual([0, 1, 2, 3, 4]);
  });

  it("a header announcing more than a chunk is refused by name", async () => {
    const { got, error } = await receive(OVERSIZED, 0);
    expect(error).toMatch(/announced a chunk of 1048577 bytes \(chunks are 1048576\)/);
    expect(got.size).toBe(0);
  });

  it("a stream cut before its END is an error, not a short success", async () => {
    const { got, error } = await receive(CUT, 0);
    expect(error).toMatch(/connection (ended|closed)/);
    expect(got.size).toBe(3);
  });
});
