// Sparse attention (native/src/sparse_attn.c): which positions a query sees, stated here again and held
// to the native rule; that the kernel attends exactly to them (against attention computed in double
// precision over the selected set: the window, sinks and rungs as cached rows, each landmark as the mean
// of its block's rows with its score + ln(block)), at every SIMD level; and that a query whose window
// reaches position 0 gets dense attention's bits.
import { describe, expect, it } from "vitest";
import {
  dequantize, fp32ToHalf, halfToFp32, kvAttend, kvAttendSparse, kvStore, quantizeAct, rowBytes, simdLevels, sparseLandmarks, sparseSelect,
  type SparseSettings,
} from "../../native/index.js";
import { normalFloats } from "../helpers/random.js";

const randoms = normalFloats(987654);

type KvName = "F16" | "Q8_0" | "Q4_0";

/** The rule, stated independently of the C: the positions a query at i attends to one by one, and the
 * blocks it sees as landmarks. */
function selected(c: SparseSettings, i: number): { positions: number[]; blocks: number } {
  const wlo = Math.max(0, i - c.window + 1);
  if (wlo === 0) return { positions: Array.from({ length: i + 1 }, (_, p) => p), blocks: 0 };
  const set = new Set<number>();
  for (let p = 0; p < Math.min(c.sinks, wlo); p++) set.add(p);
  if (c.logStride) for (let step = 1; i - step >= 0; step *= 2) if (i - step < wlo && i - step >= c.sinks) set.add(i - step);
  for (let p = wlo; p <= i; p++) set.add(p);
  return { positions: [...set].sort((a, b) => a - b), blocks: c.block > 0 ? Math.floor(wlo / c.block) : 0 };
}

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

/** softmax over the selected entries in double: cached rows scored with q rounded as the kernel rounds it
 * against the cache's K type, landmarks (block means in double) with the unrounded q and + ln(block). */
function reference(kType: KvName, K: Float32Array, V: Float32Array, q: Float32Array, ratio: number, d: number, i: number, scale: number,
  c: SparseSettings) {
  const qr = kType === "F16" ? halfToFp32(fp32ToHalf(q, "f16"), "f16") : dequantize("Q8_0", quantizeAct("Q8_0", q), new Float32Array(q.length));
  const { positions, blocks } = selected(c, i);
  const entries: { score: (h: number) => number; value: (e: number) => number }[] = [];
  for (const p of positions) {
    entries.push({
      score: (h) => { let s = 0; for (let e = 0; e < d; e++) s += qr[h * d + e] * K[p * d + e]; return s * scale; },
      value: (e) => V[p * d + e],
    });
  }
  for (let b = 0; b < blocks; b++) {
    const mk = new Float64Array(d), mv = new Float64Array(d);
    for (let p = b * c.block; p < (b + 1) * c.block; p++) for (let e = 0; e < d; e++) { mk[e] += K[p * d + e] / c.block; mv[e] += V[p * d + e] / c.block; }
    entries.push({
      score: (h) => { let s = 0; for (let e = 0; e < d; e++) s += q[h * d + e] * mk[e]; return s * scale + Math.log(c.block); },
      value: (e) => mv[e],
    });
  }
  const out = new Float32Array(ratio * d);
  for (let h = 0; h < ratio; h++) {
    const s = entries.map((x) => x.score(h)), m = Math.max(...s), w = s.map((x) => Math.exp(x - m)), sum = w.reduce((a, b) => a + b, 0);
    for (let e = 0; e < d; e++) {
      let acc = 0;
      entries.forEach((x, j) => { acc += w[j] * x.value(e); });
      out[h * d + e] = acc / sum;
    }
  }
  return { out, entries: entries.length };
}

function maxRelErr(a: Float32Array, b: Float32Array): number {
  let err = 0, mag = 0;
  for (let i = 0; i < a.length; i++) {
    err = Math.max(err, Math.abs(a[i] - b[i]));
    mag = Math.max(mag, Math.abs(b[i]));
  }
  return err / mag;
}

describe("the selection rule", () => {
  it("the native rule equals the one stated here, over settings and positions", () => {
    const settings: SparseSettings[] = [
      { window: 128, sinks: 4, logStride: true, block: 64 }, { window: 16, sinks: 0, logStride: true, block: 0 },
      { window: 1, sinks: 1, logStride: false, block: 2 }, { window: 37, sinks: 50, logStride: true, block: 7 },
      { window: 8, sinks: 3, logStride: false, block: 0 },
    ];
    let checked = 0;
    for (const c of settings)
      for (const i of [0, 1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 127, 128, 129, 200, 1000, 4095, 4096, 16383, 1 << 20]) {
        const got = sparseSelect(c, i), want = selected(c, i);
        const positions: number[] = [];
        for (let p = 0; p < got.sinkEnd; p++) positions.push(p);
        positions.push(...got.rungs);
        for (let p = got.windowStart; p <= i; p++) positions.push(p);
        expect(positions, `${JSON.stringify(c)} at ${i}`).toEqual(want.positions);
        expect(got.blocks).toBe(want.blocks);
        checked++;
      }
    expect(checked).toBe(100);
  });

  it("a query sees O(window + sinks + log i + i / block) entries: 8k positions in under 300", () => {
    const c: SparseSettings = { window: 128, sinks: 4, logStride: true, block: 64 };
    const s = selected(c, 8191);
    expect(s.positions.length + s.blocks).toBeLessThan(300);
    expect(s.positions.length + s.blocks).toBeGreaterThan(128 + 4 + 127);
  });

  it("bad settings are refused by name", () => {
    expect(() => sparseSelect({ window: 0, sinks: 0, logStride: true, block: 0 }, 5)).toThrow(/window/);
    expect(() => sparseSelect({ window: 4, sinks: 0, logStride: true, block: 1 }, 5)).toThrow(/block/);
  });
});

const TYPES: KvName[] = ["F16", "Q8_0", "Q4_0"];

describe("sparse attention attends exactly to the selected positions", () => {
  const cases: [kType: KvName, vType: KvName, ratio: number, d: number, i: number, c: SparseSettings][] = [];
  for (const k of TYPES) for (const v of TYPES) cases.push([k, v, 2, 64, 700, { window: 128, sinks: 4, logStride: true, block: 64 }]);
  cases.push(
    ["F16", "F16", 4, 32, 299, { window: 40, sinks: 0, logStride: true, block: 16 }],
    ["Q8_0", "Q4_0", 1, 128, 1500, { window: 200, sinks: 9, logStride: false, block: 100 }],
    ["F16", "Q8_0", 3, 96, 130, { window: 20, sinks: 2, logStride: true, block: 0 }],
  );
  it.each(cases)("K %s V %s, %d heads of %d, query at %d, %j", (kType, vType, ratio, d, i, c) => {
    const scale = 1 / Math.sqrt(d), nPos = i + 1;
    const K = cacheOf(kType, randoms(d * nPos), d, nPos), V = cacheOf(vType, randoms(d * nPos), d, nPos);
    const q = randoms(ratio * d, 2);
    const sel = sparseSelect(c, i);
    const lm = sparseLandmarks(kType, vType, K.bytes, V.bytes, sel.blocks, d, Math.max(c.block, 2));
    const want = reference(kType, K.floats, V.floats, q, ratio, d, i, scale, c);
    expect(want.entries).toBeLessThan(nPos / 2); // the case is sparse
    for (const level of simdLevels()) {
      const got = kvAttendSparse(kType, vType, K.bytes, V.bytes, i, ratio, d, q, scale, c, lm, 0, level);
      expect(maxRelErr(got, want.out), `${level}`).toBeLessThan(2e-5);
    }
    // not dense attention: over all positions the answer is far off
    const dense = kvAttend(kType, vType, K.bytes, V.bytes, nPos, ratio, d, q, scale);
    expect(maxRelErr(dense, want.out)).toBeGreaterThan(1e-2);
  });

  it("a query whose window reaches position 0 gets dense attention's bits, at every level", () => {
    const d = 64, ratio = 2, c: SparseSettings = { window: 128, sinks: 4, logStride: true, block: 64 };
    for (const kType of TYPES)
      for (const i of [0, 5, 127]) {
        const nPos = i + 1, K = cacheOf(kType, randoms(d * nPos), d, nPos), V = cacheOf("F16", randoms(d * nPos), d, nPos), q = randoms(ratio * d);
        for (const level of simdLevels()) {
          const got = kvAttendSparse(kType, "F16", K.bytes, V.bytes, i, ratio, d, q, 0.125, c, { k: new Float32Array(0), v: new Float32Array(0) }, 0, level);
          expect(got).toEqual(kvAttend(kType, "F16", K.bytes, V.bytes, nPos, ratio, d, q, 0.125, 0, level));
        }
      }
  });
});
