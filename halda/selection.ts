// Device selection (HALDA.md §4.4): which devices take part. "best" searches every subset that keeps
// the head (up to SELECTION_EXACT_MAX_DEVICES devices), best-first by a lower bound on each subset's
// latency so that most subsets are never planned; beyond that bound, prima.cpp's loop followed by
// single-device add/drop moves. "paper" is prima.cpp's loop: drop every non-head device left with a
// window of at most `dropWindowLayers` layers, and plan again, until none is.
// Every dropped device is reported with its own figures: the predicted latency with it and without it.

import { tieMs } from "./exact.js";
import type { IlpSolution } from "./ilp.js";
import { overloadSlopeBytes, type DeviceTerms, type ModelTerms, type ResolvedOptions } from "./terms.js";
import type { DroppedDevice, OverloadReload } from "./types.js";

/** Up to this many devices (head included) every subset is considered: 2^(M−1) subsets. */
export const SELECTION_EXACT_MAX_DEVICES = 10;

/** A solved device list: the solution at the chosen k, its terms, and a way to get the other k. */
export interface Solved {
  readonly solution: IlpSolution;
  readonly terms: readonly DeviceTerms[];
  readonly atK: (k: number) => IlpSolution | null;
  readonly notes: string[];
}

/** Plans a subset (indices into the full device list, the head first); null when it has no feasible plan. */
export type SolveSubset = (subset: readonly number[]) => Solved | null;

export interface Selection {
  readonly active: number[];
  readonly solved: Solved;
  readonly dropped: DroppedDevice[];
  readonly notes: string[];
}

const latency = (s: Solved) => s.solution.latencyMs;
const headLayers = (s: Solved) => s.solution.k * s.solution.w[0];
const ms = (x: number) => x.toFixed(x >= 100 ? 0 : 2);

/** Lower latency; on a tie (tieMs) fewer devices, then more head layers per token. */
function better(a: Solved, aSize: number, b: Solved | undefined, bSize: number): boolean {
  if (!b) return true;
  const la = latency(a), lb = latency(b);
  if (Math.abs(la - lb) > tieMs(lb)) return la < lb;
  return aSize !== bSize ? aSize < bSize : headLayers(a) > headLayers(b);
}

/** A dropped device with its own figures; `withMs` null: no feasible plan has it. */
export function droppedDevice(index: number, name: string, why: string, withMs: number | null, withoutMs: number, withWhat: string): DroppedDevice {
  const figures = withMs === null
    ? `no feasible plan ${withWhat}; ${ms(withoutMs)} ms per token without it`
    : `predicted ${ms(withMs)} ms per token with it (${withWhat}), ${ms(withoutMs)} ms without it`;
  return { index, name, reason: `${why}; ${figures}`, latencyWithMs: withMs, latencyWithoutMs: withoutMs };
}

// ---- a lower bound on a subset's latency ---------------------------------------------------------

interface Slot {
  readonly costMs: number;
  readonly layers: number;
}

/**
 * What one layer per token can cost on this device at best, as slots sorted by cost: GPU layers (up to
 * its VRAM), layers that fit in RAM, and (when its disk may overload) layers beyond RAM, which also pay
 * their reload from disk. Any plan's cost on the device is at least its cheapest slots for the layers
 * it holds, plus the fixed costs; on Metal the reload cliff is left out (still a bound).
 */
function slots(t: DeviceTerms, m: ModelTerms, reload: OverloadReload): Slot[] {
  const bp = m.layerBytesWithKv;
  const alpha = t.alphaMs, gpu = t.alphaMs + t.betaMs;
  const vram = t.dev.hasGpu ? Math.max(0, t.capGpuBytes / bp) : 0;
  const ram = Math.max(0, t.capBytes / bp);
  const out: Slot[] = [];
  if (t.dev.isMetal) {
    // GPU layers stay in RAM-side (shared) memory: they count against the same room.
    const total = t.mayOverload ? Infinity : ram;
    const onGpu = t.betaMs < 0 ? Math.min(vram, total) : 0;
    out.push({ costMs: gpu, layers: onGpu }, { costMs: alpha, layers: total - onGpu });
  } else {
    if (t.gpuLayersLeaveRam) out.push({ costMs: gpu, layers: vram });
    out.push({ costMs: alpha, layers: ram });
    // "window": an overloaded device rereads all its l layers' weights, l·b ≥ (l − ram)·b: still a bound.
    // "stream" rereads a layer and a margin more than "excess" once overloaded: leaving that out is still a bound.
    // A mixture of experts under "excess": its reread is convex in the layers, so its slope right past
    // the room (k·p̄_min·b' a layer) bounds every later layer's.
    if (t.mayOverload) out.push({ costMs: alpha + overloadSlopeBytes(m, reload) * t.deltaMsPerByte, layers: Infinity });
  }
  return out.filter((s) => s.layers > 0).sort((a, b) => a.costMs - b.costMs);
}

/** Cost of the cheapest `layers` of these sorted slots, and the slots left; null if they hold fewer. */
function take(sorted: readonly Slot[], layers: number): { costMs: number; rest: Slot[] } | null {
  let left = layers, costMs = 0;
  const rest: Slot[] = [];
  for (const s of sorted) {
    const used = Math.min(left, s.layers);
    costMs += used * s.costMs;
    left -= used;
    if (s.layers > used) rest.push({ costMs: s.costMs, layers: s.layers - used });
  }
  return left > 1e-9 ? null : { costMs, rest };
}

/**
 * For each device (terms of the whole list, the head first), a function giving a lower bound on the
 * latency of any valid plan of a subset at any k: every device holds at least one layer, the L layers
 * go to the cheapest slots, and each device pays its fixed costs (the head's output layer, one ξ).
 * Infinity when the subset cannot hold the model without overloading a slow disk or a GPU.
 */
export function subsetLowerBound(terms: readonly DeviceTerms[], m: ModelTerms, reload: OverloadReload = "excess"): (subset: readonly number[]) => number {
  const perDevice = terms.map((t) => ({ slots: slots(t, m, reload), fixedMs: t.xiMs + t.headComputeMs + t.headReadMs }));
  return (subset) => {
    let total = 0;
    const pool: Slot[] = [];
    for (const i of subset) {
      const first = take(perDevice[i].slots, 1);
      if (!first) return Infinity;
      total += perDevice[i].fixedMs + first.costMs;
      pool.push(...first.rest);
    }
    const rest = take(pool.sort((a, b) => a.costMs - b.costMs), m.nLayers - subset.length);
    return rest ? total + rest.costMs : Infinity;
  };
}

// ---- the best subset -----------------------------------------------------------------------------

/** What best-subset selection weighs beside latency: the margin (ResolvedOptions.overRoomMargin) and the
 * bytes a subset's windows hold beyond its devices' rooms, counted in layers. */
export interface OverRoom {
  readonly margin: number;
  readonly layers: (s: Solved) => number;
}

/**
 * The subset of `candidates` (the head first) with the least predicted latency, over every subset that
 * keeps the head, or with `overRoom`, of the subsets priced within its margin of that, the one holding
 * the fewest layers beyond its devices' rooms (docs/HALDA.md §4.4); each dropped device carries the
 * best latency of any subset that has it. Subsets are planned in order of their lower bound and the
 * search stops where the bound passes what can still win, so the answer is that of planning them all.
 * Null when no subset has a feasible plan.
 */
export function bestSubset(candidates: readonly number[], names: readonly string[], solve: SolveSubset, lowerBound: (subset: readonly number[]) => number,
  overRoom?: OverRoom): Selection | null {
  const others = candidates.slice(1);
  const subsets = Array.from({ length: 2 ** others.length }, (_, mask) => {
    const subset = [candidates[0], ...others.filter((_, j) => (mask & (1 << j)) !== 0)];
    return { mask, subset, bound: lowerBound(subset) };
  }).filter((s) => s.bound < Infinity).sort((a, b) => a.bound - b.bound);
  const cache = new Map<number, Solved | null>();
  const planOf = (s: (typeof subsets)[number]) => {
    if (!cache.has(s.mask)) cache.set(s.mask, solve(s.subset));
    return cache.get(s.mask)!;
  };
  /** The best over the subsets that `admit`, planning only those whose bound can still win. */
  const search = (admit: (mask: number) => boolean) => {
    let best: { s: (typeof subsets)[number]; solved: Solved } | undefined;
    for (const s of subsets) {
      if (!admit(s.mask)) continue;
      if (best && s.bound > latency(best.solved) + tieMs(latency(best.solved))) break;
      const solved = planOf(s);
      if (solved && better(solved, s.subset.length, best?.solved, best?.s.subset.length ?? 0)) best = { s, solved };
    }
    return best;
  };
  const fastest = search(() => true);
  if (!fastest) return null;
  const notes: string[] = [];
  // Second stage: within the margin of the fastest price, the fewest layers beyond the rooms, then as
  // before (a key per subset, so the choice does not depend on the order subsets are planned in).
  let best = fastest;
  if (overRoom && overRoom.margin > 0) {
    const reach = latency(fastest.solved) * (1 + overRoom.margin);
    let bestLayers = overRoom.layers(fastest.solved);
    for (const s of subsets) {
      if (s.bound > reach) break;
      const solved = planOf(s);
      if (!solved || latency(solved) > reach) continue;
      const layers = overRoom.layers(solved);
      if (layers < bestLayers || (layers === bestLayers && better(solved, s.subset.length, best.solved, best.s.subset.length))) {
        best = { s, solved };
        bestLayers = layers;
      }
    }
    if (best !== fastest) {
      const list = (x: typeof best) => `[${x.s.subset.map((i) => names[i]).join(", ")}]`;
      notes.push(`selection: ${list(best)} (${ms(latency(best.solved))} ms, ${bestLayers} layer(s) beyond the devices' rooms) rather than the fastest-priced ${list(fastest)} (${ms(latency(fastest.solved))} ms, ${overRoom.layers(fastest.solved)} beyond): within ${Math.round(overRoom.margin * 100)}%, where a window past its room runs slower than priced`);
    }
  }
  const without = latency(best.solved);
  const dropped: DroppedDevice[] = [];
  others.forEach((index, j) => {
    if ((best.s.mask & (1 << j)) !== 0) return;
    const withIt = search((mask) => (mask & (1 << j)) !== 0);
    const withMs = withIt ? latency(withIt.solved) : null;
    const why = withMs === null || withMs > without + tieMs(without) ? "the ring is faster without it"
      : withMs >= without - tieMs(without) ? "as fast without it, with one device fewer"
      : "priced faster with it, but its plans hold more layers beyond the devices' rooms";
    dropped.push(droppedDevice(index, names[index], why, withMs, without, withIt ? `its best plan, window of ${withIt.solved.solution.w[withIt.s.subset.indexOf(index)]}` : "includes it"));
  });
  notes.unshift(`selection: best of ${2 ** others.length} device subsets that keep the head (${cache.size} planned, the rest bounded out)`);
  return { active: best.s.subset, solved: best.solved, dropped, notes };
}

// ---- prima.cpp's loop, and single-device moves ---------------------------------------------------

/**
 * prima.cpp's rule (HALDA.md §4.4): drop every non-head device left with a window of at most
 * `dropWindowLayers`, plan again, repeat. With `dropOnlyIfFaster` a batch is dropped only when the ring
 * without it is predicted faster.
 */
export function paperSelection(all: readonly number[], allSolved: Solved, names: readonly string[], solve: SolveSubset, o: ResolvedOptions): Selection {
  let active = [...all];
  let solved = allSolved;
  const notes: string[] = [];
  const why = new Map<number, string>();
  for (;;) {
    const drop = active.filter((_, j) => j > 0 && solved.solution.w[j] <= o.dropWindowLayers);
    if (drop.length === 0) break;
    const list = drop.map((i) => names[i]).join(", ");
    const rest = active.filter((i) => !drop.includes(i));
    const next = solve(rest);
    if (!next) {
      notes.push(`selection: kept ${list} (window of ${o.dropWindowLayers} layer or less): no feasible plan without them`);
      break;
    }
    if (o.dropOnlyIfFaster && latency(next) >= latency(solved)) {
      notes.push(`selection: kept ${list}: the ring without them predicts ${ms(latency(next))} ms, not faster than ${ms(latency(solved))} ms`);
      break;
    }
    for (const i of drop) {
      const j = active.indexOf(i);
      why.set(i, `left with a window of ${solved.solution.w[j]} layer(s) (${solved.solution.n[j]} on GPU)`);
    }
    active = rest;
    solved = next;
  }
  return { active, solved, dropped: addedBack(active, solved, why, names, solve), notes };
}

/** Each device of `why` reported against the final ring: that ring's latency with the device added back. */
function addedBack(active: readonly number[], solved: Solved, why: ReadonlyMap<number, string>, names: readonly string[], solve: SolveSubset): DroppedDevice[] {
  return [...why].map(([index, reason]) => {
    const withIt = solve([...active, index].sort((a, b) => a - b));
    return droppedDevice(index, names[index], reason, withIt ? latency(withIt) : null, latency(solved), "added back to this ring");
  });
}

/**
 * Beyond SELECTION_EXACT_MAX_DEVICES: prima.cpp's loop (dropping a batch only when faster), then the
 * single-device move (add one dropped device back, or drop one more) that lowers the latency most,
 * until none does. A local optimum over subsets, not the best subset.
 */
export function localSelection(all: readonly number[], allSolved: Solved, names: readonly string[], solve: SolveSubset, o: ResolvedOptions): Selection {
  const start = paperSelection(all, allSolved, names, solve, { ...o, dropOnlyIfFaster: true });
  let active = start.active;
  let solved = start.solved;
  for (;;) {
    let move: { active: number[]; solved: Solved } | undefined;
    for (const i of all.slice(1)) {
      const next = active.includes(i) ? active.filter((x) => x !== i) : [...active, i].sort((a, b) => a - b);
      const s = solve(next);
      if (s && latency(s) < latency(move?.solved ?? solved) - tieMs(latency(solved))) move = { active: next, solved: s };
    }
    if (!move) break;
    active = move.active;
    solved = move.solved;
  }
  const why = new Map<number, string>();
  for (const i of all) if (!active.includes(i)) why.set(i, "the ring is faster without it (no single device added back or dropped helps)");
  const notes = [...start.notes, `selection: ${all.length} devices, more than ${SELECTION_EXACT_MAX_DEVICES}: prima.cpp's rule, then single-device moves (a local optimum, not every subset)`];
  return { active, solved, dropped: addedBack(active, solved, why, names, solve), notes };
}
