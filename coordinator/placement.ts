// Halda's plan for the head and the workers (the best subset of devices, each one's window, the
// cycles k) mapped to layer windows in ring order, and the seats that name each device in the three
// numberings (worker, Halda's index, ring position). Gathering the profiles it is made from is
// plan-ring.ts's job; setting it beside what the devices measured, prediction.ts's.
//
// Order: Halda's device 0 is the head; our ring runs the workers in ring order (by device name,
// Cluster.workersInOrder) and then the head (which holds the last window of each cycle): worker j is
// Halda device j + 1. Halda's counts do not depend on the rotation, but a MoE model's windows priced by
// the layers they name (MoE-3) do, so Halda is told the ring order.
import { assignmentPlan, selectDevices, type Assignment, type DeviceProfile, type HaldaOptions, type ModelProfile, type Plan } from "../halda/index.js";
import { kvBytesPerLayer } from "../model/index.js";
import type { WorkerHandle } from "./registry.js";
import { HEAD_ID } from "./ring-setup.js";

export interface Placement {
  readonly plan: Plan;
  /** Halda's input, the head first. */
  readonly devices: readonly DeviceProfile[];
  /** Layers per cycle in ring order (workers in join order, then the head); 0: takes no part. */
  readonly perCycle: readonly number[];
  readonly cycles: number;
  /** Per ring position: drop a window's pages after running it, so the prefetch of the next one has
   *  room (an overloaded device that runs several windows per token). */
  readonly releaseAfterUse: readonly boolean[];
  /** b': bytes of one layer with its KV cache, the unit of the devices' capacities. */
  readonly layerBytesWithKv: number;
  /** Per Halda device: of its hop (linkLatencyMs), ms of its own work handing a token on, timed (the
   * head's: DeviceDetails.handOffMs); its counters hold it as send time, so the report counts it in
   * the device's row rather than in the hops. */
  readonly handOffMs?: readonly number[];
}

/** Ring position (workers 0..n-1, head n) of Halda device i. */
export function ringPosition(haldaIndex: number, nWorkers: number): number {
  return haldaIndex === 0 ? nWorkers : haldaIndex - 1;
}

/** Halda device index of ring position pos. */
export function haldaIndexAt(pos: number, nWorkers: number): number {
  return pos === nWorkers ? 0 : pos + 1;
}

/** One device of a placement in its three numberings: the worker (null: the head), Halda's index and
 * the ring position (ringPosition). Made once a placement (seatsOf); whoever needs one numbering from
 * another looks up the seat rather than translating. */
export interface Seat {
  readonly worker: WorkerHandle | null;
  readonly id: string;
  readonly haldaIndex: number;
  readonly ringPosition: number;
}

/** The seats of a placement over these workers (ring order), the head last. */
export function seatsOf(workers: readonly WorkerHandle[]): Seat[] {
  const n = workers.length;
  return [...workers, null].map((worker, pos) => ({ worker, id: worker?.id ?? HEAD_ID, haldaIndex: haldaIndexAt(pos, n), ringPosition: pos }));
}

/** Each of `n` devices' window by Halda index (0: not in the ring). */
export function windowsByIndex(plan: Plan, n: number): number[] {
  return byIndex(plan, n, (d) => d.windowLayers);
}

/** A figure of each of the plan's devices by Halda index (0 for devices it leaves out). */
function byIndex(plan: Plan, n: number, of: (d: Plan["devices"][number]) => number): number[] {
  const out = new Array<number>(n).fill(0);
  for (const d of plan.devices) out[d.index] = of(d);
  return out;
}

/** A plan in force is kept while it is priced within this fraction of Halda's new best (keptOrNew). */
export const KEEP_PLAN_WITHIN = 0.05;

/** Halda's new plan, or `previous` (the windows in force, by Halda index) where it is a plan for these
 * devices priced within KEEP_PLAN_WITHIN of the new one: timings move a few percent from one
 * measurement to the next, and near-equal plans then took turns from run to run (a MoE ring of three
 * devices alternated [4,4,4] and [4,5,3], each run paying to move windows and warm pages anew, its
 * speed no better for it). A change worth more than that is made. */
export function keptOrNew(plan: Plan, previous: Assignment | undefined, devices: readonly DeviceProfile[], model: ModelProfile, options: HaldaOptions): Plan {
  if (!previous || previous.windowLayers.length !== devices.length) return plan;
  // what was asked for stands: cycles given (--cycles), every device in the ring (--keep-all)
  if ((options.k && previous.k !== options.k) || (options.keepAll && previous.windowLayers.includes(0))) return plan;
  const now = windowsByIndex(plan, devices.length);
  if (previous.k === plan.k && previous.windowLayers.every((w, i) => w === now[i])) return plan;
  let kept: Plan;
  try {
    kept = assignmentPlan(devices, model, previous, options, plan.planner);
  } catch {
    return plan; // not a plan for these devices (another model's layers, a device's count)
  }
  if (kept.problems.length > 0 || kept.latencyMs > plan.latencyMs * (1 + KEEP_PLAN_WITHIN)) return plan;
  // nor one holding more layers beyond the devices' rooms than the new plan (priced as the kept one is):
  // selection weighs those beside the price (HALDA.md §4.4), and a plan from before it may not
  const beyond = (p: Plan) => p.devices.reduce((s, d) => s + d.layersBeyondRoom, 0);
  const fresh = assignmentPlan(devices, model, { k: plan.k, windowLayers: now, gpuLayers: byIndex(plan, devices.length, (d) => d.gpuLayers) }, options, plan.planner);
  if (beyond(kept) > beyond(fresh)) return plan;
  const inForce = (p: Plan) => `[${p.devices.map((d) => d.windowLayers).join(",")}] (k = ${p.k}, ${p.latencyMs.toFixed(2)} ms)`;
  return { ...kept, runnerUp: plan.runnerUp, notes: [...plan.notes, `kept the plan in force ${inForce(kept)}: within ${KEEP_PLAN_WITHIN * 100}% of Halda's new best ${inForce(plan)}`] };
}

/** Halda's options for a ring of the head and nWorkers workers. Priced as the engine pages: a device
 * whose one window does not fit streams the layers past its room (native streamBeyond), rereading its
 * excess, one layer and a margin more each token ("stream"); a mixture of experts is not streamed: the
 * page cache keeps the experts tokens use most, and a token rereads its routed experts that are not
 * resident ("excess", docs/HALDA.md MoE-1). */
function ringOptions(model: ModelProfile, nWorkers: number, options: HaldaOptions): HaldaOptions {
  const ringOrder = [...Array.from({ length: nWorkers }, (_, j) => j + 1), 0];
  return { overloadReload: model.moe ? "excess" : "stream", ringOrder, ...options };
}

/** Windows given in ring order (workers, then the head; `cycles` of them) priced as placeRing prices
 * its own plans, on the profiles a placement was made from (`devices`: Halda's input, the head first):
 * what Halda thinks of a hand-made plan. */
export function priceRingWindows(devices: readonly DeviceProfile[], model: ModelProfile, perCycle: readonly number[], cycles = 1, options: HaldaOptions = {}): Plan {
  const n = devices.length - 1;
  if (perCycle.length !== devices.length) throw new Error(`${perCycle.length} windows for ${devices.length} devices`);
  const windowLayers = perCycle.map((_, hi) => perCycle[ringPosition(hi, n)]);
  return assignmentPlan(devices, model, { k: cycles, windowLayers, gpuLayers: windowLayers.map(() => 0) }, ringOptions(model, n, options));
}

/**
 * Halda's plan for the head and the workers (in their seats' order: by name), with the best subset of devices (HALDA.md
 * §4.4), or every device with `options.keepAll` (what `--keep-all` passes); throws HaldaError when there
 * is none. `previous`: the windows in force for these devices (by Halda index), kept where they are
 * priced near the new best (keptOrNew).
 */
export function placeRing(head: DeviceProfile, workers: readonly DeviceProfile[], model: ModelProfile, options: HaldaOptions = {}, previous?: Assignment): Placement {
  const devices = [head, ...workers];
  const haldaOptions = ringOptions(model, workers.length, options);
  const plan = keptOrNew(selectDevices(devices, model, haldaOptions), previous, devices, model, haldaOptions);
  const n = workers.length;
  const perCycle = new Array<number>(n + 1).fill(0);
  const releaseAfterUse = new Array<boolean>(n + 1).fill(false);
  for (const d of plan.devices) {
    const pos = ringPosition(d.index, n);
    perCycle[pos] = d.windowLayers;
    releaseAfterUse[pos] = plan.k > 1 && d.set !== "M4";
  }
  return { plan, devices, perCycle, cycles: plan.k, releaseAfterUse, layerBytesWithKv: model.layerBytes + kvBytesPerLayer(model) };
}

export const ms = (v: number) => v.toFixed(2);

/** The plan as a table: device, set, window, layers, predicted ms per token and its breakdown. */
export function formatPlan(p: Placement, labels: readonly string[]): string {
  const n = p.devices.length - 1;
  const lines = [
    `plan: Halda (${p.plan.planner}), k = ${p.cycles} cycle${p.cycles === 1 ? "" : "s"}, predicted ${ms(p.plan.latencyMs)} ms per token` +
      (p.plan.runnerUp ? ` (best other k = ${p.plan.runnerUp.k}: ${ms(p.plan.runnerUp.latencyMs)} ms)` : ""),
    `${"device".padEnd(32)} set  window  RAM-side cap    compute   memory     disk     comm   total ms`,
  ];
  const byIndex = new Map(p.plan.devices.map((d) => [d.index, d]));
  const droppedByIndex = new Map(p.plan.dropped.map((d) => [d.index, d]));
  for (let pos = 0; pos <= n; pos++) {
    const hi = haldaIndexAt(pos, n);
    const d = byIndex.get(hi);
    const label = labels[hi];
    if (!d) {
      const x = droppedByIndex.get(hi);
      const withIt = x ? (x.latencyWithMs === null ? "no feasible plan with it" : `${ms(x.latencyWithMs)} ms with it`) : "";
      lines.push(`${label.padEnd(32)} -    dropped${x ? ` (${withIt}, ${ms(x.latencyWithoutMs)} ms without)` : ""}`);
      continue;
    }
    const l = d.latency;
    const capLayers = d.ramLayerCapacityBytes / p.layerBytesWithKv;
    lines.push(
      `${label.padEnd(32)} ${d.set}   ${String(d.windowLayers).padStart(6)}  ${`${Math.max(0, capLayers).toFixed(1)} layers`.padStart(12)} ` +
      `${ms(l.computeMs).padStart(9)} ${ms(l.memoryMs).padStart(8)} ${ms(l.diskMs).padStart(8)} ${ms(l.commMs).padStart(8)} ${ms(l.totalMs).padStart(10)}`,
    );
  }
  for (const d of p.plan.dropped) lines.push(`dropped ${labels[d.index]}: ${d.reason}`);
  for (const note of p.plan.notes) lines.push(`note: ${note}`);
  return lines.join("\n");
}
