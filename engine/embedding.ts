// Embeddings as llama.cpp computes them (src/llama-graph.cpp build_pooling, tools/server): the final
// hidden state of every token (after the output norm, where the head would read it: llama.cpp's
// t_embd), pooled over the sequence, then scaled as common_embd_normalize does (the server's L2 by
// default). A pass from position 0 updates the activations in place (Pipeline.forward), so the rows are
// whatever device ran the last window: this device, or the ring's last one (ring/'s pipeline).
import type { ModelDescription } from "../model/index.js";
import { metaBool, metaNumber, type GgufFile } from "../model/index.js";
import type { LocalModel } from "./local-model.js";

/** llama.cpp's pooling types (enum llama_pooling_type), but rank: no classifier head runs here. */
export type Pooling = "none" | "mean" | "cls" | "last";
export const POOLINGS: readonly Pooling[] = ["none", "mean", "cls", "last"];
const GGUF_POOLING: Readonly<Record<number, Pooling | "rank">> = { 0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank" };

export class EmbeddingError extends Error {
  override name = "EmbeddingError";
}

/**
 * The pooling a model's embeddings use: `--pooling` when given, else the file's `<arch>.pooling_type`,
 * else "last" (a generative model's file has none: llama.cpp then pools nothing and its server refuses
 * OpenAI embeddings without --pooling; node-llama-cpp's embedding context reads the last token's row, as
 * this does). Throws EmbeddingError naming what the engine cannot do: rank pooling (a classifier head),
 * attention that is not causal.
 */
export function embeddingPooling(gguf: GgufFile, desc: ModelDescription, chosen?: Pooling): { pooling: Pooling; source: string } {
  const arch = desc.hparams.arch;
  if (metaBool(gguf, `${arch}.attention.causal`) === false) {
    throw new EmbeddingError(`the model's attention is not causal (${arch}.attention.causal = false): this engine runs causal attention only`);
  }
  if (chosen) return { pooling: chosen, source: "--pooling" };
  const key = `${arch}.pooling_type`;
  const v = metaNumber(gguf, key);
  if (v === undefined) return { pooling: "last", source: `the default: the file has no ${key}` };
  const p = GGUF_POOLING[v];
  if (p === undefined) throw new EmbeddingError(`${key} = ${v} is not a pooling type llama.cpp knows (0 none, 1 mean, 2 cls, 3 last, 4 rank)`);
  if (p === "rank") throw new EmbeddingError(`${key} = 4 (rank) scores pairs with a classifier head, which this engine does not run`);
  return { pooling: p, source: `the file's ${key}` };
}

/**
 * The pooled vectors of one sequence's final rows (n rows of nEmbd, as a pass from position 0 left
 * them): the output norm of each row, then llama.cpp's pooling: mean (over the rows), cls (the first
 * row), last (the last), none (every row, one vector each).
 */
export function poolRows(model: LocalModel, rows: Float32Array, nTokens: number, pooling: Pooling): Float32Array[] {
  const E = model.nEmbd;
  if (nTokens < 1 || rows.length < nTokens * E) throw new EmbeddingError(`pooling needs ${nTokens} whole rows of ${E}`);
  const normed = (from: number, to: number) => {
    const out = new Float32Array((to - from) * E);
    model.native.outputNorm(rows.subarray(from * E, to * E), out);
    return out;
  };
  switch (pooling) {
    case "cls":
      return [normed(0, 1)];
    case "last":
      return [normed(nTokens - 1, nTokens)];
    case "none": {
      const all = normed(0, nTokens);
      return Array.from({ length: nTokens }, (_, i) => all.slice(i * E, (i + 1) * E));
    }
    case "mean": {
      // ggml's mul_mat of the rows by a 1/n column: each sum in f32, the weight applied per term
      const all = normed(0, nTokens);
      const out = new Float32Array(E);
      const w = Math.fround(1 / nTokens);
      for (let r = 0; r < nTokens; r++) for (let i = 0; i < E; i++) out[i] += all[r * E + i] * w;
      return [out];
    }
  }
}

/**
 * A vector scaled as llama.cpp's common_embd_normalize: -1 none, 0 max absolute (to int16's range),
 * 2 Euclidean (L2, the server's default), any other p > 0 the p-norm. The sum in double; a zero vector
 * stays zero.
 */
export function normalizeEmbedding(v: Float32Array, norm: number): Float32Array {
  let sum = 0;
  if (norm === -1) sum = 1;
  else if (norm === 0) {
    for (const x of v) sum = Math.max(sum, Math.abs(x));
    sum /= 32760;
  } else if (norm === 2) {
    for (const x of v) sum += Math.fround(x * x);
    sum = Math.sqrt(sum);
  } else {
    for (const x of v) sum += Math.abs(x) ** norm;
    sum = sum ** (1 / norm);
  }
  const scale = Math.fround(sum > 0 ? 1 / sum : 0);
  return v.map((x) => x * scale);
}
