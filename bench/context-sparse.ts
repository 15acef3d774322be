// The context bench's sparse-attention part (--attention sparse): perplexity delta and KL divergence
// against the exact F16 model on chunks longer than the window (test/fixtures/story.txt, chunks of 384:
// the scored second half of each lies beyond a 128-token window), KV bytes per token with the landmarks,
// and the cost curve of one query's attention at depths up to 16k, dense against sparse, on the kernel
// the windows run (one KV head, F16 cache, head size 128, 4 query heads sharing it). The curve is speed:
// figures from a loaded machine are ratios to read with care.
import { describeModel, kvBytesPerTokenLayer, readGguf, type SparseAttention } from "../model/index.js";
import { kvAttendBench, kvStore, rowBytes, sparseLandmarks, sparseSelect } from "../native/index.js";
import { median } from "./procs.js";

export interface KlReport {
  ppl: number;
  kl: { pplBase: number; lnPplRatio: number; meanKld: number; sameTop: number };
}

const SETTINGS: SparseAttention[] = [
  { window: 128, sinks: 4, logStride: true, block: 64 },
  { window: 64, sinks: 4, logStride: true, block: 32 },
  { window: 128, sinks: 4, logStride: false, block: 0 },
];

const flags = (a: SparseAttention) => ["--attention", "sparse", "--sparse-window", String(a.window), "--sparse-sinks", String(a.sinks),
  "--sparse-log-stride", a.logStride ? "on" : "off", "--sparse-block", String(a.block)];

export async function sparseQuality(models: { name: string; path: string }[], text: string, common: (path: string) => string[], base: string,
  perplexity: (args: string[]) => Promise<KlReport>, log: (s: string) => void): Promise<void> {
  console.log(`\n## Sparse attention: quality against dense F16 attention (chunks of 384: the scored second half lies beyond a window of 128 or less; 384 so that the 775 tokens qwen3 makes of the text hold the two chunks perplexity needs)\n`);
  console.log("| model | attention | KV bytes per token | PPL | PPL delta | mean KL divergence | same top token |");
  console.log("|---|---|---|---|---|---|---|");
  for (const m of models) {
    const hp = describeModel(readGguf(m.path)).hparams;
    const args = [...common(m.path), "-c", "384"];
    log(`context: ${m.name}, dense, chunks of 384`);
    const dense = await perplexity([...args, "-f", text, "--kl-divergence-base", base]);
    console.log(`| ${m.name} | dense | ${kvBytesPerTokenLayer(hp) * hp.nLayers} | ${dense.ppl.toFixed(4)} | (base) | | |`);
    for (const a of SETTINGS) {
      log(`context: ${m.name}, sparse ${JSON.stringify(a)}`);
      const r = await perplexity([...args, "--kl-divergence-base", base, "--kl-divergence", ...flags(a)]);
      const delta = 100 * (r.ppl / r.kl.pplBase - 1);
      const bytes = kvBytesPerTokenLayer(hp, { k: "f16", v: "f16", attention: a }) * hp.nLayers;
      console.log(`| ${m.name} | sparse w${a.window} s${a.sinks}${a.logStride ? " log" : ""} b${a.block} | ${bytes} | ${r.ppl.toFixed(4)} | ${delta >= 0 ? "+" : ""}${delta.toFixed(3)}% | ${r.kl.meanKld.toExponential(2)} | ${(100 * r.kl.sameTop).toFixed(1)}% |`);
    }
  }
}

/** Microseconds of one call: the median of 7 native loops of 20 ms. */
function timeUs(f: () => number): number {
  return median(Array.from({ length: 7 }, f));
}

export function attentionCurve(): void {
  const d = 128, ratio = 4, a = SETTINGS[0], depths = [512, 1024, 2048, 4096, 8192, 16384];
  const max = depths.at(-1)!, row = rowBytes("F16", d);
  const k = new Uint8Array(row * max), v = new Uint8Array(row * max), x = new Float32Array(d);
  for (let p = 0; p < max; p++) {
    for (let i = 0; i < d; i++) x[i] = Math.sin(p * 0.37 + i * 1.3) + 0.3 * Math.cos(p * 0.011 * i);
    kvStore("F16", x, k.subarray(p * row, (p + 1) * row));
    for (let i = 0; i < d; i++) x[i] = Math.cos(p * 0.21 + i * 0.7);
    kvStore("F16", x, v.subarray(p * row, (p + 1) * row));
  }
  const q = Float32Array.from({ length: ratio * d }, (_, i) => Math.sin(i * 0.9));
  console.log(`\n## Sparse attention: one query's attention at depth N (F16 cache, head size ${d}, ${ratio} query heads per KV head; window ${a.window}, sinks ${a.sinks}, log-stride, landmarks of ${a.block})\n`);
  console.log("| depth N | entries read, dense | sparse | dense µs | sparse µs | sparse speed-up |");
  console.log("|---|---|---|---|---|---|");
  for (const n of depths) {
    const i = n - 1, sel = sparseSelect(a, i);
    const lm = sparseLandmarks("F16", "F16", k, v, sel.blocks, d, a.block);
    const entries = sel.sinkEnd + sel.rungs.length + sel.blocks + (i + 1 - sel.windowStart);
    const dense = timeUs(() => kvAttendBench("F16", "F16", k, v, i, ratio, d, q, 0.088, null));
    const sparse = timeUs(() => kvAttendBench("F16", "F16", k, v, i, ratio, d, q, 0.088, a, lm));
    console.log(`| ${n} | ${n} | ${entries} | ${dense.toFixed(1)} | ${sparse.toFixed(1)} | ${(dense / sparse).toFixed(1)}x |`);
  }
  console.log("\nA prompt of N tokens costs the sum of its queries' attention: dense grows as N², sparse as N (window + sinks + log N + N / block).");
}
