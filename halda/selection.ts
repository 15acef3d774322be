// Device selection that drops only the devices that slow the ring (HALDA.md §4.4 [EXT]). Halda's own
// rule (the paper's) drops every device left with one layer at once, even one needed to hold the
// model, and even when the smaller ring is slower.
import { halda } from "./planner.js";
import type { DeviceProfile, HaldaOptions, ModelProfile, Plan } from "./types.js";

/** A plan for a subset of the devices, with its indices turned back into indices of the full list. */
function remap(plan: Plan, subset: readonly number[]): Plan {
  return {
    ...plan,
    devices: plan.devices.map((d) => ({ ...d, index: subset[d.index] })),
    dropped: plan.dropped.map((d) => ({ ...d, index: subset[d.index] })),
  };
}

/**
 * Halda with device selection that drops only the devices that slow the ring (HALDA.md §4.4 [EXT]):
 * Halda's own rule drops every device left with one layer at once, even when one of them is needed
 * to hold the model and the smaller ring is slower. Here Halda drops that batch only if it is faster;
 * then each device still left with a window of `dropWindowLayers` or less is tried out one at a time,
 * and the removal that helps most is kept, until none helps.
 */
export function selectDevices(devices: readonly DeviceProfile[], model: ModelProfile, options: HaldaOptions = {}): Plan {
  const threshold = options.dropWindowLayers ?? 1;
  const solve = (subset: readonly number[]) => remap(halda(subset.map((i) => devices[i]), model, { ...options, dropOnlyIfFaster: true }), subset);
  let plan = solve(devices.map((_, i) => i));
  const dropped = [...plan.dropped];
  const notes = [...plan.notes];
  while (threshold > 0) {
    const active = plan.devices.map((d) => d.index);
    let best: { plan: Plan; index: number } | undefined;
    for (const d of plan.devices) {
      if (d.index === 0 || d.windowLayers > threshold) continue;
      let without: Plan;
      try {
        without = solve(active.filter((i) => i !== d.index));
      } catch {
        continue; // no plan without it: it is needed
      }
      if (without.latencyMs < (best?.plan.latencyMs ?? plan.latencyMs)) best = { plan: without, index: d.index };
    }
    if (!best) break;
    const gone = plan.devices.find((d) => d.index === best!.index)!;
    dropped.push({
      index: gone.index, name: gone.name,
      reason: `left with a window of ${gone.windowLayers} layer(s): predicted ${plan.latencyMs.toFixed(1)} ms with it, ${best.plan.latencyMs.toFixed(1)} ms without`,
    });
    dropped.push(...best.plan.dropped);
    notes.push(...best.plan.notes);
    plan = best.plan;
  }
  for (const d of plan.devices) {
    if (d.index !== 0 && d.windowLayers <= threshold) notes.push(`selection: kept ${d.name} with ${d.windowLayers} layer(s): the ring without it is not faster`);
  }
  const seen = new Set<number>();
  const uniqueDropped = dropped.filter((d) => !seen.has(d.index) && seen.add(d.index)).sort((a, b) => a.index - b.index);
  return { ...plan, dropped: uniqueDropped, notes: [...new Set(notes)] };
}

