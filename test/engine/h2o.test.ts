// H2O heavy-hitter eviction past a full context (--kv-evict h2o, engine/h2o.ts): the rule of what it
// keeps, stated by hand here; the attention statistics the kernel gathers (each query's probabilities
// sum to one per layer and head, whatever the batches; they move with the rows at a shift); and a
// generation past the context whose cache, after an eviction, holds exactly the tokens the rule keeps
// for the statistics read just before it.
import { join } from "node:path";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import {
  KvJournal, LocalModel, LocalPipeline, Sampler, generate, h2oBudget, h2oDrops, h2oKept, type Pipeline,
} from "../../engine/index.js";
import { root } from "../helpers/process.js";

const SHIPPED = join(root, "models/stories260K.gguf");
const m = LocalModel.open(SHIPPED, { threads: 2 });
afterAll(() => m.native.close());
const tokens = Int32Array.from({ length: 120 }, (_, i) => (i === 0 ? 1 : 260 + ((i * 53) % 190)));

describe("the rule", () => {
  it("keeps the sinks, the most recent half of the budget and the heaviest hitters of the rest", () => {
    // 20 positions, keep 2, budget 8: 3 recent (17..19), 3 heavy of 2..16
    const scores = Array.from({ length: 20 }, (_, p) => ({ 5: 9, 11: 7, 3: 7, 14: 2, 16: 8, 0: 50 } as Record<number, number>)[p] ?? 1);
    expect(h2oKept(scores, 20, 2, 8)).toEqual([0, 1, 5, 11, 16, 17, 18, 19]);
    // a tie goes to the later position: 3 and 11 both score 7
    expect(h2oKept(scores, 20, 2, 7)).toEqual([0, 1, 5, 16, 17, 18, 19]);
    expect(h2oKept(scores.map(() => 1), 20, 2, 8)).toEqual([0, 1, 14, 15, 16, 17, 18, 19]);
    // the drops, last run first, remove exactly what is not kept
    const kept = h2oKept(scores, 20, 2, 8), drops = h2oDrops(kept, 20);
    expect(drops).toEqual([{ p0: 12, n: 4 }, { p0: 6, n: 5 }, { p0: 2, n: 3 }]);
    const cache = Array.from({ length: 20 }, (_, p) => p);
    for (const d of drops) cache.splice(d.p0, d.n);
    expect(cache).toEqual(kept);
    expect(h2oBudget(0.2, 4096)).toBe(819);
  });
});

describe("the statistics the kernel gathers", () => {
  const hp = m.desc.hparams;
  it("sum to one per query, layer and head, whatever the batches, and move with the rows at a shift", async () => {
    const a = m.window(0, m.nLayers, { ctx: 128, maxBatch: 64, kvCacheTypes: { k: "f16", v: "f16", evict: "h2o" } });
    const b = m.window(0, m.nLayers, { ctx: 128, maxBatch: 1, kvCacheTypes: { k: "f16", v: "f16", evict: "h2o" } });
    try {
      await a.forward(m.embed(tokens.subarray(0, 100)), 0, 100);
      for (let p = 0; p < 100; p++) await b.forward(m.embed(tokens.subarray(p, p + 1)), p, 1);
      const sa = a.h2oScores()!, sb = b.h2oScores()!;
      expect(sa.length).toBe(100);
      const total = sa.reduce((x, y) => x + y, 0);
      expect(Math.abs(total - 100 * hp.nLayers * hp.nHead) / total).toBeLessThan(1e-5);
      // position 0 alone is seen by query 0 (probability 1) and, less and less, by the later ones
      expect(sa[0]).toBeGreaterThan(hp.nLayers * hp.nHead);
      for (let p = 0; p < 100; p++) expect(Math.abs(sa[p] - sb[p])).toBeLessThan(1e-4 * Math.max(1, sa[p]));
      // a shift moves them; a rewrite clears what followed
      a.kvShift(10, 30, 100);
      expect(Array.from(a.h2oScores()!)).toEqual([...Array.from(sa.subarray(0, 10)), ...Array.from(sa.subarray(40, 100))]);
      a.kvTruncate(50);
      await a.forward(m.embed(tokens.subarray(0, 1)), 50, 1);
      const after = a.h2oScores()!;
      expect(after.length).toBe(51);
      expect(after.reduce((x, y) => x + y, 0) - Array.from(sa.subarray(0, 10)).concat(Array.from(sa.subarray(40, 80))).reduce((x, y) => x + y, 0))
        .toBeCloseTo(hp.nLayers * hp.nHead, 3); // one more query's probabilities, nothing of the cleared ones
      // a window without H2O gathers none
      const c = m.window(0, m.nLayers, { ctx: 16 });
      expect(c.h2oScores()).toBeNull();
      c.close();
    } finally {
      a.close();
      b.close();
    }
  });
});

/** Records the cache and the statistics just before the first eviction. */
class Spy implements Pipeline {
  before?: { scores: Float32Array; tokens: number[]; nPast: number };
  constructor(readonly inner: LocalPipeline, readonly journal: KvJournal) {}
  get nCtx() { return this.inner.nCtx; }
  forward(acts: Float32Array, pos: number, n: number) { return this.inner.forward(acts, pos, n); }
  truncate(pos: number) { this.inner.truncate(pos); }
  h2oScores() { return this.inner.h2oScores(); }
  async shift(p0: number, n: number, nPast: number) {
    this.before ??= { scores: this.inner.h2oScores()!.slice(), tokens: [...this.journal.tokens], nPast };
    await this.inner.shift(p0, n, nPast);
  }
}

describe("generation past the context", () => {
  it("goes on, and after an eviction the cache holds what the rule keeps, with their statistics", async () => {
    const pipeline = new LocalPipeline(m, 64, 64, { k: "f16", v: "f16", evict: "h2o" });
    const journal = new KvJournal(), spy = new Spy(pipeline, journal);
    let afterFirst: { tokens: number[]; scores: Float32Array } | undefined;
    try {
      const r = await generate(m, spy, tokens.subarray(0, 20), {
        maxTokens: 150, sampler: new Sampler({ temperature: 0 }), journal, contextShift: { keep: 1, h2o: 0.25 },
        onShift: () => { afterFirst ??= { tokens: [...journal.tokens], scores: pipeline.h2oScores()!.slice() }; },
      });
      expect(r.ids.length).toBe(150);
      expect(r.shifts).toBeGreaterThan(2);
      const b = spy.before!;
      expect(b.nPast).toBe(63);
      const kept = h2oKept(b.scores, b.nPast, 1, 16);
      expect(kept.length).toBe(16);
      expect(afterFirst!.tokens).toEqual(kept.map((p) => b.tokens[p]));
      expect(Array.from(afterFirst!.scores)).toEqual(kept.map((p) => b.scores[p]));
      // not the oldest-first rule: some kept position lies before the recent ones with a gap before it
      expect(kept.some((p, i) => i > 0 && p - kept[i - 1] > 1)).toBe(true);
    } finally {
      pipeline.close();
    }
  });

  it("asked to evict by H2O, a pipeline whose windows gather no statistics fails at the first eviction, saying so", async () => {
    const pipeline = new LocalPipeline(m, 64, 64, { k: "f16", v: "f16" });
    try {
      await expect(generate(m, pipeline, tokens.subarray(0, 20), { maxTokens: 150, sampler: new Sampler({ temperature: 0 }), contextShift: { keep: 1, h2o: 0.25 } }))
        .rejects.toThrow(/needs windows that gather attention statistics/);
    } finally {
      pipeline.close();
    }
  });

  it("run --kv-evict h2o generates 4x the context; misuse is refused by name", async () => {
    const exec = promisify(execFile), cli = join(root, "dist/coordinator/cli.js");
    const { stdout } = await exec(process.execPath, [cli, "run", SHIPPED, "-p", "Once upon a time", "-n", "256", "--temp", "0", "--ctx", "64",
      "--kv-evict", "h2o", "--json"], { cwd: root, timeout: 120_000 });
    expect(JSON.parse(stdout).generated_ids.length).toBe(256);
    await expect(exec(process.execPath, [cli, "run", SHIPPED, "-p", "x", "--kv-evict", "lru"], { cwd: root })).rejects.toThrow(/--kv-evict "lru": the eviction prima has is h2o/);
    await expect(exec(process.execPath, [cli, "run", SHIPPED, "-p", "x", "--kv-budget", "0.3"], { cwd: root })).rejects.toThrow(/--kv-budget needs --kv-evict h2o/);
    await expect(exec(process.execPath, [cli, "run", SHIPPED, "-p", "x", "--kv-evict", "h2o", "--kv-budget", "2"], { cwd: root })).rejects.toThrow(/a fraction between 0 and 1/);
    await expect(exec(process.execPath, [cli, "run", SHIPPED, "-p", "x", "--kv-evict", "h2o", "--attention", "sparse"], { cwd: root })).rejects.toThrow(/choose one/);
    // one sequence's statistics: not for several (a ring sums its devices': test/ring/context-shift-ring.test.ts)
    await expect(exec(process.execPath, [cli, "serve", SHIPPED, "--kv-evict", "h2o", "--parallel", "2"], { cwd: root })).rejects.toThrow(/not with --parallel 2/);
  });
});
