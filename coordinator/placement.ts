// Halda's plan for the head and the workers (the best subset of devices, each one's window, the
// cycles k) mapped to layer windows in ring order, and the seats that name each device in the three
// numberings (worker, Halda's index, ring position). Gathering the profiles it is made from is
// plan-ring.ts's job; setting it beside what the devices measured, prediction.ts's.
//
// Order: Halda's device 0 is the head; our ring runs the workers in ring order (by device name,
// Cluster.workersInOrder) and then the head (which holds the last window of each cycle): worker j is
// Halda device j + 1. Halda's counts do not depend on the rotation, but a MoE model's windows priced by
// the layers they name (MoE-3) do, so Halda is told the ring order.
import { selectDevices, type DeviceProfile, type HaldaOptions, type ModelProfile, type Plan } from "../halda/index.js";
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

/**
 * Halda's plan for the head and the workers (in their seats' order: by name), with the best subset of devices (HALDA.md
 * §4.4), or every device with `options.keepAll` (what `--keep-all` passes); throws HaldaError when there
 * is none.
 */
export function placeRing(head: DeviceProfile, workers: readonly DeviceProfile[], model: ModelProfile, options: HaldaOptions = {}): Placement {
  const devices = [head, ...workers];
  // Priced as the engine pages: a device whose one window does not fit streams the layers past its
  // room (native streamBeyond), rereading its excess, one layer and a margin more each token ("stream");
  // a mixture of experts is not streamed: the page cache keeps the experts tokens use most, and a token
  // rereads its routed experts that are not resident ("excess", docs/HALDA.md MoE-1).
  const ringOrder = [...workers.map((_, j) => j + 1), 0];
  const plan = selectDevices(devices, model, { overloadReload: model.moe ? "excess" : "stream", ringOrder, ...options });
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
