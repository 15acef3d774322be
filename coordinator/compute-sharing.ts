// How many of a ring's devices can compute at the same moment, which is how many groups of sequences
// `serve --parallel` keeps going round the ring at once (ring/seq-slots.ts). A device on a machine of
// its own always can. Devices on one machine share its CPUs: only as many as their compute threads fit
// in the CPUs run at once, and a group beyond that waits for CPUs the others hold, its pass's threads
// stalling at every barrier, while it keeps the rows of its sequences out of the other groups' passes
// (which cost little more for a row more). `npm run bench -- --only serve`, its three-device loopback
// ring of one-thread devices on a 2-vCPU host, 4 clients: 1.90x one client's tokens/s in 3 groups
// (bench/history/2026-11-29-serve-before-compute-sharing.md), 2.30x and 2.32x in 2 (BENCHMARKS.md).

import type { DeviceProfile } from "../halda/index.js";
import { median, type DeviceDetails, type SystemInfo } from "../profiler/index.js";

/** Which machine a device runs on, as the rules about devices sharing one compare it (this one and
 * the prefetch choice): its machine-id and boot, since machines cloned from one image share a
 * machine-id; "" where no machine-id is known (never taken for another's). */
export function machineOf(system: Pick<SystemInfo, "machineId" | "bootId"> | undefined): string {
  return system?.machineId ? `${system.machineId}/${system.bootId ?? ""}` : "";
}

export interface ComputeDevice {
  readonly label: string;
  /** machineOf its system ("" where not known: never taken for a shared machine). */
  readonly machine: string;
  /** Compute threads the device runs a pass on. */
  readonly threads: number;
  /** Its machine's logical CPUs. */
  readonly logicalCpus: number;
}

export interface ComputeSharing {
  /** Devices that can compute at once (at least 1). */
  readonly count: number;
  /** Per machine that holds more devices than can compute at once: which, and its CPUs. */
  readonly crowded: readonly { readonly labels: readonly string[]; readonly cpus: number; readonly atOnce: number }[];
}

export function computeSharing(devices: readonly ComputeDevice[]): ComputeSharing {
  const machines = new Map<string, ComputeDevice[]>();
  let count = 0;
  for (const d of devices) {
    if (d.machine === "") {
      count++;
      continue;
    }
    const on = machines.get(d.machine) ?? [];
    on.push(d);
    machines.set(d.machine, on);
  }
  const crowded: { labels: string[]; cpus: number; atOnce: number }[] = [];
  for (const on of machines.values()) {
    const cpus = Math.max(...on.map((d) => d.logicalCpus));
    // the devices of fewest threads first: as many as fit run side by side, and at least one always runs
    let used = 0, atOnce = 0;
    for (const threads of on.map((d) => Math.max(1, d.threads)).sort((a, b) => a - b)) {
      if (atOnce > 0 && used + threads > cpus) break;
      used += threads;
      atOnce++;
    }
    count += atOnce;
    if (atOnce < on.length) crowded.push({ labels: on.map((d) => d.label), cpus, atOnce });
  }
  return { count: Math.max(1, count), crowded };
}

/** Why fewer groups go round than there are devices, for the log ("" when as many as devices). */
export function describeSharing(s: ComputeSharing): string {
  return s.crowded
    .map((m) => `${m.labels.join(", ")} share one machine's ${m.cpus} CPU${m.cpus === 1 ? "" : "s"}: ${m.atOnce} of them compute at once`)
    .join("; ");
}

/** Devices whose compute is one machine's own: the same machine and boot, CPU, threads, SIMD level and
 * CPU quota ("" where the machine is not known: never anyone's twin). */
export function twinKey(d: Pick<DeviceDetails, "system" | "threads" | "simd" | "cpuQuota">): string {
  const machine = machineOf(d.system);
  return machine ? JSON.stringify([machine, d.system.cpuModel, d.system.arch, d.system.logicalCpus, d.threads, d.simd, d.cpuQuota ?? null]) : "";
}

/** Twin devices (equal twinKey) priced alike: each one's compute (FLOP/s by type, KV copies) the median
 * of the twins' (of two, their mean). Each device times its own passes, and identical processes on one
 * machine time apart: in one plan of the capped MoE benchmark 52.1, 72.7 and 73.2 GFLOP/s (Q4_K), and
 * the slow-timed worker was left out (bench/history/2026-11-29-moe-capped-efd7acb.md). Returns the
 * profiles (new where changed), and the groups pooled, by index. */
export function pooledTwins(profiles: readonly DeviceProfile[], keys: readonly string[]): { profiles: DeviceProfile[]; groups: number[][] } {
  const groups = new Map<string, number[]>();
  keys.forEach((k, i) => k && groups.set(k, [...(groups.get(k) ?? []), i]));
  const out = [...profiles];
  const pooled: number[][] = [];
  for (const members of groups.values()) {
    if (members.length < 2) continue;
    const types = Object.keys(profiles[members[0]].cpuFlopsPerS).filter((t) => members.every((i) => profiles[i].cpuFlopsPerS[t] > 0));
    const flops = Object.fromEntries(types.map((t) => [t, median(members.map((i) => profiles[i].cpuFlopsPerS[t]))]));
    const kv = members.map((i) => profiles[i].kvCopyCpuMs).filter((x): x is number => x !== undefined);
    for (const i of members) {
      out[i] = { ...profiles[i], cpuFlopsPerS: { ...profiles[i].cpuFlopsPerS, ...flops }, ...(kv.length === members.length ? { kvCopyCpuMs: median(kv) } : {}) };
    }
    pooled.push(members);
  }
  return { profiles: out, groups: pooled };
}
