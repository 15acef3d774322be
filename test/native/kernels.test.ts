// The kernel family against its references: every SIMD level against the scalar twin, the scalar
// dot against a double-precision sum, and quantizers/dequantizers/activation formats/dots against
// llama.cpp's own ggml (compiled oracle harness, test/native/ggml_oracle.c).
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import {
  GgmlTypeId, MAX_NC, WEIGHT_TYPES, dequantize, dot, dotRows, fp32ToHalf, gemm, geglu, halfToFp32, quantizeAct, quantizeRef, rowBytes,
  simdLevel, simdLevels, typeInfo, type GgmlTypeName, type SimdLevel,
} from "../../native/kernels.js";
import {
  ggmlDequantize, ggmlFromFloat, ggmlQuantizeRef, ggmlVecDot, oracleUnavailable,
} from "../../bench/ggml-oracle.js";
import { mulberry32 } from "../helpers/random.js";

// ---------------------------------------------------------------- data

const rng = mulberry32;

function normals(n: number, seed: number, std = 1): Float32Array {
  const r = rng(seed);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const u = Math.max(r(), 1e-12), v = r();
    out[i] = std * Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  }
  return out;
}

/** Weight-like rows with the awkward cases quantizers meet: an all-zero block, a constant block,
 * an outlier, a block of tiny values, mixed signs. */
function awkwardRow(n: number, blockElems: number, seed: number): Float32Array {
  const x = normals(n, seed, 0.02);
  const b = Math.max(blockElems, 32);
  if (n >= 4 * b) {
    x.fill(0, 0, b);                                   // all zero
    x.fill(0.013, b, 2 * b);                           // constant
    x[2 * b + 3] = 0.9;                                // outlier
    for (let i = 3 * b; i < 4 * b; i++) x[i] *= 1e-6;  // tiny
  }
  return x;
}

const K_TYPES = new Set<GgmlTypeName>(["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]);
function blockElemsOf(t: GgmlTypeName): number { return K_TYPES.has(t) ? 256 : /^I?Q|^MXFP4$/.test(t) ? 32 : 1; }
/** An odd number of whole blocks, at least 5 (so awkwardRow's special blocks fit). */
function oddLength(t: GgmlTypeName): number { return K_TYPES.has(t) ? 256 * 5 : 32 * 13; }

const levels = simdLevels();
const addonPath = join(import.meta.dirname, "..", "..", "build", "Release", "prima.node");
const simdOnly = levels.filter((l) => l !== "scalar");

function sameBits(a: Float32Array, b: Float32Array): boolean {
  if (a.length !== b.length) return false;
  const ua = new Uint32Array(a.buffer, a.byteOffset, a.length), ub = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < a.length; i++) {
    if (ua[i] !== ub[i] && !(Number.isNaN(a[i]) && Number.isNaN(b[i]))) return false;
  }
  return true;
}

function firstDiff(a: Uint8Array, b: Uint8Array): number {
  if (a.length !== b.length) return -2;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return i;
  return -1;
}

const half = (f: number) => fp32ToHalf(new Float32Array([f]), "f16")[0];

/** Offsets of the fp16 scale fields in each block layout (to make random bytes into sane blocks). */
const HALF_FIELDS: Partial<Record<GgmlTypeName, number[]>> = {
  Q4_0: [0], Q4_1: [0, 2], Q5_0: [0], Q5_1: [0, 2], Q8_0: [0],
  Q2_K: [80, 82], Q3_K: [108], Q4_K: [0, 2], Q5_K: [0, 2], Q6_K: [208], IQ4_NL: [0], IQ4_XS: [0],
};

/** Random weight bytes: every bit pattern of the quants and scales, with the fp16 scale fields set to
 * the given values (one per field; default small powers of two keep every product exact). */
function randomWeightBytes(t: GgmlTypeName, n: number, seed: number, scales?: number[]): Uint8Array {
  const r = rng(seed);
  const bytes = new Uint8Array(rowBytes(t, n));
  if (t === "F32" || t === "F16" || t === "BF16") {
    // small integers: exactly representable in every float format
    const x = new Float32Array(n).map(() => Math.floor(r() * 17) - 8);
    if (t === "F32") return new Uint8Array(x.buffer);
    return new Uint8Array(fp32ToHalf(x, t === "F16" ? "f16" : "bf16").buffer);
  }
  for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(r() * 256);
  if (t === "Q8_0") for (let i = 0; i < bytes.length; i++) if (bytes[i] === 0x80) bytes[i] = 0x81; // ggml never writes -128
  const info = typeInfo(t)!;
  // MXFP4's E8M0 scale byte: 2^(e-128), so 126 and 127 are 0.25 and 0.5 (exact products, as above)
  if (t === "MXFP4") for (let b = 0; b < bytes.length / 17; b++) bytes[b * 17] = 126 + (b % 2);
  const fields = HALF_FIELDS[t] ?? [];
  const dv = new DataView(bytes.buffer);
  for (let b = 0; b < bytes.length / info.blockBytes; b++) {
    fields.forEach((off, k) => dv.setUint16(b * info.blockBytes + off, half(scales?.[k] ?? (k === 0 ? 0.25 : 0.5)), true));
  }
  return bytes;
}

/** Random activation rows of an activation format, consistent (Q8_1 s and Q8_K bsums match qs);
 * scale 1 keeps every product exact. */
function randomActBytes(actType: number, n: number, seed: number, scale = 1): Uint8Array {
  const r = rng(seed);
  if (actType === GgmlTypeId.F32 || actType === GgmlTypeId.F16 || actType === GgmlTypeId.BF16) {
    const x = new Float32Array(n).map(() => Math.floor(r() * 255) - 127);
    if (actType === GgmlTypeId.F32) return new Uint8Array(x.buffer);
    return new Uint8Array(fp32ToHalf(x, actType === GgmlTypeId.F16 ? "f16" : "bf16").buffer);
  }
  const bytes = new Uint8Array(rowBytes(actType, n));
  const dv = new DataView(bytes.buffer);
  const q = () => Math.floor(r() * 255) - 127; // -127..127, as ggml's quantizers produce
  if (actType === GgmlTypeId.Q8_K) {
    for (let b = 0; b < n / 256; b++) {
      const o = b * 292;
      dv.setFloat32(o, scale, true);
      for (let g = 0; g < 16; g++) {
        let s = 0;
        for (let l = 0; l < 16; l++) { const v = q(); dv.setInt8(o + 4 + 16 * g + l, v); s += v; }
        dv.setInt16(o + 260 + 2 * g, s, true);
      }
    }
  } else {
    const bb = actType === GgmlTypeId.Q8_1 ? 36 : 34, qoff = bb - 32;
    for (let b = 0; b < n / 32; b++) {
      let s = 0;
      do { // keep s = sum exact in fp16 (|s| <= 2048)
        s = 0;
        for (let l = 0; l < 32; l++) { const v = q(); dv.setInt8(b * bb + qoff + l, v); s += v; }
      } while (Math.abs(s) > 2048);
      dv.setUint16(b * bb, half(scale), true);
      if (actType === GgmlTypeId.Q8_1) dv.setUint16(b * bb + 2, half(scale * s), true);
    }
  }
  return bytes;
}

/** Activation row -> floats as the dot sees them (Q8_1's s is d*sum, so the plain dequantization is exact). */
function actToFloats(actType: number, bytes: Uint8Array, n: number): Float32Array {
  if (actType === GgmlTypeId.F32) return new Float32Array(bytes.slice().buffer);
  if (actType === GgmlTypeId.F16 || actType === GgmlTypeId.BF16) {
    return halfToFp32(new Uint16Array(bytes.slice().buffer), actType === GgmlTypeId.F16 ? "f16" : "bf16");
  }
  if (actType === GgmlTypeId.Q8_1) {
    // no ggml dequantizer for Q8_1: d * q
    const out = new Float32Array(n), dv = new DataView(bytes.buffer, bytes.byteOffset);
    for (let b = 0; b < n / 32; b++) {
      const d = halfToFp32(new Uint16Array([dv.getUint16(b * 36, true)]), "f16")[0];
      for (let l = 0; l < 32; l++) out[b * 32 + l] = d * dv.getInt8(b * 36 + 4 + l);
    }
    return out;
  }
  return dequantize(actType, bytes, new Float32Array(n));
}

/** For Q8_1 activations the dot uses the stored s = fp16(d * sum) for the weights' min term, not
 * d * sum: the difference (per block m_w * (s - d*sum)) belongs to the expected value. */
function q81Correction(t: GgmlTypeName, w: Uint8Array, a: Uint8Array, n: number): number {
  if (t !== "Q4_1" && t !== "Q5_1") return 0;
  const wb = t === "Q4_1" ? 20 : 24;
  const dw = new DataView(w.buffer, w.byteOffset), da = new DataView(a.buffer, a.byteOffset);
  const h = (v: number) => halfToFp32(new Uint16Array([v]), "f16")[0];
  let corr = 0;
  for (let b = 0; b < n / 32; b++) {
    const m = h(dw.getUint16(b * wb + 2, true)), d = h(da.getUint16(b * 36, true)), s = h(da.getUint16(b * 36 + 2, true));
    let sum = 0;
    for (let l = 0; l < 32; l++) sum += da.getInt8(b * 36 + 4 + l);
    corr += m * (s - d * sum);
  }
  return corr;
}

function exactDot(w: Float32Array, a: Float32Array): { sum: number; abs: number } {
  let sum = 0, abs = 0;
  for (let i = 0; i < w.length; i++) { sum += w[i] * a[i]; abs += Math.abs(w[i] * a[i]); }
  return { sum, abs };
}

/** nc activation rows placed `stride` bytes apart (stride > row bytes, to catch stride bugs). */
function stackRows(rows: Uint8Array[], stride: number): Uint8Array {
  const out = new Uint8Array(stride * rows.length).fill(0xAA);
  rows.forEach((r, i) => out.set(r, i * stride));
  return out;
}

// ---------------------------------------------------------------- the table

describe("kernel table", () => {
  it("has kernels for every weight type with llama.cpp's activation formats", () => {
    const act: Record<GgmlTypeName, GgmlTypeName> = {
      F32: "F32", F16: "F16", BF16: "BF16", Q4_0: "Q8_0", Q5_0: "Q8_0", Q8_0: "Q8_0", Q4_1: "Q8_1", Q5_1: "Q8_1",
      Q2_K: "Q8_K", Q3_K: "Q8_K", Q4_K: "Q8_K", Q5_K: "Q8_K", Q6_K: "Q8_K", Q8_1: "Q8_1", Q8_K: "Q8_K",
      IQ4_NL: "Q8_0", IQ4_XS: "Q8_K", MXFP4: "Q8_0",
    };
    for (const t of WEIGHT_TYPES) {
      const info = typeInfo(t, "scalar");
      expect(info, t).not.toBeNull();
      expect(info!.actType, t).toBe(GgmlTypeId[act[t]]);
      expect(rowBytes(t, 2 * info!.blockElems)).toBe(2 * info!.blockBytes);
    }
    expect(typeInfo(4)).toBeNull(); // Q4_2, removed from ggml
  });

  it("PRIMA_SIMD forces a lower level, and an unknown name is ignored", () => {
    const level = (env: string) => spawnSync(process.execPath, ["-e",
      `const k = require(${JSON.stringify(addonPath)}).kernels; console.log(k.simdLevel())`],
    { env: { ...process.env, PRIMA_SIMD: env }, encoding: "utf8" }).stdout.trim();
    expect(level("scalar")).toBe("scalar");
    expect(level("bogus")).toBe(simdLevel());
    expect(level("avx512")).toBe(simdLevel()); // the best level on an AVX-512 CPU; elsewhere never forced upward
  });

  it("has a SIMD dot for every weight type at every SIMD level", () => {
    for (const l of simdOnly) for (const t of WEIGHT_TYPES) expect(typeInfo(t, l)!.dotSimd, `${t} at ${l}`).toBe(l);
  });

  it("has a prompt kernel (gemm) for IQ4_XS at every x86 SIMD level; the scalar level's is its dot", () => {
    for (const l of levels) expect(typeInfo("IQ4_XS", l)!.gemm, `IQ4_XS at ${l}`).toBe(l === "avx2" || l === "avx512");
  });

  it("decodes through a rows kernel for every weight type on AVX2; the scalar level's rows are its dot row by row", () => {
    for (const t of WEIGHT_TYPES) {
      expect(typeInfo(t, "scalar")!.dotRows, `${t} at scalar`).toBe(false);
      if (levels.includes("avx2")) expect(typeInfo(t, "avx2")!.dotRows, `${t} at avx2`).toBe(true);
    }
  });
});

// ---------------------------------------------------------------- against ggml

const noOracle = oracleUnavailable();
if (noOracle) console.warn(`kernels.test: skipping the llama.cpp comparisons: ${noOracle}`);

describe.skipIf(noOracle !== null)("against llama.cpp's ggml", () => {
  it("quantizeRef writes the bytes of quantize_row_*_ref", () => {
    for (const t of WEIGHT_TYPES) {
      const n = oddLength(t);
      for (const seed of [1, 2]) {
        const x = seed === 1 ? awkwardRow(n, blockElemsOf(t), 100 + n) : normals(n, 7 * n + seed, 1);
        if (t === "F16" || t === "BF16") x.set([65504, 65520, -1e-8, 6e-8, 3e-8, Infinity, -0, NaN, 1e38], 0);
        const ours = quantizeRef(t, x);
        const theirs = ggmlQuantizeRef(GgmlTypeId[t], x);
        expect(firstDiff(ours, theirs), `${t} seed ${seed}: first differing byte`).toBe(-1);
      }
    }
  });

  it("dequantize equals dequantize_row_* bit for bit, on valid and on random blocks, at every level", () => {
    for (const t of [...WEIGHT_TYPES, "Q8_K" as GgmlTypeName]) {
      const n = t === "Q8_K" ? 512 : oddLength(t);
      const blocks: Uint8Array[] = [];
      if (t === "Q8_K") blocks.push(randomActBytes(GgmlTypeId.Q8_K, n, 3, 0.37));
      else {
        blocks.push(quantizeRef(t, awkwardRow(n, blockElemsOf(t), 5)));
        const raw = new Uint8Array(rowBytes(t, n));
        const r = rng(n + 17);
        for (let i = 0; i < raw.length; i++) raw[i] = Math.floor(r() * 256); // includes NaN/inf scales
        blocks.push(raw);
      }
      for (const bytes of blocks) {
        const theirs = ggmlDequantize(GgmlTypeId[t], bytes, n);
        for (const l of levels) {
          const ours = dequantize(t, bytes, new Float32Array(n), l);
          expect(sameBits(ours, theirs), `${t} at ${l}`).toBe(true);
        }
      }
    }
  });

  it("activation quantizers produce the bytes ggml's CPU backend feeds its dots, at every level", () => {
    const n = 256 * 7;
    const inputs = [normals(n, 11, 3), awkwardRow(n, 256, 12)];
    // ties: values whose scaled magnitude is exactly k + 0.5 (127 * x / amax)
    const ties = new Float32Array(n).map((_, i) => ((i % 64) - 32) + 0.5);
    for (let b = 0; b < n; b += 32) ties[b] = 127;
    inputs.push(ties);
    for (const act of ["F16", "BF16", "Q8_0", "Q8_1", "Q8_K"] as GgmlTypeName[]) {
      for (const [k, x] of inputs.entries()) {
        const theirs = ggmlFromFloat(GgmlTypeId[act], x);
        for (const l of levels) {
          const ours = quantizeAct(act, x, undefined, l);
          expect(firstDiff(ours, theirs), `${act} input ${k} at ${l}: first differing byte`).toBe(-1);
        }
      }
    }
  });

  it("Q8_K activations equal quantize_row_q8_K_ref; Q8_0 differs from its _ref only by ties", () => {
    const n = 256 * 4;
    const x = normals(n, 21, 1);
    expect(firstDiff(quantizeAct("Q8_K", x), ggmlQuantizeRef(GgmlTypeId.Q8_K, x))).toBe(-1);
    // ggml's x86 quantize_row_q8_0 (which we match) rounds ties to even and uses 127/amax;
    // quantize_row_q8_0_ref rounds half away from zero: a quant may differ by one, the scale never.
    const ours = quantizeAct("Q8_0", x), ref = ggmlQuantizeRef(GgmlTypeId.Q8_0, x);
    const dv1 = new DataView(ours.buffer), dv2 = new DataView(ref.buffer);
    let diffs = 0;
    for (let b = 0; b < n / 32; b++) {
      expect(dv1.getUint16(b * 34, true)).toBe(dv2.getUint16(b * 34, true));
      for (let l = 0; l < 32; l++) {
        const d = Math.abs(dv1.getInt8(b * 34 + 2 + l) - dv2.getInt8(b * 34 + 2 + l));
        expect(d).toBeLessThanOrEqual(1);
        diffs += d;
      }
    }
    expect(diffs).toBeLessThan(n / 50);
  });

  it("dots equal ggml's vec_dot on the same bytes (up to summation order)", () => {
    for (const t of WEIGHT_TYPES) {
      const n = oddLength(t);
      const info = typeInfo(t)!;
      const x = normals(n, 31, 0.5);
      const w = quantizeRef(t, awkwardRow(n, blockElemsOf(t), 32));
      const a = quantizeAct(info.actType, x);
      const theirs = ggmlVecDot(GgmlTypeId[t], n, w, a, 1)[0];
      const { abs } = exactDot(dequantize(t, w, new Float32Array(n)), actToFloats(info.actType, a, n));
      for (const l of levels) {
        const ours = dot(t, n, w, a, a.length, 1, new Float32Array(1), l)[0];
        expect(Math.abs(ours - theirs), `${t} at ${l}: ours ${ours} ggml ${theirs}`).toBeLessThanOrEqual(abs * 1e-5 + 1e-30);
      }
    }
  });
});

/** nr weight rows, stride bytes apart, the gaps filled with bytes no kernel should read: random quants with
 * sane scales on even rows, quantized weight-like rows on odd ones. */
function weightRows(t: GgmlTypeName, n: number, nr: number, stride: number, seed: number): Uint8Array {
  const w = new Uint8Array(stride * nr).fill(0x7C);
  for (let r = 0; r < nr; r++) {
    w.set(r % 2 ? quantizeRef(t, awkwardRow(n, blockElemsOf(t), seed + r)) : randomWeightBytes(t, n, seed + r), r * stride);
  }
  return w;
}

describe.skipIf(noOracle !== null)("rows kernels against llama.cpp's ggml", () => {
  it("each row of a rows call equals ggml's vec_dot on that row (up to summation order)", () => {
    for (const t of WEIGHT_TYPES) {
      const n = oddLength(t), nr = 3;
      const info = typeInfo(t)!;
      const rowLen = rowBytes(t, n), stride = rowLen + info.blockBytes;
      const w = weightRows(t, n, nr, stride, 500);
      const a = quantizeAct(info.actType, normals(n, 501, 0.5));
      for (const l of levels) {
        const got = dotRows(t, n, w, stride, nr, a, new Float32Array(nr), l);
        for (let r = 0; r < nr; r++) {
          const row = w.slice(r * stride, r * stride + rowLen);
          const theirs = ggmlVecDot(GgmlTypeId[t], n, row, a, 1)[0];
          const { abs } = exactDot(dequantize(t, row, new Float32Array(n)), actToFloats(info.actType, a, n));
          expect(Math.abs(got[r] - theirs), `${t} at ${l} row ${r}: ours ${got[r]} ggml ${theirs}`).toBeLessThanOrEqual(abs * 1e-5 + 1e-30);
        }
      }
    }
  });
});

// ---------------------------------------------------------------- SIMD vs scalar, scalar vs double

describe("dots", () => {
  it("scalar dot equals the double-precision sum of dequantized weights x dequantized activations", () => {
    for (const t of WEIGHT_TYPES) {
      const n = oddLength(t);
      const info = typeInfo(t, "scalar")!;
      for (const seed of [1, 2, 3]) {
        const w = quantizeRef(t, awkwardRow(n, blockElemsOf(t), seed));
        const a = quantizeAct(info.actType, normals(n, 50 + seed, 1));
        const { sum: plain, abs } = exactDot(dequantize(t, w, new Float32Array(n)), actToFloats(info.actType, a, n));
        const sum = plain + q81Correction(t, w, a, n);
        const got = dot(t, n, w, a, a.length, 1, new Float32Array(1), "scalar")[0];
        // K-quants with mins fold the min term through bsums: algebraically equal, rounded differently
        expect(Math.abs(got - sum), `${t} seed ${seed}: ${got} vs ${sum}`).toBeLessThanOrEqual(abs * 1e-5 + 1e-30);
      }
    }
  });

  it("every SIMD dot equals its scalar twin exactly on exact data, for nc = 1..MAX_NC and strided rows", () => {
    // power-of-two scales and small integers: every partial sum is an exact integer in float, so any
    // difference is a wrong integer part, not rounding
    for (const l of simdOnly) {
      for (const t of WEIGHT_TYPES) {
        const info = typeInfo(t, l)!;
        for (const blocks of K_TYPES.has(t) ? [1, 3] : [1, 7, 33]) {
          const n = blocks * Math.max(info.blockElems, t.startsWith("Q") ? 32 : 32);
          const w = randomWeightBytes(t, n, 1000 + n);
          const wf = dequantize(t, w, new Float32Array(n), "scalar");
          const actRow = rowBytes(info.actType, n);
          const stride = actRow + 64;
          const rows = Array.from({ length: MAX_NC }, (_, c) => randomActBytes(info.actType, n, 77 * c + n));
          const acts = stackRows(rows, stride);
          for (let nc = 1; nc <= MAX_NC; nc++) {
            const want = dot(t, n, w, acts, stride, nc, new Float32Array(nc), "scalar");
            const got = dot(t, n, w, acts, stride, nc, new Float32Array(nc), l);
            for (let c = 0; c < nc; c++) {
              const exact = exactDot(wf, actToFloats(info.actType, rows[c], n)).sum;
              expect(Math.abs(exact), "test data must stay exactly representable").toBeLessThan(2 ** 24);
              expect(want[c], `${t} scalar n=${n} nc=${nc} row ${c}`).toBe(exact);
              expect(got[c], `${t} ${l} n=${n} nc=${nc} row ${c}`).toBe(exact);
            }
          }
        }
      }
    }
  });

  it("every SIMD dot equals its scalar twin within summation tolerance on real data", () => {
    for (const l of simdOnly) {
      for (const t of WEIGHT_TYPES) {
        const info = typeInfo(t, l)!;
        const n = oddLength(t);
        const w = quantizeRef(t, awkwardRow(n, blockElemsOf(t), 9));
        const wf = dequantize(t, w, new Float32Array(n));
        const actRow = rowBytes(info.actType, n);
        const stride = actRow + 32;
        const rows = Array.from({ length: MAX_NC }, (_, c) => quantizeAct(info.actType, normals(n, 300 + c, 2)));
        const acts = stackRows(rows, stride);
        for (let nc = 1; nc <= MAX_NC; nc++) {
          const want = dot(t, n, w, acts, stride, nc, new Float32Array(nc), "scalar");
          const got = dot(t, n, w, acts, stride, nc, new Float32Array(nc), l);
          for (let c = 0; c < nc; c++) {
            const { abs } = exactDot(wf, actToFloats(info.actType, rows[c], n));
            expect(Math.abs(got[c] - want[c]), `${t} ${l} nc=${nc} row ${c}`).toBeLessThanOrEqual(abs * 1e-5 + 1e-30);
          }
        }
      }
    }
  });

  it("rows kernels equal the level's dot (nc = 1) on each row bit for bit, for nr = 1..5 and padded strides", () => {
    // decode runs the rows kernel and prompts run the dot: the same weights must give the same bits
    for (const l of levels) {
      for (const t of WEIGHT_TYPES) {
        const info = typeInfo(t, l)!;
        const n = oddLength(t), nrMax = 5;
        const rowLen = rowBytes(t, n), stride = rowLen + 3 * info.blockBytes + 1;
        const w = weightRows(t, n, nrMax, stride, 600);
        for (const a of [quantizeAct(info.actType, normals(n, 601, 2)), randomActBytes(info.actType, n, 602)]) {
          const want = Float32Array.from({ length: nrMax }, (_, r) =>
            dot(t, n, w.slice(r * stride, r * stride + rowLen), a, a.length, 1, new Float32Array(1), l)[0]);
          for (let nr = 1; nr <= nrMax; nr++) {
            const got = dotRows(t, n, w, stride, nr, a, new Float32Array(nr), l);
            expect(sameBits(got, want.subarray(0, nr)), `${t} at ${l} nr=${nr}: ${got} vs ${want.subarray(0, nr)}`).toBe(true);
          }
          // a sub-range of rows (the matmul hands each thread chunks that start anywhere)
          const got = dotRows(t, n, w.subarray(2 * stride), stride, 3, a, new Float32Array(3), l);
          expect(sameBits(got, want.subarray(2, 5)), `${t} at ${l} rows 2..4`).toBe(true);
        }
      }
    }
  });

  it("each row of an nc-row dot equals the nc = 1 dot on that row bit for bit, at model widths, every type and level", () => {
    // A prompt batch runs the dot with nc rows and decode one row at a time (the rows kernel, equal to
    // nc = 1 above): the prompt cache and failover replay need the same hidden state either way. Widths of
    // several super-blocks (2048 = 8 of 256, 64 of 32) and a float width with a tail past the vectors.
    for (const l of levels) {
      for (const t of WEIGHT_TYPES) {
        const info = typeInfo(t, l)!;
        for (const n of blockElemsOf(t) === 1 ? [2048, 2048 + 37] : [2048, 5632]) {
          const w = quantizeRef(t, normals(n, 700 + n, 0.02));
          const actRow = rowBytes(info.actType, n), stride = actRow + 64;
          const rows = Array.from({ length: MAX_NC }, (_, c) => quantizeAct(info.actType, normals(n, 710 + c, 1 + c)));
          const acts = stackRows(rows, stride);
          const alone = Float32Array.from(rows, (r) => dot(t, n, w, r, r.length, 1, new Float32Array(1), l)[0]);
          for (let nc = 2; nc <= MAX_NC; nc++) {
            for (const first of nc < MAX_NC ? [0, MAX_NC - nc] : [0]) { // any rows, not only the first ones
              const got = dot(t, n, w, acts.subarray(first * stride), stride, nc, new Float32Array(nc), l);
              expect(sameBits(got, alone.subarray(first, first + nc)), `${t} at ${l} n=${n} nc=${nc} rows ${first}..: ${got} vs ${alone.subarray(first, first + nc)}`)
                .toBe(true);
            }
          }
        }
      }
    }
  });

  it("a gemm (a prompt's product) equals the level's dot (nc = 1) bit for bit on every row and token, and scalar within tolerance", () => {
    // The matmul runs a gemm on prompt batches and the rows kernel (= the dot at nc = 1) on one token:
    // a level's gemm must give each row and token decode's bits, whatever its blocking of rows and tokens.
    // 19 rows and 70 tokens: whole and partial panels of rows, token blocks and tiles with tails; 5
    // tokens: a decode step of several sequences (on x86 the first group of tokens streams with prefetch).
    const nr = 19;
    for (const nt of [70, 5]) for (const l of levels) {
      for (const t of WEIGHT_TYPES) {
        const info = typeInfo(t, l)!;
        const n = K_TYPES.has(t) ? 3 * 256 : 7 * 32;
        const rowLen = rowBytes(t, n), wStride = rowLen + info.blockBytes + 5;
        const w = weightRows(t, n, nr, wStride, 800 + n);
        const actRow = rowBytes(info.actType, n), aStride = actRow + 24;
        const rows = Array.from({ length: nt }, (_, c) => quantizeAct(info.actType, normals(n, 810 + c, 0.5 + (c % 5))));
        const acts = stackRows(rows, aStride);
        const outStride = nr + 3;
        const got = gemm(t, n, w, wStride, nr, acts, aStride, nt, new Float32Array(nt * outStride), outStride, false, l);
        const base = normals(nt * outStride, 820);
        const added = gemm(t, n, w, wStride, nr, acts, aStride, nt, base.slice(), outStride, true, l);
        for (let r = 0; r < nr; r++) {
          const row = w.slice(r * wStride, r * wStride + rowLen);
          const wf = dequantize(t, row, new Float32Array(n));
          for (let c = 0; c < nt; c++) {
            const at = c * outStride + r;
            const alone = dot(t, n, row, rows[c], actRow, 1, new Float32Array(1), l)[0];
            expect(sameBits(got.subarray(at, at + 1), Float32Array.of(alone)), `${t} at ${l} row ${r} token ${c}: gemm ${got[at]} dot ${alone}`).toBe(true);
            expect(sameBits(added.subarray(at, at + 1), Float32Array.of(base[at] + alone)), `${t} at ${l} row ${r} token ${c}: accumulate`).toBe(true);
            if (l === "scalar" || c % 7) continue; // against the scalar twin: a sample of tokens
            const scalar = dot(t, n, row, rows[c], actRow, 1, new Float32Array(1), "scalar")[0];
            const { abs } = exactDot(wf, actToFloats(info.actType, rows[c], n));
            expect(Math.abs(got[at] - scalar), `${t} at ${l} row ${r} token ${c}: gemm ${got[at]} scalar ${scalar}`).toBeLessThanOrEqual(abs * 1e-5 + 1e-30);
          }
        }
        // the gaps between output rows are left alone
        for (let c = 0; c < nt; c++) for (let r = nr; r < outStride; r++) expect(got[c * outStride + r]).toBe(0);
      }
    }
  });

  it("SIMD dequantizers and activation quantizers equal the scalar ones on every level", () => {
    for (const l of simdOnly) {
      for (const t of WEIGHT_TYPES) {
        const n = oddLength(t);
        const w = quantizeRef(t, awkwardRow(n, blockElemsOf(t), 4));
        expect(sameBits(dequantize(t, w, new Float32Array(n), l), dequantize(t, w, new Float32Array(n), "scalar")), `${t} ${l}`)
          .toBe(true);
      }
      for (const act of ["F32", "F16", "BF16", "Q8_0", "Q8_1", "Q8_K"] as GgmlTypeName[]) {
        const x = awkwardRow(256 * 5, 256, 8);
        expect(firstDiff(quantizeAct(act, x, undefined, l), quantizeAct(act, x, undefined, "scalar")), `${act} ${l}`).toBe(-1);
      }
    }
  });
});

// ---------------------------------------------------------------- bad input

describe("bad input gives a clear error", () => {
  const n = 256;
  const w = quantizeRef("Q4_K", normals(n, 1));
  const a = quantizeAct("Q8_K", normals(n, 2));
  const out = new Float32Array(MAX_NC);
  it("names the problem and keeps the process up", () => {
    expect(() => dot(99, n, w, a, a.length, 1, out)).toThrow(/type/);
    expect(() => dot(4, n, w, a, a.length, 1, out)).toThrow(/not a weight type/);
    expect(() => dot("Q9_X" as GgmlTypeName, n, w, a, a.length, 1, out)).toThrow(/unknown ggml type/);
    expect(() => dot("Q4_K", n, w.subarray(1), a, a.length, 1, out)).toThrow(/needs 144/);
    expect(() => dot("Q4_K", 100, w, a, a.length, 1, out)).toThrow(/whole number of Q4_K blocks/);
    expect(() => dot("Q4_K", n, w, a.subarray(4), a.length, 1, out)).toThrow(/activation rows need/);
    expect(() => dot("Q4_K", n, w, a, 8, 1, out)).toThrow(/aStride 8 is shorter/);
    expect(() => dot("Q4_K", n, w, a, a.length, 0, out)).toThrow(/nc must be/);
    expect(() => dot("Q4_K", n, w, a, a.length, MAX_NC + 1, out)).toThrow(/nc must be/);
    expect(() => dot("Q4_K", n, w, a, a.length, 2, out)).toThrow(/activation rows need/);
    expect(() => dot("Q4_K", n, w, a, a.length, 1, new Float32Array(0))).toThrow(/out/);
    expect(() => dot("Q4_K", n, w, new Float32Array(8) as unknown as Uint8Array, 8, 1, out)).toThrow(/Uint8Array/);
    expect(() => dot("Q4_K", n, w, a, a.length, 1, out, "avx9000" as SimdLevel)).toThrow(/unknown simd level/);
    expect(() => dotRows("Q4_K", n, w, w.length, 0, a, out)).toThrow(/nr must be/);
    expect(() => dotRows("Q4_K", n, w, w.length - 1, 1, a, out)).toThrow(/wStride 143 is shorter/);
    expect(() => dotRows("Q4_K", n, w, w.length, 2, a, out)).toThrow(/2 rows need 288/);
    expect(() => dotRows("Q4_K", n, w, w.length, 1, a.subarray(1), out)).toThrow(/needs 292/);
    expect(() => dotRows("Q4_K", n, w, w.length, 1, a, new Float32Array(0))).toThrow(/out/);
    expect(() => dotRows("Q4_K", 100, w, w.length, 1, a, out)).toThrow(/whole number of Q4_K blocks/);
    expect(() => gemm("Q4_K", n, w, w.length, 2, a, a.length, 1, out, 2, false)).toThrow(/shorter than nr rows/);
    expect(() => gemm("Q4_K", n, w, w.length, 1, a, a.length, 2, out, 1, false)).toThrow(/shorter than nr rows/);
    expect(() => gemm("Q4_K", n, w, w.length, 1, a, a.length, 1, new Float32Array(0), 1, false)).toThrow(/shorter than nr rows/);
    expect(() => gemm("Q4_K", n, w, w.length, 2, a, a.length, 1, out, 1, false)).toThrow(/outStride 1 < nr 2/);
    expect(() => gemm("Q4_K", n, w, w.length - 1, 1, a, a.length, 1, out, 1, false)).toThrow(/wStride 143 < 144/);
    expect(() => gemm("Q4_K", n, w, w.length, 0, a, a.length, 1, out, 1, false)).toThrow(/nr must be/);
    expect(() => gemm("Q4_K", n, w, w.length, 1, a, a.length, 1, out, 1, 1 as unknown as boolean)).toThrow(/accumulate must be a boolean/);
    expect(() => gemm("IQ4_XS", 100, w, w.length, 1, a, a.length, 1, out, 1, false)).toThrow(/whole number of IQ4_XS blocks/);
    expect(() => quantizeRef("Q4_K", new Float32Array(100))).toThrow(/whole number/);
    expect(() => quantizeRef("Q8_K", new Float32Array(256))).toThrow(/not a weight type/);
    expect(() => quantizeAct("Q4_K", new Float32Array(256))).toThrow(/not an activation format/);
    expect(() => dequantize("Q4_K", w, new Float32Array(255))).toThrow(/whole number/);
    expect(() => dequantize("Q4_K", w, new Float32Array(512))).toThrow(/needs 288/);
    expect(() => rowBytes("Q4_K", 100)).toThrow(/whole number/);
    expect(() => rowBytes(4, 32)).toThrow(/not a known type/);
    // still alive and correct after the errors
    expect(Number.isFinite(dot("Q4_K", n, w, a, a.length, 1, out)[0])).toBe(true);
  });

  it("works on misaligned views", () => {
    const buf = new Uint8Array(w.length + 1);
    buf.set(w, 1);
    const got = dot("Q4_K", n, buf.subarray(1), a, a.length, 1, new Float32Array(1))[0];
    expect(got).toBe(dot("Q4_K", n, w, a, a.length, 1, new Float32Array(1))[0]);
  });
});

describe("gemma's GELU feed-forward (geglu)", () => {
  // every F16 value, values between them, the +-10 edges where the table stops, and odd lengths
  const halves = new Uint16Array(65536).map((_, i) => i);
  const gate = new Float32Array([...halfToFp32(halves, "f16"), ...normals(4099, 5, 4), 10, -10, 9.9999, -9.9999, 1e-8, -3e-6, 7e4, -7e4]);
  const up = normals(gate.length, 6);

  it("every SIMD level gives the scalar loop's bits", () => {
    const want = geglu(gate.slice(), up, "scalar");
    for (const l of simdOnly) expect(sameBits(geglu(gate.slice(), up, l), want), l).toBe(true);
  });

  it("is the tanh GELU read from an F16 table: within F16 rounding of the formula", () => {
    const got = geglu(gate.slice(), up, "scalar");
    const off: string[] = [];
    let checked = 0;
    for (let i = 0; i < gate.length; i++) {
      const x = gate[i];
      if (!Number.isFinite(x) || Math.abs(x) > 60000) continue;
      const g = x <= -10 ? 0 : x >= 10 ? x : 0.5 * x * (1 + Math.tanh(0.7978845608 * x * (1 + 0.044715 * x * x)));
      const want = g * up[i];
      checked++;
      if (!(Math.abs(got[i] - want) <= 2e-3 * Math.abs(x * up[i]) + 1e-7)) off.push(`x=${x}: ${got[i]} for ${want}`);
    }
    expect(checked).toBeGreaterThan(60000);
    expect(off.slice(0, 5)).toEqual([]);
  });
});
