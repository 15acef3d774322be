// HALDA.md §4.9 [EXT]: devices that read ahead (DeviceProfile.prefetches) make plans of k > 1 worth
// pricing: under the prefetch guard each overloaded device reads its next window while the others
// compute, so its reads bound the token instead of adding to it.
import { describe, expect, test } from "vitest";
import { halda, type DeviceProfile, type Plan } from "../../halda/index.js";
import { fixtureModel, GB, GiB } from "./fixtures.js";

const F8 = fixtureModel("F-8B");

/** Three CPU devices, each with room for a few of the model's 32 layers, on disks of diskGBps. */
function starved(diskGBps: number, prefetches: boolean, ramGiB = 0.9): DeviceProfile[] {
  return ["head", "laptop", "desktop"].map((name) => ({
    name, os: "linux", cpuFlopsPerS: { "*": 100e9 }, kvCopyCpuMs: 0.02, ramAvailableBytes: ramGiB * GiB,
    diskSeqReadBytesPerS: diskGBps * GB, diskRandReadBytesPerS: diskGBps * GB, prefetches,
  }));
}

/** The price §4.9 gives a plan, from the plan's own figures: the ring's work without the prefetching
 * overloaded devices' reads, or one such device's work and its reads of every layer it runs. */
function hiddenPrice(p: Plan, diskGBps: number): number {
  let ring = 0, slowest = 0;
  for (const d of p.devices) {
    const own = d.latency.computeMs + d.latency.memoryMs + d.latency.commMs;
    if (d.set === "M4") ring += own + d.latency.diskMs;
    else {
      ring += own;
      slowest = Math.max(slowest, own + (d.layersPerToken * F8.layerBytes) / (diskGBps * GB) * 1000);
    }
  }
  return Math.max(ring, slowest);
}

describe("prefetch's price (HALDA.md §4.9)", () => {
  test("memory-starved devices on slow disks that read ahead get k > 1, priced with their reads hidden", () => {
    const plain = halda(starved(0.2, false), F8);
    const ahead = halda(starved(0.2, true), F8);
    expect(plain.k).toBe(1);
    expect(ahead.k).toBeGreaterThan(1);
    expect(ahead.devices.some((d) => d.set !== "M4")).toBe(true);
    // every overloaded window fits its room (the guard), though the device's windows do not
    for (const d of ahead.devices.filter((x) => x.set !== "M4")) {
      expect(d.windowLayers * F8.layerBytes).toBeLessThanOrEqual(d.ramLayerCapacityBytes);
      expect(d.layersPerToken * F8.layerBytes).toBeGreaterThan(d.ramLayerCapacityBytes);
    }
    expect(ahead.latencyMs).toBeCloseTo(hiddenPrice(ahead, 0.2), 6);
    expect(ahead.latencyMs).toBeLessThan(plain.latencyMs);
    expect(ahead.notes.join("\n")).toMatch(/k = \d+ under the prefetch guard: .*read each window while the others compute/);
  });

  test("with a ring order and a device left out (the price of a subset of the devices)", () => {
    const slow: DeviceProfile = { ...starved(0.02, true)[0], name: "old-desktop", cpuFlopsPerS: { "*": 1e7 } };
    const devices = [...starved(0.2, true), slow];
    // selection prices subsets of the devices, whose numbers are not the ring order's
    const p = halda(devices, F8, { ringOrder: [1, 2, 3, 0] });
    expect(p.dropped.map((d) => d.name)).toEqual(["old-desktop"]);
    expect(p.k).toBeGreaterThan(1);
  });

  test("where the model fits, or nobody reads ahead, or k is the user's, the plan is the paper's", () => {
    const roomy = halda(starved(0.2, true, 4), F8);
    expect(roomy.k).toBe(1);
    expect(roomy.devices.every((d) => d.set === "M4")).toBe(true);
    expect(halda(starved(0.2, true), F8, { k: 1 }).k).toBe(1);
    expect(halda(starved(3, false), F8).k).toBe(1);
  });
});
