// MoE-3 (docs/HALDA.md): a mixture of experts' windows priced by the layers they name. Halda's ILP
// counts interchangeable layers with one averaged routing skew; measured layers differ (a model's first
// layers often route over nearly every expert, later ones over a few), so which layers a device holds
// decides what it rereads. Given the ILP's k and devices, the windows are split again in ring order by
// a shortest path over (device, first layer) with each window priced by its own layers' shares: the
// exact best split for those devices and k under MoE-1 taken layer by layer.
import { evaluateNamed, type DeviceEvaluation } from "./latency.js";
import { namedLayers, windowRates, type WindowRates } from "./named-reread.js";
import { layersBeyondRoom, type DeviceTerms, type ModelTerms, type ResolvedOptions } from "./terms.js";

export interface NamedSplit {
  /** Layers per cycle, per device in the order given (ring order). */
  readonly windows: number[];
  readonly evaluations: DeviceEvaluation[];
  readonly latencyMs: number;
}

/**
 * The best split of k cycles' layers over these devices (ring order; each takes at least one layer a
 * cycle) with every window priced by name; `prefer` (the ILP's split, in ring order) where it is
 * within `tieMs` of the best. A device whose window has a problem (it may not overload, say) cannot take it.
 * Of the splits priced within o.overRoomMargin of the best, the one with the fewest layers beyond the
 * devices' rooms (layersBeyondRoom), as best-subset selection weighs subsets (HALDA.md §4.4): a shortest
 * path per count of such layers. Null when no split is free of problems.
 */
export function bestNamedSplit(terms: readonly DeviceTerms[], k: number, m: ModelTerms, o: ResolvedOptions, prefer: readonly number[], tieMs: (ms: number) => number): NamedSplit | null {
  const A = terms.length, W = m.nLayers / k;
  const mt = m.moe!;
  // Each window's experts' rates, made once per (first layer, width): every device prices the same windows.
  const rates = new Map<number, WindowRates>();
  const ratesOf = (offset: number, w: number) => {
    const key = offset * (W + 1) + w;
    let p = rates.get(key);
    if (!p) rates.set(key, (p = windowRates(mt, namedLayers(k, W, offset, w))));
    return p;
  };
  const cost = (a: number, offset: number, w: number): number => {
    const ev = evaluateNamed(terms[a], k, w, offset, m, o, ratesOf(offset, w));
    return ev.problems.length ? Infinity : ev.latency.totalMs;
  };
  // best[a][x][r]: least latency of devices 0..a-1 covering the cycle's first x layers with r layers beyond
  // their rooms; reach[a][x]: the largest r met. r is at most each device's count at its widest window
  // (none where every device has room: the tables stay the plain path's size).
  const R = 1 + terms.reduce((sum, t) => sum + layersBeyondRoom(t, k, W - (A - 1), 0, m), 0), at = (x: number, r: number) => x * R + r;
  const best = Array.from({ length: A + 1 }, () => new Float64Array((W + 1) * R).fill(Infinity));
  const from = Array.from({ length: A + 1 }, () => new Int32Array((W + 1) * R).fill(-1));
  const reach = Array.from({ length: A + 1 }, () => new Int32Array(W + 1).fill(-1));
  best[0][at(0, 0)] = 0;
  reach[0][0] = 0;
  for (let a = 0; a < A; a++) {
    for (let x = a; x <= W - (A - a); x++) {
      for (let w = 1; x + w <= W - (A - a - 1); w++) {
        let c0 = NaN;
        const beyond = layersBeyondRoom(terms[a], k, w, 0, m);
        for (let r = 0; r <= reach[a][x]; r++) {
          if (best[a][at(x, r)] === Infinity) continue;
          if (Number.isNaN(c0)) c0 = cost(a, x, w);
          const c = best[a][at(x, r)] + c0, y = at(x + w, r + beyond);
          if (c < best[a + 1][y]) { best[a + 1][y] = c; from[a + 1][y] = at(x, r); }
          reach[a + 1][x + w] = Math.max(reach[a + 1][x + w], r + beyond);
        }
      }
    }
  }
  const least = Math.min(...best[A].subarray(at(W, 0), at(W, R)));
  if (least === Infinity) return null;
  // the fewest layers beyond the rooms among the splits within the margin (with none, the least latency)
  let rBest = 0;
  while (!(best[A][at(W, rBest)] <= least * (1 + o.overRoomMargin))) rBest++;
  let windows: number[] = [];
  for (let a = A, s = at(W, rBest); a > 0; a--) { const p = from[a][s]; windows.unshift(Math.floor(s / R) - Math.floor(p / R)); s = p; }
  const evaluate = (ws: readonly number[]) => {
    let offset = 0;
    const evs = ws.map((w, a) => { const ev = evaluateNamed(terms[a], k, w, offset, m, o, ratesOf(offset, w)); offset += w; return ev; });
    return { evs, ms: evs.reduce((s, e) => s + e.latency.totalMs, 0), ok: evs.every((e) => e.problems.length === 0) };
  };
  let chosen = evaluate(windows);
  const kept = evaluate(prefer); // the ILP's split: one of the DP's, so never below the least
  const beyondOf = (ws: readonly number[]) => ws.reduce((sum, w, a) => sum + layersBeyondRoom(terms[a], k, w, 0, m), 0);
  if (kept.ok && kept.ms <= chosen.ms + tieMs(chosen.ms) && (o.overRoomMargin === 0 || beyondOf(prefer) <= rBest)) { windows = [...prefer]; chosen = kept; }
  return { windows, evaluations: chosen.evs, latencyMs: chosen.ms };
}
