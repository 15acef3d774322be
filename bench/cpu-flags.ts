// The CPU's feature flags as /proc/cpuinfo names them (read once): which ggml library variant the
// oracle loads, whether llama.cpp's native build must leave AMX out, and the test harness's AMX case.
import { readFileSync } from "node:fs";

let cpuinfo: string | undefined;

/** Whether this CPU reports the feature flag (false off Linux). */
export function cpuHasFlag(flag: string): boolean {
  if (cpuinfo === undefined) {
    try {
      cpuinfo = readFileSync("/proc/cpuinfo", "utf8");
    } catch {
      cpuinfo = ""; // not Linux
    }
  }
  return new RegExp(`\\b${flag}\\b`).test(cpuinfo);
}
