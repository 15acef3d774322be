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

/** F over a window: prefix sums of its layers' shares merged hottest first (P[i]: the i hottest). */
export function keptShares(mt: MoeTerms, layers: readonly number[]): Float64Array {
  const all = new Float64Array(layers.length * mt.nExpert);
  let at = 0;
  for (const l of layers) for (const p of mt.layerShares![l]) all[at++] = p;
  all.sort().reverse();
  const prefix = new Float64Array(all.length + 1);
  for (let i = 0; i < all.length; i++) prefix[i + 1] = prefix[i] + all[i];
  return prefix;
}

/** ρ of r named layers from their merged prefix sums, with room C: dense parts resident first, then the
 * hottest experts of any of its layers (the last one partly), as MoE-1 with each layer's own p. */
export function rereadFromPrefix(mt: MoeTerms, prefix: Float64Array, r: number, roomBytes: number): number {
  if (r <= 0) return 0;
  const dense = r * mt.denseBytesWithKv;
  const expertRoom = roomBytes - dense;
  if (expertRoom <= 0) return Math.max(0, dense + r * mt.nUsed * mt.expertBytes - roomBytes);
  const j = Math.min(expertRoom / mt.expertBytes, prefix.length - 1); // experts resident in the window
  const whole = Math.floor(j);
  const kept = prefix[whole] + (whole < prefix.length - 1 ? (j - whole) * (prefix[whole + 1] - prefix[whole]) : 0);
  return r * mt.nUsed * mt.expertBytes * Math.max(0, 1 - kept / r);
}

/** ρ for a window of named layers (MoE-3): equals moeRereadBytes when every layer has the same shares. */
export function moeNamedRereadBytes(mt: MoeTerms, layers: readonly number[], roomBytes: number): number {
  return rereadFromPrefix(mt, keptShares(mt, layers), layers.length, roomBytes);
}

