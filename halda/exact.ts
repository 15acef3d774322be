// Exact mode (HALDA.md §4.5): each device is either in M4 or in its OS's overload set, so the model is
// a minimum over at most 2^M set assignments of one ILP each. The minimum over all of them, κ included,
// is the global optimum of the latency model: no local-optimum trap, no calibration, no rollback.
//
// The objective is the latency itself (masterPriority 1); the head's priority is a secondary key
// (HALDA.md §3): among the optima within TIE of each other, a second solve per tied assignment takes
// the plan that gives the head the most layers.
//
// Speed: every k > 1 plan maps to a k = 1 plan of the same sets with the same cost minus (k−1)·Σξ
// (HALDA.md §2.5), so the k = 1 optimum of an assignment bounds it from below at every k. Other k
// are searched in order of that bound and stop as soon as the bound cannot beat the best found.

import { solveIlp, type IlpSolution } from "./ilp.js";
import { allowedSets, type DeviceTerms, type ModelTerms, type ResolvedOptions } from "./terms.js";
import type { DeviceSet } from "./types.js";

/** Up to this many devices every assignment is enumerated; above, a local search over sets. */
export const EXACT_ENUMERATION_MAX_DEVICES = 8;

/** Latencies this close (relative) are equal: the head's priority decides between them. */
export const tieMs = (latencyMs: number) => 1e-9 * Math.max(1, Math.abs(latencyMs));

const better = (a: IlpSolution, b: IlpSolution | null | undefined) => !b || a.latencyMs < b.latencyMs - tieMs(b.latencyMs);

function* assignments(options: readonly DeviceSet[][]): Generator<DeviceSet[]> {
  const idx = options.map(() => 0);
  for (;;) {
    yield idx.map((j, i) => options[i][j]);
    let i = 0;
    while (i < idx.length && ++idx[i] === options[i].length) idx[i++] = 0;
    if (i === idx.length) return;
  }
}

/**
 * The exact optimum at any k, for one device list. Phase 1 (lazy, once) solves every set assignment at
 * k = 1 without the guard; `bestAt(k)` then searches assignments in order of that lower bound.
 * With more than 8 devices the assignments are replaced by a local search from `startSets`.
 */
export class ExactSolver {
  private base: { sets: DeviceSet[]; sol: IlpSolution }[] | null = null;
  private readonly cache = new Map<string, IlpSolution | null>();
  private readonly xiSum: number;
  /** The options the ILPs see: no priority factor (it is the secondary key here). */
  private readonly o: ResolvedOptions;
  private readonly preferHead: boolean;

  constructor(
    private readonly terms: readonly DeviceTerms[],
    private readonly m: ModelTerms,
    options: ResolvedOptions,
    private readonly searchKs: readonly number[],
    private readonly startSets?: readonly DeviceSet[],
  ) {
    this.xiSum = terms.reduce((s, t) => s + t.xiMs, 0);
    this.o = { ...options, masterPriority: 1 };
    this.preferHead = options.masterPriority > 1;
  }

  private solve(sets: readonly DeviceSet[], k: number, guard: boolean, maxLatencyMs?: number): IlpSolution | null {
    return solveIlp(this.terms, sets, k, this.m, guard === this.o.prefetchGuard ? this.o : { ...this.o, prefetchGuard: guard }, maxLatencyMs);
  }

  private phase1(): { sets: DeviceSet[]; sol: IlpSolution }[] {
    if (this.base) return this.base;
    const options = this.terms.map(allowedSets);
    const candidates = this.terms.length <= EXACT_ENUMERATION_MAX_DEVICES
      ? [...assignments(options)]
      : [localSearch(this.terms, options, this.searchKs, this.startSets, (s, k) => this.solve(s, k, this.o.prefetchGuard))];
    const base: { sets: DeviceSet[]; sol: IlpSolution }[] = [];
    for (const sets of candidates) {
      const sol = this.solve(sets, 1, false);
      if (sol) base.push({ sets, sol });
    }
    base.sort((a, b) => a.sol.latencyMs - b.sol.latencyMs);
    this.base = base;
    return base;
  }

  /** The best solution at k over all set assignments (latency, then the head's window); null when none is
   * feasible. `guard`: with the prefetch guard or without (default: the options'); phase 1 is shared. */
  bestAt(k: number, guard = this.o.prefetchGuard): IlpSolution | null {
    const key = `${k}|${guard}`;
    const hit = this.cache.get(key);
    if (hit !== undefined) return hit;
    let best: IlpSolution | null = null;
    const found: IlpSolution[] = [];
    for (const { sets, sol } of this.phase1()) {
      const lowerBound = sol.latencyMs + (k - 1) * this.xiSum;
      if (best && lowerBound > best.latencyMs + tieMs(best.latencyMs)) break; // ties are still collected
      const s = k === 1 && !guard ? sol : this.solve(sets, k, guard);
      if (!s) continue;
      found.push(s);
      if (!best || s.latencyMs < best.latencyMs) best = s;
    }
    if (best && this.preferHead) {
      const cap = best.latencyMs + tieMs(best.latencyMs);
      const most = this.m.nLayers / k - (this.terms.length - 1); // every other device keeps a layer
      for (const s of found) {
        if (s.latencyMs > cap || best.w[0] >= most) continue;
        const t = this.solve(s.sets, k, guard, cap) ?? s;
        if (t.w[0] > best.w[0] || (t.w[0] === best.w[0] && t.latencyMs < best.latencyMs)) best = t;
      }
    }
    this.cache.set(key, best);
    return best;
  }
}

/** M > 8: start from `start` (or all-M4, or all overloadable devices overloaded) and flip one device at a time while it helps. */
function localSearch(terms: readonly DeviceTerms[], options: readonly DeviceSet[][], ks: readonly number[], start: readonly DeviceSet[] | undefined, solve: (s: readonly DeviceSet[], k: number) => IlpSolution | null): DeviceSet[] {
  const value = (sets: readonly DeviceSet[]) => {
    let best: IlpSolution | null = null;
    for (const k of ks) {
      const s = solve(sets, k);
      if (s && better(s, best)) best = s;
    }
    return best;
  };
  const starts: DeviceSet[][] = [];
  if (start) starts.push([...start]);
  starts.push(terms.map(() => "M4"), options.map((o) => o[o.length - 1]));
  let cur: DeviceSet[] = starts[0];
  let curVal: IlpSolution | null = null;
  for (const s of starts) {
    const v = value(s);
    if (v && better(v, curVal)) { cur = s; curVal = v; }
  }
  if (!curVal) return cur;
  for (let improved = true; improved;) {
    improved = false;
    for (let i = 0; i < terms.length && !improved; i++) {
      for (const alt of options[i]) {
        if (alt === cur[i]) continue;
        const next = [...cur];
        next[i] = alt;
        const v = value(next);
        if (v && better(v, curVal)) { cur = next; curVal = v; improved = true; break; }
      }
    }
  }
  return cur;
}
