// The frame codec: a 32-byte little-endian header (DESIGN.md, "The two planes") and a payload.
//
//   0-3 magic "PRMA"   4-5 header version   6-7 frame type   8-11 request id
//   12-15 position of the first token   16-17 number of tokens   18-19 cycle
//   20-21 payload dtype (0 f32, 1 f16)   22-23 reserved, zero   24-27 row width   28-31 payload bytes
//
// Frame types: HELLO (handshake, JSON), ACTIVATIONS (nTokens x rowWidth rows), ERROR (why a request
// failed, UTF-8 text), KV_SHIFT (a context shift), SEQ_ACTIVATIONS (rows of several sequences: a tag
// per row, u32 slot and u32 position, then the rows; the position field is 0), H2O_SCORES (H2O's
// statistics: an f32 per position held, their count in the row width field). decodeFrame validates the whole header (validation.ts) before it reads a
// payload byte, and returns f32 rows as a view on the received buffer when it is 4-byte aligned.
import { FrameError } from "./errors.js";
import { f16ToF32, f32ToF16 } from "./f16.js";
import {
  CONTROL_PAYLOAD_MAX_BYTES, FRAME_HEADER_BYTES, FRAME_HEADER_VERSION, FRAME_MAGIC_BYTES, FrameTypeId, H2O_SCORE_BYTES, KV_SHIFT_PAYLOAD_BYTES, KV_SHIFT_SLOT_PAYLOAD_BYTES, PAYLOAD_DTYPE_BYTES,
  PayloadDtypeId, SEQ_TAG_BYTES, SEQ_TAG_MAX, U16_MAX, U32_MAX, validateHeader, validateHello,
  type FrameHeader, type FrameLimits, type Hello, type PayloadDtype,
} from "./validation.js";
import { HeaderField as F } from "./wire.js";

// Typed-array views below assume the host's byte order is the wire's.
if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) {
  throw new Error("prima ring: big-endian hosts are not supported (frames are little-endian)");
}

export interface HelloFrame {
  type: "hello";
  hello: Hello;
}

export interface ActivationsFrame {
  type: "activations";
  /** Which generation request the rows belong to. */
  requestId: number;
  /** Position in the sequence of the first row's token. */
  firstTokenPosition: number;
  nTokens: number;
  /** Which pass around the ring (piped-ring cycle) the rows are in. */
  cycle: number;
  /** Floats per row: the model's hidden size. */
  rowWidth: number;
  /** Wire dtype: f16 halves the bytes (rounded, as ggml); decoding always gives floats. */
  dtype: PayloadDtype;
  /** nTokens x rowWidth floats, row-major. */
  activations: Float32Array;
}

export interface ErrorFrame {
  type: "error";
  requestId: number;
  /** The batch that failed (0 when the failure is not about one batch). */
  firstTokenPosition: number;
  nTokens: number;
  cycle: number;
  /** What went wrong, for a person (at most 64 KiB of UTF-8; longer text is cut when encoding). */
  message: string;
}

/** Context shift (engine Pipeline.shift): every device drops positions [p0, p0 + nDiscard) of its
 * windows' caches and moves [p0 + nDiscard, nPast) down, re-rotating the keys. It goes round the ring
 * in order with the activations, once: each device shifts all its windows and passes it on. With a
 * slot, only that sequence slot's windows (serve --parallel). */
export interface KvShiftFrame {
  type: "kvShift";
  requestId: number;
  p0: number;
  nDiscard: number;
  nPast: number;
  slot?: number;
}

/** Rows of several sequences (serve --parallel on a ring): row i is at position positions[i] of
 * sequence slot slots[i], whose KV cache each device holds for its windows. */
export interface SeqActivationsFrame {
  type: "seqActivations";
  requestId: number;
  nTokens: number;
  cycle: number;
  rowWidth: number;
  dtype: PayloadDtype;
  slots: Int32Array;
  positions: Int32Array;
  activations: Float32Array;
}

/** H2O's statistics gathered round the ring (--kv-evict h2o, engine/h2o.ts): the head sends zeros for
 * the positions its cache holds; each device adds what its windows' layers gathered (the attention
 * each position received, summed over queries and heads) and passes the frame on; back at the head,
 * after its own windows', the sums are the whole model's. Every score is finite and >= 0. */
export interface H2oScoresFrame {
  type: "h2oScores";
  requestId: number;
  scores: Float32Array;
}

export type Frame = HelloFrame | ActivationsFrame | ErrorFrame | KvShiftFrame | SeqActivationsFrame | H2oScoresFrame;

const utf8Encoder = new TextEncoder();
const utf8Decoder = new TextDecoder("utf-8", { fatal: true });

function checkUint(field: string, value: number, max: number): void {
  if (!Number.isInteger(value) || value < 0 || value > max) {
    throw new FrameError(field, `${field} ${value} is not an integer in 0..${max}`);
  }
}

function writeHeader(buf: Uint8Array, h: Omit<FrameHeader, "magic" | "headerVersion" | "reserved">): void {
  const v = new DataView(buf.buffer, buf.byteOffset, FRAME_HEADER_BYTES);
  buf.set(FRAME_MAGIC_BYTES, 0);
  v.setUint16(F.headerVersion, FRAME_HEADER_VERSION, true);
  v.setUint16(F.frameType, h.frameType, true);
  v.setUint32(F.requestId, h.requestId, true);
  v.setUint32(F.firstTokenPosition, h.firstTokenPosition, true);
  v.setUint16(F.nTokens, h.nTokens, true);
  v.setUint16(F.cycle, h.cycle, true);
  v.setUint16(F.payloadDtype, h.payloadDtype, true);
  v.setUint16(F.reserved, 0, true);
  v.setUint32(F.rowWidth, h.rowWidth, true);
  v.setUint32(F.payloadBytes, h.payloadBytes, true);
}

/** Reads the 32 header bytes as numbers (no checks; validateHeader does those). */
export function readFrameHeader(buf: Uint8Array): FrameHeader {
  if (buf.length < FRAME_HEADER_BYTES) {
    throw new FrameError("header", `${buf.length} bytes is shorter than the ${FRAME_HEADER_BYTES}-byte header`);
  }
  const v = new DataView(buf.buffer, buf.byteOffset, FRAME_HEADER_BYTES);
  return {
    magic: buf.subarray(0, 4),
    headerVersion: v.getUint16(F.headerVersion, true),
    frameType: v.getUint16(F.frameType, true),
    requestId: v.getUint32(F.requestId, true),
    firstTokenPosition: v.getUint32(F.firstTokenPosition, true),
    nTokens: v.getUint16(F.nTokens, true),
    cycle: v.getUint16(F.cycle, true),
    payloadDtype: v.getUint16(F.payloadDtype, true),
    reserved: v.getUint16(F.reserved, true),
    rowWidth: v.getUint32(F.rowWidth, true),
    payloadBytes: v.getUint32(F.payloadBytes, true),
  };
}

/** A fresh frame buffer (own ArrayBuffer at offset 0, so the payload at 32 is aligned for any view). */
function allocFrame(payloadBytes: number): Buffer {
  return Buffer.allocUnsafeSlow(FRAME_HEADER_BYTES + payloadBytes);
}

/** Cuts text to at most maxBytes of UTF-8 without splitting a character. */
function utf8Within(text: string, maxBytes: number): Uint8Array {
  const bytes = utf8Encoder.encode(text);
  if (bytes.length <= maxBytes) return bytes;
  let end = maxBytes;
  while (end > 0 && (bytes[end] & 0xc0) === 0x80) end--; // step back to a character boundary
  return bytes.subarray(0, end);
}

/** The header fields an error frame shares with the activations it stands for. */
function checkRowsHeader(frame: { requestId: number; firstTokenPosition: number; nTokens: number; cycle: number }): void {
  checkUint("request id", frame.requestId, U32_MAX);
  checkUint("position", frame.firstTokenPosition, U32_MAX);
  checkUint("number of tokens", frame.nTokens, U16_MAX);
  checkUint("cycle", frame.cycle, U16_MAX);
}

/**
 * Encodes a frame: header + payload in one new buffer (the activations are copied or converted, so
 * the caller may reuse its array as soon as this returns). Throws FrameError for a field out of its
 * wire range or rows that do not match nTokens x rowWidth.
 */
export function encodeFrame(frame: Frame): Buffer {
  switch (frame.type) {
    case "hello": {
      const hello = validateHello(frame.hello); // never send what a peer would refuse to parse
      const json = utf8Encoder.encode(JSON.stringify(hello));
      if (json.length > CONTROL_PAYLOAD_MAX_BYTES) {
        throw new FrameError("payload", `hello payload of ${json.length} bytes exceeds ${CONTROL_PAYLOAD_MAX_BYTES}`);
      }
      const buf = allocFrame(json.length);
      writeHeader(buf, {
        frameType: FrameTypeId.hello, requestId: 0, firstTokenPosition: 0, nTokens: 0, cycle: 0,
        payloadDtype: 0, rowWidth: 0, payloadBytes: json.length,
      });
      buf.set(json, FRAME_HEADER_BYTES);
      return buf;
    }
    case "error": {
      checkRowsHeader(frame);
      const text = utf8Within(String(frame.message), CONTROL_PAYLOAD_MAX_BYTES);
      const buf = allocFrame(text.length);
      writeHeader(buf, {
        frameType: FrameTypeId.error, requestId: frame.requestId, firstTokenPosition: frame.firstTokenPosition,
        nTokens: frame.nTokens, cycle: frame.cycle, payloadDtype: 0, rowWidth: 0, payloadBytes: text.length,
      });
      buf.set(text, FRAME_HEADER_BYTES);
      return buf;
    }
    case "activations": {
      checkRowsHeader(frame);
      checkUint("row width", frame.rowWidth, U32_MAX);
      if (frame.nTokens === 0) throw new FrameError("number of tokens", "an activations frame with 0 tokens");
      if (frame.firstTokenPosition + frame.nTokens > U32_MAX) {
        throw new FrameError("position", `position ${frame.firstTokenPosition} + ${frame.nTokens} tokens is past the u32 range`);
      }
      const dtypeBytes = PAYLOAD_DTYPE_BYTES[frame.dtype];
      if (dtypeBytes === undefined) throw new FrameError("payload dtype", `payload dtype ${String(frame.dtype)} is unknown (f32, f16)`);
      const values = frame.nTokens * frame.rowWidth;
      if (!(frame.activations instanceof Float32Array) || frame.activations.length !== values) {
        throw new FrameError("payload",
          `activations hold ${frame.activations?.length} floats, not ${frame.nTokens} tokens x row width ${frame.rowWidth} = ${values}`);
      }
      const payloadBytes = values * dtypeBytes;
      if (payloadBytes > U32_MAX) throw new FrameError("payload length", `payload of ${payloadBytes} bytes exceeds the u32 range`);
      const buf = allocFrame(payloadBytes);
      writeHeader(buf, {
        frameType: FrameTypeId.activations, requestId: frame.requestId, firstTokenPosition: frame.firstTokenPosition,
        nTokens: frame.nTokens, cycle: frame.cycle, payloadDtype: PayloadDtypeId[frame.dtype], rowWidth: frame.rowWidth,
        payloadBytes,
      });
      const at = buf.byteOffset + FRAME_HEADER_BYTES;
      if (frame.dtype === "f32") new Float32Array(buf.buffer, at, values).set(frame.activations);
      else f32ToF16(frame.activations, new Uint16Array(buf.buffer, at, values));
      return buf;
    }
    case "seqActivations": {
      checkUint("request id", frame.requestId, U32_MAX);
      checkUint("number of tokens", frame.nTokens, U16_MAX);
      checkUint("cycle", frame.cycle, U16_MAX);
      checkUint("row width", frame.rowWidth, U32_MAX);
      if (frame.nTokens === 0) throw new FrameError("number of tokens", "a seqActivations frame with 0 rows");
      const dtypeBytes = PAYLOAD_DTYPE_BYTES[frame.dtype];
      if (dtypeBytes === undefined) throw new FrameError("payload dtype", `payload dtype ${String(frame.dtype)} is unknown (f32, f16)`);
      const n = frame.nTokens, values = n * frame.rowWidth;
      if (frame.slots?.length !== n || frame.positions?.length !== n) throw new FrameError("payload", `a seqActivations frame needs one slot and one position per row (${n})`);
      for (let i = 0; i < n; i++) {
        checkUint("slot", frame.slots[i], SEQ_TAG_MAX);
        checkUint("position", frame.positions[i], SEQ_TAG_MAX - 1);
      }
      if (!(frame.activations instanceof Float32Array) || frame.activations.length !== values) {
        throw new FrameError("payload", `activations hold ${frame.activations?.length} floats, not ${n} rows x row width ${frame.rowWidth} = ${values}`);
      }
      const payloadBytes = n * SEQ_TAG_BYTES + values * dtypeBytes;
      if (payloadBytes > U32_MAX) throw new FrameError("payload length", `payload of ${payloadBytes} bytes exceeds the u32 range`);
      const buf = allocFrame(payloadBytes);
      writeHeader(buf, {
        frameType: FrameTypeId.seqActivations, requestId: frame.requestId, firstTokenPosition: 0, nTokens: n, cycle: frame.cycle,
        payloadDtype: PayloadDtypeId[frame.dtype], rowWidth: frame.rowWidth, payloadBytes,
      });
      const tags = new DataView(buf.buffer, buf.byteOffset + FRAME_HEADER_BYTES, n * SEQ_TAG_BYTES);
      for (let i = 0; i < n; i++) {
        tags.setUint32(i * SEQ_TAG_BYTES, frame.slots[i], true);
        tags.setUint32(i * SEQ_TAG_BYTES + 4, frame.positions[i], true);
      }
      const at = buf.byteOffset + FRAME_HEADER_BYTES + n * SEQ_TAG_BYTES;
      if (frame.dtype === "f32") new Float32Array(buf.buffer, at, values).set(frame.activations);
      else f32ToF16(frame.activations, new Uint16Array(buf.buffer, at, values));
      return buf;
    }
    case "kvShift": {
      checkUint("request id", frame.requestId, U32_MAX);
      checkUint("position", frame.p0, U32_MAX);
      checkUint("tokens discarded", frame.nDiscard, U32_MAX);
      checkUint("positions held", frame.nPast, U32_MAX);
      if (frame.slot !== undefined) checkUint("sequence slot", frame.slot, SEQ_TAG_MAX);
      const bytes = frame.slot === undefined ? KV_SHIFT_PAYLOAD_BYTES : KV_SHIFT_SLOT_PAYLOAD_BYTES;
      const buf = allocFrame(bytes);
      writeHeader(buf, {
        frameType: FrameTypeId.kvShift, requestId: frame.requestId, firstTokenPosition: frame.p0, nTokens: 0, cycle: 0,
        payloadDtype: 0, rowWidth: 0, payloadBytes: bytes,
      });
      const v = new DataView(buf.buffer, buf.byteOffset + FRAME_HEADER_BYTES, bytes);
      v.setUint32(0, frame.nDiscard, true);
      v.setUint32(4, frame.nPast, true);
      if (frame.slot !== undefined) v.setUint32(8, frame.slot, true);
      return buf;
    }
    case "h2oScores": {
      checkUint("request id", frame.requestId, U32_MAX);
      const n = frame.scores?.length ?? 0;
      if (!(frame.scores instanceof Float32Array) || n === 0) throw new FrameError("payload", "an h2oScores frame needs a Float32Array of at least one position's score");
      checkUint("positions", n, U32_MAX / H2O_SCORE_BYTES);
      const buf = allocFrame(n * H2O_SCORE_BYTES);
      writeHeader(buf, {
        frameType: FrameTypeId.h2oScores, requestId: frame.requestId, firstTokenPosition: 0, nTokens: 0, cycle: 0,
        payloadDtype: 0, rowWidth: n, payloadBytes: n * H2O_SCORE_BYTES,
      });
      new Float32Array(buf.buffer, buf.byteOffset + FRAME_HEADER_BYTES, n).set(frame.scores);
      return buf;
    }
    default:
      throw new FrameError("frame type", `cannot encode frame type ${String((frame as { type: unknown }).type)}`);
  }
}

function decodeText(field: string, bytes: Uint8Array): string {
  try {
    return utf8Decoder.decode(bytes);
  } catch {
    throw new FrameError(field, `${field} is not valid UTF-8`);
  }
}

/** The payload's floats: a view when the bytes are 4-aligned, else a copy. */
function floatsAt(buf: Uint8Array, offset: number, count: number): Float32Array {
  const at = buf.byteOffset + offset;
  if (at % 4 === 0) return new Float32Array(buf.buffer, at, count);
  const out = new Float32Array(count);
  new Uint8Array(out.buffer).set(buf.subarray(offset, offset + count * 4));
  return out;
}

function halvesAt(buf: Uint8Array, offset: number, count: number): Uint16Array {
  const at = buf.byteOffset + offset;
  if (at % 2 === 0) return new Uint16Array(buf.buffer, at, count);
  const out = new Uint16Array(count);
  new Uint8Array(out.buffer).set(buf.subarray(offset, offset + count * 2));
  return out;
}

/**
 * Decodes one frame after checking every header field against the others, the buffer length and
 * `limits`. Throws FrameError (and nothing else) for any bad input. f32 rows are a view on `buf`
 * when aligned (keep `buf` unmodified while you use them); f16 rows are converted into a new array.
 */
export function decodeFrame(buf: Uint8Array, limits: FrameLimits): Frame {
  if (!(buf instanceof Uint8Array)) throw new FrameError("buffer", "a frame must be binary bytes");
  const header = readFrameHeader(buf);
  const { type, dtype } = validateHeader(header, buf.length, limits);
  const payload = buf.subarray(FRAME_HEADER_BYTES);
  switch (type) {
    case "hello": {
      const text = decodeText("hello payload", payload);
      let parsed: unknown;
      try {
        parsed = JSON.parse(text);
      } catch (e) {
        throw new FrameError("hello", `hello payload is not JSON (${(e as Error).message})`);
      }
      return { type, hello: validateHello(parsed) };
    }
    case "error":
      return {
        type, requestId: header.requestId, firstTokenPosition: header.firstTokenPosition, nTokens: header.nTokens,
        cycle: header.cycle, message: decodeText("error message", payload),
      };
    case "activations": {
      const values = header.nTokens * header.rowWidth;
      const activations = dtype === "f32"
        ? floatsAt(buf, FRAME_HEADER_BYTES, values)
        : f16ToF32(halvesAt(buf, FRAME_HEADER_BYTES, values));
      return {
        type, requestId: header.requestId, firstTokenPosition: header.firstTokenPosition, nTokens: header.nTokens,
        cycle: header.cycle, rowWidth: header.rowWidth, dtype, activations,
      };
    }
    case "seqActivations": {
      const n = header.nTokens, values = n * header.rowWidth;
      const tags = new DataView(buf.buffer, buf.byteOffset + FRAME_HEADER_BYTES, n * SEQ_TAG_BYTES);
      const slots = new Int32Array(n), positions = new Int32Array(n);
      for (let i = 0; i < n; i++) {
        const slot = tags.getUint32(i * SEQ_TAG_BYTES, true), pos = tags.getUint32(i * SEQ_TAG_BYTES + 4, true);
        if (slot > SEQ_TAG_MAX || pos >= SEQ_TAG_MAX) throw new FrameError("payload", `row ${i}'s slot ${slot} or position ${pos} is out of range`);
        slots[i] = slot;
        positions[i] = pos;
      }
      const at = FRAME_HEADER_BYTES + n * SEQ_TAG_BYTES;
      const activations = dtype === "f32" ? floatsAt(buf, at, values) : f16ToF32(halvesAt(buf, at, values));
      return { type, requestId: header.requestId, nTokens: n, cycle: header.cycle, rowWidth: header.rowWidth, dtype, slots, positions, activations };
    }
    case "kvShift": {
      const v = new DataView(buf.buffer, buf.byteOffset + FRAME_HEADER_BYTES, header.payloadBytes);
      const nDiscard = v.getUint32(0, true), nPast = v.getUint32(4, true);
      if (nDiscard === 0 || header.firstTokenPosition + nDiscard > nPast) {
        throw new FrameError("payload", `a kv shift of ${nDiscard} tokens from position ${header.firstTokenPosition} out of ${nPast} is not a range of the cache`);
      }
      const shift: KvShiftFrame = { type, requestId: header.requestId, p0: header.firstTokenPosition, nDiscard, nPast };
      if (header.payloadBytes === KV_SHIFT_SLOT_PAYLOAD_BYTES) {
        const slot = v.getUint32(8, true);
        if (slot > SEQ_TAG_MAX) throw new FrameError("payload", `a kv shift's sequence slot ${slot} is out of range`);
        shift.slot = slot;
      }
      return shift;
    }
    case "h2oScores": {
      // a copy: each device adds to the scores before passing them on
      const scores = floatsAt(buf, FRAME_HEADER_BYTES, header.rowWidth).slice();
      const bad = scores.findIndex((x) => !(x >= 0 && x < Infinity));
      if (bad >= 0) throw new FrameError("payload", `position ${bad}'s H2O score ${scores[bad]} is not a finite count >= 0`);
      return { type, requestId: header.requestId, scores };
    }
  }
}
