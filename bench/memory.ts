// Anonymous memory of a run at full context: the KV cache is filled to the last position (loaded
// from a cache file, which touches every page as a long prompt would), a few tokens are decoded at
// the end of the context, and the process's anonymous RSS (heap, KV, scratch; not the mmap'd
// weights in the page cache) is compared with the KV cache's size.
//   node dist/bench/memory.js model.gguf [ctx]      prints one JSON line
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { LocalModel, Sampler } from "../engine/index.js";
import { layerWeightBytes } from "../model/index.js";
import { anonRssBytes, peakAnonTracker } from "../profiler/index.js";
import { root } from "./procs.js";

export interface MemoryReport {
  readonly model: string;
  readonly ctx: number;
  readonly weightBytes: number;
  readonly kvBytes: number;
  /** Anonymous RSS of the process before the model was opened (Node itself). */
  readonly baselineAnonBytes: number;
  readonly peakAnonBytes: number;
  /** peak - KV: what the engine and Node need besides the cache. */
  readonly overKvBytes: number;
  /** File pages this process maps with 2 MiB pages (the weights, where the page cache holds large
   * folios: native/src/model.c map_weights); 0 where the kernel does not say. */
  readonly hugeMappedBytes: number;
}

function filePmdMappedBytes(): number {
  try {
    const kb = /^FilePmdMapped:\s+(\d+) kB/m.exec(readFileSync("/proc/self/smaps_rollup", "utf8"))?.[1];
    return kb ? Number(kb) * 1024 : 0;
  } catch {
    return 0;
  }
}

/** A KV cache file of the native format (native/src/model.c) holding `filled` positions of zeros. */
function fullCacheFile(dir: string, layers: number, kvDim: number, filled: number): string {
  const path = join(dir, "full.kv");
  const fd = openSync(path, "w");
  const header = Buffer.alloc(24);
  header.writeUInt32LE(0x31564b50, 0); // "PKV1"
  header.writeUInt32LE(1, 4); // F16
  header.writeInt32LE(layers, 8);
  header.writeInt32LE(kvDim, 12);
  header.writeInt32LE(filled, 16);
  header.writeInt32LE(0, 20);
  writeSync(fd, header);
  const zeros = Buffer.alloc(filled * kvDim * 2);
  for (let l = 0; l < 2 * layers; l++) writeSync(fd, zeros);
  closeSync(fd);
  return path;
}

export async function measureMemory(path: string, ctx = 2048): Promise<MemoryReport> {
  const baselineAnonBytes = anonRssBytes();
  const peak = peakAnonTracker();
  const model = LocalModel.open(path, { threads: 2 });
  const h = model.desc.hparams;
  const kvDim = h.nHeadKv * h.headDimK;
  const kvBytes = 2 * h.nLayers * ctx * kvDim * 2;
  const weightBytes = model.desc.tensors.layers.reduce((a, l) => a + layerWeightBytes(l), 0);
  const w = model.window(0, h.nLayers, { ctx });
  const dir = mkdtempSync(join(tmpdir(), "prima-mem-"));
  try {
    w.kvLoad(fullCacheFile(dir, h.nLayers, kvDim, ctx - 4));
    const sampler = new Sampler({ temperature: 0 });
    const logits = new Float32Array(model.nVocab);
    const tok = Int32Array.of(1);
    for (let pos = ctx - 4; pos < ctx; pos++) {
      await w.forward(model.embed(tok), pos, 1, logits);
      tok[0] = sampler.sample(logits);
      peak.sample();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  peak.sample();
  const hugeMappedBytes = filePmdMappedBytes();
  w.close();
  model.close();
  return { model: path, ctx, weightBytes, kvBytes, baselineAnonBytes, peakAnonBytes: peak.peakBytes(), overKvBytes: peak.peakBytes() - kvBytes,
    hugeMappedBytes };
}

export async function main(): Promise<void> {
  const r = await measureMemory(`${root}.cache/bench-llama-Q4_K_M.gguf`, 2048);
  const mib = (b: number) => (b / 2 ** 20).toFixed(1);
  console.log(`\n## memory at full context (${r.ctx} tokens), benchmark model\n`);
  console.log(`| weights (mmap'd) | of which in 2 MiB pages | KV cache | peak anonymous RSS | over the KV cache | goal |`);
  console.log(`|---|---|---|---|---|---|`);
  console.log(`| ${mib(r.weightBytes)} MiB | ${mib(r.hugeMappedBytes)} MiB | ${mib(r.kvBytes)} MiB | ${mib(r.peakAnonBytes)} MiB | ${mib(r.overKvBytes)} MiB | <= 64 MiB |`);
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const [path, ctx] = process.argv.slice(2);
  if (!path) {
    console.error("usage: node dist/bench/memory.js model.gguf [ctx]");
    process.exitCode = 2;
  } else {
    measureMemory(path, ctx ? Number(ctx) : 2048).then((r) => console.log(JSON.stringify(r)));
  }
}
