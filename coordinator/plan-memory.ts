// The windows last placed for a set of devices and a model's settings, kept beside the device
// profiles (a profile cache emptied forgets them too): the next plan for the same devices keeps them
// where Halda prices them near its new best (placement.ts keptOrNew). A file that is missing,
// damaged or from another version is no memory, never an error.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Assignment } from "../halda/index.js";
import { defaultCacheDir, makeDirs, writeJsonAtomically } from "../profiler/index.js";

const FILE = "plans.json";
/** Device sets and settings remembered; the oldest forgotten first. */
export const PLANS_KEPT = 64;

interface Remembered {
  readonly key: string;
  readonly k: number;
  readonly windowLayers: readonly number[];
}

function read(dir: string): Remembered[] {
  try {
    const v = JSON.parse(readFileSync(join(dir, FILE), "utf8")) as { version?: number; plans?: unknown };
    if (v?.version !== 1 || !Array.isArray(v.plans)) return [];
    return v.plans.filter((p): p is Remembered => typeof p?.key === "string" && Number.isInteger(p.k) && p.k >= 1 &&
      Array.isArray(p.windowLayers) && p.windowLayers.every((w: unknown) => Number.isInteger(w) && (w as number) >= 0));
  } catch {
    return [];
  }
}

/** The windows last placed under `key` (by Halda index), if any. */
export function recallPlan(key: string, dir = defaultCacheDir()): Assignment | undefined {
  const p = read(dir).find((x) => x.key === key);
  return p && { k: p.k, windowLayers: p.windowLayers, gpuLayers: p.windowLayers.map(() => 0) };
}

/** Remembers the windows placed under `key`; a folder that cannot be written is said, not thrown. */
export function rememberPlan(key: string, a: Pick<Assignment, "k" | "windowLayers">, dir = defaultCacheDir(), log: (line: string) => void = () => {}): void {
  const plans = [...read(dir).filter((x) => x.key !== key), { key, k: a.k, windowLayers: [...a.windowLayers] }].slice(-PLANS_KEPT);
  try {
    makeDirs(dir);
    writeJsonAtomically(join(dir, FILE), { version: 1, plans });
  } catch (e) {
    log(`could not keep the plan in ${dir} (${(e as Error).message}); the next plan starts afresh`);
  }
}
