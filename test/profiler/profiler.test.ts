// The device profiler: units and sanity of what it measures, the cache, and the step timings against
// the engine's own forward pass on a generated model.
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { LocalModel } from "../../engine/index.js";
import { resolveDevice } from "../../halda/index.js";
import { modelProfile, modelShapeByName, syntheticModelDescription } from "../../model/index.js";
import {
  flopsPerType, formatReport, lastLevelCacheBytes, modelWorkload, parseDeviceReport, profileDevice, standInLayers, standInMinBytes, stepKey, timeStep, windowOverheadMs,
  type ModelWorkload, type StepTiming,
} from "../../profiler/index.js";
import { PLACEMENT_SHAPE, testModel } from "./models.js";

const cacheDir = mkdtempSync(join(tmpdir(), "prima-profile-test-"));
afterAll(() => rmSync(cacheDir, { recursive: true, force: true }));

describe("a mixture of experts' workload", () => {
  it("is the router and one expert's slices run k times a layer, FLOPs as the model profile counts them", () => {
    const desc = syntheticModelDescription(modelShapeByName("tiny-qwen3moe")!, "Q8_0");
    const w = modelWorkload(desc);
    const expert = w.steps.find((s) => stepKey(s) === "Q8_0:256x256+Q8_0:256x256")!;
    expect(expert.perLayer).toBe(2); // gate and up of one expert (256 -> 256), 2 experts a token
    expect(w.steps.find((s) => stepKey(s) === "F32:256x8")?.perLayer).toBe(1); // the router, F32
    // the matmul FLOPs of a layer equal the profile's: attention, router, k of the experts
    const stepped = w.steps.reduce((a, s) => a + s.perLayer * s.matrices.reduce((b, m) => b + 2 * m.ne0 * m.ne1, 0), 0);
    const p = modelProfile(desc, { nCtx: 64 }).layerFlops;
    expect(stepped).toBe((p.Q8_0 ?? 0) + 2 * 256 * 8);
  });
});

describe("flopsPerType", () => {
  it("turns step timings into per-type throughput whose layer time is the steps' time", () => {
    // Two steps per layer of mixed types, one stand-in: Sum_q F_q / flops_q must equal the layer's step time.
    const w: ModelWorkload = {
      name: "synthetic", nEmbd: 256, kvFloats: 128, weightBytes: 1,
      steps: [
        { matrices: [{ type: "Q4_K", typeId: 12, ne0: 256, ne1: 256 }, { type: "Q6_K", typeId: 14, ne0: 256, ne1: 64 }], perLayer: 1 },
        { matrices: [{ type: "Q4_K", typeId: 12, ne0: 256, ne1: 512 }], perLayer: 0.5 },
        { matrices: [{ type: "F32", typeId: 0, ne0: 256, ne1: 256 }], perLayer: 0 },
      ],
    };
    const seconds = [3e-5, 2e-5, 5e-5];
    const timings = new Map<string, StepTiming>(w.steps.map((s, i) => {
      const f = s.matrices.reduce((a, m) => a + 2 * m.ne0 * m.ne1, 0);
      return [stepKey(s), { key: stepKey(s), label: "", rowsTimed: s.matrices.map((m) => m.ne1), secondsPerStep: seconds[i], flopsPerS: f / seconds[i], workingSetBytes: 0 }];
    }));
    const flops = flopsPerType(w, timings);
    const layerFlops: Record<string, number> = {};
    for (const s of w.steps) for (const m of s.matrices) if (s.perLayer > 0) layerFlops[m.type] = (layerFlops[m.type] ?? 0) + 2 * m.ne0 * m.ne1 * s.perLayer;
    const predicted = Object.entries(layerFlops).reduce((a, [t, f]) => a + f / flops[t], 0);
    expect(predicted).toBeCloseTo(1 * seconds[0] + 0.5 * seconds[1], 12);
    expect(flops.F32).toBeCloseTo((2 * 256 * 256) / seconds[2], 0);
  });
});

describe("profileDevice on a generated model", async () => {
  const modelPath = await testModel(PLACEMENT_SHAPE, "Q8_0");
  const model = LocalModel.open(modelPath, { threads: 2 });
  const workload = modelWorkload(model.desc);
  const lines: string[] = [];
  const standIn = { gguf: model.gguf, desc: model.desc };
  const first = await profileDevice({ name: "unit", model: standIn, threads: 2, diskDirs: [dirname(modelPath)], cacheDir, quick: true, progress: (l) => lines.push(l) });
  afterAll(() => model.close());

  it("measures every type the model's FLOPs need, in FLOP/s that match the engine's own forward pass", async () => {
    const mp = modelProfile(model.desc, { nCtx: 256, nPredict: 64 });
    for (const t of [...Object.keys(mp.layerFlops), ...Object.keys(mp.outputFlops)]) {
      expect(first.profile.cpuFlopsPerS[t], t).toBeGreaterThan(1e8);
      expect(first.profile.cpuFlopsPerS[t], t).toBeLessThan(1e13);
    }
    // The matmul time the profile's figures give a layer, against real decode steps through all
    // layers: the matmuls are most of a layer's work, never more than all of it. Both are timed three
    // times on one thread, interleaved, best of each: other programs on this machine slow either at random.
    const layerMs: number[] = [], matmulMs: number[] = [];
    const one = LocalModel.open(modelPath, { threads: 1 });
    const w = one.window(0, one.nLayers, { ctx: 256 });
    const acts = new Float32Array(model.nEmbd).fill(0.01);
    for (let round = 0; round < 3; round++) {
      const timings = new Map(workload.steps.map((st) => [stepKey(st), timeStep(st, { threads: 1, workingSetBytes: 64 << 20, minSeconds: 0.1 })]));
      const flops = flopsPerType(workload, timings);
      matmulMs.push(1000 * Object.entries(mp.layerFlops).filter(([t]) => t !== "F32" && t !== "F16").reduce((a, [t, f]) => a + f / flops[t], 0));
      for (let p = 0; p < 4; p++) await w.forward(acts, p, 1);
      const t0 = performance.now();
      for (let p = 4; p < 44; p++) await w.forward(acts, p, 1);
      layerMs.push((performance.now() - t0) / 40 / model.nLayers);
      w.kvClear();
    }
    w.close();
    one.close();
    const real = Math.min(...layerMs), predicted = Math.min(...matmulMs);
    expect(predicted).toBeLessThan(real * 1.5);
    expect(predicted).toBeGreaterThan(real * 0.5);
  });

  it("reports memory, disk and KV-copy figures in their units, within physical bounds", () => {
    const p = first.profile, m = first.details.memory;
    expect(p.ramTotalBytes).toBe(m.totalBytes);
    expect(m.totalBytes).toBeLessThanOrEqual(m.physicalTotalBytes);
    expect(m.availableBytes).toBeLessThanOrEqual(m.totalBytes);
    // A cgroup's room exactly where its limit binds; else prima.cpp's 0.8 margin on MemAvailable.
    if (m.cgroup && m.availableBytes < m.physicalAvailableBytes) expect(p.ramAvailableBytes).toBe(Math.floor(m.availableBytes));
    else expect(p.ramAvailableBytes).toBeLessThan(m.availableBytes);
    expect(p.ramAvailableBytes).toBeGreaterThan(0);
    expect(p.ramReadBytesPerS).toBeGreaterThan(5e8); // B/s: no device reads memory slower than 0.5 GB/s
    expect(p.ramReadBytesPerS).toBeLessThan(2e12);
    expect(p.diskSeqReadBytesPerS).toBeGreaterThan(1e6);
    expect(p.diskSeqReadBytesPerS).toBeLessThan(1e11);
    expect(p.diskRandReadBytesPerS).toBeGreaterThan(1e5);
    expect(p.kvCopyCpuMs).toBeGreaterThan(0); // ms for a few hundred halves: far below a millisecond
    expect(p.kvCopyCpuMs).toBeLessThan(0.1);
    expect(first.details.disk.direct).toBe(false); // read as the engine reads: through the page cache, its pages dropped first
    expect(first.details.windowCallMs).toBeGreaterThan(0.001); // waking threads and a libuv round trip: microseconds to a millisecond
    expect(first.details.windowCallMs).toBeLessThan(20);
    expect(() => resolveDevice(p, 0)).not.toThrow();
    expect(lines.some((l) => /kernels 1\/\d+/.test(l)) && lines.some((l) => /^disk: \d+ MB\/s/.test(l))).toBe(true);
    expect(formatReport(first)).toMatch(/disk sequential\s+\d+ MB\/s/);
  });

  it("reads speeds from the cache on the next start, and measures again when asked", async () => {
    const againLines: string[] = [];
    // Asked as the head is before a ring's plan: the output layer timed too, and its hand-off.
    const again = await profileDevice({ name: "unit", model: standIn, outputLayer: true, handOff: true, threads: 2, diskDirs: [dirname(modelPath)], cacheDir, quick: true, progress: (l) => againLines.push(l) });
    expect(again.details.measured).toEqual([]);
    expect(again.details.kernels).toEqual(first.details.kernels);
    expect(again.profile.diskSeqReadBytesPerS).toBe(first.profile.diskSeqReadBytesPerS);
    // The pass is timed again (a device's speed moves with its load); the streamed passes are cached.
    const f0 = first.details.forward!, f1 = again.details.forward!;
    expect({ ...f1, windowMs: 0, scale: 0 }).toEqual({ ...f0, windowMs: 0, scale: 0 });
    // The output layer's time (the head's), measured now and never taken from the cache.
    expect(first.profile.outputLayerMs).toBeUndefined();
    expect(again.profile.outputLayerMs).toBeGreaterThanOrEqual(0); // a 512-token vocabulary's: next to nothing
    expect(againLines.some((l) => /^output layer: [\d.]+ ms/.test(l))).toBe(true);
    expect(formatReport(again)).toMatch(/output layer\s+[\d.]+ ms/);
    const worker = await profileDevice({ name: "unit", model: standIn, threads: 2, diskDirs: [dirname(modelPath)], cacheDir, quick: true });
    expect(worker.profile.outputLayerMs).toBeUndefined();
    // The hand-off to a successor, timed only for a ring's head.
    expect(again.details.handOffMs).toBeGreaterThan(0);
    expect(againLines.some((l) => /^hand-off: [\d.]+ ms/.test(l))).toBe(true);
    expect(first.details.handOffMs).toBeUndefined();
    expect(worker.details.handOffMs).toBeUndefined();
    expect(againLines.some((l) => /^forward pass: [\d.]+ ms .*\(timed now; the streamed passes cached\)/.test(l))).toBe(true);
    expect(f1.scale * f1.kernelMs + f1.layers * again.details.kvCopyMs).toBeCloseTo(f1.windowMs, 6); // the kernels scaled to the new pass
    // In a copy of the cache: measured again, the disk may read another speed, and with it time another
    // number of streamed layers, a second pass the tests below would have to tell from the first.
    const freshDir = mkdtempSync(join(tmpdir(), "prima-profile-test-"));
    cpSync(cacheDir, freshDir, { recursive: true });
    const fresh = await profileDevice({ name: "unit", model: standIn, threads: 2, diskDirs: [dirname(modelPath)], cacheDir: freshDir, quick: true, reprofile: true }).finally(() => rmSync(freshDir, { recursive: true, force: true }));
    expect(fresh.details.measured).toContain("disk");
    expect(fresh.details.measured).toContain("forward pass");
    expect(fresh.details.measured.length).toBe(workload.steps.length + 5);
    // Another thread count is another device configuration: measured anew.
    const one = await profileDevice({ name: "unit", workload, threads: 1, diskDirs: [dirname(modelPath)], cacheDir, quick: true });
    expect(one.details.cacheKey).not.toBe(first.details.cacheKey);
    expect(one.details.measured.length).toBeGreaterThan(0);
  });

  it("keeps its streamed passes when the layers it times in memory change with free memory", async () => {
    // A cached pass taken when less memory was free: fewer layers in memory, the same streamed ones.
    const file = first.details.cacheFile!;
    const cache = JSON.parse(readFileSync(file, "utf8")) as { forward: Record<string, { layers: number; windowMs: number; streamedMs?: number }> };
    const [key, entry] = Object.entries(cache.forward).find(([, v]) => v.streamedMs !== undefined)!;
    cache.forward[key] = { ...entry, layers: entry.layers - 1, windowMs: 999 };
    writeFileSync(file, JSON.stringify(cache));
    const lines: string[] = [];
    const again = await profileDevice({ name: "unit", model: standIn, threads: 2, diskDirs: [dirname(modelPath)], cacheDir, quick: true, progress: (l) => lines.push(l) });
    expect(again.details.measured).toEqual([]); // the streamed passes (which write layers out) came from the cache
    const f = again.details.forward!;
    expect(f.layers).toBe(first.details.forward!.layers); // the layers it timed now, not the cached pass's
    expect(f.windowMs).toBeLessThan(999);
    expect(f.streamedMs).toBe(entry.streamedMs);
    expect(lines.some((l) => /^forward pass: .*\(timed now; the streamed passes cached\)/.test(l))).toBe(true);
  });

  it("takes the pass as the median of the device's last three timings within five minutes, ignoring old and malformed ones", async () => {
    const file = first.details.cacheFile!;
    const planted = (scales: unknown[]) => {
      const cache = JSON.parse(readFileSync(file, "utf8")) as { passScales: Record<string, unknown[]> };
      const [key] = Object.keys(cache.passScales); // one model, one disk: one pass
      cache.passScales = { [key]: scales };
      writeFileSync(file, JSON.stringify(cache));
    };
    const profile = async (reprofile = false) => {
      const lines: string[] = [];
      const p = await profileDevice({ name: "unit", model: standIn, threads: 2, diskDirs: [dirname(modelPath)], cacheDir, quick: true, reprofile, progress: (l) => lines.push(l) });
      return { f: p.details.forward!, kvCopyMs: p.details.kvCopyMs, lines };
    };
    // Two recent timings far slower than this machine's (its scale is 1-2 here; past 8 a pass is
    // implausible): they outvote the one timed now.
    const now = Date.now(), slow = 6;
    planted([{ scale: slow, atMs: now - 60_000 }, { scale: slow, atMs: now - 1000 }]);
    const outvoted = await profile();
    expect(outvoted.f.scale).toBeCloseTo(slow, 9);
    expect(outvoted.f.scale * outvoted.f.kernelMs + outvoted.f.layers * outvoted.kvCopyMs).toBeCloseTo(outvoted.f.windowMs, 6);
    expect(outvoted.lines.some((l) => /^forward pass: [\d.]+ ms, the median of this device's last 3 timings within 5 minutes/.test(l))).toBe(true);
    // One slower and one faster than this one: this timing is the median, and the log says so too.
    planted([{ scale: slow, atMs: now - 60_000 }, { scale: 0.01, atMs: now - 1000 }]);
    const confirmed = await profile();
    expect(confirmed.f.scale).toBeLessThan(slow - 1);
    expect(confirmed.f.scale).toBeGreaterThan(0.01);
    expect(confirmed.lines.some((l) => /^forward pass: [\d.]+ ms, the median of this device's last 3 timings within 5 minutes/.test(l))).toBe(true);
    // Older than five minutes, from the future, or malformed: not counted, and no crash.
    planted([{ scale: slow, atMs: now - 6 * 60_000 }, { scale: slow, atMs: now + 60_000 }, { scale: "x", atMs: now }, { scale: -1, atMs: now }, null, 7]);
    const alone = await profile();
    expect(alone.f.scale).toBeLessThan(slow - 1);
    expect(alone.lines.some((l) => /the median of this device's last/.test(l))).toBe(false);
    // --reprofile: the timing made now, whatever the history.
    planted([{ scale: slow, atMs: now - 60_000 }, { scale: slow, atMs: now - 1000 }]);
    const fresh = await profile(true);
    expect(fresh.f.scale).toBeLessThan(slow - 1);
    expect(fresh.lines.some((l) => /the median of this device's last/.test(l))).toBe(false);
  });

  it("scales the kernels' FLOP/s so that a layer costs what the engine's own pass over a stand-in took", () => {
    const f = first.details.forward!;
    // 12 MB layers until past five times the last-level cache (all 12 where that is 160 MiB)
    expect(f.layers).toBe(standInLayers(model.desc, standInMinBytes(lastLevelCacheBytes()), Infinity));
    expect(f.applied).toBe(true); // a plausible pass: more than a quarter of the matmuls' time, less than 8 times
    const raw = flopsPerType(workload, new Map(first.details.kernels.map((k) => [k.key, k])));
    for (const [t, v] of Object.entries(raw)) expect(first.profile.cpuFlopsPerS[t], t).toBeCloseTo(v / f.scale, -3);
    // What Halda makes of the profile: the stand-in's layers' matmuls (all Q8_0 here) and one KV write
    // each add up to the pass timed, which woke the threads as a ring device's pass does: no window
    // call is added on top.
    const mp = modelProfile(model.desc, { nCtx: 16, nPredict: 1 });
    const layerMs = (1000 * mp.layerFlops.Q8_0) / first.profile.cpuFlopsPerS.Q8_0 + first.profile.kvCopyCpuMs!;
    expect(f.layers * layerMs).toBeCloseTo(f.windowMs, 6);
    expect(windowOverheadMs(first.details)).toBe(0);
    expect(windowOverheadMs({ ...first.details, forward: { ...f, applied: false } })).toBe(first.details.windowCallMs);
    expect(formatReport(first)).toMatch(new RegExp(`forward pass\\s+[\\d.]+ ms for the model's first ${f.layers} layers .*kernels' / [\\d.]+`));
    // Rereads are priced at the speed the same layers streamed from the disk at.
    expect(f.streamedBytesPerS).toBeGreaterThan(1e6);
    expect(first.profile.diskSeqReadBytesPerS).toBe(f.streamedBytesPerS);
    expect(formatReport(first)).toMatch(/disk sequential\s+\d+ MB\/s \(streamed layers reread by the forward pass/);
  });

  it("round-trips through the join message and refuses broken profiles by name", () => {
    const back = parseDeviceReport(JSON.stringify({ ...first, linkProbePort: 4321 }));
    expect(back.profile).toEqual(first.profile);
    expect(() => parseDeviceReport("")).toThrow(/no profile/);
    expect(() => parseDeviceReport("{oops")).toThrow(/not JSON/);
    expect(() => parseDeviceReport(JSON.stringify({ version: 1, error: "disk full" }))).toThrow(/could not profile itself: disk full/);
    expect(() => parseDeviceReport(JSON.stringify({ ...first, profile: { ...first.profile, ramAvailableBytes: -1 } }))).toThrow(/ramAvailableBytes/);
    expect(() => parseDeviceReport(JSON.stringify({ ...first, linkProbePort: 70000 }))).toThrow(/link probe port/);
  });
});
