// Chunk streams on the cluster port. gRPC's framing held a loopback fetch to a sixth of a plain
// socket's speed, and Node's TLS (16 KiB records, a copy into OpenSSL and a JS call for each) to
// about half: so a request is made inside the cluster's TLS (the coordinator tells it from gRPC by
// its ALPN name, trust/tls.ts), proving the join token bound to that connection (trust/token.ts
// chunkProof), and the chunks themselves come on a keyed stream: a second TCP connection to the same
// port, named by a one-time ticket the TLS connection carried, whose records are AES-256-GCM sealed
// under a key both ends export from that TLS session (trust/tls.ts chunkStreamKey). Only the two
// ends of the TLS connection know the key, so only the pinned coordinator can seal what the device
// opens, and nobody else can read it. A record is sealed and opened in place (native StreamSeal):
// the device reads each chunk's bytes straight into the buffer they are verified and written from.
//
//   on TLS, request:  CHUNK_MAGIC, u32 length, JSON { proof, info?: true, fingerprint, chunks: number[] }
//   on TLS, answer:   to info: u32 INFO, u32 length, JSON ModelDescription; then END
//                     to chunks: u32 STREAM, 16-byte ticket (then the TLS connection stays open, idle)
//                     refused: u32 ERROR, u32 length, UTF-8 message
//   keyed stream:     device: STREAM_MAGIC, the ticket
//                     coordinator: records, each a 40-byte header (authenticated, in clear: u32 tag,
//                     u32 body length, 32-byte BLAKE3 digest), the body (sealed), a 16-byte GCM tag.
//                     tag = the chunk's index; END (no body; authenticated, so a cut stream shows);
//                     ERROR (body: UTF-8 message). Each record's nonce is its place in the stream.
// All integers little-endian.
import type { Socket } from "node:net";
import type { StreamSeal } from "../native/index.js";
import { chunkBuffer } from "./cache.js";
import type { Chunk } from "./fetch.js";

export const CHUNK_MAGIC = Buffer.from("PRIMACHK");
/** The first bytes of a keyed stream (the cluster port tells it from TLS by them), then the ticket. */
export const STREAM_MAGIC = Buffer.from("PRIMASTR");
export const TICKET_BYTES = 16;
export const END = 0xffffffff;
export const ERROR = 0xfffffffe;
export const INFO = 0xfffffffd;
export const STREAM = 0xfffffffc;
/** A keyed stream record's header and GCM tag. */
export const RECORD_HEADER_BYTES = 40;
export const RECORD_TAG_BYTES = 16;
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

/** A keyed stream record's header (authenticated, not encrypted): what follows and how long it is. */
export function encodeRecordHeader(tag: number, bodyBytes: number, digestHex = ""): Buffer {
  const h = Buffer.alloc(RECORD_HEADER_BYTES);
  h.writeUInt32LE(tag, 0);
  h.writeUInt32LE(bodyBytes, 4);
  if (digestHex) h.write(digestHex, 8, "hex");
  return h;
}

/**
 * Seals one record in place and returns its parts to write in order (header, body, tag). The body is
 * encrypted where it lies: the caller must not use its bytes afterwards.
 */
export function sealRecord(seal: StreamSeal, tag: number, body: Buffer, digestHex = ""): [Buffer, Buffer, Buffer] {
  const header = encodeRecordHeader(tag, body.length, digestHex);
  const mac = Buffer.alloc(RECORD_TAG_BYTES);
  seal.seal(header, body, mac);
  return [header, body, mac];
}

/** A sealed ERROR record (the coordinator's reason for ending the stream), parts as sealRecord's. */
export function sealError(seal: StreamSeal, message: string): [Buffer, Buffer, Buffer] {
  return sealRecord(seal, ERROR, errorBytes(message));
}

/** A sealed END record: the stream is complete (authenticated, so a cut stream shows). */
export function sealEnd(seal: StreamSeal): [Buffer, Buffer, Buffer] {
  return sealRecord(seal, END, Buffer.alloc(0));
}

/** The TLS answer to a chunk request: go to the keyed stream with this ticket. */
export function encodeStreamTicket(ticket: Buffer): Buffer {
  const b = Buffer.alloc(4 + TICKET_BYTES);
  b.writeUInt32LE(STREAM, 0);
  ticket.copy(b, 4);
  return b;
}

function encodeEnd(): Buffer {
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

/** An error message as sent (on TLS or in a sealed ERROR record): UTF-8, at most MAX_ERROR_BYTES. */
function errorBytes(message: string): Buffer {
  return Buffer.from(message).subarray(0, MAX_ERROR_BYTES);
}

export function encodeError(message: string): Buffer {
  const m = errorBytes(message);
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

/** The first word of the coordinator's answer on TLS; its ERROR thrown with the message. */
async function answerTag(r: Reader): Promise<number> {
  const tag = (await r.take(4)).readUInt32LE(0);
  if (tag !== ERROR) return tag;
  const n = Math.min((await r.take(4)).readUInt32LE(0), MAX_ERROR_BYTES);
  throw new Error((await r.take(n)).toString("utf8"));
}

/** The device's side: the ticket of its keyed stream (or the coordinator's refusal, thrown). */
export async function readTicket(socket: Socket, timeoutMs: number): Promise<Buffer> {
  const r = new Reader(socket, timeoutMs);
  const head = await answerTag(r);
  if (head !== STREAM) throw new Error("the coordinator did not answer the chunk request");
  return Buffer.from(await r.take(TICKET_BYTES));
}

/** The device's side: the answer to an info request. */
export async function readInfo(socket: Socket, timeoutMs: number): Promise<unknown> {
  const r = new Reader(socket, timeoutMs);
  const head = await answerTag(r);
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

/** Where bytes go while every chunk buffer is taken (the socket is paused, but what it had already
 * read is handed over). */
const SPILL_BYTES = 64 << 10;

type Phase = "head" | "body" | "mac";

/**
 * The device's side of a keyed stream: the chunks as they arrive. The socket must be created with
 * `onread` (net's user-buffer reads): the kernel copies each read straight into the buffer this names
 * next, which is the current chunk's buffer at its fill point (or the header's, or the tag's), and
 * each record is opened (decrypted and authenticated) in place once its tag is in. Chunk buffers are
 * shared memory, so the hashing thread reads them in place. A chunk's `release` gives its buffer
 * back; with every buffer taken the socket is paused, so memory stays bounded however slow the disk.
 */
export class ChunkReceiver {
  /** For the socket's options (net.connect's `onread`). */
  readonly onread = { buffer: () => this.nextBuffer(), callback: (n: number) => this.received(n) };
  /** Chunk buffers this stream holds and is not filling, and how many it has in all. */
  private readonly free: Buffer[] = [];
  private holding = 0;
  private closed = false;
  private readonly ready: Chunk[] = [];
  private failed: Error | undefined;
  private finished = false;
  private wake: (() => void) | undefined;
  // The record being read: its header (and an ERROR's message after it), its body, its GCM tag.
  private readonly head = Buffer.alloc(RECORD_HEADER_BYTES + MAX_ERROR_BYTES);
  private readonly mac = Buffer.alloc(RECORD_TAG_BYTES);
  private phase: Phase = "head";
  private have = 0;
  private body: Buffer = this.head.subarray(RECORD_HEADER_BYTES, RECORD_HEADER_BYTES);
  private cur: { index: number; digest: string; buf: Buffer; length: number } | undefined;
  /** The socket's current read buffer, and whether it is where the next bytes belong. */
  private target: Buffer | undefined;
  private direct = false;
  /** Reads that came while no chunk buffer was free, kept until one is. */
  private held: Buffer[] = [];
  private waitingForBuffer = false;
  private lastData = performance.now();
  private socket: Socket | undefined;
  private stall: NodeJS.Timeout | undefined;
  private readonly onEnd = () => this.fail(new Error("the connection ended"));
  private readonly onClose = () => this.fail(new Error("the connection closed"));
  private readonly onError = (e: Error) => this.fail(e);

  constructor(private readonly maxChunkBytes: number, private readonly timeoutMs: number, private readonly opener: StreamSeal) {}

  /** Starts watching the socket (created with this.onread) for its end and for silence. */
  attach(socket: Socket): void {
    this.socket = socket;
    socket.on("end", this.onEnd).on("close", this.onClose).on("error", this.onError);
    // One timer for the stream, not one per wait: reads arrive every few microseconds. Time spent
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
      if (this.cur) giveBuffer(this.cur.buf);
      this.cur = undefined;
      clearInterval(this.stall);
      this.opener.close();
      this.socket?.off("end", this.onEnd).off("close", this.onClose).off("error", this.onError);
    }
  }

  private fail(e: Error): void {
    if (!this.finished) this.failed ??= e;
    this.wake?.();
  }

  /** Where the next bytes belong: exactly what the header, the body or the tag still lacks, so a
   * read never spans two of them. */
  private place(): Buffer {
    if (this.phase === "head") return this.head.subarray(this.have, RECORD_HEADER_BYTES);
    if (this.phase === "body") return this.body.subarray(this.have);
    return this.mac.subarray(this.have);
  }

  /** The socket's next read buffer (net calls this after every read). While no chunk buffer is
   * free, a spare one whose bytes are kept for later. */
  private nextBuffer(): Buffer {
    // Once the consumer is gone its buffers may serve another stream: nothing lands in them then.
    this.direct = !this.closed && !this.waitingForBuffer && !this.finished && !this.failed;
    this.target = this.direct ? this.place() : Buffer.allocUnsafe(SPILL_BYTES);
    return this.target;
  }

  /** n bytes were read into this.target; false pauses the socket. */
  private received(n: number): boolean {
    this.lastData = performance.now();
    const bytes = this.target!.subarray(0, n);
    if (this.closed || this.finished || this.failed) return true; // nothing more is read from this stream
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

  /** Accounts for n bytes placed where nextBuffer() said, and moves on when a part is complete. */
  private advance(n: number): void {
    this.have += n;
    if (this.place().length > 0) return;
    this.have = 0;
    try {
      if (this.phase === "head") this.header();
      else if (this.phase === "body") this.phase = "mac";
      else this.record();
    } catch (e) {
      this.fail(e as Error);
    }
  }

  /** A record's header is in: where its body goes. */
  private header(): void {
    const tag = this.head.readUInt32LE(0), length = this.head.readUInt32LE(4);
    this.phase = "body";
    if (tag === END || tag === ERROR) {
      if (tag === END ? length !== 0 : length > MAX_ERROR_BYTES) throw new Error(`the coordinator sent a malformed ${tag === END ? "END" : "ERROR"} record`);
      this.body = this.head.subarray(RECORD_HEADER_BYTES, RECORD_HEADER_BYTES + length);
      if (length === 0) this.phase = "mac";
      return;
    }
    if (length > this.maxChunkBytes) throw new Error(`the coordinator announced a chunk of ${length} bytes (chunks are ${this.maxChunkBytes})`);
    if (this.free.length === 0 && this.holding < RECEIVE_SLOTS) {
      this.free.push(takeBuffer(this.maxChunkBytes));
      this.holding++;
    }
    if (this.free.length > 0) this.startChunk();
    else this.waitingForBuffer = true; // every buffer is being hashed or written
  }

  private startChunk(): void {
    const buf = this.free.pop()!;
    const length = this.head.readUInt32LE(4);
    this.cur = { index: this.head.readUInt32LE(0), digest: this.head.subarray(8, 40).toString("hex"), buf, length };
    this.body = buf.subarray(0, length);
    if (length === 0) this.phase = "mac";
  }

  /** A whole record is in: opened in place, then a chunk, the end, or the coordinator's error. */
  private record(): void {
    this.phase = "head";
    if (!this.opener.open(this.head.subarray(0, RECORD_HEADER_BYTES), this.body, this.mac)) {
      throw new Error("a record of the chunk stream failed authentication (corrupted or forged in transit)");
    }
    const tag = this.head.readUInt32LE(0);
    if (tag === END) {
      this.finished = true;
      this.wake?.();
    } else if (tag === ERROR) {
      throw new Error(this.body.toString("utf8"));
    } else {
      this.complete(this.cur!);
    }
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

  /** A buffer came back: the waiting chunk starts, the reads kept meanwhile are placed, and the
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
