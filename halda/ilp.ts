// One ILP: fixed sets, fixed k (HALDA.md §3), solved with javascript-lp-solver. The solver's answer is
// rounded and every constraint re-checked before it is trusted; the objective is recomputed here.

import lpSolverModule from "javascript-lp-solver";
import type { Model as LpModel, SolverAPI } from "javascript-lp-solver";
import { setCoefficients, type DeviceTerms, type ModelTerms, type ResolvedOptions, type SetCoefficients } from "./terms.js";
import type { DeviceSet } from "./types.js";

export interface IlpSolution {
  readonly k: number;
  readonly sets: readonly DeviceSet[];
  readonly w: readonly number[];
  readonly n: readonly number[];
  /** What the solver minimised: the head's window coefficient divided by masterPriority, plus the constant
   *  (exact mode solves with masterPriority 1, so there it equals latencyMs). */
  readonly objectiveMs: number;
  /** The model's latency of this solution: k·Σ(a·w + b·n + ξ) + κ with unscaled coefficients; with
   * `prefetched`, the price of its reads hidden behind the ring (overlap.ts, HALDA.md §4.9). */
  readonly latencyMs: number;
  readonly prefetched?: boolean;
}

/** Integer bounds of the rows of one device (HALDA.md §2.4 C4, C5, and the §4.6 guard). */
export interface DeviceRows {
  /** Coefficient of n in the RAM row (−1 when GPU layers leave RAM in this set, else 0). */
  readonly ramN: number;
  /** RAM row: ≥ ramMin (overloaded sets) or ≤ ramMax (M4). */
  readonly ramMin?: number;
  readonly ramMax?: number;
  /** n ≤ vramMax. */
  readonly vramMax: number;
  /** Guard: w + ramN·n ≤ guardMax (overloaded sets with prefetchGuard). */
  readonly guardMax?: number;
}

const EPS = 1e-9;

// The package's types describe its ES module, but TypeScript reads them as CommonJS (no "type":
// "module"), so its default export types as the namespace. At run time Node loads index.mjs, whose
// default export is the solver itself.
const solver: SolverAPI = ((lpSolverModule as unknown as { default?: SolverAPI }).default ?? lpSolverModule) as unknown as SolverAPI;

export function deviceRows(t: DeviceTerms, set: DeviceSet, k: number, m: ModelTerms, o: ResolvedOptions): DeviceRows {
  const bp = m.layerBytesWithKv;
  const ramN = t.gpuLayersLeaveRam && (set === "M3" || set === "M4") ? -1 : 0;
  // Rounding the right-hand sides is exact: the left-hand sides are integers.
  const perWindow = t.capBytes / (k * bp);
  const vramMax = t.dev.hasGpu ? Math.floor(t.capGpuBytes / (k * bp) + EPS) : 0;
  if (set === "M4") return { ramN, ramMax: Math.floor(perWindow + EPS), vramMax };
  return {
    ramN,
    // "window" pricing is a cliff, not a slope: a device that exactly fits pays nothing, so overloaded
    // means strictly more than fits (M4 covers the equality).
    ramMin: o.overloadReload === "window" ? Math.floor(perWindow + EPS) + 1 : Math.ceil(perWindow - EPS),
    vramMax,
    guardMax: o.prefetchGuard ? Math.floor(t.capBytes / bp + EPS) : undefined,
  };
}

function feasibleFor(rows: DeviceRows, w: number, n: number, L: number): boolean {
  if (w < 1 || w > L || n < 0 || n > L || n > w || n > rows.vramMax) return false;
  const r = w + rows.ramN * n;
  if (rows.ramMin !== undefined && r < rows.ramMin) return false;
  if (rows.ramMax !== undefined && r > rows.ramMax) return false;
  if (rows.guardMax !== undefined && r > rows.guardMax) return false;
  return true;
}

/**
 * Solves the ILP for these sets and k; null when infeasible. With `maxLatencyMs` (the secondary key of
 * HALDA.md §3) it instead maximises the head's window among the plans whose latency is at most that
 * bound, so a second solve at the first solve's optimum picks the tie that gives the head most layers.
 */
export function solveIlp(terms: readonly DeviceTerms[], sets: readonly DeviceSet[], k: number, m: ModelTerms, o: ResolvedOptions, maxLatencyMs?: number): IlpSolution | null {
  const L = m.nLayers;
  if (L % k !== 0) return null;
  const W = L / k;
  const M = terms.length;
  if (W < M) return null;
  const coefs: SetCoefficients[] = terms.map((t, i) => setCoefficients(t, sets[i], m, o.overloadReload));
  const rows: DeviceRows[] = terms.map((t, i) => deviceRows(t, sets[i], k, m, o));

  // Cheap infeasibility check before calling the solver: the windows each device allows must be able
  // to sum to W. With n <= min(w, vramMax), the RAM row bounds w from below by ramMin and from above
  // by ramMax (+ vramMax when GPU layers leave RAM).
  let wLo = 0, wHi = 0;
  for (const r of rows) {
    if (r.vramMax < 0) return null;
    const gpuRelief = r.ramN === 0 ? 0 : r.vramMax;
    const lo = Math.max(1, r.ramMin ?? 1);
    const hi = Math.min(W, r.ramMax === undefined ? W : r.ramMax + gpuRelief, r.guardMax === undefined ? W : r.guardMax + gpuRelief);
    if (lo > hi) return null;
    wLo += lo;
    wHi += hi;
  }
  if (wLo > W || wHi < W) return null;

  const constraints: LpModel["constraints"] = { sumW: { equal: W } };
  // The latency's constant part (k·Σξ + Σκ), which the solver does not see (the MoE reread it does, as z).
  const constantMs = terms.reduce((s, t, i) => s + k * t.xiMs + coefs[i].kappa, 0);
  const capped = maxLatencyMs !== undefined;
  if (capped) constraints.latencyCap = { max: maxLatencyMs - constantMs };
  const variables: LpModel["variables"] = {};
  const ints: Record<string, 1> = {};
  for (let i = 0; i < M; i++) {
    const r = rows[i];
    const headScale = i === 0 ? 1 / o.masterPriority : 1;
    constraints[`wMin${i}`] = { min: 1 };
    constraints[`wMax${i}`] = { max: L };
    constraints[`nMax${i}`] = { max: L };
    constraints[`nLeW${i}`] = { max: 0 };
    constraints[`vram${i}`] = { max: r.vramMax };
    const w: Record<string, number> = { latencyMs: k * coefs[i].a * headScale, sumW: 1, [`wMin${i}`]: 1, [`wMax${i}`]: 1, [`nLeW${i}`]: -1 };
    const n: Record<string, number> = { latencyMs: k * coefs[i].b, [`nMax${i}`]: 1, [`nLeW${i}`]: 1, [`vram${i}`]: 1 };
    if (capped) {
      w.latencyCap = k * coefs[i].a;
      n.latencyCap = k * coefs[i].b;
      if (i === 0) w.headLayers = 1;
    }
    constraints[`ram${i}`] = r.ramMin !== undefined ? { min: r.ramMin } : { max: r.ramMax! };
    w[`ram${i}`] = 1;
    if (r.ramN !== 0) n[`ram${i}`] = r.ramN;
    if (r.guardMax !== undefined) {
      constraints[`guard${i}`] = { max: r.guardMax };
      w[`guard${i}`] = 1;
      if (r.ramN !== 0) n[`guard${i}`] = r.ramN;
    }
    const rr = coefs[i].reread;
    if (rr) {
      // z_i ≥ each line of δ·ρ in r = k·(w + ramN·n), and z_i ≥ 0: at the optimum z_i = δ·ρ(r).
      const z: Record<string, number> = { latencyMs: 1 };
      if (capped) z.latencyCap = 1;
      rr.linesMs.forEach((line, j) => {
        const row = `reread${i}_${j}`;
        constraints[row] = { min: line.intercept };
        z[row] = 1;
        w[row] = -line.slope * k;
        if (rr.ramN !== 0) n[row] = -line.slope * k * rr.ramN;
      });
      variables[`z${i}`] = z;
    }
    variables[`w${i}`] = w;
    variables[`n${i}`] = n;
    ints[`w${i}`] = 1;
    ints[`n${i}`] = 1;
  }
  const model: LpModel = capped
    ? { optimize: "headLayers", opType: "max", constraints, variables, ints }
    : { optimize: "latencyMs", opType: "min", constraints, variables, ints };
  const res = solver.Solve(model) as { feasible: boolean; [v: string]: number | boolean | undefined };
  if (!res.feasible) return null;

  // Results omit variables equal to 0. Round, then re-check everything: the solver returns numbers
  // even when it failed, and its tolerances are not ours.
  const value = (name: string) => {
    const v = res[name];
    return typeof v === "number" ? v : 0;
  };
  const wv: number[] = [], nv: number[] = [];
  for (let i = 0; i < M; i++) {
    const w = value(`w${i}`), n = value(`n${i}`);
    if (Math.abs(w - Math.round(w)) > 1e-6 || Math.abs(n - Math.round(n)) > 1e-6) return null;
    wv.push(Math.round(w));
    nv.push(Math.round(n));
  }
  if (wv.reduce((s, x) => s + x, 0) !== W) return null;
  for (let i = 0; i < M; i++) if (!feasibleFor(rows[i], wv[i], nv[i], L)) return null;
  const sol = finishSolution(terms, sets, k, wv, nv, coefs, o);
  // The solver's tolerance on the cap row is not ours.
  if (capped && sol.latencyMs > maxLatencyMs) return null;
  return sol;
}

/** Objective and latency of a given (w, n) under fixed sets. */
export function finishSolution(terms: readonly DeviceTerms[], sets: readonly DeviceSet[], k: number, w: readonly number[], n: readonly number[], coefs: readonly SetCoefficients[], o: ResolvedOptions): IlpSolution {
  let objectiveMs = 0, latencyMs = 0;
  for (let i = 0; i < terms.length; i++) {
    const c = coefs[i];
    // The reread is evaluated exactly, not taken from the solver's auxiliary variable.
    const constant = k * terms[i].xiMs + c.kappa + (c.reread ? c.reread.ms(k * (w[i] + c.reread.ramN * n[i])) : 0);
    latencyMs += k * (c.a * w[i] + c.b * n[i]) + constant;
    objectiveMs += k * (c.a * w[i] * (i === 0 ? 1 / o.masterPriority : 1) + c.b * n[i]) + constant;
  }
  return { k, sets: [...sets], w: [...w], n: [...n], objectiveMs, latencyMs };
}

/** Whether (w, n) satisfies every row of these sets at k (for calibration and tests). */
export function satisfiesRows(terms: readonly DeviceTerms[], sets: readonly DeviceSet[], k: number, w: readonly number[], n: readonly number[], m: ModelTerms, o: ResolvedOptions): boolean {
  if (w.reduce((s, x) => s + x, 0) * k !== m.nLayers) return false;
  return terms.every((t, i) => feasibleFor(deviceRows(t, sets[i], k, m, o), w[i], n[i], m.nLayers));
}
