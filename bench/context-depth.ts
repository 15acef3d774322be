// Speed at depth (issue #33: attention over thousands of cached tokens must not fall behind llama.cpp;
// goal >= 1.0x decode, >= 0.9x prompt): prima's engine and llama-bench -d on the same file, with the
// cache holding 512, 2048 and 8192 tokens before the timed prompt (128 tokens) and decode (32 steps),
// F16 and q8_0 caches, flash attention on for llama.cpp (prima's attention is a tiled online softmax).
// `--reps` rounds each, alternating (single rounds swing by up to 1.4x on a shared host), each engine
// filling its cache anew every round. Filling is not timed but takes long: at 8192 several minutes an
// engine on 2 threads each round (`--depths 512,2048` or `--reps 1` for a shorter run).
import { existsSync } from "node:fs";
import type { KvCacheTypes } from "../model/index.js";
import { versusLlamaBench, versusRow } from "./engine.js";
import { ensureLlamaBench } from "./llama-bench.js";
import { root } from "./procs.js";

const TYPES: KvCacheTypes[] = [{ k: "f16", v: "f16" }, { k: "q8_0", v: "q8_0" }];

export async function depthSpeed(threads: number, reps: number, depths: readonly number[], log: (s: string) => void): Promise<void> {
  if (depths.some((d) => !Number.isInteger(d) || d < 1)) throw new Error(`--depths takes whole numbers of tokens (got ${depths.join(",")})`);
  // the families bench's qwen3 (generated there): a real head size (128) and GQA, fast enough to fill 8k
  const path = `${root}.cache/bench-qwen3-0.6b-Q4_K_M.gguf`;
  if (!existsSync(path)) {
    console.log(`\n(speed at depth skipped: ${path.slice(root.length)} is made by \`npm run bench -- --only families\`)`);
    return;
  }
  ensureLlamaBench(log);
  const prompt = 128, decode = 32;
  console.log(`\n## Speed at depth against llama-bench -d (qwen3-0.6b Q4_K_M, ${threads} threads, ${prompt} prompt tokens and ${decode} decode steps after the depth, ${reps} rounds)\n`);
  console.log("| depth, K / V | prima prompt tok/s | llama.cpp prompt tok/s | ratio (goal) | prima decode tok/s | llama.cpp decode tok/s | ratio (goal) |");
  console.log("|---|---|---|---|---|---|---|");
  let build = "";
  for (const depth of depths) {
    for (const kvCacheTypes of TYPES) {
      log(`context: depth ${depth}, K ${kvCacheTypes.k} V ${kvCacheTypes.v}, ${reps} rounds`);
      const { ours, peer } = await versusLlamaBench(path, { threads, prompt, decode, reps, depth, kvCacheTypes });
      build = peer.build;
      console.log(versusRow(`${depth}, ${kvCacheTypes.k} / ${kvCacheTypes.v}`, ours, peer, { pp: 0.9, tg: 1.0 }));
    }
  }
  console.log(`\nllama-bench: -p ${prompt} -n ${decode} -d DEPTH -fa on -ctk/-ctv -t ${threads} -r 1 (${build}), ${reps} rounds alternating with prima's (the means); prima: bench/engine.ts with the cache filled to the depth first`);
}
