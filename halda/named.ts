// MoE-3 (docs/HALDA.md): a mixture of experts' windows priced by the layers they name. Halda's ILP
// counts interchangeable layers with one averaged routing skew; measured layers differ (a model's first
// layers often route over nearly every expert, later ones over a few), so which layers a device holds
// decides what it rereads. Given the ILP's k and devices, the windows are split again in ring order by
// a shortest path over (device, first layer) with each window priced by its own layers' shares: the
// exact best split for those devices and k under MoE-1 taken layer by layer.
import { evaluateNamed, type DeviceEvaluation } from "./latency.js";
import { namedLayers, windowRates, type WindowRates } from "./named-reread.js";
import type { DeviceTerms, ModelTerms, ResolvedOptions } from "./terms.js";

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
 * Null when no split is free of problems.
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
  // best[a][x]: least latency of devices 0..a-1 covering the cycle's first x layers
  const best = Array.from({ length: A + 1 }, () => new Float64Array(W + 1).fill(Infinity));
  const from = Array.from({ length: A + 1 }, () => new Int32Array(W + 1).fill(-1));
  best[0][0] = 0;
  for (let a = 0; a < A; a++) {
    for (let x = a; x <= W - (A - a); x++) {
      if (best[a][x] === Infinity) continue;
      for (let w = 1; x + w <= W - (A - a - 1); w++) {
        const c = best[a][x] + cost(a, x, w);
        if (c < best[a + 1][x + w]) { best[a + 1][x + w] = c; from[a + 1][x + w] = x; }
      }
    }
  }
  if (best[A][W] === Infinity) return null;
  let windows: number[] = [];
  for (let a = A, x = W; a > 0; a--) { const y = from[a][x]; windows.unshift(x - y); x = y; }
  const evaluate = (ws: readonly number[]) => {
    let offset = 0;
    const evs = ws.map((w, a) => { const ev = evaluateNamed(terms[a], k, w, offset, m, o, ratesOf(offset, w)); offset += w; return ev; });
    return { evs, ms: evs.reduce((s, e) => s + e.latency.totalMs, 0), ok: evs.every((e) => e.problems.length === 0) };
  };
  let chosen = evaluate(windows);
  const kept = evaluate(prefer); // the ILP's split: one of the DP's, so never below it
  if (kept.ok && kept.ms <= chosen.ms + tieMs(chosen.ms)) { windows = [...prefer]; chosen = kept; }
  return { windows, evaluations: chosen.evs, latencyMs: chosen.ms };
}
