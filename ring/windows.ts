// Which layers each device runs in each cycle. A plan lists, in ring order, how many layers each
// device takes per cycle (prima.cpp's -lw, or Halda's w); with W layers per cycle a token makes
// k = L / W cycles, and device m's window in cycle c is layers [c*W + sum(w[0..m)), ... + w[m]).
import type { WindowSpec } from "./node.js";

export class PlanError extends Error {
  override name = "PlanError";
}

export interface RingWindows {
  readonly cycles: number;
  /** For each device in ring order, its windows (empty for a device that takes no layers). */
  readonly perDevice: readonly (readonly WindowSpec[])[];
}

export function ringWindows(nLayers: number, layersPerCycle: readonly number[], cycles?: number): RingWindows {
  if (layersPerCycle.some((w) => !Number.isInteger(w) || w < 0)) throw new PlanError(`layer windows must be whole numbers >= 0 (got ${layersPerCycle.join(",")})`);
  const W = layersPerCycle.reduce((a, b) => a + b, 0);
  if (W === 0) throw new PlanError("the layer windows add up to 0 layers");
  if (nLayers % W !== 0) {
    throw new PlanError(`the layer windows add up to ${W} layers per cycle, which does not divide the model's ${nLayers} layers`);
  }
  const k = nLayers / W;
  if (cycles !== undefined && cycles !== k) {
    throw new PlanError(`${cycles} cycles of ${W} layers make ${cycles * W} layers, the model has ${nLayers}`);
  }
  const perDevice = layersPerCycle.map((w, m) => {
    const offset = layersPerCycle.slice(0, m).reduce((a, b) => a + b, 0);
    const specs: WindowSpec[] = [];
    if (w > 0) for (let c = 0; c < k; c++) specs.push({ firstLayer: c * W + offset, endLayer: c * W + offset + w, cycle: c });
    return specs;
  });
  return { cycles: k, perDevice };
}

/** Splits L layers over devices as evenly as possible, for k cycles (used when nothing else decides). */
export function evenLayerWindows(nLayers: number, devices: number, cycles = 1): number[] {
  if (nLayers % cycles !== 0) throw new PlanError(`${cycles} cycles do not divide ${nLayers} layers`);
  const W = nLayers / cycles;
  if (W < devices) throw new PlanError(`${devices} devices cannot each take a layer of ${W} per cycle`);
  return Array.from({ length: devices }, (_, m) => Math.floor(W / devices) + (m < W % devices ? 1 : 0));
}
