// Plans are valid, bad input is refused by name, infeasible clusters get a reason, baselines behave.

import { describe, expect, test } from "vitest";
import {
  baselinePlan, halda, HaldaError, parseDeviceProfiles, predictLatency, resolveDevice,
  type DeviceProfile, type HaldaOptions, type ModelProfile, type Plan,
} from "../../halda/index.js";
import { fixtureCluster, fixtureModel, GB, GiB } from "./fixtures.js";
import { defaultOracleOptions, oracleCost } from "./oracle.js";
import { mulberry32, randomInstance } from "./random-instances.js";

function thrown(f: () => unknown): HaldaError {
  try {
    f();
  } catch (e) {
    if (e instanceof HaldaError) return e;
    throw e;
  }
  throw new Error("expected a HaldaError");
}

/** Every constraint of HALDA.md §2.4 on a finished plan, checked with the plan's own compute buffers. */
function expectValid(p: Plan, devices: readonly DeviceProfile[], model: ModelProfile, o: HaldaOptions): void {
  const L = model.nLayers;
  const bp = model.layerBytes + model.kvBytesPerTokenLayer * model.nCtx;
  expect(p.devices.reduce((s, d) => s + d.windowLayers, 0) * p.k).toBe(L);
  expect(p.devices[0].index).toBe(0);
  const indices = [...p.devices.map((d) => d.index), ...p.dropped.map((d) => d.index)].sort((a, b) => a - b);
  expect(indices).toEqual(devices.map((_, i) => i)); // every device is either in the ring or dropped with a reason
  for (const d of p.devices) {
    expect(Number.isInteger(d.windowLayers) && d.windowLayers >= 1).toBe(true);
    expect(Number.isInteger(d.gpuLayers) && d.gpuLayers >= 0 && d.gpuLayers <= d.windowLayers).toBe(true);
    expect(d.gpuLayersPerToken * bp).toBeLessThanOrEqual(d.gpuLayerCapacityBytes * (1 + 1e-12)); // C5 VRAM
    const dev = devices[d.index];
    const ramLayers = dev.os === "macos" ? d.layersPerToken : d.layersPerToken - d.gpuLayersPerToken;
    if (d.set === "M4") expect(ramLayers * bp).toBeLessThanOrEqual(d.ramLayerCapacityBytes * (1 + 1e-12)); // C4: fits
    else {
      const s = dev.os === "linux" ? dev.diskSeqReadBytesPerS ?? dev.diskRandReadBytesPerS! : dev.diskRandReadBytesPerS ?? dev.diskSeqReadBytesPerS!;
      expect(s).toBeGreaterThanOrEqual(1e8); // only a fast disk may overload
      if (o.prefetchGuard) expect((dev.os === "macos" ? d.windowLayers : d.windowLayers - d.gpuLayers) * bp).toBeLessThanOrEqual(d.ramLayerCapacityBytes * (1 + 1e-12));
    }
  }
  for (const x of p.dropped) expect(x.reason.length).toBeGreaterThan(10);
  expect(p.problems).toEqual([]);
  // The library's own evaluator, with the buffers the plan used, agrees and finds no violation.
  const buffers = devices.map((_, i) => {
    const d = p.devices.find((x) => x.index === i);
    return { cpuBytes: d?.cpuComputeBufferBytes ?? 0, gpuBytes: d?.gpuComputeBufferBytes ?? 0 };
  });
  const pred = predictLatency(devices, model, {
    k: p.k,
    windowLayers: devices.map((_, i) => p.devices.find((x) => x.index === i)?.windowLayers ?? 0),
    gpuLayers: devices.map((_, i) => p.devices.find((x) => x.index === i)?.gpuLayers ?? 0),
  }, { ...o, computeBuffers: buffers });
  expect(pred.problems).toEqual([]);
  expect(Math.abs(pred.latencyMs - p.latencyMs) / p.latencyMs).toBeLessThan(1e-9);
}

describe("plans are valid", () => {
  for (const mode of ["exact", "prima"] as const) {
    test(`${mode}: 150 random clusters with device selection`, () => {
      let plans = 0, infeasible = 0;
      for (let seed = 5000; seed < 5150; seed++) {
        const rand = mulberry32(seed);
        const inst = randomInstance(rand, 4, 32);
        const o: HaldaOptions = { mode, registerLoadTerms: inst.registerLoadTerms, prefetchGuard: rand() < 0.2 };
        let p: Plan;
        try {
          p = halda(inst.devices, inst.model, o);
        } catch (e) {
          if (!(e instanceof HaldaError)) throw e;
          expect(e.reason).toBe("infeasible");
          expect(e.message.length).toBeGreaterThan(20);
          infeasible++;
          continue;
        }
        expectValid(p, inst.devices, inst.model, o);
        if (mode === "exact") {
          // The independent oracle sees the kept devices' plan as valid too.
          const kept = p.devices.map((d) => inst.devices[d.index]);
          const c = oracleCost(kept, inst.model, { ...defaultOracleOptions, registerLoadTerms: inst.registerLoadTerms, prefetchGuard: o.prefetchGuard ?? false }, p.k, p.devices.map((d) => d.windowLayers), p.devices.map((d) => d.gpuLayers));
          expect(c.valid).toBe(true);
          expect(c.latencyMs).toBeCloseTo(p.latencyMs, 6);
        }
        plans++;
      }
      expect(plans).toBeGreaterThan(90);
      expect(infeasible).toBeGreaterThan(0);
    });
  }

  for (const mode of ["exact", "prima"] as const) {
    test(`${mode}: 80 random mixtures of experts (skewed routing, half with an overloaded head), evaluated as planned`, () => {
      let plans = 0;
      for (let seed = 5200; seed < 5280; seed++) {
        const rand = mulberry32(seed);
        const inst = randomInstance(rand, 4, 32, undefined, { moe: "skewed", headOverloaded: seed % 2 === 0 });
        const o: HaldaOptions = { mode, registerLoadTerms: inst.registerLoadTerms, overloadReload: (["excess", "stream", "window"] as const)[seed % 3] };
        let p: Plan;
        try {
          p = halda(inst.devices, inst.model, o);
        } catch (e) {
          if (!(e instanceof HaldaError)) throw e;
          expect(e.reason).toBe("infeasible");
          continue;
        }
        expectValid(p, inst.devices, inst.model, o);
        plans++;
      }
      expect(plans).toBeGreaterThan(50);
    });
  }

  test("6 devices x 80 layers and 10 devices (local search) give valid plans", () => {
    const six = fixtureCluster(["D1", "D2", "D3", "D4", "D5", "D6"]);
    const F70 = fixtureModel("F-70B");
    expectValid(halda(six, F70), six, F70, {});
    const ten = [...six, ...fixtureCluster(["D2", "D3", "D5", "D4"]).map((d, i) => ({ ...d, name: `${d.name}-b${i}` }))];
    const p = halda(ten, F70, { dropWindowLayers: 0 });
    expectValid(p, ten, F70, {});
    // The local search starts from faithful mode's sets, so it is never worse than faithful mode.
    expect(p.latencyMs).toBeLessThanOrEqual(halda(ten, F70, { mode: "prima", dropWindowLayers: 0 }).latencyMs + 1e-9);
  });
});

describe("infeasible inputs get a reason, not a plan", () => {
  const F70 = fixtureModel("F-70B");
  const slow = (name: string, ramGiB: number): DeviceProfile => ({
    name, os: "linux", cpuFlopsPerS: { "*": 1e11 }, ramAvailableBytes: ramGiB * GiB, diskSeqReadBytesPerS: 0.05 * GB,
  });

  test("a model larger than the cluster with no disk fast enough to stream the rest", () => {
    const e = thrown(() => halda([slow("a", 16), slow("b", 16)], F70));
    expect(e.reason).toBe("infeasible");
    expect(e.message).toMatch(/does not fit: 80 layers .* need \d+\.\d\d GiB, the devices hold \d+ layers without overload, and no disk reaches the 0\.10 GB\/s/);
    // The same cluster with one fast disk streams the excess.
    const ok = halda([{ ...slow("a", 16), diskSeqReadBytesPerS: 2 * GB }, slow("b", 16)], F70);
    expect(ok.devices[0].set).toBe("M3");
    expect(ok.devices[1].set).toBe("M4");
  });

  test("more devices than layers, the head cannot hold a layer, forced k too large", () => {
    const tiny: ModelProfile = { ...fixtureModel("F-8B"), nLayers: 2, layerBytesEach: [1, 1] };
    const three = [slow("a", 8), slow("b", 8), slow("c", 8)];
    expect(thrown(() => halda(three, tiny, { dropWindowLayers: 0 })).message).toMatch(/2 layers but 3 devices/);
    expect(thrown(() => halda([slow("head", 0.1), slow("b", 64)], F70)).message).toMatch(/the head head cannot hold one layer/);
    const k = thrown(() => halda(fixtureCluster(["D1", "D2", "D3", "D4"]), F70, { k: 40 }));
    expect(k.reason).toBe("invalid-input");
    expect(k.message).toMatch(/k = 40 leaves 2 layer\(s\) per cycle for 4 devices.*valid k: 1, 2, 4, 5, 8, 10, 16, 20/);
    expect(thrown(() => halda(fixtureCluster(["D1", "D2"]), F70, { k: 3 })).message).toMatch(/k = 3 does not divide the model's 80 layers/);
  });

  test("a device that cannot hold one layer on a slow disk is dropped with the reason", () => {
    const p = halda([slow("head", 64), slow("phone", 0.2)], F70);
    expect(p.devices.map((d) => d.name)).toEqual(["head"]);
    expect(p.dropped[0]).toMatchObject({ name: "phone" });
    expect(p.dropped[0].reason).toMatch(/cannot hold one layer .* below the 0\.10 GB\/s overload threshold/);
  });

  test("a weight type the model uses with no measured throughput", () => {
    const d = { ...fixtureCluster(["D3"])[0], cpuFlopsPerS: { Q4_K: 1e11 } };
    const model = { ...fixtureModel("F-8B"), layerFlops: { Q4_K: 4e8, F16: 1e7 } };
    const e = thrown(() => halda([d], model));
    expect(e.reason).toBe("invalid-input");
    expect(e.message).toMatch(/device #0 \(D3\): cpuFlopsPerS has no throughput for weight type F16/);
    const zero = { ...d, cpuFlopsPerS: { "*": 1e11 }, gpuFlopsPerS: { Q4_K: 0, "*": 1e12 } };
    expect(thrown(() => halda([zero], model)).message).toMatch(/gpuFlopsPerS has no throughput for weight type Q4_K/);
  });
});

describe("device files are checked field by field", () => {
  const good = { name: "a", os: "linux", cpuFlopsPerS: { "*": 1e11 }, ramAvailableBytes: 8e9, diskSeqReadBytesPerS: 2e9 };
  const cases: [string, unknown, RegExp][] = [
    ["not a list", { foo: 1 }, /expected an array of device profiles or \{"devices": \[\.\.\.\]\}/],
    ["empty", [], /no devices/],
    ["missing RAM", [{ ...good, ramAvailableBytes: undefined }], /device #0 \(a\): missing ramAvailableBytes/],
    ["negative", [{ ...good, ramAvailableBytes: -1 }], /device #0 \(a\): ramAvailableBytes must be a finite number >= 0, got -1/],
    ["string number", [{ ...good, linkLatencyMs: "3" }], /linkLatencyMs must be a finite number >= 0, got "3"/],
    ["bad os", [{ ...good, os: "windows" }], /os must be one of macos, linux, android, got "windows"/],
    ["metal on linux", [{ ...good, gpuBackend: "metal", gpuFreeBytes: 1e9, gpuFlopsPerS: { "*": 1e12 } }], /gpuBackend "metal" needs os "macos"/],
    ["GPU without memory", [{ ...good, gpuBackend: "cuda", gpuFlopsPerS: { "*": 1e12 } }], /missing gpuFreeBytes/],
    ["GPU without FLOPs", [{ ...good, gpuBackend: "cuda", gpuFreeBytes: 1e9 }], /missing gpuFlopsPerS/],
    ["no disk", [{ ...good, diskSeqReadBytesPerS: undefined }], /missing disk speed/],
    ["bad flops key", [{ ...good, cpuFlopsPerS: { "Q4 K": 1 } }], /cpuFlopsPerS has a key "Q4 K" that is not a weight type name/],
    ["bad flops value", [{ ...good, cpuFlopsPerS: { Q4_K: "fast" } }], /cpuFlopsPerS.Q4_K must be a finite number >= 0/],
    ["no name", [{ ...good, name: "" }], /device #0: missing name/],
    ["duplicate", [good, good], /device #1: name "a" is used twice/],
  ];
  for (const [what, json, message] of cases) {
    test(what, () => {
      const e = thrown(() => parseDeviceProfiles(json));
      expect(e.reason).toBe("invalid-input");
      expect(e.message).toMatch(message);
    });
  }
  test("unknown fields are warned about, not kept", () => {
    const r = parseDeviceProfiles({ devices: [{ ...good, ramAvailabeBytes: 1 }], comment: "x" });
    expect(r.warnings).toEqual(['device #0: unknown field "ramAvailabeBytes" ignored']);
    expect(Object.keys(r.devices[0])).not.toContain("ramAvailabeBytes");
  });
  test("defaults: disk speeds stand in for each other; uma follows Metal; gpuMemCapBytes caps", () => {
    const r = parseDeviceProfiles([
      { ...good, name: "mac", os: "macos", diskSeqReadBytesPerS: 1e9, gpuBackend: "metal", gpuFreeBytes: 8e9, gpuMemCapBytes: 4e9, gpuFlopsPerS: { "*": 1e12 } },
      { ...good, name: "linux", diskSeqReadBytesPerS: 2e9, diskRandReadBytesPerS: 3e8 },
    ]);
    const mac = resolveDevice(r.devices[0], 0);
    expect(mac).toMatchObject({ uma: true, gpuFreeBytes: 4e9, diskBytesPerS: 1e9, kvCopyCpuMs: 0, linkLatencyMs: 0, swappableBytes: 0 });
    expect(resolveDevice({ ...r.devices[0], diskRandReadBytesPerS: 5e8 }, 0).diskBytesPerS).toBe(5e8); // macOS reads randomly
    expect(resolveDevice(r.devices[1], 1)).toMatchObject({ gpu: "none", uma: false, gpuFreeBytes: 0, diskBytesPerS: 2e9 }); // Linux sequentially
  });
});

describe("baselines", () => {
  const F70 = fixtureModel("F-70B");
  const four = fixtureCluster(["D1", "D2", "D3", "D4"]);
  test("every baseline covers the model, respects VRAM and reports slow-disk overloads", () => {
    for (const name of ["even", "memory", "flops"] as const) {
      for (const k of [1, 2, 4]) {
        const p = baselinePlan(name, four, F70, { k });
        expect(p.devices.reduce((s, d) => s + d.windowLayers, 0) * k).toBe(80);
        expect(p.devices.every((d) => d.windowLayers >= 1 && d.gpuLayers <= d.windowLayers)).toBe(true);
        for (const d of p.devices) expect(d.gpuLayersPerToken * 516_915_200).toBeLessThanOrEqual(d.gpuLayerCapacityBytes);
        expect(p.objectiveMs).toBe(p.latencyMs);
        expect(p.latencyMs).toBeGreaterThan(halda(four, F70, { k }).latencyMs);
      }
    }
    expect(baselinePlan("even", four, F70).devices.map((d) => d.windowLayers)).toEqual([20, 20, 20, 20]);
    // flops: the faster a device runs this model's layers, the larger its window (D3's GPU is the fastest).
    const f = baselinePlan("flops", four, F70).devices.map((d) => d.windowLayers);
    expect(f[2]).toBeGreaterThan(f[1]);
    expect(f[1]).toBeGreaterThan(f[0]);
    expect(f[0]).toBeGreaterThan(f[3]);
    // A baseline that overloads a disk below the threshold says so.
    const slowDisk = [...fixtureCluster(["D3"]), { ...fixtureCluster(["D3", "D4"])[1], diskSeqReadBytesPerS: 0.05 * GB }];
    const even = baselinePlan("even", slowDisk, F70);
    expect(even.problems.some((x) => /D4 holds more than its memory .* below the 0\.10 GB\/s overload threshold/.test(x))).toBe(true);
    expect(() => baselinePlan("even", four, F70, { k: 3 })).toThrow(HaldaError);
  });
});
