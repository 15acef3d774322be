// The wire format's constants and limits, in one place: the TS codec (validation.ts, frame.ts) reads
// them from here, and native/src/wire.h (the native lane's copy, for C) is generated from this file:
// test/ring/wire.test.ts fails when the two differ and prints the command that regenerates it.

/** Byte offsets of the 32-byte little-endian header's fields (DESIGN.md, "The two planes"). */
export const HeaderField = {
  magic: 0, headerVersion: 4, frameType: 6, requestId: 8, firstTokenPosition: 12, nTokens: 16, cycle: 18,
  payloadDtype: 20, reserved: 22, rowWidth: 24, payloadBytes: 28,
} as const;

export const FRAME_MAGIC = "PRMA";
export const FRAME_HEADER_VERSION = 1;
export const FRAME_HEADER_BYTES = 32;
/** Version of the ring protocol (frame types and handshake), carried in HELLO. 2: keyed links (seal.ts);
 * 3: KV_SHIFT frames (context shift); 4: SEQ_ACTIVATIONS frames (rows of several sequences); 5: a
 * KV_SHIFT of one sequence slot; 6: H2O_SCORES frames (H2O's statistics gathered round the ring). */
export const PROTOCOL_VERSION = 6;
/** Most payload bytes of a HELLO or ERROR frame (JSON, message text). */
export const CONTROL_PAYLOAD_MAX_BYTES = 64 * 1024;
export const U16_MAX = 0xffff;
export const U32_MAX = 0xffffffff;
/** Frame type ids on the wire. 0 is never a frame, so a zeroed buffer is refused. */
export const FrameTypeId = { hello: 1, activations: 2, error: 3, kvShift: 4, seqActivations: 5, h2oScores: 6 } as const;
/** A SEQ_ACTIVATIONS frame's payload starts with one tag per row: u32 sequence slot, u32 position. */
export const SEQ_TAG_BYTES = 8;
/** Slots and positions travel as u32 but are used as int32 (NativeWindow.forwardSeqs): at most this. */
export const SEQ_TAG_MAX = 0x7fffffff;
/** A KV_SHIFT frame's payload: u32 tokens discarded, u32 positions the cache holds (nPast); one of a
 * sequence slot's cache (serve --parallel) adds u32 slot. */
export const KV_SHIFT_PAYLOAD_BYTES = 8;
export const KV_SHIFT_SLOT_PAYLOAD_BYTES = 12;
/** An H2O_SCORES frame's payload: one f32 per position the cache holds (its row width is that count). */
export const H2O_SCORE_BYTES = 4;
/** Payload dtype ids on the wire and their sizes. */
export const PayloadDtypeId = { f32: 0, f16: 1 } as const;
export const PAYLOAD_DTYPE_BYTES = { f32: 4, f16: 2 } as const;

/**
 * Keyed links (ring/seal.ts). Before any frame, the key proof: the dialer sends PROOF_MAGIC, step 1 and
 * a nonce; the listener answers PROOF_MAGIC, step 2, its nonce and a MAC. Then every message is a
 * record: an 8-byte little-endian sequence number and the frame's header (in clear, authenticated),
 * the payload encrypted with AES-256-GCM, and the 16-byte tag.
 */
export const LINK_KEY_BYTES = 32;
export const PROOF_MAGIC = "PRMK";
export const PROOF_NONCE_BYTES = 32;
export const PROOF_MAC_BYTES = 32;
export const RECORD_SEQ_BYTES = 8;
export const RECORD_TAG_BYTES = 16;

/** native/src/wire.h's text. */
export function wireHeaderC(): string {
  const d = (name: string, v: number | string) => `#define PRIMA_WIRE_${name} ${typeof v === "string" ? JSON.stringify(v) : v}`;
  const snake = (s: string) => s.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase();
  return [
    "/* Generated from ring/wire.ts (the one home of the wire format); do not edit. Regenerate with",
    " *   npx tsc -p tsconfig.json && node -e 'import(\"./dist/ring/wire.js\").then((m) => process.stdout.write(m.wireHeaderC()))' > native/src/wire.h */",
    "#ifndef PRIMA_WIRE_H",
    "#define PRIMA_WIRE_H",
    "",
    d("MAGIC", FRAME_MAGIC),
    d("HEADER_VERSION", FRAME_HEADER_VERSION),
    d("HEADER_BYTES", FRAME_HEADER_BYTES),
    d("CONTROL_PAYLOAD_MAX_BYTES", CONTROL_PAYLOAD_MAX_BYTES),
    d("U32_MAX", `${U32_MAX}u`).replace(/"/g, ""),
    ...Object.entries(FrameTypeId).map(([k, v]) => d(`TYPE_${snake(k)}`, v)),
    ...Object.entries(PayloadDtypeId).map(([k, v]) => d(`DTYPE_${snake(k)}`, v)),
    ...Object.entries(PAYLOAD_DTYPE_BYTES).map(([k, v]) => d(`DTYPE_${snake(k)}_BYTES`, v)),
    ...Object.entries(HeaderField).map(([k, v]) => d(`AT_${snake(k)}`, v)),
    d("SEQ_TAG_BYTES", SEQ_TAG_BYTES),
    d("SEQ_TAG_MAX", SEQ_TAG_MAX),
    d("LINK_KEY_BYTES", LINK_KEY_BYTES),
    d("RECORD_SEQ_BYTES", RECORD_SEQ_BYTES),
    d("RECORD_TAG_BYTES", RECORD_TAG_BYTES),
    "",
    "#endif",
    "",
  ].join("\n");
}
