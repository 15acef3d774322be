// MoE-3 (docs/HALDA.md): windows priced by the layers they name, where each layer's routing is measured.
// The reread is LRU's under Che's approximation over the window's experts (MoE-1 when they route
// uniformly, hand-worked on a small window); Halda's split equals the best of every split in ring order;
// the ring order decides which device gets the broadly routed layers.
import { describe, expect, test } from "vitest";
import {
  halda, moeNamedRereadBytes, moeRereadBytes, moeTermsOf, predictLatency, routingSegments,
  type DeviceProfile, type HaldaOptions, type ModelProfile, type MoeTerms,
} from "../../halda/index.js";
import { layersBeyondRoom, modelTerms, resolveOptions, type DeviceTerms, type ModelTerms } from "../../halda/terms.js";

const terms = (layerShares: number[][], k: number, e: number, dense: number): MoeTerms => ({
  nExpert: layerShares[0].length, nUsed: k, expertBytes: e, denseBytesWithKv: dense,
  segments: routingSegments(layerShares[0].map((_, i) => layerShares.reduce((a, s) => a + s[i], 0) / layerShares.length)), layerShares,
});

describe("ρ of a window of named layers", () => {
  test("layers that route uniformly: MoE-1 at every room", () => {
    const mt = terms(Array.from({ length: 6 }, () => new Array<number>(8).fill(1 / 8)), 3, 12, 200);
    const bp = mt.denseBytesWithKv + mt.nExpert * mt.expertBytes;
    for (let r = 1; r <= 6; r++) {
      const layers = Array.from({ length: r }, (_, i) => i);
      for (let room = -200; room <= 7 * bp; room += bp / 13) expect(moeNamedRereadBytes(mt, layers, room)).toBeCloseTo(moeRereadBytes(mt, r, room), 6);
    }
  });

  test("skewed layers: LRU misses more than the hottest-fit, less than uniform routing, and falls with room", () => {
    const shares = [0.3, 0.05, 0.2, 0.2, 0.1, 0.05, 0.05, 0.05].sort((a, b) => b - a);
    const mt = terms(Array.from({ length: 4 }, () => shares), 3, 12, 200);
    const uniform = terms(Array.from({ length: 4 }, () => new Array<number>(8).fill(1 / 8)), 3, 12, 200);
    const layers = [0, 1, 2, 3];
    let last = Infinity;
    for (let experts = 0.5; experts < 32; experts += 0.5) {
      const room = 4 * 200 + experts * 12;
      const lru = moeNamedRereadBytes(mt, layers, room);
      expect(lru).toBeGreaterThan(moeRereadBytes(mt, 4, room) - 1e-9);
      expect(lru).toBeLessThan(moeNamedRereadBytes(uniform, layers, room));
      expect(lru).toBeLessThan(last);
      last = lru;
    }
    expect(moeNamedRereadBytes(mt, layers, 4 * 200 + 32 * 12)).toBe(0);
  });

  test("Che's approximation on a hand-worked window: one flat layer, one that always routes to one expert", () => {
    // layer 0 routes evenly over 2 experts, layer 1 always to one (its other expert is never touched)
    const mt = terms([[0.5, 0.5], [1, 0]], 1, 100, 0);
    // room for one expert: 2(1 − x) + (1 − x²) = 1 with x = e^(−T/2), so x = √3 − 1; a token misses
    // 2·0.5·x + x² = 3 − √3 experts (the hottest-fit, keeping layer 1's, misses 1)
    expect(moeNamedRereadBytes(mt, [0, 1], 100)).toBeCloseTo(100 * (3 - Math.sqrt(3)), 9);
    // room for two: x² + 2x − 1 = 0, x = √2 − 1, misses x + x² = 2 − √2 (the hottest-fit: 0.5)
    expect(moeNamedRereadBytes(mt, [0, 1], 200)).toBeCloseTo(100 * (2 - Math.sqrt(2)), 9);
    // room for the three it touches: none
    expect(moeNamedRereadBytes(mt, [0, 1], 300)).toBe(0);
    // averaged over the layers ([0.75, 0.25]), MoE-1 with half an expert a layer misses 1.25 experts a token
    expect(moeRereadBytes(mt, 2, 100)).toBeCloseTo(125, 9);
  });

  test("a measurement's size smooths its shares: an expert it never saw is rare, not never read", () => {
    const seen = terms([[0.5, 0.5, 0, 0]], 1, 100, 0);
    // without the measurement's size, the two unseen experts are never touched: room for two, no reread
    expect(moeNamedRereadBytes(seen, [0], 200)).toBe(0);
    // measured over 8 assignments: each unseen expert gets 0.5 of 10 pseudo-assignments' share
    const smoothed = { ...seen, routingAssignments: 8 };
    const reread = moeNamedRereadBytes(smoothed, [0], 200);
    expect(reread).toBeGreaterThan(0);
    expect(reread).toBeLessThan(100 * 2 * (0.5 / 10) + 1e-9 + 100 * 0.5); // below missing both rare ones and half a hot one
  });
});

describe("Halda with each layer's routing measured", () => {
  const MiB = 2 ** 20;
  const L = 12, X = 16, k = 2, e = 2 * MiB, b = X * e + 4 * MiB;
  // the first layers route over nearly every expert, the later ones over a few: as measured on the
  // generated benchmark MoE (layer 0: 30 of 32 experts, layer 9: 7)
  const layerShare = (j: number): number[] => {
    const s = Array.from({ length: X }, (_, i) => Math.exp(-i * (0.05 + 0.05 * j)));
    const sum = s.reduce((a, c) => a + c, 0);
    return s.map((v) => v / sum); // the steepest's hottest takes 0.45 < 1/k
  };
  const byLayer = Array.from({ length: L }, (_, j) => layerShare(j));
  const mean = byLayer[0].map((_, i) => byLayer.reduce((a, s) => a + s[i], 0) / L);
  const model: ModelProfile = {
    name: "moe", arch: "qwen3moe", nLayers: L, nVocab: 32000, nEmbd: 1024, nHead: 16, nHeadKv: 4, headDimK: 64, headDimV: 64, nFf: 2048,
    nCtx: 256, nKvForFlops: 256, layerBytes: b, layerBytesEach: new Array<number>(L).fill(b),
    layerFlops: { "*": 5e7 }, inputBytes: 32000 * 1024, outputBytes: 32000 * 1024, outputFlops: { "*": 2 * 32000 * 1024 },
    kvBytesPerTokenLayer: 1024, weightBytesTotal: L * b,
    moe: { nExpert: X, nExpertUsed: k, expertBytes: e, activeLayerBytes: b - (X - k) * e, routingShare: mean, routing: "measured", routingShareByLayer: byLayer },
  };
  const flat = { ...model, moe: { ...model.moe!, routingShareByLayer: undefined } };
  // three alike devices, none holding a third of the model: each is overloaded
  const device = (name: string, roomLayers: number): DeviceProfile => ({
    name, os: "linux", cpuFlopsPerS: { "*": 2e10 }, ramAvailableBytes: roomLayers * b + 9 * MiB, diskSeqReadBytesPerS: 3e8, cpuComputeBufferBytes: 8 * MiB,
  });
  const devices = [device("head", 3.2), device("a", 3.2), device("b", 3.2)];
  // The exactness checks take the fastest-priced split (overRoomMargin 0); the margin is checked after them.
  const options: HaldaOptions = { keepAll: true, k: 1, ringOrder: [1, 2, 0], overRoomMargin: 0 };

  /** Every split in ring order priced (by device index: head, a, b), those without problems. */
  function everySplit(devs: readonly DeviceProfile[], o: HaldaOptions): { ms: number; windows: number[] }[] {
    const splits: { ms: number; windows: number[] }[] = [];
    for (let a = 1; a < L; a++) {
      for (let c = 1; a + c < L; c++) {
        const windows = [L - a - c, a, c];
        const p = predictLatency(devs, model, { k: 1, windowLayers: windows, gpuLayers: [0, 0, 0] }, o);
        if (p.problems.length === 0) splits.push({ ms: p.latencyMs, windows });
      }
    }
    return splits;
  }

  function bestByBruteForce(devs: readonly DeviceProfile[], o: HaldaOptions): { ms: number; windows: number[] } {
    return everySplit(devs, o).reduce((best, s) => (s.ms < best.ms ? s : best), { ms: Infinity, windows: [] as number[] });
  }

  test("the terms take each layer's shares, checked", () => {
    expect(moeTermsOf(model)!.layerShares).toHaveLength(L);
    expect(() => halda(devices, { ...model, moe: { ...model.moe!, routingShareByLayer: byLayer.slice(1) } }, options)).toThrow(/11 layers, the model 12/);
    expect(() => halda(devices, { ...model, moe: { ...model.moe!, routingShareByLayer: byLayer.map((s) => [...s].reverse()) } }, options)).toThrow(/sorted hottest first/);
    expect(() => halda(devices, model, { ...options, ringOrder: [0, 1] })).toThrow(/ringOrder lists 2 devices, there are 3/);
  });

  test("the plan is the best split in ring order, and predictLatency prices it the same", () => {
    const plan = halda(devices, model, options);
    const windows = plan.devices.map((d) => d.windowLayers);
    const brute = bestByBruteForce(devices, options);
    expect(plan.latencyMs).toBeCloseTo(brute.ms, 6);
    expect(predictLatency(devices, model, { k: 1, windowLayers: windows, gpuLayers: [0, 0, 0] }, options).latencyMs).toBeCloseTo(plan.latencyMs, 9);
    // the averaged profile cannot tell the two workers apart; named, the one running the broadly
    // routed first layers (a: first in the ring) takes fewer of them than its twin
    expect(windows[1]).toBeLessThan(windows[2]);
    expect(plan.notes.join("\n")).toMatch(/windows named by layer \(MoE-3\)/);
  });

  test("another ring order moves the smaller window with the first layers", () => {
    const plan = halda(devices, model, { ...options, ringOrder: [2, 1, 0] });
    const windows = plan.devices.map((d) => d.windowLayers);
    expect(windows[2]).toBeLessThan(windows[1]);
    expect(plan.latencyMs).toBeCloseTo(bestByBruteForce(devices, { ...options, ringOrder: [2, 1, 0] }).ms, 6);
  });

  test("unlike devices: still the best split, and a flat profile's plan is the ILP's own", () => {
    const devs = [device("head", 5), device("a", 2.5), device("b", 3.5)];
    const plan = halda(devs, model, options);
    expect(plan.latencyMs).toBeCloseTo(bestByBruteForce(devs, options).ms, 6);
    const flatPlan = halda(devs, flat, options);
    expect(flatPlan.notes.join("\n")).not.toMatch(/MoE-3/);
    // the named plan is never priced above the flat plan's split priced by name
    const flatSplit = flatPlan.devices.map((d) => d.windowLayers);
    expect(plan.latencyMs).toBeLessThanOrEqual(predictLatency(devs, model, { k: 1, windowLayers: flatSplit, gpuLayers: [0, 0, 0] }, options).latencyMs + 1e-9);
  });

  test("over-room margin: of the splits priced within 15% of the best, the fewest layers beyond the devices' rooms", () => {
    const bp = modelTerms(model, resolveOptions({})).layerBytesWithKv;
    let moved = 0;
    for (const devs of [devices, [device("head", 5), device("a", 2.5), device("b", 3.5)], [device("head", 2.2), device("a", 4.6), device("b", 3.9)]]) {
      const o = { ...options, overRoomMargin: 0.15 };
      const plan = halda(devs, model, o);
      // each device's room for layers (the plan's; it does not depend on the split here)
      const room = plan.devices.map((d) => d.ramLayerCapacityBytes);
      const beyond = (windows: readonly number[]) => windows.reduce((sum, w, i) => sum + Math.min(w, Math.round(Math.max(0, w * bp - room[i]) / bp)), 0);
      const splits = everySplit(devs, o), least = Math.min(...splits.map((s) => s.ms));
      const within = splits.filter((s) => s.ms <= least * 1.15 * (1 + 1e-9));
      const windows = plan.devices.map((d) => d.windowLayers);
      const where = `rooms ${devs.map((d) => d.ramAvailableBytes)}: plan [${windows}] ${plan.latencyMs} ms, ${beyond(windows)} beyond; fastest ${least}`;
      expect(plan.latencyMs, where).toBeLessThanOrEqual(least * 1.15 * (1 + 1e-9));
      expect(beyond(windows), where).toBe(Math.min(...within.map((s) => beyond(s.windows))));
      // the least latency among the splits with that many layers beyond
      expect(plan.latencyMs, where).toBeCloseTo(Math.min(...within.filter((s) => beyond(s.windows) === beyond(windows)).map((s) => s.ms)), 6);
      if (plan.latencyMs > least * (1 + 1e-9)) moved++;
    }
    // the margin must move some plan off the fastest, or the check means little
    expect(moved).toBeGreaterThan(0);
  });
});

test("layers beyond a device's room: to the nearest layer, per token, at most the layers it holds", () => {
  const m = { layerBytesWithKv: 100 } as ModelTerms;
  const device = (capBytes: number, gpuLayersLeaveRam = false) => ({ capBytes, gpuLayersLeaveRam }) as DeviceTerms;
  expect(layersBeyondRoom(device(400), 1, 4, 0, m)).toBe(0);
  expect(layersBeyondRoom(device(360), 1, 4, 0, m)).toBe(0); // 0.4 of a layer
  expect(layersBeyondRoom(device(340), 1, 4, 0, m)).toBe(1); // 0.6
  expect(layersBeyondRoom(device(340), 2, 4, 0, m)).toBe(5); // 8 a token in room for 3.4
  expect(layersBeyondRoom(device(340, true), 1, 6, 2, m)).toBe(1); // the GPU's 2 leave RAM
  expect(layersBeyondRoom(device(340, false), 1, 6, 2, m)).toBe(3); // they stay (unified memory)
  expect(layersBeyondRoom(device(-250), 1, 3, 0, m)).toBe(3); // no room at all: every layer it holds
});
