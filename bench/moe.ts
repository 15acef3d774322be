// Mixture of experts on one device against llama-bench on the same file: a mid-size qwen3moe shape
// (32 experts of which a token uses 4) at Q4_K_M. A token reads about a seventh of each layer, so the
// decode is bound by how well the expert matmuls read only the routed rows; the prompt batches tokens by
// expert. Goals (issue #29): decode >= 1.0x, prompt >= 0.9x. Then the same model on three memory-capped
// loopback devices (cappedMoe, root): automatic >= 0.95x the best hand-made plan, >= 5x prima alone.
import { existsSync } from "node:fs";
import type { ModelShape } from "../model/index.js";
import { versusLlamaBench, versusRow } from "./engine.js";
import { cappedSetup, cappedUnavailable } from "./capped.js";
import { ensureLlamaBench } from "./llama-bench.js";
import { root, useTemporaryHome } from "./procs.js";

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
  await cappedMoe(path, reps, log);
}

/** The paper's headline for MoE: the model on three loopback devices in memory cgroups whose caps sum
 * to about 1.2x its size (as capped's 3 x 256 MiB for the dense model), none able to hold it: the
 * automatic plan (routing measured), with the expert prefetch and with uniform routing, against a sweep of hand-made plans, prima alone
 * and llama-bench alone in one such cgroup (bench/capped.ts; root). */
export async function cappedMoe(model: string, reps: number, log: (s: string) => void, cap = MOE_CAP_MIB): Promise<void> {
  const why = cappedUnavailable();
  if (why) {
    console.log(`\n## capped MoE devices: skipped (${why})`);
    return;
  }
  log(`capped MoE: 3 x ${cap} MiB, ${reps} rounds`);
  const sweep = [[4, 4, 4], [5, 4, 3], [4, 5, 3], [3, 4, 5], [6, 4, 2]];
  console.log(`\n${await cappedSetup(model, { name: "MoE benchmark model (qwen3moe 12 x 1024, 32 experts, 4 used)", cap, sweep, reps, aloneGoal: true, moe: true, nPredict: MOE_CAPPED_TOKENS, autoVariants: [{ name: "--expert-prefetch", flags: ["--expert-prefetch"] }, { name: "--uniform-routing", flags: ["--uniform-routing"] }] })}`);
}

/** Each device's cap for the capped MoE setup: three sum to about 1.2x the model's 411 MiB. */
const MOE_CAP_MIB = 170;
/** Decode tokens a capped MoE run times: at ~160 tok/s the dense setups' 48 took 0.3 s, and a plan's
 * rounds spread 141-178 tok/s (2026-11-29); a longer run is less at the mercy of one slow spell. */
const MOE_CAPPED_TOKENS = 160;

// node dist/bench/moe.js --capped [reps]: only the capped setup (root), its profiles and plans in a
// temporary home as the whole bench keeps them
if (process.argv[2] === "--capped") {
  useTemporaryHome();
  void moeModel(console.error).then((path) => cappedMoe(path, Number(process.argv[3] ?? 3), console.error));
}
