// The chunk stream on the cluster port: gRPC's framing held a loopback fetch to a sixth of a plain
// socket's speed, so chunks travel as raw bytes on a connection of their own, inside the cluster's
// TLS (the coordinator tells it from gRPC by its ALPN name, trust/tls.ts). Every request carries the
// join token's proof bound to that TLS connection (trust/token.ts chunkProof), checked before anything
// about the model is said.
//
//   request:  CHUNK_MAGIC, u32 length, JSON { proof, info?: true, fingerprint, chunks: number[] }
//   answer:   to info: u32 INFO, u32 length, JSON ModelDescription; then END
//             per chunk: u32 index, u32 length, 32 bytes BLAKE3 digest, the data
//             end: u32 END; error: u32 ERROR, u32 length, UTF-8 message
// All integers little-endian.
import type { Socket } from "node:net";
import { chunkBuffer } from "./cache.js";
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
export function encodeChunkHeader(index: number, length: number, digestHex: string): Buffer {
  const h = Buffer.alloc(40);
  h.writeUInt32LE(index, 0);
  h.writeUInt32LE(length, 4);
  h.write(digestHex, 8, "hex");
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

/** Chunks a receiver holds at once: one being received while the others are hashed and written
 * (CachedModel.writeVerified). */
const RECEIVE_SLOTS = 4;
/** Chunk buffers between streams: the header's fetch and then the windows', or one assignment and the
 * next, use the same memory rather than fault in fresh pages each time (on this project's VMs a
 * fresh page costs as much as the bytes' hashing). Dropped after a few idle seconds: a capped device
 * needs its memory for its layers. */
const idleBuffers = new Map<number, Buffer[]>();
let dropIdle: NodeJS.Timeout | undefined;

function takeBuffer(bytes: number): Buffer {
  return idleBuffers.get(bytes)?.pop() ?? chunkBuffer(bytes);
}

function giveBuffer(b: Buffer): void {
  const list = idleBuffers.get(b.length) ?? [];
  list.push(b);
  idleBuffers.set(b.length, list);
  dropIdle ??= setTimeout(() => {
    dropIdle = undefined;
    idleBuffers.clear();
  }, 5000).unref();
  dropIdle.refresh();
}

/** Where records go while every chunk buffer is taken (the socket is paused, but TLS still hands
 * over what it had already decrypted). */
const SPILL_BYTES = 16 << 10;

/**
 * The device's side: the chunks as they arrive on a chunk stream. The socket must be created with
 * `onread` (net's user-buffer reads): TLS then decrypts each record straight into the buffer this
 * names next, which is the current chunk's buffer at its fill point (or the header's). Each record
 * costs no allocation, no stream event and no copy of ours; chunk buffers are shared memory, so the
 * hashing thread reads them in place. A chunk's `release` gives its buffer back; with every buffer
 * taken the socket is paused, so memory stays bounded however slow the disk.
 */
export class ChunkReceiver {
  /** For the socket's options (tls.connect's `onread`). */
  readonly onread = { buffer: () => this.nextBuffer(), callback: (n: number) => this.received(n) };
  /** Chunk buffers this stream holds and is not filling, and how many it has in all. */
  private readonly free: Buffer[] = [];
  private holding = 0;
  private closed = false;
  private readonly ready: Chunk[] = [];
  private failed: Error | undefined;
  private finished = false;
  private wake: (() => void) | undefined;
  // Header bytes (index, length, hash; or END; or ERROR and its message) gathered across records.
  private readonly head = Buffer.alloc(8 + MAX_ERROR_BYTES);
  private headHave = 0;
  private headNeed = 4;
  private cur: { index: number; digest: string; buf: Buffer; length: number; got: number } | undefined;
  /** The socket's current read buffer, and whether it is where the next bytes belong. */
  private target: Buffer | undefined;
  private direct = false;
  /** Records that came while no chunk buffer was free, kept until one is. */
  private held: Buffer[] = [];
  private waitingForBuffer = false;
  private lastData = performance.now();
  private socket: Socket | undefined;
  private stall: NodeJS.Timeout | undefined;
  private readonly onEnd = () => this.fail(new Error("the connection ended"));
  private readonly onClose = () => this.fail(new Error("the connection closed"));
  private readonly onError = (e: Error) => this.fail(e);

  constructor(private readonly maxChunkBytes: number, private readonly timeoutMs: number) {
  }

  /** Starts watching the socket (created with this.onread) for its end and for silence. */
  attach(socket: Socket): void {
    this.socket = socket;
    socket.on("end", this.onEnd).on("close", this.onClose).on("error", this.onError);
    // One timer for the stream, not one per wait: records arrive every few microseconds. Time spent
    // waiting for our own disk (the socket paused) is not the coordinator's silence.
    this.stall = setInterval(() => {
      if (!this.waitingForBuffer && !this.finished && performance.now() - this.lastData > this.timeoutMs) this.fail(new Error(`nothing received for ${this.timeoutMs / 1000} s`));
    }, Math.min(1000, this.timeoutMs));
  }

  /** The chunks, in the order they came; ends after the coordinator's END, throws its ERROR. */
  async *chunks(): AsyncGenerator<Chunk> {
    try {
      for (;;) {
        while (this.ready.length === 0) {
          if (this.failed) throw this.failed;
          if (this.finished) return;
          await new Promise<void>((resolve) => (this.wake = resolve));
          this.wake = undefined;
        }
        yield this.ready.shift()!;
      }
    } finally {
      this.closed = true;
      for (const b of this.free.splice(0)) giveBuffer(b);
      clearInterval(this.stall);
      this.socket?.off("end", this.onEnd).off("close", this.onClose).off("error", this.onError);
    }
  }

  private fail(e: Error): void {
    if (!this.finished) this.failed ??= e;
    this.wake?.();
  }

  /** Where the next bytes belong: exactly what the header or the chunk still lacks, so a record
   * that spans the two is split by TLS itself. */
  private place(): Buffer {
    return this.cur ? this.cur.buf.subarray(this.cur.got, this.cur.length) : this.head.subarray(this.headHave, this.headNeed);
  }

  /** The socket's next read buffer (net calls this after every read). While no chunk buffer is
   * free, a spare one whose bytes are kept for later. */
  private nextBuffer(): Buffer {
    this.direct = !this.waitingForBuffer && !this.finished && !this.failed;
    this.target = this.direct ? this.place() : Buffer.allocUnsafe(SPILL_BYTES);
    return this.target;
  }

  /** n bytes were read into this.target; false pauses the socket. */
  private received(n: number): boolean {
    this.lastData = performance.now();
    const bytes = this.target!.subarray(0, n);
    if (this.finished || this.failed) return true; // nothing more is read from this stream
    if (this.direct) this.advance(n);
    else if (this.waitingForBuffer) this.held.push(bytes);
    else this.feed(bytes); // read into a spare before a buffer came back
    return !this.waitingForBuffer;
  }

  /** Places bytes that were read elsewhere (held while every buffer was taken); what does not fit
   * once the buffers are all taken again is held again. */
  private feed(d: Buffer): void {
    while (d.length > 0 && !this.finished && !this.failed) {
      if (this.waitingForBuffer) {
        this.held.push(d);
        return;
      }
      const t = this.place();
      const k = Math.min(t.length, d.length);
      d.copy(t, 0, 0, k);
      d = d.subarray(k);
      this.advance(k);
    }
  }

  /** Accounts for n bytes placed where nextBuffer() said. */
  private advance(n: number): void {
    const c = this.cur;
    if (c) {
      c.got += n;
      if (c.got === c.length) this.complete(c);
      return;
    }
    this.headHave += n;
    if (this.headHave < this.headNeed) return;
    let data: boolean;
    try {
      data = this.header();
    } catch (e) {
      return this.fail(e as Error);
    }
    if (!data) return;
    if (this.free.length === 0 && this.holding < RECEIVE_SLOTS) {
      this.free.push(takeBuffer(this.maxChunkBytes));
      this.holding++;
    }
    if (this.free.length > 0) this.startChunk();
    else this.waitingForBuffer = true; // every buffer is being hashed or written
  }

  /** Reads the header gathered so far: true when a chunk's data follows, false when more header
   * bytes are needed (or the stream ended). */
  private header(): boolean {
    const tag = this.head.readUInt32LE(0);
    if (tag === END) {
      this.finished = true;
      this.wake?.();
      return false;
    }
    if (tag === ERROR) {
      if (this.headNeed === 4) {
        this.headNeed = 8;
        return false;
      }
      const n = Math.min(this.head.readUInt32LE(4), MAX_ERROR_BYTES);
      if (this.headNeed < 8 + n) {
        this.headNeed = 8 + n;
        return false;
      }
      throw new Error(this.head.subarray(8, 8 + n).toString("utf8"));
    }
    if (this.headNeed === 4) {
      this.headNeed = 40;
      return false;
    }
    const length = this.head.readUInt32LE(4);
    if (length > this.maxChunkBytes) throw new Error(`the coordinator announced a chunk of ${length} bytes (chunks are ${this.maxChunkBytes})`);
    return true;
  }

  private startChunk(): void {
    const buf = this.free.pop()!;
    this.cur = { index: this.head.readUInt32LE(0), digest: this.head.subarray(8, 40).toString("hex"), buf, length: this.head.readUInt32LE(4), got: 0 };
    this.headHave = 0;
    this.headNeed = 4;
    if (this.cur.length === 0) this.complete(this.cur);
  }

  private complete(c: NonNullable<ChunkReceiver["cur"]>): void {
    this.cur = undefined;
    let released = false;
    this.ready.push({
      index: c.index, digest: c.digest, data: c.buf.subarray(0, c.length),
      release: () => {
        if (released) return;
        released = true;
        if (this.closed) return giveBuffer(c.buf);
        this.free.push(c.buf);
        if (this.waitingForBuffer) this.unblock();
      },
    });
    this.wake?.();
  }

  /** A buffer came back: the waiting chunk starts, the records kept meanwhile are placed, and the
   * socket reads again (unless they filled every buffer once more). */
  private unblock(): void {
    this.waitingForBuffer = false;
    this.direct = false; // the socket's current read buffer is a spare, not the chunk's
    this.lastData = performance.now();
    this.startChunk();
    const held = this.held;
    this.held = [];
    for (const d of held) this.feed(d);
    if (!this.waitingForBuffer) this.socket?.resume();
  }
}
