// Attention over a quantized KV cache (native/src/kv_cache.c) reads the blocks directly: Q·K is the
// kernels' dot of Q8_0-quantized Q against the K blocks, and V is accumulated from the V blocks. It must
// equal attention computed in double precision over the dequantized cache (Q rounded as the kernel
// rounds it: to F16 against an F16 K, to Q8_0 against a quantized K), at every SIMD level.
import { describe, expect, it } from "vitest";
import { GgmlTypeId, dequantize, fp32ToHalf, halfToFp32, kvAttend, kvAttendRows, kvStore, quantizeAct, quantizeRef, rowBytes, simdLevels } from "../../native/index.js";
import { normalFloats } from "../helpers/random.js";

const randoms = normalFloats(12345);

type KvName = "F16" | "Q8_0" | "Q4_0";

/** The cache's rows as the window stores them, and as floats again. */
function cacheOf(type: KvName, x: Float32Array, d: number, nPos: number) {
  const row = rowBytes(type, d), bytes = new Uint8Array(row * nPos), floats = new Float32Array(d * nPos);
  for (let p = 0; p < nPos; p++) {
    const dst = bytes.subarray(p * row, (p + 1) * row);
    kvStore(type, x.subarray(p * d, (p + 1) * d), dst);
    if (type === "F16") halfToFp32(new Uint16Array(dst.slice().buffer), "f16", floats.subarray(p * d, (p + 1) * d));
    else dequantize(type, dst.slice(), floats.subarray(p * d, (p + 1) * d));
  }
  return { bytes, floats };
}

/** softmax(scale * q·K)·V in double over float rows, the query rounded as the kernel rounds it. */
function reference(kType: KvName, K: Float32Array, V: Float32Array, q: Float32Array, ratio: number, d: number, nPos: number, scale: number, softcap: number) {
  const qr = kType === "F16"
    ? halfToFp32(fp32ToHalf(q, "f16"), "f16")
    : dequantize("Q8_0", quantizeAct("Q8_0", q), new Float32Array(q.length));
  const out = new Float32Array(ratio * d);
  for (let h = 0; h < ratio; h++) {
    const s = new Float64Array(nPos);
    for (let p = 0; p < nPos; p++) {
      let dot = 0;
      for (let i = 0; i < d; i++) dot += qr[h * d + i] * K[p * d + i];
      s[p] = softcap > 0 ? Math.tanh((dot * scale) / softcap) * softcap : dot * scale;
    }
    const m = Math.max(...s);
    let sum = 0;
    for (let p = 0; p < nPos; p++) sum += (s[p] = Math.exp(s[p] - m));
    for (let i = 0; i < d; i++) {
      let acc = 0;
      for (let p = 0; p < nPos; p++) acc += s[p] * V[p * d + i];
      out[h * d + i] = acc / sum;
    }
  }
  return out;
}

function maxRelErr(a: Float32Array, b: Float32Array): number {
  let err = 0, mag = 0;
  for (let i = 0; i < a.length; i++) {
    err = Math.max(err, Math.abs(a[i] - b[i]));
    mag = Math.max(mag, Math.abs(b[i]));
  }
  return err / mag;
}

const TYPES: KvName[] = ["F16", "Q8_0", "Q4_0"];

describe("attention over the quantized cache equals attention over the dequantized cache", () => {
  const cases: [kType: KvName, vType: KvName, ratio: number, d: number, nPos: number, softcap: number][] = [];
  for (const k of TYPES) for (const v of TYPES) cases.push([k, v, 2, 64, 300, 0]);
  cases.push(["Q8_0", "Q4_0", 4, 128, 129, 0], ["Q4_0", "Q8_0", 1, 32, 7, 0], ["Q8_0", "Q8_0", 3, 96, 260, 30]);
  it.each(cases)("K %s V %s, %d heads of %d over %d positions, softcap %d", (kType, vType, ratio, d, nPos, softcap) => {
    const scale = 1 / Math.sqrt(d);
    const K = cacheOf(kType, randoms(d * nPos), d, nPos), V = cacheOf(vType, randoms(d * nPos), d, nPos);
    const q = randoms(ratio * d, 2);
    const want = reference(kType, K.floats, V.floats, q, ratio, d, nPos, scale, softcap);
    for (const level of simdLevels()) {
      const got = kvAttend(kType, vType, K.bytes, V.bytes, nPos, ratio, d, q, scale, softcap, level);
      // float summation against double: a few ulp of the output's magnitude
      expect(maxRelErr(got, want), `${level}`).toBeLessThan(2e-5);
    }
    // the reference is not trivially close to anything: without the V blocks' scales it is far off
    if (vType !== "F16") {
      const wrong = reference(kType, K.floats, V.floats.map((x) => x * 1.01), q, ratio, d, nPos, scale, softcap);
      expect(maxRelErr(wrong, want)).toBeGreaterThan(1e-3);
    }
  });
});

describe("a batch's tiled attention over an F16 cache equals each token's attention", () => {
  // tokens at pos0.. attend causally (or to their last `window` positions): tiles of several tokens, blocks
  // of cached positions that straddle the tokens' own, row padding (ratio 3), soft-capping
  const cases: [ratio: number, d: number, pos0: number, nTok: number, window: number, softcap: number][] = [
    [2, 128, 150, 70, 0, 0], [3, 64, 0, 45, 0, 0], [1, 256, 37, 5, 0, 0], [4, 32, 90, 40, 60, 0], [2, 64, 200, 33, 0, 30],
  ];
  it.each(cases)("%d heads of %d, %d cached + %d tokens, window %d, softcap %d", (ratio, d, pos0, nTok, window, softcap) => {
    const scale = 1 / Math.sqrt(d), nPos = pos0 + nTok;
    const K = cacheOf("F16", randoms(d * nPos, 5), d, nPos), V = cacheOf("F16", randoms(d * nPos, 6), d, nPos);
    const q = randoms(nTok * ratio * d, 7);
    const want = new Float32Array(nTok * ratio * d);
    for (let t = 0; t < nTok; t++) {
      const hi = pos0 + t + 1, lo = window > 0 && hi > window ? hi - window : 0;
      want.set(reference("F16", K.floats.subarray(lo * d, hi * d), V.floats.subarray(lo * d, hi * d), q.subarray(t * ratio * d, (t + 1) * ratio * d),
        ratio, d, hi - lo, scale, softcap), t * ratio * d);
    }
    const levels = simdLevels();
    for (const level of levels) {
      const { out, tiled } = kvAttendRows("F16", "F16", K.bytes, V.bytes, pos0, nTok, ratio, d, q, scale, { softcap, window, level });
      expect(tiled, `${level}`).toBe(level === "avx2" || level === "avx512");
      expect(maxRelErr(out, want), `${level}`).toBeLessThan(2e-5);
    }
    // a token alone (decode) gets the bits it gets in the batch: the prompt cache and failover replay rely on it
    for (const t of [0, nTok - 1]) {
      const n = pos0 + t + 1, qt = q.subarray(t * ratio * d, (t + 1) * ratio * d);
      const alone = kvAttendRows("F16", "F16", K.bytes.subarray(0, n * 2 * d), V.bytes.subarray(0, n * 2 * d), pos0 + t, 1, ratio, d, qt, scale,
        { softcap, window });
      const { out } = kvAttendRows("F16", "F16", K.bytes, V.bytes, pos0, nTok, ratio, d, q, scale, { softcap, window });
      expect(alone.out, `token ${t}`).toEqual(out.subarray(t * ratio * d, (t + 1) * ratio * d));
    }
    // the reference tells a window from none: attending to every position is far off
    if (window > 0) {
      const { out } = kvAttendRows("F16", "F16", K.bytes, V.bytes, pos0, nTok, ratio, d, q, scale, { softcap, level: levels[levels.length - 1] });
      expect(maxRelErr(out, want)).toBeGreaterThan(1e-2);
    }
  });
});

describe("cache rows are quantized as llama.cpp writes them", () => {
  it("Q8_0 as the CPU backend's quantize_row_q8_0, Q4_0 as quantize_row_q4_0_ref, F16 rounded to nearest even", () => {
    const x = randoms(32 * 64, 3);
    expect(kvStore("Q8_0", x)).toEqual(quantizeAct("Q8_0", x));
    expect(kvStore("Q4_0", x)).toEqual(quantizeRef("Q4_0", x));
    expect(kvStore("F16", x)).toEqual(quantizeAct("F16", x));
  });

  it("other types are refused by name", () => {
    expect(() => kvStore("Q4_K", randoms(256))).toThrow(/Q4_K is not a KV cache type/);
    expect(() => kvAttend(GgmlTypeId.Q8_0, GgmlTypeId.F16, new Uint8Array(34), new Uint8Array(16), 1, 1, 8, randoms(8), 1))
      .toThrow(/blocks of 32/);
  });
});
