// The decoder against thousands of hostile buffers: random bytes, every truncation, bit flips,
// wrong versions and random header fields. It may only ever throw FrameError, and whatever it
// accepts must be a frame that re-encodes to itself.
import { describe, expect, it } from "vitest";
import {
  decodeFrame, encodeFrame, f16ToF32, f32ToF16, FrameError, PROTOCOL_VERSION, type Frame, type FrameLimits,
} from "../../ring/index.js";
import { laneFrameCycle } from "../../native/index.js";

const H = 32;
const limits: FrameLimits = { hiddenSize: H, maxTokensPerFrame: 8, maxPayloadBytes: 8 * H * 4 };

let seed = 0x9e3779b9;
function rand(): number {
  seed ^= seed << 13;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  return (seed >>> 0) / 2 ** 32;
}
const randInt = (n: number) => Math.floor(rand() * n);

function sampleFrames(): Frame[] {
  // Values a half holds exactly, so the f16 sample also decodes to what was encoded.
  const activations = (n: number) => f16ToF32(f32ToF16(Float32Array.from({ length: n * H }, () => (rand() - 0.5) * 200)));
  return [
    {
      type: "hello",
      hello: {
        protocolVersion: PROTOCOL_VERSION, deviceId: "phone-2", modelFingerprint: "fp:0123456789abcdef", hiddenSize: H,
        ringId: "r1", maxTokensPerFrame: 8, maxPayloadBytes: 1024,
      },
    },
    { type: "error", requestId: 77, firstTokenPosition: 12, nTokens: 4, cycle: 1, message: "layer 7: NaN in activations ✗" },
    { type: "activations", requestId: 5, firstTokenPosition: 40, nTokens: 3, cycle: 2, rowWidth: H, dtype: "f32", activations: activations(3) },
    { type: "activations", requestId: 6, firstTokenPosition: 0, nTokens: 8, cycle: 0, rowWidth: H, dtype: "f16", activations: activations(8) },
    {
      type: "seqActivations", requestId: 8, nTokens: 3, cycle: 1, rowWidth: H, dtype: "f32", slots: Int32Array.of(0, 2, 1),
      positions: Int32Array.of(17, 0, 5), activations: activations(3),
    },
    {
      type: "seqActivations", requestId: 9, nTokens: 8, cycle: 0, rowWidth: H, dtype: "f16", slots: new Int32Array(8).fill(3),
      positions: Int32Array.from({ length: 8 }, (_, i) => 40 + i), activations: activations(8),
    },
  ];
}

type Outcome = { ok: true; frame: Frame } | { ok: false; error: FrameError };

/** Decodes; any throw other than FrameError fails the test with the offending input. */
function tryDecode(buf: Uint8Array): Outcome {
  try {
    return { ok: true, frame: decodeFrame(buf, limits) };
  } catch (e) {
    if (!(e instanceof FrameError)) {
      throw new Error(`decodeFrame threw ${String(e)} for ${Buffer.from(buf.subarray(0, 64)).toString("hex")}`);
    }
    expect(e.message).toMatch(/^frame: /);
    expect(e.field.length).toBeGreaterThan(0);
    return { ok: false, error: e };
  }
}

/** Equality where NaN equals NaN (f16 payloads canonicalize NaNs). */
function sameFrame(a: Frame, b: Frame): boolean {
  if (a.type !== "activations" || b.type !== "activations") return JSON.stringify(a) === JSON.stringify(b);
  const { activations: x, ...ha } = a;
  const { activations: y, ...hb } = b;
  if (JSON.stringify(ha) !== JSON.stringify(hb) || x.length !== y.length) return false;
  for (let i = 0; i < x.length; i++) if (!Object.is(x[i], y[i])) return false;
  return true;
}

/** An accepted buffer must be a real frame: re-encoding it decodes to the same frame (f32: same bytes). */
function expectConsistent(buf: Uint8Array, frame: Frame): void {
  const again = encodeFrame(frame);
  const back = decodeFrame(again, limits);
  if (!sameFrame(frame, back)) throw new Error(`accepted frame does not round-trip: ${Buffer.from(buf.subarray(0, 48)).toString("hex")}`);
  if (frame.type === "activations" && frame.dtype === "f32") expect(Buffer.compare(Buffer.from(again), Buffer.from(buf))).toBe(0);
}

describe("decoder fuzz", () => {
  const frames = sampleFrames();
  // Plain Uint8Array copies: Buffer#slice would share memory and let one case's mutations leak into the next.
  const encoded = frames.map((f) => new Uint8Array(encodeFrame(f)));

  it("accepts the unmodified sample frames", () => {
    for (const [i, buf] of encoded.entries()) expect(sameFrame(decodeFrame(buf, limits), frames[i])).toBe(true);
  });

  it("refuses 3000 random buffers", () => {
    for (let i = 0; i < 3000; i++) {
      const buf = new Uint8Array(randInt(300));
      for (let j = 0; j < buf.length; j++) buf[j] = randInt(256);
      if (i % 3 === 0 && buf.length >= 4) buf.set([0x50, 0x52, 0x4d, 0x41]); // with the right magic, to get past it
      expect(tryDecode(buf).ok).toBe(false);
    }
  });

  it("refuses every truncation of every frame type", () => {
    let n = 0;
    for (const buf of encoded) {
      for (let len = 0; len < buf.length; len++, n++) expect(tryDecode(buf.subarray(0, len)).ok).toBe(false);
    }
    expect(n).toBeGreaterThan(1000);
  });

  it("refuses every header version but 1", () => {
    for (const buf of encoded) {
      for (let i = 0; i < 300; i++) {
        const copy = buf.slice();
        const version = i < 5 ? [0, 2, 3, 0x100, 0xffff][i] : 2 + randInt(0xfffe);
        new DataView(copy.buffer).setUint16(4, version, true);
        const out = tryDecode(copy);
        expect(out.ok).toBe(false);
        if (!out.ok) expect(out.error.field).toBe("header version");
      }
    }
  });

  it("survives 8000 bit-flipped frames: either a FrameError or a frame that re-encodes to itself", () => {
    let accepted = 0;
    let refused = 0;
    for (let i = 0; i < 8000; i++) {
      const buf = encoded[i % encoded.length].slice();
      const flips = 1 + randInt(3);
      // Half the flips land in the header, where every field is checked.
      for (let k = 0; k < flips; k++) {
        const byte = rand() < 0.5 ? randInt(32) : randInt(buf.length);
        buf[byte] ^= 1 << randInt(8);
      }
      const out = tryDecode(buf);
      if (out.ok) {
        accepted++;
        expectConsistent(buf, out.frame);
      } else refused++;
    }
    // Both outcomes occur (a flip in a request id or a float is still a valid frame).
    expect(accepted).toBeGreaterThan(100);
    expect(refused).toBeGreaterThan(100);
  });

  it("survives 4000 frames with random header fields", () => {
    const offsets: Array<[number, 2 | 4]> = [[4, 2], [6, 2], [8, 4], [12, 4], [16, 2], [18, 2], [20, 2], [22, 2], [24, 4], [28, 4]];
    for (let i = 0; i < 4000; i++) {
      const buf = encoded[i % encoded.length].slice();
      const v = new DataView(buf.buffer);
      const [at, size] = offsets[randInt(offsets.length)];
      const small = rand() < 0.5; // small values hit the interesting range (0, 1, 2, hidden size...)
      const value = small ? randInt(70) : Math.floor(rand() * (size === 2 ? 0x10000 : 2 ** 32));
      if (size === 2) v.setUint16(at, value, true);
      else v.setUint32(at, value, true);
      const out = tryDecode(buf);
      if (out.ok) expectConsistent(buf, out.frame);
    }
  });

  it("refuses non-Uint8Array input with a FrameError", () => {
    for (const bad of [null, undefined, "PRMA", 42, {}, new ArrayBuffer(40)]) {
      expect(() => decodeFrame(bad as unknown as Uint8Array, limits)).toThrow(FrameError);
    }
  });
});

// The native lane runs the frames its own check (lane.c, prima_lane_frame_cycle) accepts without
// asking the decoder: anything it accepts, ring/validation.ts must accept too, as the same frame.
describe("the native lane's frame check never accepts what the decoder refuses", () => {
  const lane = (buf: Uint8Array) => laneFrameCycle(buf, limits.hiddenSize, limits.maxTokensPerFrame, limits.maxPayloadBytes);
  const agree = (buf: Uint8Array): boolean => {
    const cycle = lane(buf);
    if (cycle < 0) return false;
    const out = tryDecode(buf);
    if (!out.ok) throw new Error(`the lane accepts what the decoder refuses (${out.error.message}): ${Buffer.from(buf.subarray(0, 32)).toString("hex")}`);
    expect(["activations", "seqActivations"]).toContain(out.frame.type);
    expect((out.frame.type === "activations" || out.frame.type === "seqActivations") && out.frame.cycle).toBe(cycle);
    return true;
  };
  const valid = sampleFrames().filter((f) => f.type === "activations" || f.type === "seqActivations").map((f) => new Uint8Array(encodeFrame(f)));

  it("accepts the valid samples", () => {
    for (const buf of valid) expect(agree(buf)).toBe(true);
  });

  it("a position past the u32 range is refused by both", () => {
    const buf = new Uint8Array(valid[0]);
    new DataView(buf.buffer).setUint32(12, 0xffffffff - 1, true); // 3 tokens from 2^32 - 2
    expect(lane(buf)).toBe(-1);
    expect(tryDecode(buf).ok).toBe(false);
  });

  it("over mutated valid frames and random headers", () => {
    let accepted = 0;
    const edges = [0, 1, 2, 3, 7, 8, 9, 31, 32, 33, 255, 256, 0xffff, 0x10000, 0x7fffffff, 0xfffffffe, 0xffffffff];
    for (let i = 0; i < 20000; i++) {
      const base = valid[randInt(valid.length)];
      const buf = new Uint8Array(base);
      const v = new DataView(buf.buffer);
      const mode = randInt(5);
      if (mode === 0) buf[randInt(32)] ^= 1 << randInt(8); // one bit of the header
      else if (mode === 4) v.setUint32(32 + 4 * randInt(6), edges[randInt(edges.length)] >>> 0, true); // a row tag (or a row's bytes)
      else if (mode === 1) {
        const at = [4, 6, 8, 12, 16, 18, 20, 22, 24, 28][randInt(10)];
        const value = edges[randInt(edges.length)];
        if (at === 8 || at === 12 || at >= 24) v.setUint32(at, value >>> 0, true);
        else v.setUint16(at, value & 0xffff, true);
      } else if (mode === 2) {
        for (let k = 0; k < 32; k++) if (rand() < 0.2) buf[k] = randInt(256);
      }
      // mode 3: the frame as it is, with a random length cut or extension below
      const len = rand() < 0.1 ? randInt(buf.length + 8) : buf.length;
      const cut = len <= buf.length ? buf.subarray(0, len) : Uint8Array.from([...buf, ...new Uint8Array(len - buf.length)]);
      if (agree(new Uint8Array(cut))) accepted++;
    }
    for (let i = 0; i < 20000; i++) {
      const buf = Uint8Array.from({ length: 32 + randInt(3) * 64 * randInt(9) }, () => randInt(256));
      buf.set([0x50, 0x52, 0x4d, 0x41, 1, 0, 2 + 3 * randInt(2), 0]); // magic, version, (seq) activations: the rest random
      if (agree(buf)) accepted++;
    }
    expect(accepted).toBeGreaterThan(1000);
  });
});
