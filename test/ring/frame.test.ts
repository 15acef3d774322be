// The frame codec: the wire layout of DESIGN.md's header table, round trips of every frame type and
// dtype, zero-copy decoding, and one clear FrameError per header field a peer can get wrong.
import { describe, expect, it } from "vitest";
import { ggmlDequantize, ggmlQuantizeRef, oracleUnavailable } from "../../bench/ggml-oracle.js";
import {
  decodeFrame, encodeFrame, FrameError, PROTOCOL_VERSION,
  type ActivationsFrame, type ErrorFrame, type Frame, type FrameLimits, type Hello, type HelloFrame,
} from "../../ring/index.js";

const H = 64;
const limits: FrameLimits = { hiddenSize: H, maxTokensPerFrame: 16, maxPayloadBytes: 16 * H * 4 };

const hello: Hello = {
  protocolVersion: PROTOCOL_VERSION, deviceId: "laptop-1", modelFingerprint: "sha256:abc", hiddenSize: H,
  ringId: "ring-7", maxTokensPerFrame: 16, maxPayloadBytes: 4096,
};

function rows(nTokens: number, seed = 1): Float32Array {
  const a = new Float32Array(nTokens * H);
  for (let i = 0; i < a.length; i++) a[i] = Math.sin(seed * 1000 + i) * 37.5;
  return a;
}

function acts(nTokens: number, dtype: "f32" | "f16" = "f32", extra: Partial<ActivationsFrame> = {}): ActivationsFrame {
  return {
    type: "activations", requestId: 0xdeadbeef, firstTokenPosition: 1000, nTokens, cycle: 3, rowWidth: H, dtype,
    activations: rows(nTokens), ...extra,
  };
}

/** The header as DESIGN.md's table lays it out, read independently of the codec. */
function readTable(buf: Uint8Array) {
  const v = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  return {
    magic: new TextDecoder().decode(buf.subarray(0, 4)),
    version: v.getUint16(4, true), type: v.getUint16(6, true), requestId: v.getUint32(8, true),
    position: v.getUint32(12, true), nTokens: v.getUint16(16, true), cycle: v.getUint16(18, true),
    dtype: v.getUint16(20, true), reserved: v.getUint16(22, true), rowWidth: v.getUint32(24, true),
    payloadBytes: v.getUint32(28, true),
  };
}

/** A header written field by field (for frames the encoder would never make). */
function rawFrame(h: Partial<ReturnType<typeof readTable>>, payload: Uint8Array = new Uint8Array(0)): Uint8Array {
  const buf = new Uint8Array(32 + payload.length);
  const v = new DataView(buf.buffer);
  buf.set(new TextEncoder().encode(h.magic ?? "PRMA"), 0);
  v.setUint16(4, h.version ?? 1, true);
  v.setUint16(6, h.type ?? 2, true);
  v.setUint32(8, h.requestId ?? 0, true);
  v.setUint32(12, h.position ?? 0, true);
  v.setUint16(16, h.nTokens ?? 0, true);
  v.setUint16(18, h.cycle ?? 0, true);
  v.setUint16(20, h.dtype ?? 0, true);
  v.setUint16(22, h.reserved ?? 0, true);
  v.setUint32(24, h.rowWidth ?? 0, true);
  v.setUint32(28, h.payloadBytes ?? payload.length, true);
  buf.set(payload, 32);
  return buf;
}

function decodeError(buf: Uint8Array, l: FrameLimits = limits): FrameError {
  try {
    decodeFrame(buf, l);
  } catch (e) {
    if (e instanceof FrameError) return e;
    throw new Error(`decodeFrame threw a non-FrameError: ${String(e)}`);
  }
  throw new Error("decodeFrame accepted a bad frame");
}

describe("frame layout", () => {
  it("writes DESIGN.md's 32-byte little-endian header", () => {
    const f = acts(5, "f16");
    const buf = encodeFrame(f);
    expect(readTable(buf)).toEqual({
      magic: "PRMA", version: 1, type: 2, requestId: f.requestId, position: f.firstTokenPosition, nTokens: 5,
      cycle: f.cycle, dtype: 1, reserved: 0, rowWidth: H, payloadBytes: 5 * H * 2,
    });
    expect(buf.length).toBe(32 + 5 * H * 2);
    const e = encodeFrame({ type: "error", requestId: 9, firstTokenPosition: 128, nTokens: 64, cycle: 1, message: "oom" });
    expect(readTable(e)).toMatchObject({ type: 3, requestId: 9, position: 128, nTokens: 64, cycle: 1, dtype: 0, rowWidth: 0, payloadBytes: 3 });
    const h = encodeFrame({ type: "hello", hello });
    expect(readTable(h)).toMatchObject({ type: 1, requestId: 0, nTokens: 0, rowWidth: 0 });
    expect(JSON.parse(new TextDecoder().decode(h.subarray(32)))).toEqual(hello);
  });

  it("puts f32 rows little-endian right after the header", () => {
    const f = acts(2);
    const buf = encodeFrame(f);
    const v = new DataView(buf.buffer, buf.byteOffset);
    for (let i = 0; i < f.activations.length; i++) expect(v.getFloat32(32 + 4 * i, true)).toBe(f.activations[i]);
  });
});

describe("round trips", () => {
  it("HELLO, ERROR (any UTF-8) and f32 ACTIVATIONS come back equal", () => {
    const frames: Frame[] = [
      { type: "hello", hello },
      { type: "error", requestId: 4, firstTokenPosition: 0, nTokens: 0, cycle: 0, message: "window 3 failed: out of memory ✗ 内存" },
      { type: "error", requestId: 0xffffffff, firstTokenPosition: 0xffffffff, nTokens: 65535, cycle: 65535, message: "" },
      acts(1),
      acts(16, "f32", { requestId: 0, firstTokenPosition: 0xffffffff - 16, cycle: 65535 }),
    ];
    for (const f of frames) expect(decodeFrame(encodeFrame(f), limits)).toEqual(f);
  });

  it("keeps f32 specials bit for bit (NaN payloads, -0, inf, denormals)", () => {
    const f = acts(1);
    const bits = new Uint32Array(f.activations.buffer);
    bits.set([0x7fc00001, 0xffbadbad, 0x80000000, 0x7f800000, 0xff800000, 0x00000001, 0x807fffff, 0x7f7fffff]);
    const back = decodeFrame(encodeFrame(f), limits) as ActivationsFrame;
    expect(Array.from(new Uint32Array(back.activations.buffer, back.activations.byteOffset, 8))).toEqual(Array.from(bits.subarray(0, 8)));
  });

  it.skipIf(oracleUnavailable())("f16 ACTIVATIONS come back rounded exactly as ggml rounds them", () => {
    const f = acts(16, "f16");
    f.activations[0] = 1e6; // overflows to inf
    f.activations[1] = 1e-7; // subnormal half
    f.activations[2] = NaN;
    const back = decodeFrame(encodeFrame(f), limits) as ActivationsFrame;
    const viaGgml = ggmlDequantize(1, ggmlQuantizeRef(1, f.activations), f.activations.length);
    expect(back.dtype).toBe("f16");
    expect(Array.from(new Uint32Array(back.activations.slice().buffer))).toEqual(Array.from(new Uint32Array(viaGgml.buffer)));
  });

  it("decodes f32 rows as a view on an aligned buffer, and copies from an unaligned one", () => {
    const buf = encodeFrame(acts(3));
    const viewed = decodeFrame(buf, limits) as ActivationsFrame;
    expect(viewed.activations.buffer).toBe(buf.buffer);
    const shifted = new Uint8Array(buf.length + 1).subarray(1);
    shifted.set(buf);
    const copied = decodeFrame(shifted, limits) as ActivationsFrame;
    expect(copied.activations.buffer).not.toBe(shifted.buffer);
    expect(copied.activations).toEqual(viewed.activations);
    // f16 from an odd offset too
    const b16 = encodeFrame(acts(3, "f16"));
    const odd = new Uint8Array(b16.length + 1).subarray(1);
    odd.set(b16);
    expect((decodeFrame(odd, limits) as ActivationsFrame).activations).toEqual((decodeFrame(b16, limits) as ActivationsFrame).activations);
  });
});

describe("decoder refusals name the field", () => {
  const good = () => rawFrame({ type: 2, nTokens: 1, rowWidth: H }, new Uint8Array(H * 4));

  it("accepts the hand-written good frame these cases start from", () => {
    expect(decodeFrame(good(), limits)).toMatchObject({ type: "activations", nTokens: 1, rowWidth: H });
  });

  const cases: Array<[string, Uint8Array | (() => Uint8Array), string, string | RegExp, FrameLimits?]> = [
    ["short buffer", () => good().subarray(0, 20), "header", "frame: 20 bytes is shorter than the 32-byte header"],
    ["bad magic", rawFrame({ magic: "PRMB", type: 2, nTokens: 1, rowWidth: H }, new Uint8Array(H * 4)), "magic", /magic bytes 0x50 0x52 0x4d 0x42 are not "PRMA"/],
    ["wrong version", rawFrame({ version: 2, type: 2, nTokens: 1, rowWidth: H }, new Uint8Array(H * 4)), "header version", "frame: header version 2 is not supported (this build reads version 1)"],
    ["type 0", rawFrame({ type: 0 }), "frame type", /frame type 0 is unknown/],
    ["type 77", rawFrame({ type: 77 }), "frame type", /frame type 77 is unknown/],
    ["dtype 7", rawFrame({ type: 2, nTokens: 1, rowWidth: H, dtype: 7 }, new Uint8Array(H * 4)), "payload dtype", /payload dtype 7 is unknown/],
    ["reserved", rawFrame({ type: 2, nTokens: 1, rowWidth: H, reserved: 5 }, new Uint8Array(H * 4)), "reserved", /reserved bytes 22-23 hold 5/],
    ["truncated payload", () => good().subarray(0, 32 + H * 4 - 1), "payload length", /declares 256 payload bytes but 255 follow it \(truncated frame\)/],
    ["trailing bytes", rawFrame({ type: 2, nTokens: 1, rowWidth: H, payloadBytes: H * 4 }, new Uint8Array(H * 4 + 2)), "payload length", /trailing bytes/],
    ["row width", rawFrame({ type: 2, nTokens: 1, rowWidth: 4096 }, new Uint8Array(4096 * 4)), "row width", "frame: row width 4096 does not match the model's hidden size 2048", { hiddenSize: 2048, maxTokensPerFrame: 16, maxPayloadBytes: 1 << 24 }],
    ["zero tokens", rawFrame({ type: 2, nTokens: 0, rowWidth: H }), "number of tokens", /0 tokens/],
    ["too many tokens", rawFrame({ type: 2, nTokens: 17, rowWidth: H }, new Uint8Array(17 * H * 4)), "number of tokens", /17 exceeds this link's limit of 16/],
    ["payload vs rows", rawFrame({ type: 2, nTokens: 2, rowWidth: H }, new Uint8Array(H * 4)), "payload length", "frame: payload length 256 is not 2 tokens x row width 64 x 4 bytes (f32) = 512"],
    ["f16 payload vs rows", rawFrame({ type: 2, nTokens: 1, rowWidth: H, dtype: 1 }, new Uint8Array(H * 4)), "payload length", /x 2 bytes \(f16\) = 128/],
    ["over the byte limit", rawFrame({ type: 2, nTokens: 2, rowWidth: H }, new Uint8Array(2 * H * 4)), "payload length", /exceeds this link's limit of 300 bytes/, { hiddenSize: H, maxTokensPerFrame: 16, maxPayloadBytes: 300 }],
    ["position overflow", rawFrame({ type: 2, nTokens: 2, rowWidth: H, position: 0xfffffffe }, new Uint8Array(2 * H * 4)), "position", /past the u32 range/],
    ["hello with a request id", rawFrame({ type: 1, requestId: 3 }, new TextEncoder().encode(JSON.stringify(hello))), "request id", /hello frame must have request id 0, got 3/],
    ["hello with rows", rawFrame({ type: 1, rowWidth: H }, new TextEncoder().encode(JSON.stringify(hello))), "row width", /must have row width 0/],
    ["error with a dtype", rawFrame({ type: 3, dtype: 1 }, new TextEncoder().encode("x")), "payload dtype", /error frame must have payload dtype 0/],
    ["empty hello", rawFrame({ type: 1 }), "payload", /empty payload/],
    ["hello not JSON", rawFrame({ type: 1 }, new TextEncoder().encode("{nope")), "hello", /not JSON/],
    ["hello not an object", rawFrame({ type: 1 }, new TextEncoder().encode("[1,2]")), "hello", /not a JSON object/],
    ["hello missing a field", rawFrame({ type: 1 }, new TextEncoder().encode(JSON.stringify({ ...hello, ringId: undefined }))), "hello", /ringId must be a string/],
    ["hello bad hidden size", rawFrame({ type: 1 }, new TextEncoder().encode(JSON.stringify({ ...hello, hiddenSize: -1 }))), "hello", /hiddenSize must be an integer/],
    ["hello control chars", rawFrame({ type: 1 }, new TextEncoder().encode(JSON.stringify({ ...hello, deviceId: "a\u001b[2J" }))), "hello", /control characters/],
    ["hello bad UTF-8", rawFrame({ type: 1 }, Uint8Array.of(0x7b, 0xff, 0x7d)), "hello payload", /not valid UTF-8/],
    ["error bad UTF-8", rawFrame({ type: 3 }, Uint8Array.of(0xc3, 0x28)), "error message", /not valid UTF-8/],
    ["huge control payload", rawFrame({ type: 3 }, new Uint8Array(70000)), "payload length", /exceeds 65536/],
  ];
  for (const [name, make, field, message, l] of cases) {
    it(name, () => {
      const err = decodeError(typeof make === "function" ? make() : make, l);
      expect(err.field).toBe(field);
      if (typeof message === "string") expect(err.message).toBe(message);
      else expect(err.message).toMatch(message);
    });
  }
});

describe("encoder refusals", () => {
  const bad: Array<[string, Frame, RegExp]> = [
    ["rows vs nTokens x rowWidth", { ...acts(2), nTokens: 3 }, /hold 128 floats, not 3 tokens x row width 64 = 192/],
    ["too many tokens for u16", { ...acts(1), nTokens: 70000, activations: new Float32Array(70000 * H) }, /number of tokens 70000 is not an integer in 0..65535/],
    ["negative request id", { ...acts(1), requestId: -1 }, /request id -1/],
    ["fractional position", { ...acts(1), firstTokenPosition: 1.5 }, /position 1.5/],
    ["cycle past u16", { ...acts(1), cycle: 65536 }, /cycle 65536/],
    ["unknown dtype", { ...acts(1), dtype: "bf16" as "f16" }, /payload dtype bf16 is unknown/],
    ["zero tokens", { ...acts(1), nTokens: 0, activations: new Float32Array(0) }, /0 tokens/],
    ["a hello that would be refused", { type: "hello", hello: { ...hello, deviceId: "" } } as HelloFrame, /deviceId must be 1 to 256 characters/],
  ];
  for (const [name, frame, message] of bad) {
    it(name, () => {
      expect(() => encodeFrame(frame)).toThrow(FrameError);
      expect(() => encodeFrame(frame)).toThrow(message);
    });
  }

  it("cuts an overlong error message at a character boundary instead of failing", () => {
    const message = "é".repeat(40000); // 80000 bytes of UTF-8
    const f: ErrorFrame = { type: "error", requestId: 1, firstTokenPosition: 0, nTokens: 0, cycle: 0, message };
    const back = decodeFrame(encodeFrame(f), limits) as ErrorFrame;
    expect(back.message).toBe("é".repeat(32768));
  });
});

describe("KV_SHIFT frames (context shift round the ring)", () => {
  it("round-trip with the range in the position field and the payload", () => {
    const f: Frame = { type: "kvShift", requestId: 7, p0: 5, nDiscard: 29, nPast: 63 };
    const buf = encodeFrame(f);
    const t = readTable(buf);
    expect(t).toMatchObject({ type: 4, requestId: 7, position: 5, nTokens: 0, cycle: 0, dtype: 0, rowWidth: 0, payloadBytes: 8 });
    const v = new DataView(buf.buffer, buf.byteOffset + 32, 8);
    expect([v.getUint32(0, true), v.getUint32(4, true)]).toEqual([29, 63]);
    expect(decodeFrame(buf, limits)).toEqual(f);
  });

  it("refuse a range the cache cannot hold, a wrong payload length and rows fields by name", () => {
    const good = encodeFrame({ type: "kvShift", requestId: 1, p0: 5, nDiscard: 29, nPast: 63 });
    const patch = (at: number, value: number, bytes: 2 | 4) => {
      const b = Buffer.from(good);
      if (bytes === 2) b.writeUInt16LE(value, at);
      else b.writeUInt32LE(value, at);
      return b;
    };
    expect(() => decodeFrame(patch(32, 0, 4), limits)).toThrow(/not a range of the cache/); // nothing discarded
    expect(() => decodeFrame(patch(36, 20, 4), limits)).toThrow(/not a range of the cache/); // past nPast
    expect(() => decodeFrame(patch(16, 3, 2), limits)).toThrow(/must have number of tokens 0/);
    expect(() => decodeFrame(patch(24, H, 4), limits)).toThrow(/must have row width 0/);
    expect(() => decodeFrame(Buffer.concat([patch(28, 16, 4), Buffer.alloc(8)]), limits)).toThrow(/payload is 8 bytes \(12 for one sequence slot\), got 16/);
  });
});

describe("H2O_SCORES frames (H2O's statistics round the ring)", () => {
  const scores = Float32Array.from({ length: 40 }, (_, i) => i * 0.75 + 0.125);

  it("round-trip with the count in the row width field and one f32 per position", () => {
    const buf = encodeFrame({ type: "h2oScores", requestId: 9, scores });
    expect(readTable(buf)).toMatchObject({ type: 6, requestId: 9, position: 0, nTokens: 0, cycle: 0, dtype: 0, rowWidth: 40, payloadBytes: 160 });
    expect(new DataView(buf.buffer, buf.byteOffset + 32 + 4 * 3, 4).getFloat32(0, true)).toBe(scores[3]);
    const back = decodeFrame(buf, limits) as Frame & { scores: Float32Array };
    expect(back).toEqual({ type: "h2oScores", requestId: 9, scores });
    // a copy: a device adds to it before passing it on, and must not write into the received bytes
    back.scores[0] += 1;
    expect((decodeFrame(buf, limits) as Frame & { scores: Float32Array }).scores[0]).toBe(scores[0]);
  });

  it("refuse a score that is no count, a count beyond the link's limit and rows fields by name", () => {
    const good = encodeFrame({ type: "h2oScores", requestId: 1, scores });
    const patched = (write: (b: Buffer) => void) => {
      const b = Buffer.from(good);
      write(b);
      return b;
    };
    expect(() => decodeFrame(patched((b) => b.writeFloatLE(NaN, 40)), limits)).toThrow(/position 2's H2O score NaN is not a finite count >= 0/);
    expect(() => decodeFrame(patched((b) => b.writeFloatLE(-1, 32)), limits)).toThrow(/position 0's H2O score -1/);
    expect(() => decodeFrame(patched((b) => b.writeFloatLE(Infinity, 32 + 39 * 4)), limits)).toThrow(/position 39's H2O score Infinity/);
    expect(() => decodeFrame(patched((b) => b.writeUInt16LE(2, 16)), limits)).toThrow(/must have number of tokens 0/);
    expect(() => decodeFrame(patched((b) => b.writeUInt32LE(7, 12)), limits)).toThrow(/must have position 0/);
    expect(() => decodeFrame(patched((b) => b.writeUInt32LE(41, 24)), limits)).toThrow(/payload length 160 is not 41 positions x 4 bytes/);
    expect(() => decodeFrame(patched((b) => b.writeUInt32LE(0, 24)), limits)).toThrow(/for 0 positions/);
    // the larger of a control frame's and an activations frame's payload: 64 KiB here
    const big = encodeFrame({ type: "h2oScores", requestId: 1, scores: new Float32Array(16385) });
    expect(() => decodeFrame(big, limits)).toThrow(/16385 positions exceeds this link's limit of 16384/);
    expect(() => encodeFrame({ type: "h2oScores", requestId: 1, scores: new Float32Array(0) })).toThrow(/at least one position/);
  });
});
