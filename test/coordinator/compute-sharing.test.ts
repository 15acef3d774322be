// How many of a ring's devices compute at once (coordinator/compute-sharing.ts), which is how many
// groups of sequences serve --parallel keeps round the ring: every device of a machine of its own; of
// devices sharing a machine, as many as their threads fit in its CPUs.
import { describe, expect, it } from "vitest";
import { computeSharing, describeSharing, machineOf, pooledTwins, twinKey, type ComputeDevice } from "../../coordinator/index.js";
import type { DeviceProfile } from "../../halda/index.js";

const dev = (label: string, machine: string, threads: number, logicalCpus: number): ComputeDevice => ({ label, machine, threads, logicalCpus });

describe("devices computing at once", () => {
  it("devices on machines of their own all compute at once, whatever their threads", () => {
    const s = computeSharing([dev("laptop", "m1", 8, 8), dev("desktop", "m2", 4, 4), dev("phone", "m3", 8, 8)]);
    expect(s).toEqual({ count: 3, crowded: [] });
    expect(describeSharing(s)).toBe("");
  });

  it("devices sharing a machine compute at once only as far as their threads fit in its CPUs", () => {
    // three loopback devices of one thread on two CPUs (the serve benchmark's ring): two at once
    const loopback = computeSharing([dev("w1", "m", 1, 2), dev("w2", "m", 1, 2), dev("head", "m", 1, 2)]);
    expect(loopback.count).toBe(2);
    expect(describeSharing(loopback)).toBe("w1, w2, head share one machine's 2 CPUs: 2 of them compute at once");
    // each with every CPU: one at a time; the machine of its own beside them still counts
    expect(computeSharing([dev("w1", "m", 2, 2), dev("w2", "m", 2, 2), dev("head", "m", 2, 2), dev("laptop", "o", 4, 4)]).count).toBe(2);
    // the devices of fewest threads first: 1 + 2 fit in 4 CPUs, 1 + 2 + 3 do not
    expect(computeSharing([dev("a", "m", 3, 4), dev("b", "m", 1, 4), dev("c", "m", 2, 4)]).count).toBe(2);
    // enough CPUs for all: none crowded
    expect(computeSharing([dev("a", "m", 2, 16), dev("b", "m", 2, 16)])).toEqual({ count: 2, crowded: [] });
  });

  it("a device whose machine is unknown is its own machine; at least one device always computes", () => {
    expect(computeSharing([dev("a", "", 2, 2), dev("b", "", 2, 2), dev("c", "", 2, 2)]).count).toBe(3);
    expect(computeSharing([dev("a", "m", 64, 2)]).count).toBe(1);
    expect(computeSharing([]).count).toBe(1);
  });

  it("machines cloned from one image (one machine-id, another boot) are different machines", () => {
    const a = machineOf({ machineId: "3d12", bootId: "b1" }), b = machineOf({ machineId: "3d12", bootId: "b2" });
    expect(a).not.toBe(b);
    expect(machineOf({ machineId: "3d12", bootId: "b1" })).toBe(a);
    expect(machineOf({ machineId: "", bootId: "b1" })).toBe("");
    expect(machineOf(undefined)).toBe("");
    expect(computeSharing([dev("a", a, 2, 2), dev("b", b, 2, 2)]).count).toBe(2);
  });

  it("twins (one machine and boot, CPU, threads, SIMD level and quota) are priced at the median of their timings; others keep theirs", () => {
    const system = { machineId: "m", bootId: "b", cpuModel: "EPYC", arch: "x64", logicalCpus: 2 };
    const details = (over: object = {}) => ({ system, threads: 2, simd: "avx512", ...over }) as Parameters<typeof twinKey>[0];
    const keys = [details(), details(), details(), details({ cpuQuota: 0.25 }), details({ system: { ...system, bootId: "b2" } }), details({ system: { ...system, machineId: "" } })].map(twinKey);
    expect(new Set(keys.slice(0, 3)).size).toBe(1);
    expect(new Set(keys.slice(2, 5)).size).toBe(3); // a quota, another boot: other machines' speeds
    expect(keys[5]).toBe(""); // no machine-id: nobody's twin
    const prof = (name: string, q4k: number, kv?: number): DeviceProfile =>
      ({ name, os: "linux", cpuFlopsPerS: { Q4_K: q4k, F32: q4k / 8 }, ramAvailableBytes: 1, ...(kv !== undefined ? { kvCopyCpuMs: kv } : {}) }) as DeviceProfile;
    const ps = [prof("head", 73.7e9, 0.03), prof("w1", 68.5e9, 0.05), prof("w2", 79.1e9, 0.04), prof("slow", 20e9, 0.2), prof("other", 90e9), prof("unknown", 50e9)];
    const { profiles, groups } = pooledTwins(ps, keys);
    expect(groups).toEqual([[0, 1, 2]]);
    for (const p of profiles.slice(0, 3)) expect(p).toMatchObject({ cpuFlopsPerS: { Q4_K: 73.7e9, F32: 73.7e9 / 8 }, kvCopyCpuMs: 0.04 });
    expect(profiles.slice(3)).toEqual(ps.slice(3));
    expect(profiles[0].name).toBe("head"); // only the compute changes
    expect(ps[1].cpuFlopsPerS.Q4_K).toBe(68.5e9); // the inputs are left as they were
  });
});

