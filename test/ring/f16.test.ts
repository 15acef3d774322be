// f32 <-> f16 conversions of the ring's f16 payloads against llama.cpp's own (ggml_fp32_to_fp16_row,
// ggml_fp16_to_fp32_row, and the CPU backend's F16C from_float), bit for bit.
import { describe, expect, it } from "vitest";
import { ggmlDequantize, ggmlFromFloat, ggmlQuantizeRef, oracleUnavailable } from "../../bench/ggml-oracle.js";
import { f16ToF32, f32ToF16 } from "../../ring/index.js";

const GGML_F16 = 1;
const noOracle = oracleUnavailable();

function floatsFromBits(bits: number[] | Uint32Array): Float32Array {
  return new Float32Array(Uint32Array.from(bits).buffer);
}

function bitsOf(x: Float32Array): Uint32Array {
  return new Uint32Array(x.buffer, x.byteOffset, x.length);
}

function halvesOf(bytes: Uint8Array): Uint16Array {
  const copy = bytes.slice(); // aligned copy
  return new Uint16Array(copy.buffer, 0, copy.length / 2);
}

/** First index where a and b differ, with both values in hex, or null. */
function firstDifference(a: ArrayLike<number>, b: ArrayLike<number>, input?: Uint32Array): string | null {
  if (a.length !== b.length) return `lengths ${a.length} vs ${b.length}`;
  for (let i = 0; i < a.length; i++) {
    if (a[i] !== b[i]) {
      const at = input ? ` (input bits 0x${input[i].toString(16)})` : "";
      return `index ${i}${at}: ours 0x${a[i].toString(16)}, ggml 0x${b[i].toString(16)}`;
    }
  }
  return null;
}

/** Float bit patterns where rounding to half is decided: around every boundary, tie and special value. */
function edgeCaseBits(): Uint32Array {
  const f = (x: number) => bitsOf(new Float32Array([x]))[0];
  const centres = [
    0, f(1), f(-1), f(65504), f(65519.99), f(65520), f(65536), f(1e38), 0x7f7fffff, // max half, overflow, max float
    0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffc00001, 0x7fffffff, 0xffffffff, 0x7fa00000, // inf, NaNs
    f(2 ** -24), f(2 ** -25), f(3 * 2 ** -25), f(5 * 2 ** -25), f(1023 * 2 ** -24), f(1023.5 * 2 ** -24), // subnormals, ties
    f(2 ** -14), f(2 ** -15), f(2 ** -26), 0x33000000, 0x38800000, 0x477ff000, 0x38000000,
    f(1 + 2 ** -11), f(1 + 3 * 2 ** -11), f(2048 + 1), f(2048 + 3), f(-1 - 2 ** -11), // normal-range ties
    1, 0x00400000, 0x007fffff, 0x00800000, // float denormals
  ];
  const out: number[] = [];
  for (const c of centres) {
    for (let d = -4; d <= 4; d++) {
      out.push((c + d) >>> 0, ((c ^ 0x80000000) + d) >>> 0);
    }
  }
  return Uint32Array.from(out);
}

describe.skipIf(noOracle)("f16 conversion against ggml", () => {
  it("every half converts to the float ggml gives (all 65536, NaNs included)", () => {
    const halves = new Uint16Array(65536);
    for (let i = 0; i < 65536; i++) halves[i] = i;
    const ours = bitsOf(f16ToF32(halves));
    const ggml = bitsOf(ggmlDequantize(GGML_F16, new Uint8Array(halves.buffer), 65536));
    expect(firstDifference(ours, ggml)).toBeNull();
  });

  it("edge-case floats (ties, subnormals, max half, overflow, inf, NaN, float denormals) round like ggml", () => {
    const bits = edgeCaseBits();
    const x = floatsFromBits(bits);
    const ours = f32ToF16(x);
    expect(firstDifference(ours, halvesOf(ggmlQuantizeRef(GGML_F16, x)), bits)).toBeNull();
  });

  it("random bit patterns and random values round like ggml's portable and F16C conversions", () => {
    let s = 12345;
    const rand = () => {
      s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
      return s;
    };
    const n = 1 << 19;
    const bits = new Uint32Array(n);
    const x = new Float32Array(bits.buffer);
    for (let i = 0; i < n; i++) {
      const kind = i % 4;
      if (kind === 0) bits[i] = rand(); // any pattern, NaNs included
      else if (kind === 1) x[i] = ((rand() / 2 ** 32) - 0.5) * 140000; // around the half range
      else if (kind === 2) x[i] = ((rand() / 2 ** 32) - 0.5) * 2 ** -12; // subnormal halves
      else bits[i] = ((rand() & 0x80000000) | ((0x33000000 + (rand() % 0x14800000)) & 0x7fffffff)) >>> 0; // half range, exhaustive-ish
    }
    const ours = f32ToF16(x);
    expect(firstDifference(ours, halvesOf(ggmlQuantizeRef(GGML_F16, x)), bits)).toBeNull();

    // The CPU backend's converter (F16C on this machine) keeps NaN payloads, so compare the rest.
    const notNaN = x.filter((v) => !Number.isNaN(v));
    expect(firstDifference(f32ToF16(notNaN), halvesOf(ggmlFromFloat(GGML_F16, notNaN)), bitsOf(notNaN))).toBeNull();
  });
});

describe("f16 conversion", () => {
  it("round-trips every finite half exactly (half -> float -> half)", () => {
    const halves = new Uint16Array(65536);
    for (let i = 0; i < 65536; i++) halves[i] = i;
    const back = f32ToF16(f16ToF32(halves));
    for (let i = 0; i < 65536; i++) {
      const isNaN = (i & 0x7c00) === 0x7c00 && (i & 0x3ff) !== 0;
      if (isNaN) expect(back[i]).toBe((i & 0x8000) | 0x7e00);
      else if (back[i] !== i) expect.fail(`half 0x${i.toString(16)} came back as 0x${back[i].toString(16)}`);
    }
  });

  it("works on arrays at an offset inside a larger buffer, and refuses mismatched lengths", () => {
    const big = new Float32Array(10).fill(3.5);
    const src = big.subarray(3, 7);
    const dstBig = new Uint16Array(9);
    f32ToF16(src, dstBig.subarray(5, 9));
    expect(Array.from(f16ToF32(dstBig.subarray(5, 9)))).toEqual([3.5, 3.5, 3.5, 3.5]);
    expect(Array.from(dstBig.subarray(0, 5))).toEqual([0, 0, 0, 0, 0]);
    expect(() => f32ToF16(src, new Uint16Array(3))).toThrow(RangeError);
    expect(() => f16ToF32(new Uint16Array(3), new Float32Array(4))).toThrow(RangeError);
  });

  it("converts at the pace of a plain typed-array loop, both ways", () => {
    const n = 1 << 22;
    const x = new Float32Array(n);
    for (let i = 0; i < n; i++) x[i] = Math.sin(i) * 100;
    const h = new Uint16Array(n);
    const y = new Float32Array(n);
    const plain = (src: Float32Array, dst: Uint16Array): void => { for (let i = 0; i < src.length; i++) dst[i] = src[i] & 0xffff; };
    f32ToF16(x.subarray(0, 1024), h.subarray(0, 1024)); // warm up (and build the table)
    f16ToF32(h.subarray(0, 1024), y.subarray(0, 1024));
    plain(x.subarray(0, 1024), h.subarray(0, 1024));
    // Each conversion against a plain loop over the same arrays, timed side by side (medians of 3),
    // so a loaded machine slows both: only a change that makes a conversion scalar-slow (a DataView or
    // Math call per value) fails.
    const time = (f: () => void): number => {
      const ms = [0, 1, 2].map(() => { const t = performance.now(); f(); return performance.now() - t; });
      return ms.sort((a, b) => a - b)[1];
    };
    const plainMs = Math.max(time(() => plain(x, h)), 0.05);
    const toHalfMs = time(() => f32ToF16(x, h));
    const toFloatMs = time(() => f16ToF32(h, y));
    console.log(`f16: plain ${plainMs.toFixed(2)} ms, to half ${toHalfMs.toFixed(2)} ms, to float ${toFloatMs.toFixed(2)} ms`);
    expect(toHalfMs / plainMs).toBeLessThan(8);
    expect(toFloatMs / plainMs).toBeLessThan(8);
  });
});
