// A device's in-memory work as its ring ran it, against the plan's price: the rule that reads it off a
// decode's counters (only where the device ran from memory), the store beside the profiles, the scaling
// of the next plan's compute by it, and the ratio kept against the profile's own figure (so that a
// plan already scaled does not undo itself).
import { describe, expect, it } from "vitest";
import type { RingPlan } from "../../coordinator/plan-ring.js";
import { recordPasses, type StepCost } from "../../coordinator/prediction.js";
import type { DeviceProfile } from "../../halda/index.js";
import {
  MAX_IN_MEMORY_READ_BYTES, RECENT_RING_PASS_MS, RingPassStore, observedPassRatio, ringPassFigure, ringPassKey, withPassRatio, type DeviceReport,
} from "../../profiler/index.js";
import { tempDir } from "../helpers/temp.js";

describe("a pass ratio read off a decode", () => {
  it("is the device's own work over its in-memory price, where it ran from memory", () => {
    expect(observedPassRatio(0.92, 1.32, 0, 0)).toBeCloseTo(0.92 / 1.32, 12);
    expect(observedPassRatio(0.92, 1.32, 0, MAX_IN_MEMORY_READ_BYTES)).toBeCloseTo(0.92 / 1.32, 12);
  });

  it("is none for a device priced or seen reading the disk, or an implausible one", () => {
    expect(observedPassRatio(2.5, 1.5, 1.0, 0)).toBeUndefined(); // priced with rereads
    expect(observedPassRatio(2.5, 1.5, 0, MAX_IN_MEMORY_READ_BYTES + 1)).toBeUndefined(); // it read the disk
    expect(observedPassRatio(0.1, 1.5, 0, 0)).toBeUndefined(); // 15x faster: not the gap's effect
    expect(observedPassRatio(9, 1.5, 0, 0)).toBeUndefined();
    expect(observedPassRatio(Number.NaN, 1.5, 0, 0)).toBeUndefined();
    expect(observedPassRatio(1, 0, 0, 0)).toBeUndefined();
  });
});

describe("the store and the figure", () => {
  it("keeps a device's last three of a model within the hour, and prices by their middle", () => {
    const dir = tempDir("prima-passes-");
    const store = new RingPassStore(dir);
    const t0 = 1_800_000_000_000;
    for (const [i, r] of [0.9, 0.6, 0.7, 0.65].entries()) store.add("a|fp", r, t0 + i);
    // another process's store reads the same file
    const seen = new RingPassStore(dir).recent("a|fp", t0 + 10);
    expect(seen.map((o) => o.ratio)).toEqual([0.6, 0.7, 0.65]);
    expect(ringPassFigure(seen)).toBe(0.65);
    // a plan's devices looked up in one read of the file: the same observations, none for a key never seen
    const snap = new RingPassStore(dir).snapshot(t0 + 10);
    expect(snap.recent("a|fp")).toEqual(seen);
    expect(snap.recent("b|fp")).toEqual([]);
    expect(store.recent("a|fp", t0 + RECENT_RING_PASS_MS + 10)).toEqual([]);
    expect(ringPassFigure([])).toBeUndefined();
  });

  it("keys a device's passes by its hardware and the model", () => {
    const r = (id: string) => ({ profile: { id } }) as unknown as DeviceReport;
    expect(ringPassKey(r("h1"), "fp1")).toBe(ringPassKey(r("h1"), "fp1"));
    expect(new Set([ringPassKey(r("h1"), "fp1"), ringPassKey(r("h2"), "fp1"), ringPassKey(r("h1"), "fp2")]).size).toBe(3);
    expect(ringPassKey(r("x".repeat(5000)), "fp").length).toBeLessThanOrEqual(300);
  });

  it("scales a profile's compute: its FLOP/s down, its output layer and KV copies up", () => {
    const p = { name: "d", cpuFlopsPerS: { Q4_K: 6e10, F32: 1e10 }, outputLayerMs: 2, kvCopyCpuMs: 0.1 } as unknown as DeviceProfile;
    const q = withPassRatio(p, 0.8);
    expect(q.cpuFlopsPerS).toEqual({ Q4_K: 6e10 / 0.8, F32: 1e10 / 0.8 });
    expect([q.outputLayerMs, q.kvCopyCpuMs]).toEqual([1.6, 0.1 * 0.8]);
    expect(withPassRatio({ name: "e", cpuFlopsPerS: { F32: 1 } } as unknown as DeviceProfile, 2)).toEqual({ name: "e", cpuFlopsPerS: { F32: 0.5 } });
  });
});

describe("a decode's passes recorded for the next plan", () => {
  const cost = (o: Partial<StepCost>): StepCost => ({ computeMs: 0, waitMs: 0, sendMs: 0, descheduledMs: 0, majorFaults: 0, readBytes: 0, ...o });
  const lat = (computeMs: number, diskMs: number) => ({ computeMs, memoryMs: 0.1, diskMs, commMs: 0.4, totalMs: computeMs + 0.1 + diskMs + 0.4 });
  // the head streams (priced with rereads); worker a held its window, priced at 0.8x its profile already
  const plan = {
    cycles: 1, handOffMs: [0.25, 0, 0], labels: ["head (this coordinator)", "w1 \"a\"", "w2 \"b\""],
    passKeys: ["h|fp", "a|fp", "b|fp"], passRatios: [1, 0.8, 1],
    plan: { devices: [{ index: 0, latency: lat(7.5, 30) }, { index: 1, latency: lat(0.9, 0) }, { index: 2, latency: lat(1.2, 0) }] },
  } as unknown as RingPlan;

  it("keeps each in-memory device's ratio against its profile's own figure, and none for a streaming one", () => {
    const store = new RingPassStore(tempDir("prima-passes-"));
    const said = recordPasses(plan, [
      { haldaIndex: 0, before: {}, cost: cost({ computeMs: 35, readBytes: 190 * 2 ** 20 }) },
      { haldaIndex: 1, before: {}, cost: cost({ computeMs: 0.95, sendMs: 0.1, descheduledMs: 0.05 }) },
      { haldaIndex: 2, before: {}, cost: cost({ computeMs: 0.9, sendMs: 0.05, descheduledMs: 0.05 }) },
      { haldaIndex: 2, cost: cost({ computeMs: 0.1 }) }, // no decode counters before: not a decode's own
    ], store);
    expect(store.recent("h|fp")).toEqual([]);
    // a: 1.0 ms against 1.0 priced, at 0.8x its profile: 0.8x its profile's own figure
    expect(store.recent("a|fp").map((o) => o.ratio)[0]).toBeCloseTo(0.8, 12);
    expect(store.recent("b|fp").map((o) => o.ratio)[0]).toBeCloseTo(0.9 / 1.3, 12);
    expect(said).toHaveLength(2);
    expect(said[0]).toMatch(/device w1 "a" ran its window in 1\.00x the time priced \(0\.80x its profile's\)/);
  });
});
