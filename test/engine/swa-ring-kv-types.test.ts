// Quantized KV caches in a sliding-window layer's ring: on generated gemma3 and gpt-oss (attention sinks,
// YaRN) models with a 4-token window and a batch of 4 (rings of 8 rows in a 96-token context), a prompt and a greedy continuation
// far past the ring give llama.cpp's logits at every position with the same cache types (q8_0, q4_0 K
// with q8_0 V, and q8_0 rotated; flash attention on, as llama.cpp needs for a quantized V); the window's KV
// bytes are model/'s one rule (rows by type x ring rows).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Llama } from "node-llama-cpp";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LocalModel, LocalPipeline, Sampler, generate } from "../../engine/index.js";
import { Tokenizer, kvBytesPerLayer, kvBytesPerTokenLayer, kvCacheRows, modelProfile, type KvCacheType, type KvCacheTypes } from "../../model/index.js";
import { generateModel } from "../../modelgen/index.js";
import { TOL_FIRST_POSITION, ORACLE_THREADS, TOL_FLOOR, compare, loadOracle, oracleLogits } from "./oracle-harness.js";

const dir = mkdtempSync(join(tmpdir(), "prima-swa-kvtypes-"));
let llama: Llama;
beforeAll(async () => {
  llama = await loadOracle();
}, 60_000);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const TEXT = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day she found a shiny red ball under a big tree.";
const CTX = 96;
const BATCH = 4;
const GREEDY_TOKENS = 16;
const ggml = (t: KvCacheType) => t.replace("-rot", "").toUpperCase() as "F16" | "Q8_0" | "Q4_0";

/** llama.cpp's logits at every position with these cache types; it rotates a quantized cache (head
 * size a multiple of 64) unless LLAMA_ATTN_ROT_DISABLE=1, read as the context is made. */
async function theirLogits(path: string, tokens: readonly number[], types: KvCacheTypes): Promise<Float32Array[]> {
  const model = await llama.loadModel({ modelPath: path, gpuLayers: 0 });
  if (types.k.endsWith("-rot") || types.v.endsWith("-rot")) delete process.env.LLAMA_ATTN_ROT_DISABLE;
  else process.env.LLAMA_ATTN_ROT_DISABLE = "1";
  try {
    const context = await model.createContext({
      contextSize: CTX, batchSize: CTX, threads: ORACLE_THREADS, flashAttention: true,
      experimentalKvCacheKeyType: ggml(types.k), experimentalKvCacheValueType: ggml(types.v),
    });
    try {
      const out = await context.getSequence().controlledEvaluate(tokens.map((t) => [t, { generateNext: { logits: true } }] as const) as never);
      return out.map((item) => {
        const m = (item as { next?: { logits?: Map<number, number> } }).next!.logits!;
        const v = new Float32Array(model.tokens.length ?? m.size);
        for (const [id, l] of m) v[id] = l;
        return v;
      });
    } finally {
      await context.dispose();
    }
  } finally {
    await model.dispose();
  }
}

/** Ours at every position, BATCH rows per pass through the rings. */
async function ringLogits(m: LocalModel, tokens: readonly number[], types: KvCacheTypes): Promise<Float32Array[]> {
  const w = m.window(0, m.nLayers, { ctx: CTX, maxBatch: BATCH, kvCacheTypes: types });
  const acts = m.embed(Int32Array.from(tokens));
  await w.forward(acts, 0, tokens.length);
  const rows: Float32Array[] = [];
  for (let i = 0; i < tokens.length; i++) rows.push(await m.logits(acts.subarray(i * m.nEmbd, (i + 1) * m.nEmbd)));
  w.close();
  return rows;
}

// (K f16 with V q4_0, plain or rotated, is 1.6x the tolerance on this model with or without a ring, and
// K q8_0-rot with V f16 1.07x on gemma3: a gap of the mixed types there, not of the ring; left out here)
const TYPES: KvCacheTypes[] = [{ k: "q8_0", v: "q8_0" }, { k: "q4_0", v: "q8_0" }, { k: "q8_0-rot", v: "q8_0-rot" }];

// A quantized cache rounds every value it stores: where the two engines' K or V differ in the last
// bits, one value can round to the neighbouring level. Seen on an AVX-512 host (llama.cpp's kernels
// there sum in another order): q4_0 K, the 4 positions of one batch at 2e-3 of the logit spread, every
// other position within 2e-7. Such a flip moves the logits by a small part of what the cache type
// does to them (0.35 of the spread for q4_0 K on tiny-gpt-oss); a format or kernel bug moves them by
// the order of that. So a type's tolerance is at least 1% of llama.cpp's own shift from an f16 cache.
const SHARE_OF_TYPE_SHIFT = 0.01;

describe.each(["tiny-gemma3", "tiny-gpt-oss"])("%s: quantized caches in sliding-window rings", (shape) => {
  const path = join(dir, `${shape}.gguf`);
  let m: LocalModel;
  let prompt: number[];
  let tol: number;

  beforeAll(async () => {
    await generateModel({ shape, type: "F32", out: path, pure: true, seed: 7, weightStd: 0.05 });
    m = LocalModel.open(path, { threads: 2 });
    prompt = [1, ...Tokenizer.fromGguf(path).encode(TEXT)];
    // as kv-types.test.ts: twice llama.cpp's own flash-attention noise, at least TOL_FLOOR
    const f16 = await oracleLogits(llama, path, prompt, false);
    tol = Math.max(2 * compare(await oracleLogits(llama, path, prompt, true), f16, 0).maxRelErr, TOL_FLOOR);
  }, 120_000);
  afterAll(() => m?.close());

  it.each(TYPES)("K $k V $v: the window's KV bytes are the one rule's, rings included", (types) => {
    const hp = m.desc.hparams;
    const rows = kvCacheRows(hp.layerWindow, CTX, BATCH).reduce((a, b) => a + b, 0);
    expect(rows).toBeLessThan(hp.nLayers * CTX);
    const w = m.window(0, m.nLayers, { ctx: CTX, maxBatch: BATCH, kvCacheTypes: types });
    const kv = w.info().kvBytes;
    w.close();
    expect(kv).toBe(kvBytesPerTokenLayer(hp, types) * rows);
    expect(kvBytesPerLayer(modelProfile(m.desc, { nCtx: CTX, maxBatch: BATCH, kvCacheTypes: types })) * hp.nLayers).toBeCloseTo(kv, 6);
  });

  it.each(TYPES)("K $k V $v: logits at every position equal llama.cpp's with the same cache, far past the ring", async (types) => {
    expect(prompt.length).toBeGreaterThan(4 * (4 + BATCH)); // the rings wrap several times
    const ref = await theirLogits(path, prompt, types);
    const ours = await ringLogits(m, prompt, types);
    const shift = compare(ref, await theirLogits(path, prompt, { k: "f16", v: "f16" }), 0).maxRelErr;
    const typeTol = Math.max(tol, SHARE_OF_TYPE_SHIFT * shift);
    // the first position returns the one cached V row: equal only when both caches hold the same bytes
    expect(compare(ours.slice(0, 1), ref.slice(0, 1), TOL_FIRST_POSITION).maxRelErr).toBeLessThan(TOL_FIRST_POSITION);
    const all = compare(ours, ref, typeTol);
    expect(all.top1Mismatches).toEqual([]);
    expect(all.maxRelErr).toBeLessThan(typeTol);
    // the check tells the cache types apart: an F16 cache's logits are not within it at every position
    const f16 = await ringLogits(m, prompt, { k: "f16", v: "f16" });
    expect(compare(ours, f16, 0).maxRelErr).toBeGreaterThan(TOL_FIRST_POSITION);

    // greedy tokens through the pipeline (one token a pass, the rings wrapping), then llama.cpp's
    // logits over the whole text with the same cache types
    const pipe = new LocalPipeline(m, CTX, BATCH, types);
    const res = await generate(m, pipe, Int32Array.from(prompt), { maxTokens: GREEDY_TOKENS, sampler: new Sampler({ temperature: 0 }), isEnd: () => false });
    pipe.close();
    const seq = [...prompt, ...res.ids];
    const theirs = await theirLogits(path, seq, types);
    for (let k = 0; k < GREEDY_TOKENS; k++) {
      const r = theirs[prompt.length - 1 + k];
      let best = 0, min = Infinity;
      for (let i = 0; i < r.length; i++) {
        if (r[i] > r[best]) best = i;
        min = Math.min(min, r[i]);
      }
      if (best !== res.ids[k]) expect((r[best] - r[res.ids[k]]) / (r[best] - min), `greedy step ${k}: llama.cpp picks ${best}, we ${res.ids[k]}`).toBeLessThan(typeTol);
    }
    const whole = compare(await ringLogits(m, seq, types), theirs, typeTol);
    expect(whole.maxRelErr).toBeLessThan(typeTol);
    console.log(`${shape} K ${types.k} V ${types.v}: max |ours - llama.cpp| ${whole.maxRelErr.toExponential(2)} over ${seq.length} positions ` +
      `(tolerance ${typeTol.toExponential(2)}: llama.cpp's noise ${tol.toExponential(2)}, the type's shift from f16 ${shift.toExponential(2)})`);
  }, 180_000);
});
