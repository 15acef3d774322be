// Anonymous memory of a run at full context: the KV cache is filled to the last position (loaded
// from a cache file, which touches every page as a long prompt would), a few tokens are decoded at
// the end of the context, and the process's anonymous RSS (heap, KV, scratch; not the mmap'd
// weights in the page cache) is compared with the KV cache's size.
//   node dist/bench/memory.js model.gguf [ctx [ctk ctv]]   prints one JSON line (ctk/ctv: the KV cache's types)
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { LocalModel, Sampler } from "../engine/index.js";
import { DEFAULT_KV_CACHE_TYPES, kvBytesPerTokenLayer, kvCacheGgmlType, kvCacheRotated, parseKvCacheType, layerWeightBytes, rowBytes, type KvCacheTypes } from "../model/index.js";
import { anonRssBytes, peakAnonTracker } from "../profiler/index.js";
import { root } from "./procs.js";

export interface MemoryReport {
  readonly model: string;
  readonly ctx: number;
  readonly weightBytes: number;
  readonly kvBytes: number;
  readonly kvCacheTypes: KvCacheTypes;
  /** The window's own count of its KV cache, and of its KV cache and scratch (NativeWindow.info()). */
  readonly windowKvBytes: number;
  readonly windowAnonBytesInfo: number;
  /** Measured: anonymous RSS once the window's cache was filled, less before the window was made. */
  readonly windowAnonBytes: number;
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

/** A KV cache file of the native format (native/src/model.c) holding `filled` positions of zeros (zero
 * blocks are valid Q8_0/Q4_0 blocks too). */
function fullCacheFile(dir: string, layers: number, kvDim: number, filled: number, types: KvCacheTypes): string {
  const k = kvCacheGgmlType(types.k), v = kvCacheGgmlType(types.v);
  const code = (k === v ? k : k | (v << 8)) | (kvCacheRotated(types.k) ? 1 << 16 : 0) | (kvCacheRotated(types.v) ? 1 << 17 : 0);
  const path = join(dir, "full.kv");
  const fd = openSync(path, "w");
  const header = Buffer.alloc(24);
  header.writeUInt32LE(0x31564b50, 0); // "PKV1"
  header.writeUInt32LE(code, 4); // the cache's types (native/src/model.c kv_type_code)
  header.writeInt32LE(layers, 8);
  header.writeInt32LE(kvDim, 12);
  header.writeInt32LE(filled, 16);
  header.writeInt32LE(0, 20);
  writeSync(fd, header);
  const kRows = Buffer.alloc(filled * rowBytes(k, kvDim)), vRows = Buffer.alloc(filled * rowBytes(v, kvDim));
  for (let l = 0; l < layers; l++) {
    writeSync(fd, kRows);
    writeSync(fd, vRows);
  }
  closeSync(fd);
  return path;
}

export async function measureMemory(path: string, ctx = 2048, kvCacheTypes: KvCacheTypes = DEFAULT_KV_CACHE_TYPES): Promise<MemoryReport> {
  const baselineAnonBytes = anonRssBytes();
  const peak = peakAnonTracker();
  const model = LocalModel.open(path, { threads: 2 });
  const h = model.desc.hparams;
  const kvDim = h.nHeadKv * h.headDimK;
  const kvBytes = kvBytesPerTokenLayer(h, kvCacheTypes) * h.nLayers * ctx;
  const weightBytes = model.desc.tensors.layers.reduce((a, l) => a + layerWeightBytes(l), 0);
  // (with node --expose-gc, collected garbage does not blur the window's own memory)
  const settled = () => ((globalThis as { gc?: () => void }).gc?.(), anonRssBytes());
  for (let i = 0; i < 3; i++) {
    settled();
    await new Promise((r) => setTimeout(r, 20)); // V8 gives freed pages back between tasks
  }
  const beforeWindow = settled();
  let windowAnonBytes = 0;
  const w = model.window(0, h.nLayers, { ctx, kvCacheTypes });
  const dir = mkdtempSync(join(tmpdir(), "prima-mem-"));
  try {
    const file = fullCacheFile(dir, h.nLayers, kvDim, ctx - 4, kvCacheTypes);
    w.kvLoad(file);
    windowAnonBytes = settled() - beforeWindow;
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
  const info = w.info();
  const hugeMappedBytes = filePmdMappedBytes();
  w.close();
  model.close();
  return { model: path, ctx, weightBytes, kvBytes, kvCacheTypes, windowKvBytes: info.kvBytes, windowAnonBytesInfo: info.anonBytes, windowAnonBytes, baselineAnonBytes, peakAnonBytes: peak.peakBytes(), overKvBytes: peak.peakBytes() - kvBytes,
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
  const [path, ctx, ctk, ctv] = process.argv.slice(2);
  if (!path) {
    console.error("usage: node dist/bench/memory.js model.gguf [ctx]");
    process.exitCode = 2;
  } else {
    const types = { k: parseKvCacheType("cache type K", ctk ?? "f16"), v: parseKvCacheType("cache type V", ctv ?? ctk ?? "f16") };
    measureMemory(path, ctx ? Number(ctx) : 2048, types).then((r) => console.log(JSON.stringify(r)));
  }
}
