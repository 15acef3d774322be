// npm run bench -- --only context: what each KV cache type (--cache-type-k/-v) costs and saves. Per
// model: KV bytes per token of context (the rule, model/kv-cache.ts, which the native window allocates)
// and, with `prima-coord perplexity --kl-divergence` on test/fixtures/story.txt against the F16 cache's
// log-probabilities, the perplexity delta and KL divergence of q8_0 and q4_0, plain and rotated by a
// Hadamard matrix (q8_0-rot, q4_0-rot, as llama.cpp rotates a quantized cache). Quality, not speed: the
// figures do not depend on the machine's load. Then sparse attention (context-sparse.ts): its quality on
// longer chunks and its cost curve against dense attention (speed: that one depends on the load). The
// engine's speed at depth against llama-bench -d is its own part, `--only depth` (context-depth.ts).
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describeModel, kvBytesPerTokenLayer, kvCacheProblem, readGguf, type KvCacheTypes } from "../model/index.js";
import { h2oQuality } from "./context-h2o.js";
import { attentionCurve, sparseQuality, type KlReport } from "./context-sparse.js";
import { generateModel, padHeads } from "../modelgen/index.js";
import { coordCli, root, start } from "./procs.js";

const TEXT = `${root}test/fixtures/story.txt`;
const TYPES: KvCacheTypes[] = [
  { k: "q8_0", v: "q8_0" }, { k: "q8_0", v: "q4_0" }, { k: "q4_0", v: "q4_0" }, { k: "q8_0-rot", v: "q8_0-rot" }, { k: "q4_0-rot", v: "q4_0-rot" },
];


async function perplexity(args: string[]): Promise<KlReport> {
  const p = start(coordCli, ["perplexity", ...args, "--json"]);
  const code = await p.exited;
  if (code !== 0) throw new Error(`prima-coord perplexity ${args.join(" ")} failed (${code}): ${p.err.slice(-500)}`);
  return JSON.parse(p.out.trim().split("\n").at(-1)!) as KlReport;
}

/** A model with a head size quantized caches can hold (the shipped model's is 8): generated once. */
async function contextModel(): Promise<string> {
  const path = `${root}.cache/bench-context-small-llama-Q8_0.gguf`;
  if (!existsSync(path)) {
    await generateModel({ shape: "small-llama", type: "Q8_0", out: path, seed: 1, weightStd: 0.08 });
  }
  return path;
}

export async function main(threads: number, log: (s: string) => void): Promise<void> {
  const models = [
    { name: "stories260K (shipped)", path: `${root}models/stories260K.gguf` },
    { name: "small-llama Q8_0 (generated, head size 64)", path: await contextModel() },
    // the families bench's model, where it has been generated
    { name: "qwen3-0.6b Q4_K_M (generated, head size 128)", path: `${root}.cache/bench-qwen3-0.6b-Q4_K_M.gguf` },
  ].filter((m) => existsSync(m.path));
  const dir = mkdtempSync(join(tmpdir(), "prima-bench-context-"));
  // The shipped model's trained weights with heads a quantized cache can hold (the same function: their
  // F16 rows equal the shipped model's), so the cache types are measured on trained weights too: at 32
  // a block holds 8 of a head's values (and the rotation, over 64, is refused), at 64 it holds 4.
  const padded = [32, 64].map((hd) => ({
    name: `stories260K, heads padded to ${hd} (trained, the same function)`, path: padHeads(models[0].path, join(dir, `stories260K-hd${hd}.gguf`), hd).out,
  }));
  console.log(`\n## KV cache types: bytes and quality against the F16 cache (${TEXT.slice(root.length)}, chunks of 128)\n`);
  console.log("| model | K / V | KV bytes per token | of F16 | PPL | PPL delta | mean KL divergence | same top token |");
  console.log("|---|---|---|---|---|---|---|---|");
  try {
    for (const m of [models[0], ...padded, ...models.slice(1)]) {
      const hp = describeModel(readGguf(m.path)).hparams;
      const f16Bytes = kvBytesPerTokenLayer(hp) * hp.nLayers;
      const base = join(dir, "base.kld");
      log(`context: ${m.name}, F16 cache`);
      const common = [m.path, "-c", "128", "-t", String(threads)];
      const f16 = await perplexity([...common, "-f", TEXT, "--kl-divergence-base", base]);
      console.log(`| ${m.name} | f16 / f16 | ${f16Bytes} | 100% | ${f16.ppl.toFixed(4)} | (base) | | |`);
      for (const types of TYPES) {
        const bytes = kvBytesPerTokenLayer(hp, types) * hp.nLayers;
        const problem = kvCacheProblem(hp, types);
        if (problem) {
          console.log(`| ${m.name} | ${types.k} / ${types.v} | ${bytes} | ${(100 * bytes / f16Bytes).toFixed(0)}% | refused: ${problem} | | | |`);
          continue;
        }
        log(`context: ${m.name}, K ${types.k} V ${types.v}`);
        const r = await perplexity([...common, "--kl-divergence-base", base, "--kl-divergence", "-ctk", types.k, "-ctv", types.v]);
        const delta = 100 * (r.ppl / r.kl.pplBase - 1);
        console.log(`| ${m.name} | ${types.k} / ${types.v} | ${bytes} | ${(100 * bytes / f16Bytes).toFixed(0)}% | ${r.ppl.toFixed(4)} | ${delta >= 0 ? "+" : ""}${delta.toFixed(3)}% | ${r.kl.meanKld.toExponential(2)} | ${(100 * r.kl.sameTop).toFixed(1)}% |`);
      }
    }
    await sparseQuality(models, TEXT, (path) => [path, "-t", String(threads)], join(dir, "base512.kld"), perplexity, log);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  await h2oQuality(models, TEXT, threads, log);
  attentionCurve();
  console.log("\nKV bytes per token: every layer's K and V rows in their types (model/kv-cache.ts; test/engine/kv-types.test.ts measures the same in the process's memory). Generated models have random weights: their perplexity is high, the delta and KL divergence still measure how far a cache type moves the model from its F16 cache. The padded stories260K rows are trained weights (modelgen/pad-heads.ts): llama.cpp with the same cache types gives the same perplexities (test/engine/perplexity.test.ts).");
}
