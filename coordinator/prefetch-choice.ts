// Whether a ring device reads its next window ahead while the others compute (prima.cpp's prefetch;
// ring/node.ts advise, native prima_window_prefetch_background). It pays where the read would otherwise
// wait on the critical path and the CPU it takes is free: on a device of its own, or on a disk slow
// enough that reading leaves the CPU idle. It costs where devices share a machine's CPUs and the disk
// is fast: filling the page cache costs about the same CPU per byte on any disk (0.1-0.2 ms a MiB
// here), so the faster the disk the larger the share of a CPU the background read takes, from devices
// whose passes' threads then wait for each other at every barrier. Measured (`npm run bench -- --only
// ring`, memory-starved workers, k = 2, three devices on one 2-vCPU host): a 200 MB/s disk (reading
// took 4% of a CPU) ran 1.9x faster with prefetch; the host's cached disk at 1-2 GB/s (12-24% of a
// CPU) 1.5x slower.

/** --prefetch / --no-prefetch, or (neither) the choice below. */
export type PrefetchMode = "auto" | "on" | "off";

/** Reading takes at least this share of a CPU: too much to take from devices sharing the CPUs. */
export const CPU_BOUND_READ_SHARE = 0.1;

export interface PrefetchDevice {
  readonly label: string;
  /** machineOf its system (compute-sharing.ts; "" where there is none: never taken for a shared machine). */
  readonly machine: string;
  /** The profiler's CPU share of sequential reading (absent: not measured). */
  readonly readCpuShare?: number;
}

export interface PrefetchChoice {
  readonly on: boolean;
  readonly why: string;
}

/** Each device's choice (in the order given: the ring's devices, the head among them). */
export function choosePrefetch(mode: PrefetchMode, devices: readonly PrefetchDevice[]): PrefetchChoice[] {
  return devices.map((d) => {
    if (mode !== "auto") return { on: mode === "on", why: mode === "on" ? "--prefetch" : "--no-prefetch" };
    const sharing = devices.filter((o) => o !== d && d.machine !== "" && o.machine === d.machine).map((o) => o.label);
    if (sharing.length === 0) return { on: true, why: "its CPU is its own: it reads while the others compute" };
    const share = d.readCpuShare;
    if (typeof share !== "number" || !Number.isFinite(share)) return { on: true, why: "its disk's CPU share was not measured" };
    const pct = `${(100 * share).toFixed(0)}% of a CPU`;
    return share >= CPU_BOUND_READ_SHARE
      ? { on: false, why: `it shares its machine's CPUs with ${sharing.join(", ")} and reading its disk takes ${pct}: reading ahead would take the CPU they compute on` }
      : { on: true, why: `reading its disk takes ${pct}: the read waits on the disk, not on the CPU it shares with ${sharing.join(", ")}` };
  });
}
