// Mixture of experts on one device against llama-bench on the same file: a mid-size qwen3moe shape
// (32 experts of which a token uses 4) at Q4_K_M. A token reads about a seventh of each layer, so the
// decode is bound by how well the expert matmuls read only the routed rows; the prompt batches tokens by
// expert. Goals (issue #29): decode >= 1.0x, prompt >= 0.9x.
import { existsSync } from "node:fs";
import type { ModelShape } from "../model/index.js";
import { versusLlamaBench, versusRow } from "./engine.js";
import { ensureLlamaBench } from "./llama-bench.js";
import { root } from "./procs.js";

/** 12 layers of 1024 with 32 experts of 512 (4 used): ~0.7 B parameters, ~0.14 B active a token. */
export const BENCH_MOE_SHAPE: ModelShape = {
  name: "bench-qwen3moe", arch: "qwen3moe", nEmbd: 1024, nLayers: 12, nHead: 16, nHeadKv: 4, headDim: 64, nFf: 3072, nVocab: 32000,
  tiedEmbeddings: false, qkvBias: false, contextLength: 4096, ropeFreqBase: 1000000, normEps: 1e-6, defaultVocab: "llama-spm",
  nExpert: 32, nExpertUsed: 4, nFfExp: 512,
};

async function moeModel(log: (s: string) => void): Promise<string> {
  const path = `${root}.cache/bench-qwen3moe-Q4_K_M.gguf`;
  if (existsSync(path)) return path;
  log(`generating the MoE benchmark model at ${path} (once)`);
  const { generateModel } = await import("../modelgen/index.js");
  await generateModel({ shape: BENCH_MOE_SHAPE, type: "Q4_K_M", out: path, vocab: "llama-spm", seed: 1 });
  return path;
}

export async function main(threads: number, reps: number, log: (s: string) => void): Promise<void> {
  ensureLlamaBench(log);
  const path = await moeModel(log);
  const prompt = 128, decode = 64;
  const { ours, peer } = await versusLlamaBench(path, { threads, prompt, decode, reps });
  console.log(`\n## mixture of experts vs llama-bench (${threads} threads, ${reps} reps)\n`);
  console.log("| model | prima prompt tok/s | llama.cpp prompt tok/s | ratio (goal) | prima decode tok/s | llama.cpp decode tok/s | ratio (goal) |");
  console.log("|---|---|---|---|---|---|---|");
  console.log(versusRow("qwen3moe 12x1024, 32 experts (4 used) Q4_K_M", ours, peer, { pp: 0.9, tg: 1.0 }));
  console.log(`\nllama-bench: -p ${prompt} -n ${decode} -t ${threads} -r 1, ${reps} rounds alternating with prima's (${peer.build}); prima: the same batch and steps through engine/ (bench/engine.ts)`);
}
