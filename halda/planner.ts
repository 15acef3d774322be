// Halda's entry point: resolve the inputs, choose the devices (HALDA.md §4.4, selection.ts) and solve
// (exact or faithful) for them, then write the answer up as a Plan.

import { resolveDevice, type ResolvedDevice } from "./devices.js";
import { ExactSolver, tieMs } from "./exact.js";
import { solveFaithful } from "./faithful.js";
import { deviceRows, type IlpSolution } from "./ilp.js";
import { evaluateDevice, fmtGiB, predictResolved, type DeviceEvaluation } from "./latency.js";
import { bestNamedSplit, type NamedSplit } from "./named.js";
import { pricedByName } from "./named-reread.js";
import { readsAhead } from "./overlap.js";
import {
  allowedSets, conservativeFlags, deviceTerms, layersBeyondRoom, modelTerms, resolveOptions, validKs,
  type ModelTerms, type ResolvedOptions,
} from "./terms.js";
import {
  bestSubset, droppedDevice, localSelection, paperSelection, SELECTION_EXACT_MAX_DEVICES, subsetLowerBound, type Selection, type Solved,
} from "./selection.js";
import { HaldaError, type DevicePlan, type DeviceProfile, type DroppedDevice, type HaldaOptions, type ModelProfile, type Plan } from "./types.js";

/** Lowest latency; among ties (tieMs) the most head layers per token if the head has priority; then the smaller k. */
const pickBest = (sols: (IlpSolution | null)[], preferHead: boolean): IlpSolution | null => {
  let best: IlpSolution | null = null;
  for (const s of sols) {
    if (!s) continue;
    if (!best || s.latencyMs < best.latencyMs - tieMs(best.latencyMs)) best = s;
    else if (preferHead && s.latencyMs <= best.latencyMs + tieMs(best.latencyMs) && s.k * s.w[0] > best.k * best.w[0]) best = s;
  }
  return best;
};

/** The k values that decide the plan: userK; all of K with the guard (k matters); else k = 1 suffices (§2.5). */
function decidingKs(ks: readonly number[], o: ResolvedOptions): number[] {
  if (o.userK > 0 || o.prefetchGuard) return [...ks];
  return ks.includes(1) ? [1] : [...ks];
}

function solveExactly(devs: readonly ResolvedDevice[], ks: readonly number[], m: ModelTerms, o: ResolvedOptions, notes: string[]): Solved | null {
  const terms = devs.map((d, i) => deviceTerms(d, i === 0, conservativeFlags(d), m, o));
  let startSets: IlpSolution["sets"] | undefined;
  if (devs.length > 8) startSets = solveFaithful(devs, ks, m, { ...o, mode: "prima" })?.solution.sets;
  const ex = new ExactSolver(terms, m, o, ks, startSets);
  let solution = pickBest(decidingKs(ks, o).map((k) => ex.bestAt(k)), o.masterPriority > 1);
  if (!solution) return null;
  const prefetched = o.userK === 0 && !o.prefetchGuard && devs.some((d) => d.prefetches) ? bestPrefetched(devs, ex, ks, m, o) : null;
  if (prefetched && prefetched.latencyMs < solution.latencyMs - tieMs(solution.latencyMs)) {
    notes.push(`k = ${prefetched.k} under the prefetch guard: ${devs.filter((d, i) => prefetched.w[i] > 0 && readsAhead(prefetched.k, d.prefetches, prefetched.sets[i])).map((d) => d.name).join(", ")} ` +
      `read each window while the others compute (${prefetched.latencyMs.toFixed(1)} ms a token against ${solution.latencyMs.toFixed(1)} at k = ${solution.k}; HALDA.md §4.9)`);
    solution = prefetched;
  }
  return { solution, terms, atK: (k) => (k === solution!.k ? solution : ex.bestAt(k)), notes };
}

/** §4.9 [EXT]: the best plan of k > 1 under the prefetch guard, priced with its prefetching devices'
 * reads hidden (overlap.ts); its latencyMs is that price. null: none is feasible. */
function bestPrefetched(devs: readonly ResolvedDevice[], ex: ExactSolver, ks: readonly number[], m: ModelTerms, o: ResolvedOptions): IlpSolution | null {
  let best: IlpSolution | null = null;
  for (const k of ks) {
    if (k === 1) continue;
    const s = ex.bestAt(k, true);
    if (!s) continue;
    // hidden reads priced (§4.9); ringOrder numbers every input device, devs may be a subset of them
    const latencyMs = predictResolved(devs, { k, windowLayers: s.w, gpuLayers: s.n }, m, { ...o, ringOrder: undefined }).latencyMs;
    if (!best || latencyMs < best.latencyMs - tieMs(best.latencyMs)) best = { ...s, latencyMs, objectiveMs: latencyMs, prefetched: true };
  }
  return best;
}

function solveOnce(devs: readonly ResolvedDevice[], m: ModelTerms, o: ResolvedOptions): Solved | null {
  const ks = validKs(m.nLayers, devs.length, o.userK);
  if (ks.length === 0) return null;
  if (o.mode === "prima") {
    const f = solveFaithful(devs, ks, m, o);
    if (f) return { solution: f.solution, terms: f.terms, atK: (k) => f.byK.get(k) ?? null, notes: f.notes };
    const notes = ["prima: the first pass has no feasible k (prima.cpp aborts here); fell back to exact mode"];
    return solveExactly(devs, ks, m, o, notes);
  }
  return solveExactly(devs, ks, m, o, []);
}

/** A device that can hold no layer in any set it may be in can never be in a feasible plan. */
function cannotHoldALayer(d: ResolvedDevice, isHead: boolean, m: ModelTerms, o: ResolvedOptions): string | null {
  const t = deviceTerms(d, isHead, conservativeFlags(d), m, o);
  for (const set of allowedSets(t)) {
    const rows = deviceRows(t, set, 1, m, o);
    for (const n of [0, 1]) {
      if (n > rows.vramMax) continue;
      const r = 1 + rows.ramN * n;
      if ((rows.ramMax === undefined || r <= rows.ramMax) && (rows.ramMin === undefined || r >= rows.ramMin)) return null;
    }
  }
  return `cannot hold one layer (${fmtGiB(m.layerBytesWithKv)} with its KV cache; room for ${fmtGiB(Math.max(0, t.capBytes))} in RAM, ${fmtGiB(t.capGpuBytes)} on the GPU) and its disk (${(d.diskBytesPerS / 1e9).toFixed(2)} GB/s) is below the ${(o.minDiskBytesPerS / 1e9).toFixed(2)} GB/s overload threshold`;
}

/** Why no plan exists, in terms a user can act on (HALDA.md §4.3). */
function explainInfeasible(devs: readonly ResolvedDevice[], m: ModelTerms, o: ResolvedOptions): string {
  const L = m.nLayers, M = devs.length;
  if (L < M) return `the model has ${L} layers but ${M} devices are in the ring; every device needs at least one layer: remove ${M - L} device(s)`;
  if (o.userK > 0) {
    if (L % o.userK !== 0) return `k = ${o.userK} does not divide the model's ${L} layers (valid k: ${validKs(L, M, 0).join(", ")})`;
    if (L / o.userK < M) return `k = ${o.userK} leaves ${L / o.userK} layer(s) per cycle for ${M} devices; every device needs at least one (valid k: ${validKs(L, M, 0).join(", ")})`;
  }
  const terms = devs.map((d, i) => deviceTerms(d, i === 0, conservativeFlags(d), m, o));
  const bp = m.layerBytesWithKv;
  const anyOverload = terms.some((t) => t.mayOverload);
  const holdable = terms.reduce((s, t) => {
    const ram = Math.max(0, Math.floor(t.capBytes / bp + 1e-9));
    const gpu = t.dev.hasGpu ? Math.floor(t.capGpuBytes / bp + 1e-9) : 0;
    return s + (t.gpuLayersLeaveRam ? ram + gpu : ram);
  }, 0);
  const detail = terms.map((t) => `${t.dev.name}: ${fmtGiB(Math.max(0, t.capBytes))} RAM-side${t.dev.hasGpu ? ` + ${fmtGiB(t.capGpuBytes)} GPU` : ""}, disk ${(t.dev.diskBytesPerS / 1e9).toFixed(2)} GB/s`).join("; ");
  if (!anyOverload && holdable < L) {
    return `the model does not fit: ${L} layers of ${fmtGiB(bp)} (weights plus KV cache for ${m.nCtx} tokens) need ${fmtGiB(L * bp)}, the devices hold ${holdable} layers without overload, and no disk reaches the ${(o.minDiskBytesPerS / 1e9).toFixed(2)} GB/s needed to stream the rest (${detail}). Add memory or a device with a fast disk, or use a smaller model or context`;
  }
  return `no assignment satisfies every device's memory limits at k ∈ {${validKs(L, M, o.userK).join(", ")}} (${detail})`;
}

/** (MoE-3) The best split of a solution's k over its devices with each window priced by the layers it
 * names, in ring order (ring: the active devices' positions in it); null where windows are not priced by name. */
function namedSplit(devs: readonly ResolvedDevice[], active: readonly number[], solved: Solved, m: ModelTerms, o: ResolvedOptions): { ring: number[]; split: NamedSplit } | null {
  const sol = solved.solution;
  if (!pricedByName(m, o, sol.n)) return null;
  const ring = (o.ringOrder ?? devs.map((_, i) => i)).map((i) => active.indexOf(i)).filter((j) => j >= 0);
  const split = bestNamedSplit(ring.map((j) => solved.terms[j]), sol.k, m, o, ring.map((j) => sol.w[j]), tieMs);
  return split && { ring, split };
}

/** The split pricedAsPlanned found for the solution it returned: the plan built from it takes the same
 * (the shortest path is the costliest part of planning a MoE; once is enough). */
const splitOf = new WeakMap<Solved, { ring: number[]; split: NamedSplit }>();

/** A named split's figures (in ring order) by device: index j of the active devices. */
function byDevice<T>(ring: readonly number[], inRing: readonly T[]): T[] {
  const out = new Array<T>(ring.length);
  ring.forEach((j, r) => { out[j] = inRing[r]; });
  return out;
}

/** The layers a subset's windows hold beyond its devices' rooms (each window as named, MoE-3, or as the
 * ILP split them; layersBeyondRoom). */
const overRoomLayers = (m: ModelTerms) => (solved: Solved): number => {
  const sol = solved.solution, named = splitOf.get(solved);
  const w = named ? byDevice(named.ring, named.split.windows) : sol.w;
  return solved.terms.reduce((sum, t, j) => sum + layersBeyondRoom(t, sol.k, w[j], sol.n[j], m), 0);
};

/** A subset's solution priced as its plan will be (MoE-3's split where windows are priced by name), so
 * that subsets are compared by what they will run at, not by the ILP's averaged routing. */
function pricedAsPlanned(devs: readonly ResolvedDevice[], active: readonly number[], solved: Solved, m: ModelTerms, o: ResolvedOptions): Solved {
  // a plan whose reads are hidden is priced as a whole (§4.9), not as the sum of its devices
  const named = solved.solution.prefetched ? null : namedSplit(devs, active, solved, m, o);
  if (!named) return solved;
  const sol = solved.solution, latencyMs = named.split.latencyMs;
  const priced: Solved = { ...solved, solution: { ...sol, latencyMs, objectiveMs: sol.objectiveMs + (latencyMs - sol.latencyMs) } };
  splitOf.set(priced, named);
  return priced;
}

/** The ILP's windows, or (MoE-3) the best split of its k over its devices with each window priced by
 * the layers it names in ring order; each active device's windows and evaluation. */
function namedWindows(devs: readonly ResolvedDevice[], active: readonly number[], solved: Solved, m: ModelTerms, o: ResolvedOptions, notes: string[]): { w: readonly number[]; evals: DeviceEvaluation[] } {
  const sol = solved.solution;
  const ilp = () => ({ w: sol.w, evals: active.map((_, j) => evaluateDevice(solved.terms[j], sol.k, sol.w[j], sol.n[j], m, o)) });
  const named = splitOf.get(solved) ?? namedSplit(devs, active, solved, m, o);
  if (!named) return ilp();
  const { ring, split } = named;
  const w = byDevice(ring, split.windows), evals = byDevice(ring, split.evaluations);
  if (ring.some((j) => w[j] !== sol.w[j])) {
    const inRing = (ws: readonly number[]) => ring.map((j) => ws[j]).join(",");
    notes.push(`windows named by layer (MoE-3): the layers' routing differs, so [${inRing(sol.w)}] in ring order became [${inRing(w)}]`);
  }
  return { w, evals };
}

function buildPlan(planner: Plan["planner"], devs: readonly ResolvedDevice[], active: readonly number[], solved: Solved, m: ModelTerms, o: ResolvedOptions, dropped: DroppedDevice[], notes: string[]): Plan {
  const sol = solved.solution;
  const { w, evals } = namedWindows(devs, active, solved, m, o, notes);
  const devices: DevicePlan[] = active.map((di, j) => {
    const t = solved.terms[j];
    const ev = evals[j];
    return {
      index: di, name: devs[di].name, set: ev.set,
      windowLayers: w[j], gpuLayers: sol.n[j],
      layersPerToken: sol.k * w[j], gpuLayersPerToken: sol.k * sol.n[j],
      reloadBytesPerToken: ev.reloadBytesPerToken,
      ramLayerCapacityBytes: t.capBytes, gpuLayerCapacityBytes: t.capGpuBytes, layersBeyondRoom: layersBeyondRoom(t, sol.k, w[j], sol.n[j], m),
      cpuComputeBufferBytes: t.cCpuBytes, gpuComputeBufferBytes: t.cGpuBytes,
      latency: ev.latency,
    };
  });
  // a prefetched plan's token is not the sum of its devices' shares: their reads are hidden (§4.9)
  const latencyMs = sol.prefetched ? sol.latencyMs : devices.reduce((s, d) => s + d.latency.totalMs, 0);
  if (w === sol.w && Math.abs(latencyMs - sol.latencyMs) > 1e-6 * Math.max(1, latencyMs)) {
    notes.push(`the ILP's linear cost (${sol.latencyMs.toFixed(3)} ms) differs from the plan's evaluated latency (${latencyMs.toFixed(3)} ms): a device sits exactly on its memory boundary`);
  }
  let runnerUp: Plan["runnerUp"] = null;
  const others = validKs(m.nLayers, active.length, 0).filter((k) => k !== sol.k);
  for (const k of others) {
    const s = solved.atK(k);
    if (s && (!runnerUp || s.latencyMs < runnerUp.latencyMs)) runnerUp = { k, latencyMs: s.latencyMs };
  }
  return { planner, nLayers: m.nLayers, k: sol.k, devices, dropped, latencyMs, objectiveMs: sol.objectiveMs + (latencyMs - sol.latencyMs), runnerUp, problems: [], notes: [...notes, ...solved.notes] };
}

/**
 * Halda: the plan for these devices (ring order, the first is the head) and this model, with device
 * selection (options.selection; none with keepAll). Throws HaldaError on invalid input or when no plan
 * exists (the message says why).
 */
export function halda(devices: readonly DeviceProfile[], model: ModelProfile, options: HaldaOptions = {}): Plan {
  const o = resolveOptions(options);
  const m = modelTerms(model, o);
  if (devices.length === 0) throw new HaldaError("no devices to plan for", "invalid-input");
  const devs = devices.map((d, i) => resolveDevice(d, i));
  if (o.ringOrder && o.ringOrder.length !== devs.length) throw new HaldaError(`ringOrder lists ${o.ringOrder.length} devices, there are ${devs.length}`, "invalid-input");
  const names = devs.map((d) => d.name);
  const L = m.nLayers;
  if (o.userK > 0 && L % o.userK !== 0) throw new HaldaError(explainInfeasible(devs, m, o), "invalid-input");
  const selecting = !o.keepAll && o.dropWindowLayers > 0;

  // [EXT] A device that cannot hold one layer and may not overload makes every plan infeasible: drop it
  // up front (the head cannot be dropped, and with keepAll nothing may be: that is an error).
  const headProblem = cannotHoldALayer(devs[0], true, m, o);
  if (headProblem) throw new HaldaError(`the head ${devs[0].name} ${headProblem}`, "infeasible");
  const cannot = new Map<number, string>();
  for (let i = 1; i < devs.length; i++) {
    const why = cannotHoldALayer(devs[i], false, m, o);
    if (!why) continue;
    if (!selecting) throw new HaldaError(`${devs[i].name} ${why}; every device must take part (keepAll), so there is no plan`, "infeasible");
    cannot.set(i, why);
  }
  const candidates = devs.map((_, i) => i).filter((i) => !cannot.has(i));
  const noPlan = () => new HaldaError(explainInfeasible(candidates.map((i) => devs[i]), m, o), "infeasible");

  if (o.userK > 0 && L / o.userK < candidates.length) throw new HaldaError(explainInfeasible(candidates.map((i) => devs[i]), m, o), "invalid-input");
  const solve = (idx: readonly number[]) => {
    const solved = idx.length <= L ? solveOnce(idx.map((i) => devs[i]), m, o) : null;
    return solved && pricedAsPlanned(devs, idx, solved, m, o);
  };
  let sel: Selection;
  if (selecting && o.selection === "best" && candidates.length <= SELECTION_EXACT_MAX_DEVICES) {
    // The bound must hold for every plan the mode may return: exact mode's buffers are the conservative
    // ones; faithful mode's depend on the plan, so there the bound assumes none (the most room).
    const boundDevs = o.mode === "exact" ? devs : devs.map((d) => ({ ...d, cpuComputeBufferBytes: 0, gpuComputeBufferBytes: 0 }));
    const terms = boundDevs.map((d, i) => deviceTerms(d, i === 0, conservativeFlags(d), m, o));
    sel = bestSubset(candidates, names, solve, subsetLowerBound(terms, m, o.overloadReload), { margin: o.overRoomMargin, layers: overRoomLayers(m) }) ?? (() => { throw noPlan(); })();
  } else {
    const all = solve(candidates);
    if (!all) throw noPlan();
    sel = !selecting ? { active: candidates, solved: all, dropped: [], notes: [] }
      : o.selection === "best" ? localSelection(candidates, all, names, solve, o)
      : paperSelection(candidates, all, names, solve, o);
  }
  const withoutMs = sel.solved.solution.latencyMs;
  const dropped: DroppedDevice[] = [...[...cannot].map(([i, why]) => droppedDevice(i, names[i], why, null, withoutMs, "can hold it")), ...sel.dropped];
  dropped.sort((a, b) => a.index - b.index);
  return buildPlan(o.mode === "prima" ? "halda-prima" : "halda", devs, sel.active, sel.solved, m, o, dropped, sel.notes);
}

/** Halda with the best-subset device selection whatever the mode (HALDA.md §4.4). */
export function selectDevices(devices: readonly DeviceProfile[], model: ModelProfile, options: HaldaOptions = {}): Plan {
  return halda(devices, model, { ...options, selection: "best" });
}
