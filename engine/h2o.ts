// H2O heavy-hitter eviction (Zhang et al., "H2O: Heavy-Hitter Oracle", 2023) past a full context, as a
// context shift with a chosen keep set: the first `keep` positions (sinks), the most recent ones and the
// heavy hitters (the positions that received the most attention, summed over every query, layer and
// head: native h2oScores; on a ring, each device's summed round it in an H2O_SCORES frame), `budget` positions in all, half recent and half heavy; every other position
// is dropped. Positions: the kept entries move down to consecutive positions with their keys re-rotated
// (native kv_shift.c, one shift per dropped run), as llama.cpp's context shift keeps a cache's positions
// consecutive; H2O's own code keeps each key at its original rotary position instead, which prima's
// caches, ring frames and journal (a row is a position) do not allow.
import type { KvJournal } from "./context-shift.js";
import type { Pipeline } from "./generate.js";

/** The positions H2O keeps out of nPast, ascending: [0, keep), the last `recent`, and the `heavy` highest
 * scores of the rest (ties: the later position), where recent = ceil((budget - keep) / 2) and heavy the
 * remainder. budget is clamped to [keep + 2, nPast - 1]: something recent and something dropped. */
export function h2oKept(scores: ArrayLike<number>, nPast: number, keep: number, budget: number): number[] {
  const total = Math.max(keep + 2, Math.min(budget, nPast - 1));
  const recent = Math.ceil((total - keep) / 2), heavy = total - keep - recent;
  const middle: number[] = [];
  for (let p = keep; p < nPast - recent; p++) middle.push(p);
  middle.sort((a, b) => scores[b] - scores[a] || b - a);
  const kept = new Set<number>();
  for (let p = 0; p < Math.min(keep, nPast); p++) kept.add(p);
  for (const p of middle.slice(0, heavy)) kept.add(p);
  for (let p = Math.max(keep, nPast - recent); p < nPast; p++) kept.add(p);
  return [...kept].sort((a, b) => a - b);
}

/** The runs of positions not kept, as shifts (drop [p0, p0 + n)), the last run first: each shift moves
 * only what lies above it, so the earlier runs keep their positions. */
export function h2oDrops(kept: readonly number[], nPast: number): { p0: number; n: number }[] {
  const drops: { p0: number; n: number }[] = [];
  let next = 0;
  for (const p of [...kept, nPast]) {
    if (p > next) drops.push({ p0: next, n: p - next });
    next = p + 1;
  }
  return drops.reverse();
}

/** Positions an eviction keeps for a context of nCtx tokens at this fraction (--kv-budget). */
export function h2oBudget(fraction: number, nCtx: number): number {
  return Math.floor(fraction * nCtx);
}

/** One eviction of a full cache of nPast positions: the statistics read, the rule applied, each dropped
 * run shifted out on the pipeline (and recorded in the journal). Returns the positions dropped. */
export async function h2oEvict(pipeline: Pipeline, nPast: number, keep: number, fraction: number, journal?: KvJournal): Promise<number> {
  const scores = await pipeline.h2oScores?.();
  if (!scores || !pipeline.shift) throw new Error("H2O eviction (--kv-evict h2o) needs windows that gather attention statistics");
  let d = 0;
  for (const r of h2oDrops(h2oKept(scores, nPast, keep, h2oBudget(fraction, pipeline.nCtx)), nPast)) {
    await pipeline.shift(r.p0, r.n, nPast - d);
    journal?.shift(r.p0, r.n);
    d += r.n;
  }
  return d;
}
