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
import type { NativeWindow } from "../native/index.js";
import { dropFileCache } from "../native/index.js";
import { GgufValueType, layerWeightBytes, writeGguf, type GgufFile, type GgufKV, type GgufTensorToWrite, type ModelDescription } from "../model/index.js";
import { RING_COMPUTE_OPTIONS } from "../ring/index.js";
import { layerSteps, stepFlops, stepKey, type StepTiming } from "./compute.js";
import { timeHandOff } from "./link.js";
import { removeLeftOverScratch } from "./scratch-files.js";

/** A window's one-token pass over the stand-in's layers, as a ring device runs it. */
export interface ForwardTiming {
  /** Layers in the window (the model's first ones). */
  readonly layers: number;
  /** Median ms of a one-token pass through them after an idle gap. */
  readonly windowMs: number;
  /** Layers of the streamed passes (the model's first ones): they need no room, so they may be more
   * than `layers`. */
  readonly streamedLayers?: number;
  /** Median ms of a pass through them that reads every layer from the disk and drops it once computed. */
  readonly streamedMs?: number;
  /** Median ms of a pass through the same layers in memory; where they are more than `layers` (they
   * would not fit), windowMs scaled by their bytes. */
  readonly inMemoryMs?: number;
  /** Weight bytes a streamed pass reads. */
  readonly streamedBytes?: number;
  /** With `output`: the median pass that also runs the output layer (the head's last window), less
   * windowMs: what the output layer costs. */
  readonly outputMs?: number;
  /** With `handOff`: ms the head's hand-off of one token's activations takes after such a pass
   * (timeHandOff). */
  readonly handOffMs?: number;
  /** Why the hand-off could not be timed (the output layer's timing stands). */
  readonly handOffFailure?: string;
}

/** The forward timing and what it did to the kernels' FLOP/s (DeviceDetails.forward). */
export interface ForwardCalibration extends ForwardTiming {
  /** ms the kernel timings give the same layers' matmuls. */
  readonly kernelMs: number;
  /** (windowMs - KV writes) / kernelMs: the kernels' FLOP/s were divided by it. */
  readonly scale: number;
  /** False when the scale was implausible and the kernels' FLOP/s were used as timed. */
  readonly applied: boolean;
  /** streamedBytes over the time streaming added to a pass: the profile's diskSeqReadBytesPerS. */
  readonly streamedBytesPerS?: number;
}

/** Rows the stand-in's embedding and output keep: they are never run, only described. */
const STAND_IN_VOCAB = 32;

/** Weight bytes a stand-in should hold to time a pass as a ring's windows run: five times the
 * last-level cache (32 MiB where it cannot be read). A cache that resists thrashing keeps part of a
 * cyclic working set a few times its size: on this project's VM (32 MiB L3), in passes after the
 * ring's idle gap, the benchmark model's layers ran up to 8% faster per layer over 3 layers (75 MB)
 * than over the 8 (200 MB) a ring's window there holds, and 3% over 5; at another hour, within 1%
 * (`npm run bench -- --only standin`). */
export function standInMinBytes(llcBytes: number | undefined): number {
  return 5 * (llcBytes ?? 32 << 20);
}

/** Layers worth timing: the model's first ones until they hold `minBytes` (past the last-level cache,
 * so that the weights stream from memory as a real window's do), within `budgetBytes` of page cache; 0
 * if not one layer fits. */
export function standInLayers(desc: ModelDescription, minBytes: number, budgetBytes: number): number {
  const ls = desc.tensors.layers;
  let n = 0, bytes = 0;
  while (n < ls.length && bytes < minBytes && bytes + layerWeightBytes(ls[n]) <= budgetBytes) bytes += layerWeightBytes(ls[n++]);
  return n;
}

/** Weight bytes of the model's first `layers` layers. */
export function standInBytes(desc: ModelDescription, layers: number): number {
  return desc.tensors.layers.slice(0, layers).reduce((s, l) => s + layerWeightBytes(l), 0);
}

/** Cache key of a forward timing: the layers' matmul steps (types and shapes) and the attention's shape. */
export function forwardKey(desc: ModelDescription, layers: number): string {
  const hp = desc.hparams;
  const steps = desc.tensors.layers.slice(0, layers).map((l) => layerSteps(l, hp.nExpertUsed).map(stepKey).join("+"));
  return `${hp.arch}:${hp.nEmbd}:${hp.nHead}/${hp.nHeadKv}:${hp.headDimK}${hp.hasQkvBias ? ":bias" : ""}|${steps.join("|")}`;
}

/** Writes the stand-in of the model's first `layers` layers to `path`: its header's metadata (less the
 * tokenizer) and tensors; norms and RoPE factors are ones (zeros would make them divide by zero), the
 * layers' weights zeros, as holes (no disk) except the first `onDisk` layers' (written out, to be read
 * back from the disk), the embedding and output holes: of STAND_IN_VOCAB rows, or all the model's with
 * `fullVocab` (the output layer is timed). */
export function writeStandIn(gguf: GgufFile, desc: ModelDescription, layers: number, path: string, onDisk = 0, fullVocab = false): void {
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
    const vocabRows = !fullVocab && (t.name === "token_embd.weight" || t.name === "output.weight");
    const dims = vocabRows ? [t.dims[0], STAND_IN_VOCAB] : t.dims;
    // RoPE factors divide the angles: zeros would make them infinite (phi3's long/short factors too)
    const scale = /_norm\.weight$/.test(t.name) || /^rope_(freqs|factors_long|factors_short)\.weight$/.test(t.name);
    tensors.push({ name: t.name, dims, type: t.type, data: scale ? ones(t.nElements) : layer && Number(layer[1]) < onDisk ? () => new Uint8Array(t.nBytes) : null });
  }
  writeGguf(path, metadata, tensors, gguf.alignment);
}

export interface ForwardOptions {
  /** Where the stand-in is written: the model's own disk, when its speed is wanted. */
  readonly dir: string;
  readonly threads: number;
  readonly passes: number;
  readonly gapMs: number;
  /** Also time passes over the first `streamedLayers` layers that read every one back from the disk,
   * as a window streamed past its room does (ForwardTiming.streamedMs): those layers are written out
   * rather than left as holes. Each is dropped once computed, so they need no room and may be more than
   * `layers`. Passes stop after STREAM_SECONDS (at least one is timed). */
  readonly streamedLayers?: number;
  /** Also time the passes with the output layer (the stand-in then keeps the whole vocabulary's
   * output, as holes): ForwardTiming.outputMs. */
  readonly output?: boolean;
  /** With `output`: also time the head's hand-off after passes with the output layer (timeHandOff). */
  readonly handOff?: boolean;
  /** Under a CPU quota: the in-memory passes back to back for SUSTAINED_SECONDS, and their mean. A
   * quota throttles sustained work, which a pass after an idle gap never meets, and the kernels are
   * timed sustained: the scale would credit the device with the quota's time back. */
  readonly sustained?: boolean;
  /** The in-memory passes (after their idle gaps) in this many slices, SLICE_GAP_MS apart: a quarter
   * second of passes can fall in a slow spell of a shared machine. */
  readonly slices?: number;
}

/** What the streamed passes may take in all, after their first (a slow disk gets one or two). */
const STREAM_SECONDS = 1;
/** Several periods of a cgroup's CPU quota (100 ms by default). */
const SUSTAINED_SECONDS = 0.5;
/** Between slices of the in-memory passes: three slices span about a second. On this project's VM a
 * sliced timing was off the minute's median by over 8% half as often as one in one go (`npm run bench
 * -- --only passnoise`). */
export const SLICE_GAP_MS = 300;

/** How timePasses runs: `count` passes at most, the first `skip` untimed, each after `gapMs`, until
 * `seconds` have gone on timed passes (at least one is timed); with `logits`, through the output layer.
 * With `slices`, the timed passes come in that many runs `sliceGapMs` apart, each after one untimed pass
 * (the threads wake again after the pause). */
export interface PassOptions {
  readonly count: number;
  readonly skip: number;
  readonly seconds?: number;
  readonly gapMs: number;
  readonly logits?: Float32Array;
  readonly slices?: number;
  readonly sliceGapMs?: number;
}

/** One token's pass through a window at position `pos`, from activations of a real model's scale each
 * time (the first norm makes them the next layers' input); with `logits`, through the output layer. */
function onePass(w: NativeWindow, nEmbd: number, logits?: Float32Array): (pos: number) => void {
  const input = Float32Array.from({ length: nEmbd }, (_, i) => Math.sin(i * 0.7) * 0.5);
  const acts = new Float32Array(nEmbd);
  return (pos) => {
    acts.set(input);
    w.forwardNow(acts, pos, 1, logits);
  };
}

/** One-token passes through a window (its KV cache holding `count + slices - 1` tokens), from activations of a real
 * model's scale each time (the first norm makes them the next layers' input): their times in ms. The
 * profile's stand-in and the bench's real layers are timed by this one loop, so they compare. */
export async function timePasses(w: NativeWindow, nEmbd: number, o: PassOptions): Promise<number[]> {
  const pass = onePass(w, nEmbd, o.logits);
  const ms: number[] = [];
  const seconds = o.seconds ?? Infinity;
  const slices = Math.max(1, o.slices ?? 1);
  const perSlice = Math.ceil((o.count - o.skip) / slices);
  let untimed = o.skip;
  for (let pos = 0; pos < o.count + slices - 1 && (ms.length === 0 || sum(ms) < seconds * 1000); pos++) {
    if (o.gapMs > 0) await sleep(o.gapMs);
    const t0 = performance.now();
    pass(pos);
    const t = performance.now() - t0;
    if (untimed > 0) {
      untimed--;
      continue;
    }
    ms.push(t);
    // A slice done, not the last: the pause, then one untimed pass.
    if (ms.length % perSlice === 0 && ms.length < perSlice * slices) {
      await sleep(o.sliceGapMs ?? 0);
      untimed = 1;
    }
  }
  return ms;
}

/** Times the engine's one-token pass through the stand-in's `layers` layers, each pass after the idle gap
 * a ring device has between its passes (or back to back, `sustained`): the median of `passes` with the
 * layers in memory, and (with `streamedLayers`) of passes that drop each layer once computed, so that
 * the next pass reads it again. */
export async function timeForward(gguf: GgufFile, desc: ModelDescription, layers: number, o: ForwardOptions): Promise<ForwardTiming> {
  removeLeftOverScratch(o.dir, "prima-forward-");
  const path = join(o.dir, `prima-forward-${process.pid}.gguf`);
  const streamedLayers = Math.min(desc.tensors.layers.length, o.streamedLayers ?? 0);
  try {
    writeStandIn(gguf, desc, Math.max(layers, streamedLayers), path, streamedLayers, o.output);
    if (streamedLayers) dropFileCache(path); // written back, and its pages dropped: the first pass reads the disk
    const model = LocalModel.open(path, { threads: o.threads, ...RING_COMPUTE_OPTIONS });
    try {
      const logits = new Float32Array(o.output ? desc.hparams.nVocab : 0);
      const passes = async (n: number, count: number, skip: number, seconds: number, gapMs: number, before?: (w: NativeWindow) => void, withOutput = false, slices = 1) => {
        const w = model.window(0, n, { ctx: count + slices, maxBatch: 1 });
        try {
          before?.(w);
          return { ms: await timePasses(w, model.nEmbd, { count, skip, seconds, gapMs, logits: withOutput ? logits : undefined, slices, sliceGapMs: SLICE_GAP_MS }), bytes: w.residency().totalBytes };
        } finally {
          w.close();
        }
      };
      const inMemory = async (n: number, withOutput = false) => o.sustained
        ? mean((await passes(n, 3 + SUSTAINED_PASSES, 3, SUSTAINED_SECONDS, 0, undefined, withOutput)).ms)
        : median((await passes(n, 3 + o.passes, 3, Infinity, o.gapMs, undefined, withOutput, o.slices)).ms);
      const windowMs = await inMemory(layers);
      const output = o.output ? {
        outputMs: Math.max(0, (await inMemory(layers, true)) - windowMs),
        ...(o.handOff ? await handOffAfterPasses(model, layers, logits, o.gapMs) : {}),
      } : {};
      if (!streamedLayers) return { layers, windowMs, ...output };
      // The first streamed layers alone, with no room: each goes once computed (the first pass still
      // finds them in memory), and the next pass reads it again. Their pass in memory, to subtract.
      const inMemoryMs = streamedLayers === layers ? windowMs
        : streamedLayers < layers ? await inMemory(streamedLayers)
        : (windowMs * standInBytes(desc, streamedLayers)) / standInBytes(desc, layers);
      const streamed = await passes(streamedLayers, 1 + Math.ceil(o.passes / 3), 1, STREAM_SECONDS, o.gapMs, (w) => w.streamBeyond(0, true));
      return { layers, windowMs, streamedLayers, streamedMs: median(streamed.ms), inMemoryMs, streamedBytes: streamed.bytes, ...output };
    } finally {
      model.close();
    }
  } finally {
    rmSync(path, { force: true });
  }
}

/** Hand-offs timed after passes through the stand-in's layers and the output layer: their median, or
 * why they could not be timed (the output layer's timing stands either way). */
const HAND_OFF_ROUNDS = 15;

async function handOffAfterPasses(model: LocalModel, layers: number, logits: Float32Array, gapMs: number): Promise<Pick<ForwardTiming, "handOffMs" | "handOffFailure">> {
  const w = model.window(0, layers, { ctx: HAND_OFF_ROUNDS + 4, maxBatch: 1 });
  try {
    const ms = await timeHandOff({ hiddenSize: model.nEmbd, rounds: HAND_OFF_ROUNDS, gapMs, relax: () => model.relax(), pass: onePass(w, model.nEmbd, logits) });
    return { handOffMs: median(ms) };
  } catch (e) {
    return { handOffFailure: e instanceof Error ? e.message : String(e) };
  } finally {
    w.close();
  }
}

const sum = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const mean = (xs: readonly number[]) => sum(xs) / xs.length;
/** At most this many sustained passes (their KV cache is sized for them). */
const SUSTAINED_PASSES = 1000;

/** The middle value (the mean of the two middle ones for an even count; NaN for none). */
export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b), mid = s.length >> 1;
  return s.length === 0 ? NaN : s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

/** ms the kernel timings give the matmuls of the model's first `layers` layers. */
export function kernelWindowMs(desc: ModelDescription, layers: number, timings: ReadonlyMap<string, StepTiming>): number {
  let ms = 0;
  for (const l of desc.tensors.layers.slice(0, layers)) {
    for (const step of layerSteps(l, desc.hparams.nExpertUsed)) {
      const t = timings.get(stepKey(step));
      if (!t) throw new Error(`no kernel timing for ${stepKey(step)}`);
      ms += (1000 * stepFlops(step.matrices) * step.perLayer) / t.flopsPerS;
    }
  }
  return ms;
}

/** A forward pass this far from the kernels' prediction is a broken measurement, not overhead. */
const MIN_FORWARD_SCALE = 0.25, MAX_FORWARD_SCALE = 8;

/** What a timing makes of the kernels' figures: one factor on their FLOP/s so that a layer's time in
 * Halda (its matmuls at the kernels' FLOP/s, and its KV write) is the pass's share; the types keep the
 * kernels' proportions. The pass wakes the threads as a ring device's does (inline, after an idle gap),
 * so that cost is in the layers, and Halda adds no window call for it (windowOverheadMs). And the
 * disk speed of rereads: the weight bytes over what streaming added to a pass. */
export function calibrateForward(t: ForwardTiming, kernelMs: number, kvCopyMs: number): ForwardCalibration {
  const scale = (t.windowMs - t.layers * kvCopyMs) / kernelMs;
  const streamedBytesPerS = rereadBytesPerS(t.streamedBytes, t.streamedMs ?? 0, t.inMemoryMs ?? t.windowMs);
  return { ...t, kernelMs, scale, applied: scale > MIN_FORWARD_SCALE && scale < MAX_FORWARD_SCALE, ...(streamedBytesPerS ? { streamedBytesPerS } : {}) };
}

/** The disk speed of rereads: `bytes` streamed over what streaming added to a pass (undefined where it
 * added nothing). */
export function rereadBytesPerS(bytes: number | undefined, streamedMs: number, inMemoryMs: number): number | undefined {
  const readMs = streamedMs - inMemoryMs;
  return bytes && readMs > 0 ? (1000 * bytes) / readMs : undefined;
}
