// Every check the codec makes, in one place: a frame header against itself, against the buffer that
// carried it and against the link's limits (before any payload byte is read), and a HELLO payload's
// JSON. Each failure is a FrameError naming the field. Pure functions, no I/O.
import { FrameError } from "./errors.js";
import {
  CONTROL_PAYLOAD_MAX_BYTES, FRAME_HEADER_BYTES, FRAME_HEADER_VERSION, FRAME_MAGIC, FrameTypeId, H2O_SCORE_BYTES, KV_SHIFT_PAYLOAD_BYTES,
  KV_SHIFT_SLOT_PAYLOAD_BYTES, PAYLOAD_DTYPE_BYTES, PayloadDtypeId, SEQ_TAG_BYTES, U16_MAX, U32_MAX,
} from "./wire.js";

/** Header fields as read from the wire (numbers, not yet trusted). */
export interface FrameHeader {
  magic: Uint8Array;
  headerVersion: number;
  frameType: number;
  requestId: number;
  firstTokenPosition: number;
  nTokens: number;
  cycle: number;
  payloadDtype: number;
  reserved: number;
  rowWidth: number;
  payloadBytes: number;
}

/** What one side of a link accepts; the decoder refuses anything outside it. */
export interface FrameLimits {
  /** The model's hidden size: every activation row is this wide. */
  hiddenSize: number;
  /** Most tokens one ACTIVATIONS frame may carry (at most 65535, the header field's range). */
  maxTokensPerFrame: number;
  /** Most payload bytes one ACTIVATIONS frame may carry. */
  maxPayloadBytes: number;
}

/** The peer-facing identity and limits each side sends in its HELLO. */
export interface Hello {
  /** Ring protocol version (PROTOCOL_VERSION); both sides must speak the same. */
  protocolVersion: number;
  deviceId: string;
  /** Identifies the model file (e.g. a hash of the GGUF's tensor table); both sides must agree. */
  modelFingerprint: string;
  hiddenSize: number;
  /** The ring session: a device of an old or another ring must not feed this one. */
  ringId: string;
  /** The sender's receive limits, so its peer can refuse an oversized frame locally, with a clear error. */
  maxTokensPerFrame: number;
  maxPayloadBytes: number;
}

export {
  CONTROL_PAYLOAD_MAX_BYTES, FRAME_HEADER_BYTES, FRAME_HEADER_VERSION, FRAME_MAGIC, FrameTypeId, H2O_SCORE_BYTES, KV_SHIFT_PAYLOAD_BYTES, KV_SHIFT_SLOT_PAYLOAD_BYTES,
  PAYLOAD_DTYPE_BYTES, PROTOCOL_VERSION, PayloadDtypeId, SEQ_TAG_BYTES, SEQ_TAG_MAX, U16_MAX, U32_MAX,
} from "./wire.js";
export const FRAME_MAGIC_BYTES: Uint8Array = new TextEncoder().encode(FRAME_MAGIC);
export type FrameTypeName = keyof typeof FrameTypeId;
export type PayloadDtype = keyof typeof PayloadDtypeId;

export function frameTypeName(id: number): FrameTypeName | undefined {
  return (Object.keys(FrameTypeId) as FrameTypeName[]).find((k) => FrameTypeId[k] === id);
}

/** Most positions one H2O_SCORES frame carries: its payload is bounded as a control frame's or an
 * activations frame's, whichever is larger (the link's message limit already allows both). */
export function maxH2oPositions(limits: FrameLimits): number {
  return Math.floor(Math.max(limits.maxPayloadBytes, CONTROL_PAYLOAD_MAX_BYTES) / H2O_SCORE_BYTES);
}

export function payloadDtypeName(id: number): PayloadDtype | undefined {
  return id === 0 ? "f32" : id === 1 ? "f16" : undefined;
}

function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => `0x${b.toString(16).padStart(2, "0")}`).join(" ");
}

function mustBeZero(type: FrameTypeName, field: string, value: number): void {
  if (value !== 0) throw new FrameError(field, `a ${type} frame must have ${field} 0, got ${value}`);
}

/**
 * Checks a header against itself, the buffer length and the limits; returns the frame's type and
 * dtype names. Reads nothing past the header.
 */
export function validateHeader(h: FrameHeader, bufferBytes: number, limits: FrameLimits): {
  type: FrameTypeName;
  dtype: PayloadDtype;
} {
  for (let i = 0; i < 4; i++) {
    if (h.magic[i] !== FRAME_MAGIC_BYTES[i]) {
      throw new FrameError("magic", `magic bytes ${hex(h.magic)} are not "${FRAME_MAGIC}"; not a prima frame`);
    }
  }
  if (h.headerVersion !== FRAME_HEADER_VERSION) {
    throw new FrameError("header version",
      `header version ${h.headerVersion} is not supported (this build reads version ${FRAME_HEADER_VERSION})`);
  }
  const type = frameTypeName(h.frameType);
  if (type === undefined) {
    throw new FrameError("frame type", `frame type ${h.frameType} is unknown (${Object.entries(FrameTypeId).map(([k, v]) => `${v} ${k}`).join(", ")})`);
  }
  const dtype = payloadDtypeName(h.payloadDtype);
  if (dtype === undefined) {
    throw new FrameError("payload dtype", `payload dtype ${h.payloadDtype} is unknown (0 f32, 1 f16)`);
  }
  if (h.reserved !== 0) {
    throw new FrameError("reserved", `reserved bytes 22-23 hold ${h.reserved}, expected 0`);
  }
  const payloadInBuffer = bufferBytes - FRAME_HEADER_BYTES;
  if (payloadInBuffer !== h.payloadBytes) {
    throw new FrameError("payload length",
      `the header declares ${h.payloadBytes} payload bytes but ${payloadInBuffer} follow it` +
      (payloadInBuffer < h.payloadBytes ? " (truncated frame)" : " (trailing bytes)"));
  }

  if (type === "activations") {
    if (h.rowWidth !== limits.hiddenSize) {
      throw new FrameError("row width", `row width ${h.rowWidth} does not match the model's hidden size ${limits.hiddenSize}`);
    }
    if (h.nTokens === 0) throw new FrameError("number of tokens", "an activations frame with 0 tokens");
    if (h.nTokens > limits.maxTokensPerFrame) {
      throw new FrameError("number of tokens",
        `number of tokens ${h.nTokens} exceeds this link's limit of ${limits.maxTokensPerFrame} per frame`);
    }
    if (h.firstTokenPosition + h.nTokens > U32_MAX) {
      throw new FrameError("position", `position ${h.firstTokenPosition} + ${h.nTokens} tokens is past the u32 range`);
    }
    const expected = h.nTokens * h.rowWidth * PAYLOAD_DTYPE_BYTES[dtype];
    if (h.payloadBytes !== expected) {
      throw new FrameError("payload length",
        `payload length ${h.payloadBytes} is not ${h.nTokens} tokens x row width ${h.rowWidth} x ` +
        `${PAYLOAD_DTYPE_BYTES[dtype]} bytes (${dtype}) = ${expected}`);
    }
    if (h.payloadBytes > limits.maxPayloadBytes) {
      throw new FrameError("payload length",
        `payload length ${h.payloadBytes} exceeds this link's limit of ${limits.maxPayloadBytes} bytes`);
    }
  } else if (type === "seqActivations") {
    // rows of several sequences, each tagged with its slot and position (the payload's first bytes)
    mustBeZero(type, "position", h.firstTokenPosition);
    if (h.rowWidth !== limits.hiddenSize) {
      throw new FrameError("row width", `row width ${h.rowWidth} does not match the model's hidden size ${limits.hiddenSize}`);
    }
    if (h.nTokens === 0) throw new FrameError("number of tokens", "a seqActivations frame with 0 rows");
    if (h.nTokens > limits.maxTokensPerFrame) {
      throw new FrameError("number of tokens", `number of rows ${h.nTokens} exceeds this link's limit of ${limits.maxTokensPerFrame} per frame`);
    }
    const expected = h.nTokens * (SEQ_TAG_BYTES + h.rowWidth * PAYLOAD_DTYPE_BYTES[dtype]);
    if (h.payloadBytes !== expected) {
      throw new FrameError("payload length",
        `payload length ${h.payloadBytes} is not ${h.nTokens} rows x (${SEQ_TAG_BYTES} tag bytes + row width ${h.rowWidth} x ${PAYLOAD_DTYPE_BYTES[dtype]} bytes) = ${expected}`);
    }
    if (h.payloadBytes > limits.maxPayloadBytes + h.nTokens * SEQ_TAG_BYTES) {
      throw new FrameError("payload length", `payload length ${h.payloadBytes} exceeds this link's limit of ${limits.maxPayloadBytes} bytes (and the tags)`);
    }
  } else if (type === "kvShift") {
    // A context shift for every device's cache: the range dropped starts at the position field.
    mustBeZero(type, "number of tokens", h.nTokens);
    mustBeZero(type, "cycle", h.cycle);
    mustBeZero(type, "payload dtype", h.payloadDtype);
    mustBeZero(type, "row width", h.rowWidth);
    if (h.payloadBytes !== KV_SHIFT_PAYLOAD_BYTES && h.payloadBytes !== KV_SHIFT_SLOT_PAYLOAD_BYTES) {
      throw new FrameError("payload length", `a kvShift frame's payload is ${KV_SHIFT_PAYLOAD_BYTES} bytes (${KV_SHIFT_SLOT_PAYLOAD_BYTES} for one sequence slot), got ${h.payloadBytes}`);
    }
  } else if (type === "h2oScores") {
    // H2O's statistics round the ring: one f32 per position held, the count in the row width field.
    mustBeZero(type, "position", h.firstTokenPosition);
    mustBeZero(type, "number of tokens", h.nTokens);
    mustBeZero(type, "cycle", h.cycle);
    mustBeZero(type, "payload dtype", h.payloadDtype);
    if (h.rowWidth === 0) throw new FrameError("row width", "an h2oScores frame for 0 positions");
    if (h.rowWidth > maxH2oPositions(limits)) {
      throw new FrameError("row width", `an h2oScores frame for ${h.rowWidth} positions exceeds this link's limit of ${maxH2oPositions(limits)}`);
    }
    if (h.payloadBytes !== h.rowWidth * H2O_SCORE_BYTES) {
      throw new FrameError("payload length", `payload length ${h.payloadBytes} is not ${h.rowWidth} positions x ${H2O_SCORE_BYTES} bytes`);
    }
  } else {
    // HELLO and ERROR carry no rows; HELLO no request either. Zero fields keep the header unambiguous.
    if (type === "hello") {
      mustBeZero(type, "request id", h.requestId);
      mustBeZero(type, "position", h.firstTokenPosition);
      mustBeZero(type, "number of tokens", h.nTokens);
      mustBeZero(type, "cycle", h.cycle);
    }
    mustBeZero(type, "payload dtype", h.payloadDtype);
    mustBeZero(type, "row width", h.rowWidth);
    if (h.payloadBytes > CONTROL_PAYLOAD_MAX_BYTES) {
      throw new FrameError("payload length",
        `a ${type} frame's payload of ${h.payloadBytes} bytes exceeds ${CONTROL_PAYLOAD_MAX_BYTES}`);
    }
    if (type === "hello" && h.payloadBytes === 0) throw new FrameError("payload", "a hello frame with an empty payload");
  }
  return { type, dtype };
}

const CONTROL_CHARS = /[\u0000-\u001f\u007f]/;

function helloString(o: Record<string, unknown>, key: keyof Hello, maxChars: number): string {
  const v = o[key];
  if (typeof v !== "string") throw new FrameError("hello", `hello field ${key} must be a string, got ${typeof v}`);
  if (v.length === 0 || v.length > maxChars) {
    throw new FrameError("hello", `hello field ${key} must be 1 to ${maxChars} characters, got ${v.length}`);
  }
  if (CONTROL_CHARS.test(v)) throw new FrameError("hello", `hello field ${key} contains control characters`);
  return v;
}

function helloInteger(o: Record<string, unknown>, key: keyof Hello, min: number, max: number): number {
  const v = o[key];
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
    throw new FrameError("hello", `hello field ${key} must be an integer in ${min}..${max}, got ${JSON.stringify(v) ?? typeof v}`);
  }
  return v;
}

/** Checks a parsed HELLO payload's shape and ranges (not whether it matches ours: see hello.ts). */
export function validateHello(value: unknown): Hello {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new FrameError("hello", "hello payload is not a JSON object");
  }
  const o = value as Record<string, unknown>;
  return {
    protocolVersion: helloInteger(o, "protocolVersion", 1, U16_MAX),
    deviceId: helloString(o, "deviceId", 256),
    modelFingerprint: helloString(o, "modelFingerprint", 1024),
    hiddenSize: helloInteger(o, "hiddenSize", 1, 1 << 30),
    ringId: helloString(o, "ringId", 256),
    maxTokensPerFrame: helloInteger(o, "maxTokensPerFrame", 1, U16_MAX),
    maxPayloadBytes: helloInteger(o, "maxPayloadBytes", 1, U32_MAX),
  };
}

/** Checks limits a caller configured (a programming error, not peer input: throws RangeError). */
export function validateLimits(limits: FrameLimits): FrameLimits {
  const { hiddenSize, maxTokensPerFrame, maxPayloadBytes } = limits;
  const ok = (v: number, max: number) => Number.isInteger(v) && v >= 1 && v <= max;
  if (!ok(hiddenSize, 1 << 30)) throw new RangeError(`ring: hidden size ${hiddenSize} must be an integer in 1..2^30`);
  if (!ok(maxTokensPerFrame, U16_MAX)) {
    throw new RangeError(`ring: max tokens per frame ${maxTokensPerFrame} must be an integer in 1..${U16_MAX}`);
  }
  if (!ok(maxPayloadBytes, U32_MAX)) {
    throw new RangeError(`ring: max payload bytes ${maxPayloadBytes} must be an integer in 1..${U32_MAX}`);
  }
  return { hiddenSize, maxTokensPerFrame, maxPayloadBytes };
}
