// The chunk stream on the cluster port: gRPC's framing held a loopback fetch to a sixth of a plain
// socket's speed, so chunks travel as raw bytes on a connection of their own, inside the cluster's
// TLS (the coordinator tells it from gRPC by its ALPN name, trust/tls.ts). Every request carries the
// join token's proof bound to that TLS connection (trust/token.ts chunkProof), checked before anything
// about the model is said.
//
//   request:  CHUNK_MAGIC, u32 length, JSON { proof, info?: true, fingerprint, chunks: number[] }
//   answer:   to info: u32 INFO, u32 length, JSON ModelDescription; then END
//             per chunk: u32 index, u32 length, 32 bytes SHA-256, the data
//             end: u32 END; error: u32 ERROR, u32 length, UTF-8 message
// All integers little-endian.
import type { Socket } from "node:net";
import type { Chunk } from "./fetch.js";

export const CHUNK_MAGIC = Buffer.from("PRIMACHK");
export const END = 0xffffffff;
export const ERROR = 0xfffffffe;
export const INFO = 0xfffffffd;
const MAX_INFO_BYTES = 64 << 10;
/** A request names at most this many chunks (a 1 TB model in 4 MiB chunks), in at most this many bytes. */
export const MAX_REQUEST_CHUNKS = 1 << 18;
const MAX_REQUEST_BYTES = 8 << 20;
const MAX_ERROR_BYTES = 4096;

export interface ChunkRequest {
  /** chunkProof as hex. */
  readonly proof: string;
  /** Asks what the model is (ModelDescription) instead of chunks. */
  readonly info?: boolean;
  readonly fingerprint: string;
  readonly chunks: readonly number[];
}

export function encodeRequest(r: ChunkRequest): Buffer {
  const body = Buffer.from(JSON.stringify(r));
  const len = Buffer.alloc(4);
  len.writeUInt32LE(body.length);
  return Buffer.concat([CHUNK_MAGIC, len, body]);
}

/** A chunk's header (index, length, hash), ready to be written before its data. */
export function encodeChunkHeader(index: number, length: number, sha256Hex: string): Buffer {
  const h = Buffer.alloc(40);
  h.writeUInt32LE(index, 0);
  h.writeUInt32LE(length, 4);
  h.write(sha256Hex, 8, "hex");
  return h;
}

export function encodeEnd(): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(END);
  return b;
}

export function encodeInfo(info: object): Buffer {
  const m = Buffer.from(JSON.stringify(info));
  const b = Buffer.alloc(8);
  b.writeUInt32LE(INFO, 0);
  b.writeUInt32LE(m.length, 4);
  return Buffer.concat([b, m, encodeEnd()]);
}

export function encodeError(message: string): Buffer {
  const m = Buffer.from(message.slice(0, MAX_ERROR_BYTES));
  const b = Buffer.alloc(8);
  b.writeUInt32LE(ERROR, 0);
  b.writeUInt32LE(m.length, 4);
  return Buffer.concat([b, m]);
}

/** Reads bytes off a socket as they are asked for (a small pull parser over 'data' events). */
class Reader {
  private bufs: Buffer[] = [];
  private have = 0;
  private waiter: (() => void) | undefined;
  private ended: Error | undefined;

  constructor(socket: Socket, private readonly timeoutMs: number) {
    socket.on("data", (d: Buffer) => {
      this.bufs.push(d);
      this.have += d.length;
      this.waiter?.();
    });
    const end = (e: Error) => {
      this.ended ??= e;
      this.waiter?.();
    };
    socket.on("end", () => end(new Error("the connection ended")));
    socket.on("close", () => end(new Error("the connection closed")));
    socket.on("error", (e) => end(e));
  }

  /** Exactly n bytes (one buffer; copied only when they span several). */
  async take(n: number): Promise<Buffer> {
    while (this.have < n) {
      if (this.ended) throw this.ended;
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`nothing received for ${this.timeoutMs / 1000} s`)), this.timeoutMs);
        this.waiter = () => {
          clearTimeout(timer);
          this.waiter = undefined;
          resolve();
        };
      });
    }
    let out: Buffer;
    if (this.bufs[0].length >= n) {
      out = this.bufs[0].subarray(0, n);
      this.bufs[0] = this.bufs[0].subarray(n);
      if (this.bufs[0].length === 0) this.bufs.shift();
    } else {
      out = Buffer.allocUnsafe(n);
      let o = 0;
      while (o < n) {
        const b = this.bufs[0];
        const k = Math.min(b.length, n - o);
        b.copy(out, o, 0, k);
        o += k;
        if (k === b.length) this.bufs.shift();
        else this.bufs[0] = b.subarray(k);
      }
    }
    this.have -= n;
    return out;
  }
}

/** The coordinator's side: the request (CHUNK_MAGIC first), checked. */
export async function readRequest(socket: Socket, timeoutMs: number): Promise<ChunkRequest> {
  const r = new Reader(socket, timeoutMs);
  if (!(await r.take(CHUNK_MAGIC.length)).equals(CHUNK_MAGIC)) throw new Error("not a chunk request");
  const len = (await r.take(4)).readUInt32LE(0);
  if (len > MAX_REQUEST_BYTES) throw new Error(`a chunk request of ${len} bytes is over the limit`);
  let j: unknown;
  try {
    j = JSON.parse((await r.take(len)).toString("utf8"));
  } catch {
    throw new Error("the chunk request is not valid JSON");
  }
  const q = j as { proof?: unknown; info?: unknown; fingerprint?: unknown; chunks?: unknown };
  if (typeof q.proof !== "string" || !/^[0-9a-f]{64}$/.test(q.proof)) throw new Error("the chunk request has no proof of the join token");
  if (q.info === true) return { proof: q.proof, info: true, fingerprint: "", chunks: [] };
  if (typeof q.fingerprint !== "string" || !Array.isArray(q.chunks) || q.chunks.length > MAX_REQUEST_CHUNKS || !q.chunks.every((c) => Number.isInteger(c) && c >= 0)) {
    throw new Error("the chunk request needs a fingerprint and a list of chunk numbers");
  }
  return { proof: q.proof, fingerprint: q.fingerprint, chunks: q.chunks as number[] };
}

/** The device's side: the answer to an info request. */
export async function readInfo(socket: Socket, timeoutMs: number): Promise<unknown> {
  const r = new Reader(socket, timeoutMs);
  const head = (await r.take(4)).readUInt32LE(0);
  if (head === ERROR) {
    const n = Math.min((await r.take(4)).readUInt32LE(0), MAX_ERROR_BYTES);
    throw new Error((await r.take(n)).toString("utf8"));
  }
  if (head !== INFO) throw new Error("the coordinator did not describe its model");
  const n = (await r.take(4)).readUInt32LE(0);
  if (n > MAX_INFO_BYTES) throw new Error(`a model description of ${n} bytes is over the limit`);
  try {
    return JSON.parse((await r.take(n)).toString("utf8"));
  } catch {
    throw new Error("the model description is not valid JSON");
  }
}

/** The device's side: the chunks as they arrive on a socket the request was written to. */
export async function* readChunks(socket: Socket, maxChunkBytes: number, timeoutMs: number): AsyncGenerator<Chunk> {
  const r = new Reader(socket, timeoutMs);
  for (;;) {
    const head = await r.take(4);
    const index = head.readUInt32LE(0);
    if (index === END) return;
    if (index === ERROR) {
      const n = Math.min((await r.take(4)).readUInt32LE(0), MAX_ERROR_BYTES);
      throw new Error((await r.take(n)).toString("utf8"));
    }
    const rest = await r.take(36);
    const length = rest.readUInt32LE(0);
    if (length > maxChunkBytes) throw new Error(`the coordinator announced a chunk of ${length} bytes (chunks are ${maxChunkBytes})`);
    const sha256 = rest.subarray(4, 36).toString("hex");
    yield { index, sha256, data: await r.take(length) };
  }
}
