// MoE-3's reread (docs/HALDA.md): a window of named layers, each layer with its own measured routing
// shares; named.ts splits the layers by it. Pure terms, as terms.ts.
import type { ModelTerms, MoeTerms, ResolvedOptions } from "./terms.js";

/** Whether windows are priced by name: a measured per-layer skew, "excess" pricing, no GPU layers. */
export function pricedByName(m: ModelTerms, o: ResolvedOptions, gpuLayers: readonly number[]): boolean {
  return !!m.moe?.layerShares && o.overloadReload === "excess" && gpuLayers.every((n) => n === 0);
}

/** The layers a window names: [c·W + offset, c·W + offset + w) for each of k cycles of W layers. */
export function namedLayers(k: number, cycleLayers: number, offset: number, w: number): number[] {
  const out: number[] = [];
  for (let c = 0; c < k; c++) for (let i = 0; i < w; i++) out.push(c * cycleLayers + offset + i);
  return out;
}

/** The pseudo-assignments each expert gets before a measurement's own (Jeffreys' prior): an expert the
 * routing text never reached is rare, not never used. */
export const ROUTING_PRIOR = 0.5;

/** A window's experts as distinct per-token access rates (k_e·p̃, p̃ a layer's share smoothed by the
 * measurement's size, where known) with how many of its experts have each. */
export interface WindowRates {
  readonly rate: Float64Array;
  readonly count: Float64Array;
}

/** Each layer's distinct rates, made once per model's terms (a plan prices thousands of windows). */
const layerRatesOf = new WeakMap<MoeTerms, WindowRates[]>();

function layerRates(mt: MoeTerms, layer: number): WindowRates {
  let all = layerRatesOf.get(mt);
  if (!all) layerRatesOf.set(mt, (all = []));
  let lr = all[layer];
  if (!lr) {
    const A = mt.routingAssignments, n = mt.nExpert;
    const counts = new Map<number, number>();
    for (const p of mt.layerShares![layer]) {
      const rate = mt.nUsed * (A ? (p * A + ROUTING_PRIOR) / (A + n * ROUTING_PRIOR) : p);
      if (rate > 0) counts.set(rate, (counts.get(rate) ?? 0) + 1);
    }
    all[layer] = lr = { rate: Float64Array.from(counts.keys()), count: Float64Array.from(counts.values()) };
  }
  return lr;
}

/** The window's layers' rates side by side (a rate may repeat: the sums do not mind). */
export function windowRates(mt: MoeTerms, layers: readonly number[]): WindowRates {
  const parts = layers.map((l) => layerRates(mt, l));
  const size = parts.reduce((a, p) => a + p.rate.length, 0);
  const rate = new Float64Array(size), count = new Float64Array(size);
  let at = 0;
  for (const p of parts) {
    rate.set(p.rate, at);
    count.set(p.count, at);
    at += p.rate.length;
  }
  return { rate, count };
}

/**
 * Experts read per token when the page cache holds `slots` of the window's experts and keeps the recently
 * used (LRU, tokens routed independently): Che's approximation. Over T tokens an expert of rate q is
 * touched with probability 1 − e^(−qT); the cache's characteristic time T is where the expected distinct
 * experts touched fill it, Σ(1 − e^(−qT)) = slots; an expert is resident with probability 1 − e^(−qT), so
 * a token misses Σ q·e^(−qT) of them. Uniform rates give MoE-1's 1 − j/n; skewed ones miss more than
 * MoE-1's hottest-fit would (the recently used are not always the hottest).
 */
export function lruMissesPerToken(w: WindowRates, slots: number): number {
  let experts = 0, total = 0;
  for (let i = 0; i < w.rate.length; i++) (experts += w.count[i]), (total += w.count[i] * w.rate[i]);
  if (slots <= 0) return total;
  if (slots >= experts) return 0;
  // g(T) = Σ c(1 − e^(−qT)) − slots is increasing and concave: Newton from a T where g <= 0 (1 − e^(−x) <= x)
  // climbs to the root from below, every step staying at or left of it.
  let T = slots / total;
  for (let it = 0; it < 200; it++) {
    let g = -slots, dg = 0;
    for (let i = 0; i < w.rate.length; i++) {
      const e = Math.exp(-w.rate[i] * T);
      g += w.count[i] * (1 - e);
      dg += w.count[i] * w.rate[i] * e;
    }
    if (!(dg > 0)) break;
    const step = -g / dg;
    T += step;
    if (step <= 1e-12 * T) break;
  }
  let misses = 0;
  for (let i = 0; i < w.rate.length; i++) misses += w.count[i] * w.rate[i] * Math.exp(-w.rate[i] * T);
  return misses;
}

/** ρ of r named layers with room C: dense parts resident first (every token touches them), the rest
 * of the room holds experts as LRU keeps them (lruMissesPerToken); the other two cases as MoE-1. */
export function rereadOfRates(mt: MoeTerms, w: WindowRates, r: number, roomBytes: number): number {
  if (r <= 0) return 0;
  const dense = r * mt.denseBytesWithKv;
  const expertRoom = roomBytes - dense;
  if (expertRoom <= 0) return Math.max(0, dense + r * mt.nUsed * mt.expertBytes - roomBytes);
  return mt.expertBytes * lruMissesPerToken(w, expertRoom / mt.expertBytes);
}

/** ρ for a window of named layers (MoE-3): equals moeRereadBytes when every layer routes uniformly. */
export function moeNamedRereadBytes(mt: MoeTerms, layers: readonly number[], roomBytes: number): number {
  return rereadOfRates(mt, windowRates(mt, layers), layers.length, roomBytes);
}
