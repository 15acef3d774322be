// Faithful mode (HALDA.md §4.1–4.3): the paper's Algorithm 1 as prima.cpp runs it. Sets come from the
// previous iterate, the ILP is solved for every k, calibration may force a device into M4, and a pass
// with no feasible k rolls back. Kept to compare with exact mode and to reproduce prima.cpp's plans.

import type { ResolvedDevice } from "./devices.js";
import { solveIlp, type IlpSolution } from "./ilp.js";
import { deviceTerms, flagsFromPlan, type DeviceTerms, type ModelTerms, type ResolvedOptions } from "./terms.js";
import type { DeviceSet } from "./types.js";

export interface FaithfulResult {
  readonly solution: IlpSolution;
  /** The terms (compute buffers included) the final solution's ILP was built with. */
  readonly terms: readonly DeviceTerms[];
  /** Best solution per k in the pass that produced the final solution. */
  readonly byK: ReadonlyMap<number, IlpSolution | null>;
  readonly notes: string[];
}

/** prima.cpp's C `round`: halves away from zero. */
function roundHalfAway(x: number): number {
  return Math.sign(x) * Math.round(Math.abs(x));
}

/** Step 2: windows proportional to the memory budgets, at least one each, summing to L. */
export function initialWindows(budgets: readonly number[], L: number): number[] {
  const total = budgets.reduce((s, b) => s + b, 0);
  const w = budgets.map((b) => (total > 0 ? roundHalfAway((L * b) / total) : Math.floor(L / budgets.length)));
  for (let i = 0; i < w.length; i++) {
    if (w[i] > 0) continue;
    w[i] = 1;
    let big = 0;
    for (let j = 1; j < w.length; j++) if (w[j] > w[big]) big = j;
    if (w[big] > 1) w[big]--;
  }
  const diff = L - w.reduce((s, x) => s + x, 0);
  if (diff !== 0) {
    let pick = 0;
    for (let j = 1; j < budgets.length; j++) if (diff > 0 ? budgets[j] > budgets[pick] : budgets[j] < budgets[pick]) pick = j;
    w[pick] += diff;
    // [EXT] prima.cpp can leave the smallest device at 0 here; take the rest from the largest instead.
    while (w[pick] < 1) {
      let big = 0;
      for (let j = 1; j < w.length; j++) if (w[j] > w[big]) big = j;
      if (w[big] <= 1) break;
      w[big]--;
      w[pick]++;
    }
  }
  return w;
}

export function memoryBudget(d: ResolvedDevice): number {
  return d.isMetal ? d.gpuFreeBytes : d.os === "android" ? d.ramAvailableBytes + d.swappableBytes : d.ramAvailableBytes;
}

/** §2.2 on a given iterate: l = k·w, g = k·n. */
export function classify(terms: readonly DeviceTerms[], k: number, w: readonly number[], n: readonly number[], m: ModelTerms, forcedM4: readonly boolean[]): DeviceSet[] {
  return terms.map((t, i) => {
    if (forcedM4[i] || !t.mayOverload) return "M4";
    const l = k * w[i], g = k * n[i];
    const r = t.gpuLayersLeaveRam ? l - g : l;
    return r * m.layerBytesWithKv > t.capBytes ? t.overloadSet : "M4";
  });
}

export interface Calibration {
  readonly weak: boolean;
  readonly freeGpu: boolean;
  readonly gpuOverload: boolean;
  readonly cpuOverload: boolean;
  readonly fires: boolean;
  /** The device to force into M4: not in M4, slowest disk, lowest index on ties. */
  readonly device: number | undefined;
}

/** §4.2, on the best solution of a pass. */
export function calibrationCheck(terms: readonly DeviceTerms[], sets: readonly DeviceSet[], best: IlpSolution, m: ModelTerms): Calibration {
  const bp = m.layerBytesWithKv;
  const weak = best.w.some((w, i) => w === 1 && best.n[i] === 0);
  const freeGpu = terms.some((t, i) => t.dev.hasGpu && best.n[i] < Math.floor(t.capGpuBytes / (best.k * bp) + 1e-9));
  const gpuOverload = terms.some((t, i) => t.dev.hasGpu && best.w[i] > best.n[i]);
  const cpuOverload = terms.some((t, i) => !t.dev.hasGpu && sets[i] !== "M4");
  const fires = !weak && freeGpu && (gpuOverload || cpuOverload);
  let device: number | undefined;
  if (fires) {
    for (let i = 0; i < terms.length; i++) {
      if (sets[i] === "M4") continue;
      if (device === undefined || terms[i].dev.diskBytesPerS < terms[device].dev.diskBytesPerS) device = i;
    }
  }
  return { weak, freeGpu, gpuOverload, cpuOverload, fires, device };
}

const sameSets = (a: readonly DeviceSet[], b: readonly DeviceSet[]) => a.every((s, i) => s === b[i]);
const sameSolution = (a: IlpSolution, b: IlpSolution) => a.k === b.k && a.w.every((x, i) => x === b.w[i]) && a.n.every((x, i) => x === b.n[i]);

/** Runs Algorithm 1; null when the first pass has no feasible k (prima.cpp aborts; the caller falls back to exact mode). */
export function solveFaithful(devs: readonly ResolvedDevice[], ks: readonly number[], m: ModelTerms, o: ResolvedOptions): FaithfulResult | null {
  const L = m.nLayers;
  const notes: string[] = [];
  let w = initialWindows(devs.map(memoryBudget), L);
  let n = devs.map((d, i) => (d.hasGpu ? w[i] : 0)); // HEAD starts GPU devices full; the paper starts at 0
  notes.push(`prima: initial windows [${w.join(", ")}] from memory budgets`);
  const forced = devs.map(() => false);
  let prevSets: DeviceSet[] | null = null;
  type Accepted = { sol: IlpSolution; terms: DeviceTerms[]; byK: Map<number, IlpSolution | null> };
  let final: Accepted | null = null;
  let rollback: Accepted | null = null;
  for (let pass = 1; pass <= 64; pass++) {
    const W = w.reduce((s, x) => s + x, 0);
    if (W < 1 || L % W !== 0) {
      notes.push(`prima: pass ${pass}: windows sum to ${W}, not a divisor of ${L}; stopping`);
      break;
    }
    const kcur = L / W;
    const terms = devs.map((d, i) => deviceTerms(d, i === 0, flagsFromPlan(w[i], n[i]), m, o));
    const sets = classify(terms, kcur, w, n, m, forced);
    if (prevSets && sameSets(sets, prevSets)) break;
    prevSets = sets;
    const byK = new Map<number, IlpSolution | null>();
    let best: IlpSolution | null = null;
    for (const k of ks) {
      const s = solveIlp(terms, sets, k, m, o);
      byK.set(k, s);
      if (s && (!best || s.objectiveMs < best.objectiveMs)) best = s;
    }
    notes.push(`prima: pass ${pass}: sets [${sets.join(", ")}] -> ${best ? `k=${best.k} w=[${best.w.join(", ")}] n=[${best.n.join(", ")}] ${best.latencyMs.toFixed(1)} ms` : "no feasible k"}`);
    if (!best) {
      if (rollback) { final = rollback; notes.push(`prima: rolled back to the previous pass`); }
      break;
    }
    rollback = { sol: best, terms, byK };
    const cal = calibrationCheck(terms, sets, best, m);
    if (cal.fires && cal.device !== undefined) {
      forced[cal.device] = true;
      notes.push(`prima: calibration: GPU memory left free while others overload; ${devs[cal.device].name} (slowest disk) forced into M4`);
      continue; // redo the pass with the previous w, n
    }
    w = [...best.w];
    n = [...best.n];
    if (final && sameSolution(best, final.sol)) break;
    final = { sol: best, terms, byK };
  }
  if (!final) return null;
  return { solution: final.sol, terms: final.terms, byK: final.byK, notes };
}
