// Embeddings against llama.cpp (node-llama-cpp's embedding context, CPU, offline) on the same files: the
// shipped model (no pooling_type: the last token's row, as node-llama-cpp reads it) and generated ones
// whose files say mean and cls pooling. Ours are the rows a pass from position 0 leaves, pooled by
// engine/embedding.ts; theirs llama_get_embeddings_seq (pooled) or _ith(-1) (none).
//
// Tolerance: the pooled vector is the output norm of the last layer's rows, which carry the same
// rounding the logits do (llama.cpp rounds attention to F16 where we keep F32, and Q8 activations turn
// such differences into whole quantization steps: oracle-harness.ts). So, as for the logits, the bound is
// measured rather than assumed: llama.cpp's own vector with flash attention on against off, twice that
// (at least TOL_FLOOR of the largest value, and 1 - cosine at least 1e-4, i.e. cosine > 0.9999). Seen:
// the shipped model 1 - cosine 2e-8..1.4e-7, max |diff| 2-3e-4 of the largest value; the generated
// Q8_0 models (random weights: larger activations) up to 6.5e-5 and 1.2e-2, about half of llama.cpp's
// own flash-attention difference; cls (one row, no attention mixing) 1e-7. A wrong pooling, a missing
// norm or a row off by one gives cosines far below 0.99.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import type { Llama } from "node-llama-cpp";
import { LocalModel, LocalPipeline, embeddingPooling, normalizeEmbedding, poolRows, type Pooling } from "../../engine/index.js";
import { kv, Tokenizer } from "../../model/index.js";
import { generateModel } from "../../modelgen/index.js";
import { ORACLE_THREADS, TOL_FLOOR, loadOracle } from "./oracle-harness.js";
import { tempDir } from "../helpers/temp.js";

const SHIPPED = "models/stories260K.gguf";
const TEXTS = ["Once upon a time there was a little dog.", "The sun", "Tim and Sue went to the park to play with a red ball and a kite."];

let llama: Llama;
beforeAll(async () => {
  llama = await loadOracle();
}, 60_000);
afterAll(async () => {
  await llama?.dispose();
});

/** A tiny llama whose file says how its embeddings pool (llama.cpp's enum: 1 mean, 2 cls, 3 last). */
async function pooledModel(type: number): Promise<string> {
  const out = join(tempDir("prima-embed-model-"), `pooling${type}.gguf`);
  await generateModel({ shape: "small-llama", type: "Q8_0", out, seed: 11, pure: true, extraMetadata: [kv.u32("llama.pooling_type", type)] });
  return out;
}

async function theirs(path: string, text: string, flashAttention = false): Promise<Float32Array> {
  const model = await llama.loadModel({ modelPath: path, gpuLayers: 0, defaultContextFlashAttention: flashAttention });
  const ctx = await model.createEmbeddingContext({ contextSize: 256, threads: ORACLE_THREADS });
  try {
    return Float32Array.from((await ctx.getEmbeddingFor(text)).vector);
  } finally {
    await ctx.dispose();
    await model.dispose();
  }
}

async function ours(path: string, text: string): Promise<{ v: Float32Array; pooling: Pooling }> {
  const m = LocalModel.open(path, { threads: 2 });
  const p = new LocalPipeline(m, 256);
  try {
    const tok = Tokenizer.fromGguf(m.gguf);
    const ids = tok.encode(text, { addSpecial: true, parseSpecial: true });
    const rows = m.embed(ids);
    await p.forward(rows, 0, ids.length);
    const { pooling } = embeddingPooling(m.gguf, m.desc);
    return { v: poolRows(m, rows, ids.length, pooling)[0], pooling };
  } finally {
    p.close();
    m.close();
  }
}

function agreement(a: Float32Array, b: Float32Array) {
  let dot = 0, na = 0, nb = 0, maxDiff = 0, maxAbs = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
    maxDiff = Math.max(maxDiff, Math.abs(a[i] - b[i]));
    maxAbs = Math.max(maxAbs, Math.abs(b[i]));
  }
  return { cosine: dot / Math.sqrt(na * nb), relDiff: maxDiff / maxAbs };
}

describe("embeddings equal llama.cpp's", () => {
  const cases: [string, () => Promise<string>, Pooling][] = [
    ["the shipped model (no pooling_type: last)", async () => SHIPPED, "last"],
    ["a generated model with pooling_type mean", () => pooledModel(1), "mean"],
    ["a generated model with pooling_type cls", () => pooledModel(2), "cls"],
    ["a generated model with pooling_type last", () => pooledModel(3), "last"],
  ];
  for (const [name, file, expected] of cases) {
    it(name, async () => {
      const path = await file();
      for (const text of TEXTS) {
        const [o, t, tFlash] = [await ours(path, text), await theirs(path, text), await theirs(path, text, true)];
        expect(o.pooling).toBe(expected);
        expect(o.v.length).toBe(t.length);
        const a = agreement(o.v, t);
        // llama.cpp's own rounding noise on this vector: its flash attention against its default
        const noise = agreement(tFlash, t);
        const tol = Math.max(2 * noise.relDiff, TOL_FLOOR), cosTol = Math.max(2 * (1 - noise.cosine), 1e-4);
        expect(1 - a.cosine, `${text}: cosine ${a.cosine}`).toBeLessThan(cosTol);
        expect(a.relDiff, `${text}: max |diff| ${a.relDiff} of the largest value (tolerance ${tol})`).toBeLessThan(tol);
        if (process.env.PRIMA_SHOW) console.log(name, text, 1 - a.cosine, a.relDiff, tol);
      }
    }, 120_000);
  }

  it("pooling differs where it should: mean, cls and last of the same rows are different vectors", async () => {
    const m = LocalModel.open(SHIPPED, { threads: 2 });
    const p = new LocalPipeline(m, 64);
    try {
      const ids = Int32Array.from([1, 400, 300, 200, 100]);
      const rows = m.embed(ids);
      await p.forward(rows, 0, ids.length);
      const [mean, cls, last] = (["mean", "cls", "last"] as const).map((k) => poolRows(m, rows, ids.length, k)[0]);
      const none = poolRows(m, rows, ids.length, "none");
      expect(none).toHaveLength(5);
      expect(Array.from(none[0])).toEqual(Array.from(cls));
      expect(Array.from(none[4])).toEqual(Array.from(last));
      for (const [x, y] of [[mean, cls], [mean, last], [cls, last]]) expect(agreement(x, y).cosine).toBeLessThan(0.999);
    } finally {
      p.close();
      m.close();
    }
  });

  it("normalizes as common_embd_normalize", () => {
    const v = Float32Array.from([3, -4, 0]);
    expect(Array.from(normalizeEmbedding(v, 2))).toEqual([Math.fround(3 / 5), Math.fround(-4 / 5), 0]);
    expect(Array.from(normalizeEmbedding(v, -1))).toEqual([3, -4, 0]);
    expect(Array.from(normalizeEmbedding(v, 1))).toEqual([Math.fround(3 * Math.fround(1 / 7)), Math.fround(-4 * Math.fround(1 / 7)), 0]);
    // max absolute: scaled to int16's range
    expect(normalizeEmbedding(v, 0)[1]).toBeCloseTo(-32760, 1);
    expect(Array.from(normalizeEmbedding(new Float32Array(3), 2))).toEqual([0, 0, 0]);
  });
});
