// Memory readings of this process and this device, from /proc (Linux and Android); other systems get
// what Node itself reports.
import { readFileSync } from "node:fs";
import { freemem, totalmem } from "node:os";

function procKiB(file: string, key: string): number | undefined {
  try {
    const m = readFileSync(file, "utf8").match(new RegExp(`^${key}:\\s+(\\d+) kB`, "m"));
    return m ? Number(m[1]) * 1024 : undefined;
  } catch {
    return undefined;
  }
}

/** Anonymous resident memory of this process (heap, stacks, KV caches; not mmap'd file pages). */
export function anonRssBytes(): number {
  return procKiB("/proc/self/status", "RssAnon") ?? process.memoryUsage().rss;
}

/** MemTotal and MemAvailable of the device. */
export function deviceMemory(): { totalBytes: number; availableBytes: number } {
  return {
    totalBytes: procKiB("/proc/meminfo", "MemTotal") ?? totalmem(),
    availableBytes: procKiB("/proc/meminfo", "MemAvailable") ?? freemem(),
  };
}

/** Tracks the peak of anonymous RSS by sampling (cheap enough for every few tokens). */
export function peakAnonTracker(): { sample(): void; peakBytes(): number } {
  let peak = anonRssBytes();
  return {
    sample() {
      const v = anonRssBytes();
      if (v > peak) peak = v;
    },
    peakBytes: () => peak,
  };
}

/** The paper's memory pressure: the largest drop of MemAvailable during a run relative to MemTotal. */
export function memoryPressureTracker(): { sample(): void; pressure(): number } {
  const start = deviceMemory();
  let lowest = start.availableBytes;
  return {
    sample() {
      const a = deviceMemory().availableBytes;
      if (a < lowest) lowest = a;
    },
    pressure: () => Math.max(0, start.availableBytes - lowest) / start.totalBytes,
  };
}
