// The engine's own forward pass, timed on this device, on a stand-in of the model's first layers: a
// sparse GGUF with the model's tensor types and shapes whose weights are holes (zeros, no disk, no
// download: a worker that fetches only its window has no layers yet). A window's one-token pass costs
// more than its matmuls (norms, RoPE, attention, quantizing activations, the threads' barriers): the
// kernel timings alone predicted 0.50 ms a layer of the benchmark model where the ring's devices ran
// 0.66. The profile scales its FLOP/s so that Halda's layer time is this pass's (profile.ts). Written
// out instead and dropped layer by layer, the same layers give the speed an overloaded device rereads
// its streamed layers at: faults through the weights' mapping between the matmuls (3.1-3.3 GB/s on
// this project's VM, where 8 MiB reads of a scratch file got 2.6-2.9).
import { rmSync } from "node:fs";
import { join } from "node:path";
import { LocalModel } from "../engine/index.js";
import { dropFileCache } from "../native/profile.js";
import { GgufValueType, writeGguf, type GgufFile, type GgufKV, type GgufTensorToWrite, type ModelDescription } from "../model/index.js";
import { RING_COMPUTE_OPTIONS } from "../ring/index.js";
import { layerSteps, stepFlops, stepKey, type StepTiming } from "./compute.js";

/** A window's one-token pass over the stand-in's layers, as a ring device runs it. */
export interface ForwardTiming {
  /** Layers in the window (the model's first ones). */
  readonly layers: number;
  /** Median ms of a one-token pass through them after an idle gap. */
  readonly windowMs: number;
  /** Median ms of a pass that reads every layer from the disk and drops it once computed (streamed). */
  readonly streamedMs?: number;
  /** Weight bytes such a pass reads. */
  readonly streamedBytes?: number;
}

/** The forward timing and what it did to the kernels' FLOP/s (DeviceDetails.forward). */
export interface ForwardCalibration extends ForwardTiming {
  /** ms the kernel timings give the same layers' matmuls. */
  readonly kernelMs: number;
  /** (windowMs - window call - KV writes) / kernelMs: the kernels' FLOP/s were divided by it. */
  readonly scale: number;
  /** False when the scale was implausible and the kernels' FLOP/s were used as timed. */
  readonly applied: boolean;
  /** streamedBytes over the time streaming added to a pass: the profile's diskSeqReadBytesPerS. */
  readonly streamedBytesPerS?: number;
}

/** Rows the stand-in's embedding and output keep: they are never run, only described. */
const STAND_IN_VOCAB = 32;

/** Layers worth timing: the model's first ones until they hold `minBytes` (past the last-level cache,
 * so that the weights stream from memory as a real window's do), within `budgetBytes` of page cache; 0
 * if not one layer fits. */
export function standInLayers(desc: ModelDescription, minBytes: number, budgetBytes: number): number {
  const layerBytes = (i: number) => Object.values(desc.tensors.layers[i]).reduce((s, t) => s + (t?.nBytes ?? 0), 0);
  let n = 0, bytes = 0;
  while (n < desc.tensors.layers.length && bytes < minBytes && bytes + layerBytes(n) <= budgetBytes) bytes += layerBytes(n++);
  return n;
}

/** Cache key of a forward timing: the layers' matmul steps (types and shapes) and the attention's shape. */
export function forwardKey(desc: ModelDescription, layers: number): string {
  const hp = desc.hparams;
  const steps = desc.tensors.layers.slice(0, layers).map((l) => layerSteps(l).map(stepKey).join("+"));
  return `${hp.arch}:${hp.nEmbd}:${hp.nHead}/${hp.nHeadKv}:${hp.headDimK}${hp.hasQkvBias ? ":bias" : ""}|${steps.join("|")}`;
}

/** Writes the stand-in of the model's first `layers` layers to `path`: its header's metadata (less the
 * tokenizer) and tensors; norms and RoPE factors are ones (zeros would make them divide by zero), the
 * layers' weights zeros, as holes (no disk) or written out (`onDisk`: to be read back from the disk),
 * the embedding and output holes. */
export function writeStandIn(gguf: GgufFile, desc: ModelDescription, layers: number, path: string, onDisk = false): void {
  const arch = desc.hparams.arch;
  const metadata: GgufKV[] = [];
  for (const m of gguf.metadata.values()) {
    if (m.key.startsWith("tokenizer.")) continue;
    metadata.push(m.key === `${arch}.block_count` ? { key: m.key, type: GgufValueType.UINT32, value: layers } : m);
  }
  const ones = (n: number) => new Uint8Array(new Float32Array(n).fill(1).buffer);
  const tensors: GgufTensorToWrite[] = [];
  for (const t of gguf.tensors) {
    const layer = /^blk\.(\d+)\./.exec(t.name);
    if (layer && Number(layer[1]) >= layers) continue;
    const vocabRows = t.name === "token_embd.weight" || t.name === "output.weight";
    const dims = vocabRows ? [t.dims[0], STAND_IN_VOCAB] : t.dims;
    const scale = /_norm\.weight$/.test(t.name) || t.name === "rope_freqs.weight";
    tensors.push({ name: t.name, dims, type: t.type, data: scale ? ones(t.nElements) : layer && onDisk ? () => new Uint8Array(t.nBytes) : null });
  }
  writeGguf(path, metadata, tensors, gguf.alignment);
}

export interface ForwardOptions {
  /** Where the stand-in is written: the model's own disk, when its speed is wanted. */
  readonly dir: string;
  readonly threads: number;
  readonly passes: number;
  readonly gapMs: number;
  /** Also time passes that read every layer back from the disk, as a window streamed past its room
   * does (ForwardTiming.streamedMs): the layers are written out rather than left as holes. */
  readonly streamed?: boolean;
}

/** Times the engine's one-token pass through the stand-in's `layers` layers, each pass after the idle gap
 * a ring device has between its passes: the median of `passes` with the layers in memory, and (with
 * `streamed`) of passes that drop each layer once computed, so that the next pass reads it again. */
export async function timeForward(gguf: GgufFile, desc: ModelDescription, layers: number, o: ForwardOptions): Promise<ForwardTiming> {
  const path = join(o.dir, `prima-forward-${process.pid}.gguf`);
  try {
    writeStandIn(gguf, desc, layers, path, o.streamed);
    if (o.streamed) dropFileCache(path); // written back, and its pages dropped: the first pass reads the disk
    const model = LocalModel.open(path, { threads: o.threads, ...RING_COMPUTE_OPTIONS });
    try {
      const warmup = 3, n = warmup + o.passes, nStreamed = o.streamed ? 1 + Math.ceil(o.passes / 3) : 0;
      const w = model.window(0, layers, { ctx: n + nStreamed + 1, maxBatch: 1 });
      try {
        // Activations of a real model's scale: the first norm makes them the next layers' input.
        const input = Float32Array.from({ length: model.nEmbd }, (_, i) => Math.sin(i * 0.7) * 0.5);
        const acts = new Float32Array(model.nEmbd);
        let pos = 0;
        const medianOf = async (count: number, skip: number) => {
          const ms: number[] = [];
          for (let i = 0; i < count; i++, pos++) {
            acts.set(input);
            await new Promise((r) => setTimeout(r, o.gapMs));
            const t0 = performance.now();
            w.forwardNow(acts, pos, 1);
            if (i >= skip) ms.push(performance.now() - t0);
          }
          return median(ms);
        };
        const windowMs = await medianOf(n, warmup);
        if (!o.streamed) return { layers, windowMs };
        const bytes = w.residency().totalBytes;
        w.streamBeyond(0); // no room: every layer goes once computed (the first such pass still finds them)
        const streamedMs = await medianOf(nStreamed, 1);
        return { layers, windowMs, streamedMs, streamedBytes: bytes };
      } finally {
        w.close();
      }
    } finally {
      model.close();
    }
  } finally {
    rmSync(path, { force: true });
  }
}

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b), mid = s.length >> 1;
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

/** ms the kernel timings give the matmuls of the model's first `layers` layers. */
export function kernelWindowMs(desc: ModelDescription, layers: number, timings: ReadonlyMap<string, StepTiming>): number {
  let ms = 0;
  for (const l of desc.tensors.layers.slice(0, layers)) {
    for (const step of layerSteps(l)) {
      const t = timings.get(stepKey(step));
      if (!t) throw new Error(`no kernel timing for ${stepKey(step)}`);
      ms += (1000 * stepFlops(step.matrices)) / t.flopsPerS;
    }
  }
  return ms;
}

/** A forward pass this far from the kernels' prediction is a broken measurement, not overhead. */
const MIN_FORWARD_SCALE = 0.25, MAX_FORWARD_SCALE = 8;

/** What a timing makes of the kernels' figures: one factor on their FLOP/s so that a layer's time in
 * Halda (its matmuls at the kernels' FLOP/s, and its KV write) plus the window call Halda adds per
 * window is the pass's; the types keep the kernels' proportions. And the disk speed of rereads: the
 * weight bytes over what streaming added to a pass. */
export function calibrateForward(t: ForwardTiming, kernelMs: number, windowCallMs: number, kvCopyMs: number): ForwardCalibration {
  const scale = (t.windowMs - windowCallMs - t.layers * kvCopyMs) / kernelMs;
  const readMs = (t.streamedMs ?? 0) - t.windowMs;
  const streamedBytesPerS = t.streamedBytes && readMs > 0 ? (1000 * t.streamedBytes) / readMs : undefined;
  return { ...t, kernelMs, scale, applied: scale > MIN_FORWARD_SCALE && scale < MAX_FORWARD_SCALE, ...(streamedBytesPerS ? { streamedBytesPerS } : {}) };
}
