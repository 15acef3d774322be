// Mixture-of-experts pricing (docs/HALDA.md "Mixture of experts"): the reread formula ρ on hand-worked
// numbers, its linear form against it, the routing segments, and a skewed MoE model priced with fewer
// reread bytes than its uniform and dense equivalents of the same size.

import { describe, expect, test } from "vitest";
import { moeRereadBytes, moeRereadLines, moeTermsOf, predictLatency, routingSegments, type DeviceProfile, type ModelProfile, type MoeTerms } from "../../halda/index.js";
import { routingShareFromHits, withMeasuredRouting } from "../../model/index.js";
import { moeReread } from "./oracle.js";

const terms = (shares: number[], k: number, e: number, dense: number): MoeTerms => ({
  nExpert: shares.length, nUsed: k, expertBytes: e, denseBytesWithKv: dense, segments: routingSegments(shares),
});

describe("ρ: expected reread bytes per token", () => {
  const mt = terms([0.4, 0.3, 0.2, 0.1], 1, 100, 50); // b' = 450 a layer

  test("a window that fits rereads nothing", () => {
    expect(moeRereadBytes(mt, 2, 900)).toBe(0);
    expect(moeRereadBytes(mt, 2, 1000)).toBe(0);
  });

  test("hottest experts resident: 1.5 of 4 per layer keeps 0.4 + 0.5·0.3 of the assignments", () => {
    // room 400 = 2 dense parts (100) + 3 experts: j = 1.5; missed share 1 − 0.4 − 0.15 = 0.45; 2 layers · k·e = 200
    expect(moeRereadBytes(mt, 2, 400)).toBeCloseTo(90, 9);
    // one expert a layer: 1 − 0.4 = 0.6 of 200
    expect(moeRereadBytes(mt, 2, 300)).toBeCloseTo(120, 9);
  });

  test("no room for the dense parts: their excess and every routed expert", () => {
    expect(moeRereadBytes(mt, 2, 60)).toBeCloseTo(100 - 60 + 2 * 100, 9);
    expect(moeRereadBytes(mt, 0, -30)).toBeCloseTo(30, 9);
  });

  test("k experts a token: k times the bytes of one routed expert", () => {
    const k2 = terms([0.25, 0.25, 0.25, 0.25], 2, 100, 50);
    // nothing of the experts resident: 2 layers · 2 experts · 100
    expect(moeRereadBytes(k2, 2, 100)).toBeCloseTo(400, 9);
    // half of them resident, uniform: half of that
    expect(moeRereadBytes(k2, 2, 500)).toBeCloseTo(200, 9);
  });

  test("the linear form (the maximum of its lines and 0) equals ρ everywhere, and the oracle's greedy fill agrees", () => {
    const shapes: MoeTerms[] = [mt, terms([0.25, 0.25, 0.25, 0.25], 2, 70, 33), terms([0.3, 0.05, 0.2, 0.2, 0.1, 0.05, 0.05, 0.05], 3, 12, 200)];
    for (const s of shapes) {
      const bp = s.denseBytesWithKv + s.nExpert * s.expertBytes;
      for (let r = 0; r <= 6; r++) {
        for (let room = -200; room <= 7 * bp; room += bp / 13) {
          const rho = moeRereadBytes(s, r, room);
          const viaLines = Math.max(0, ...moeRereadLines(s, room).map((l) => l.slope * r + l.intercept));
          expect(viaLines).toBeCloseTo(rho, 6);
          const model = { layerBytes: bp, kvBytesPerTokenLayer: 0, nCtx: 1, moe: { nExpert: s.nExpert, nExpertUsed: s.nUsed, expertBytes: s.expertBytes, routingShare: s.segments.flatMap((g) => new Array<number>(g.count).fill(g.share)) } } as unknown as ModelProfile;
          expect(moeReread(model, r, room)).toBeCloseTo(rho, 6);
        }
      }
    }
  });
});

describe("routing segments", () => {
  test("equal shares merge exactly; a skew keeps its ranks, hottest first", () => {
    expect(routingSegments([0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125])).toEqual([{ count: 8, share: 0.125 }]);
    expect(routingSegments([0.1, 0.4, 0.1, 0.4]).map((s) => [s.count, s.share])).toEqual([[2, 0.4], [2, 0.1]]);
  });

  test("128 experts become at most 16 segments, and the grouped ρ never prices less than the exact one", () => {
    const z = Array.from({ length: 128 }, (_, i) => (i + 1) ** -0.8);
    const exact: MoeTerms = { nExpert: 128, nUsed: 8, expertBytes: 1e6, denseBytesWithKv: 2e7, segments: routingSegments(z, 128) };
    const grouped: MoeTerms = { ...exact, segments: routingSegments(z) };
    expect(exact.segments.length).toBe(128);
    expect(grouped.segments.length).toBeLessThanOrEqual(16);
    expect(grouped.segments.reduce((a, s) => a + s.count, 0)).toBe(128);
    for (let room = 0; room < 4 * 1.48e8; room += 1e7) expect(moeRereadBytes(grouped, 4, room)).toBeGreaterThanOrEqual(moeRereadBytes(exact, 4, room) - 1e-6);
  });
});

describe("routing measured from expert hits", () => {
  test("each layer sorted on its own, then averaged rank by rank; layers with no tokens skipped", () => {
    expect(routingShareFromHits([[1, 3, 0, 0], [0, 0, 2, 2], [0, 0, 0, 0]])).toEqual([0.625, 0.375, 0, 0]);
    expect(() => routingShareFromHits([[0, 0]])).toThrow(/no layer/);
  });
});

describe("a skewed MoE model overloaded on a device rereads less than its dense equivalent", () => {
  const GiB = 2 ** 30;
  const L = 16, b = 0.5 * GiB, X = 8, k = 2, e = (0.8 * b) / X;
  const dense: ModelProfile = {
    name: "dense", arch: "llama", nLayers: L, nVocab: 32000, nEmbd: 2048, nHead: 16, nHeadKv: 4, headDimK: 128, headDimV: 128, nFf: 8192,
    nCtx: 1024, nKvForFlops: 1024, layerBytes: b, layerBytesEach: new Array<number>(L).fill(b),
    layerFlops: { "*": 2e8 }, inputBytes: 32000 * 2048, outputBytes: 32000 * 2048, outputFlops: { "*": 2 * 32000 * 2048 },
    kvBytesPerTokenLayer: 2 * 2 * 512, weightBytesTotal: L * b,
  };
  const moe = (share: number[]): ModelProfile => ({ ...dense, name: "moe", arch: "qwen3moe", moe: { nExpert: X, nExpertUsed: k, expertBytes: e, activeLayerBytes: b - (X - k) * e, routingShare: share, routing: "measured" } });
  const uniform = moe(new Array<number>(X).fill(1 / X));
  const skewed = moe([0.3, 0.25, 0.15, 0.1, 0.08, 0.06, 0.04, 0.02]);
  // one Linux device with room for about half the model
  const device: DeviceProfile = { name: "box", os: "linux", cpuFlopsPerS: { "*": 1e11 }, ramAvailableBytes: 4.5 * GiB, diskSeqReadBytesPerS: 2e9, cpuComputeBufferBytes: 0.25 * GiB };
  // the head's room for layers: its RAM less its compute buffer, output layer and embedding row
  const headBytes = dense.outputBytes + Math.floor(dense.inputBytes / dense.nVocab);
  const room = 4.25 * GiB - headBytes;
  const reread = (m: ModelProfile, reload: "excess" | "stream" | "window" = "excess") => {
    const p = predictLatency([device], m, { k: 1, windowLayers: [L], gpuLayers: [0] }, { overloadReload: reload }).devices[0]!;
    expect(p.set).toBe("M3");
    return p.reloadBytesPerToken;
  };

  test("excess: skewed < uniform < dense, and the dense one pays its whole excess", () => {
    const d = reread(dense), u = reread(uniform), s = reread(skewed);
    expect(d).toBeCloseTo(L * (b + 2 * 512 * 1024 * 2) - room, -3);
    expect(u).toBeLessThan(d);
    expect(s).toBeLessThan(u);
    // uniform: every token misses the non-resident fraction of its k experts in every layer
    const mt = moeTermsOf(uniform)!;
    const j = (room - L * mt.denseBytesWithKv) / (L * e);
    expect(u).toBeCloseTo(L * k * e * (1 - j / X), -3);
  });

  test("stream and window: an MoE rereads only what a token touches, a/b of the dense bytes", () => {
    expect(reread(uniform, "stream")).toBeCloseTo(reread(dense, "stream") * ((b - (X - k) * e) / b), -3);
    expect(reread(uniform, "window")).toBeCloseTo(L * (b - (X - k) * e) + headBytes, -3);
    expect(reread(skewed, "stream")).toBe(reread(uniform, "stream")); // the engine keeps whole layers: skew does not help
  });

  test("withMeasuredRouting stores the distribution and marks it measured", () => {
    // one layer routed, the rest saw no token: those keep the mean
    const hits = [[5, 1, 0, 0, 0, 0, 0, 2], ...Array.from({ length: L - 1 }, () => new Array<number>(X).fill(0))];
    const p = withMeasuredRouting(uniform, hits, 4);
    expect(p.moe!.routing).toBe("measured");
    expect(p.moe!.routingTokens).toBe(4);
    expect(p.moe!.routingShare).toEqual([0.625, 0.25, 0.125, 0, 0, 0, 0, 0]);
    expect(p.moe!.routingShareByLayer).toEqual(new Array(L).fill([0.625, 0.25, 0.125, 0, 0, 0, 0, 0]));
    expect(() => withMeasuredRouting(uniform, hits.slice(0, 15), 4)).toThrow(/15 layers, the model has 16/);
  });
});
