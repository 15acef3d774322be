// Prefetch's price (HALDA.md §4.9 [EXT]), in latency.ts's price of any plan. The paper's objective
// is a sum: no disk read is hidden, so a plan of k > 1 never beats one of k = 1 (§2.5). A device that
// reads ahead (DeviceProfile.prefetches) and is overloaded in a plan of k > 1 under the prefetch guard
// (each window within its room, all of them not) drops each window after its pass and reads the next
// one whole while the others compute. Its reads then leave the ring's sum and bound the token
// instead: a cycle of the ring must hold its own work and its read of the next window.

import type { ResolvedDevice } from "./devices.js";
import type { ModelTerms } from "./terms.js";
import type { DeviceEvaluation } from "./latency.js";
import type { DeviceSet } from "./types.js";

/** One device of a plan as the price needs it: its evaluation and the RAM-side layers it runs a token. */
export interface PricedDevice {
  readonly dev: ResolvedDevice;
  readonly ev: DeviceEvaluation;
  readonly ramLayers: number;
  readonly deltaMsPerByte: number;
}

/** Whether a device reads its windows ahead in a plan of k cycles: it prefetches, k > 1 and it is
 * overloaded (the prefetch guard keeps each of its windows within its room, not all of them). */
export function readsAhead(k: number, prefetches: boolean, set: DeviceSet): boolean {
  return k > 1 && prefetches && set !== "M4";
}

/** The token latency with the reads of the devices that read ahead hidden behind the ring: the longer
 * of the ring's work without those reads and, for each such device, its own work plus its reads of
 * every RAM-side layer it runs. undefined where no device reads ahead (the plan's price is the sum). */
export function hiddenReadsLatencyMs(k: number, devices: readonly PricedDevice[], m: ModelTerms): number | undefined {
  let ring = 0, slowest = 0, hides = false;
  for (const d of devices) {
    const { computeMs, memoryMs, commMs, diskMs } = d.ev.latency;
    const own = computeMs + memoryMs + commMs;
    if (readsAhead(k, d.dev.prefetches, d.ev.set)) {
      hides = true;
      ring += own;
      slowest = Math.max(slowest, own + d.ramLayers * m.layerReadBytes * d.deltaMsPerByte);
    } else {
      ring += own + diskMs;
    }
  }
  return hides ? Math.max(ring, slowest) : undefined;
}
