// How fast a device's own in-memory work ran in its ring against what the plan priced it at, kept for
// the next plans. A profile times a pass after a fixed idle gap (10 ms), but a pass's speed moves with
// the gap before it, which is the ring's token less the device's own work (threads and caches go cold:
// `npm run bench -- --only ring`'s idle-gap table, a 7-layer window 4.95 ms back to back and 6.01 after
// 25 ms idle, threads spread as a ring's are), so a fast ring's devices ran their windows 30% under
// their price (`--only moe`, capped). The next plans of the same model on the device price its compute
// and output layer by the median of its recent ratios: the pass as its ring runs it.
import { join } from "node:path";
import type { DeviceProfile } from "../halda/index.js";
import type { DeviceReport } from "./report.js";
import { middleOf, TimedStore } from "./timed-store.js";

/** How long an observation counts, and how many count. */
export const RECENT_RING_PASS_MS = 60 * 60_000, RECENT_RING_PASSES = 3;
/** A ratio beyond these is a broken measurement (a stalled device, a clock), not the gap's effect. */
const MIN_RING_PASS_RATIO = 0.25, MAX_RING_PASS_RATIO = 4;
/** A device that read more than this a token from storage was not running from memory. */
export const MAX_IN_MEMORY_READ_BYTES = 2 ** 20;

/** measuredMs (compute and send, less preemption) over pricedMs (the plan's compute, memory and
 * hand-off), where the device ran from memory (priced so, and read almost nothing); else undefined. */
export function observedPassRatio(measuredMs: number, pricedMs: number, pricedDiskMs: number, readBytesPerToken: number): number | undefined {
  if (!(pricedDiskMs === 0) || !(readBytesPerToken <= MAX_IN_MEMORY_READ_BYTES) || !(pricedMs > 0) || !(measuredMs > 0)) return undefined;
  const ratio = measuredMs / pricedMs;
  return ratio >= MIN_RING_PASS_RATIO && ratio <= MAX_RING_PASS_RATIO ? ratio : undefined;
}

/** A device's passes of one model: its hardware (the profile's id) and the model's fingerprint. */
export function ringPassKey(r: DeviceReport, fingerprint: string): string {
  return `${String(r.profile.id ?? "-")}|${fingerprint}`.slice(0, 300);
}

/** The profile with its compute (FLOP/s, the output layer, KV copies) scaled by `ratio`. */
export function withPassRatio(p: DeviceProfile, ratio: number): DeviceProfile {
  const flops = Object.fromEntries(Object.entries(p.cpuFlopsPerS).map(([k, v]) => [k, v / ratio]));
  return {
    ...p, cpuFlopsPerS: flops,
    ...(p.outputLayerMs !== undefined ? { outputLayerMs: p.outputLayerMs * ratio } : {}),
    ...(p.kvCopyCpuMs !== undefined ? { kvCopyCpuMs: p.kvCopyCpuMs * ratio } : {}),
  };
}

/** The middle of the recent ratios, or undefined. */
export function ringPassFigure(list: readonly { readonly ratio: number }[]): number | undefined {
  return middleOf(list.map((o) => o.ratio));
}

/** Observations kept in a file beside the profiles (the coordinator's), by ringPassKey. */
export class RingPassStore extends TimedStore<"ratio"> {
  constructor(dir: string) {
    super(join(dir, "ring-passes.json"), "ratio", RECENT_RING_PASS_MS, RECENT_RING_PASSES);
  }
}
