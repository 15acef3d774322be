// Every family against llama-bench on the same file (issue #28: decode >= 1.0x, prompt >= 0.9x): a
// generated model of each family's real shape, cut to fewer layers where the whole would take minutes
// to generate (the per-layer work and the output layer, which dominate a small model's decode, are the
// real ones), at Q4_K_M, and one IQ4_XS row; and Q8_0 rows of a 1B and a 3B shape of other families than
// the benchmark model's, and of its own (issue #35 asks for both types). Generated once into .cache/.
import { existsSync } from "node:fs";
import { modelShapeByName, type ModelShape } from "../model/index.js";
import { rooflineLine, versusLlamaBench, versusRow } from "./engine.js";
import { ensureLlamaBench } from "./llama-bench.js";
import { root } from "./procs.js";

const CASES: { shape: string; layers?: number; type: string }[] = [
  { shape: "qwen3-0.6b", type: "Q4_K_M" },
  { shape: "qwen3-0.6b", type: "IQ4_XS" },
  { shape: "gemma3-1b", layers: 12, type: "Q4_K_M" },
  { shape: "gemma2-2b", layers: 8, type: "Q4_K_M" },
  { shape: "phi3-mini", layers: 6, type: "Q4_K_M" },
  { shape: "gemma3-1b", layers: 12, type: "Q8_0" },
  { shape: "phi3-mini", layers: 6, type: "Q8_0" },
  { shape: "tinyllama-1.1b", type: "Q8_0" },
];

async function familyModel(shapeName: string, layers: number | undefined, type: string, log: (s: string) => void): Promise<{ path: string; label: string }> {
  const base = modelShapeByName(shapeName);
  if (!base) throw new Error(`no shape ${shapeName}`);
  const shape: ModelShape = layers ? { ...base, name: `${base.name}-${layers}l`, nLayers: layers } : base;
  const label = `${shape.name} (${shape.arch}, ${shape.nLayers} x ${shape.nEmbd}) ${type}`;
  const path = `${root}.cache/bench-${shape.name}-${type}.gguf`;
  if (!existsSync(path)) {
    log(`generating ${path} (once)`);
    const { generateModel } = await import("../modelgen/index.js");
    await generateModel({ shape, type, out: path, seed: 1 });
  }
  return { path, label };
}

export async function main(threads: number, reps: number, log: (s: string) => void): Promise<void> {
  ensureLlamaBench(log);
  const prompt = 128, decode = 64;
  console.log(`\n## families vs llama-bench (${threads} threads, ${reps} reps)\n`);
  console.log("| model | prima prompt tok/s | llama.cpp prompt tok/s | ratio (goal) | prima decode tok/s | llama.cpp decode tok/s | ratio (goal) |");
  console.log("|---|---|---|---|---|---|---|");
  let build = "";
  const roofline: string[] = [];
  for (const c of CASES) {
    const { path, label } = await familyModel(c.shape, c.layers, c.type, log);
    const { ours, peer, readBytesPerS } = await versusLlamaBench(path, { threads, prompt, decode, reps, roofline: true });
    build = peer.build;
    console.log(versusRow(label, ours, peer, { pp: 0.9, tg: 1.0 }));
    roofline.push(rooflineLine(label, path, ours, peer, readBytesPerS));
  }
  console.log(`\nllama-bench: -p ${prompt} -n ${decode} -t ${threads} -r 1, ${reps} rounds alternating with prima's (${build}); prima: the same batch and steps through engine/ (bench/engine.ts)`);
  console.log(`\ndecode against the machine's read bandwidth:\n${roofline.join("\n")}`);
}
