// Typed surface of the native model and its windows (bind_model.cc). The engine is its only user.
import { addon } from "./binding.js";
import type { SparseSettings } from "./kernels.js";

export interface NativeHParams {
  readonly nVocab: number;
  readonly nEmbd: number;
  readonly nLayers: number;
  readonly nHead: number;
  readonly nHeadKv: number;
  readonly headDim: number;
  readonly nFf: number;
  readonly ropeDims: number;
  readonly ropeNeox: boolean;
  readonly normEps: number;
  readonly ropeFreqBase: number;
  readonly ropeFreqScale: number;
  /** The switches of the shared blocks (model/arch/types.ts HParams says what each does). */
  readonly ffnAct: "silu" | "gelu" | "swiglu-oai";
  readonly moeGating: "softmax-norm" | "topk-softmax";
  readonly ropeYarnExtFactor: number;
  readonly ropeYarnBetaFast: number;
  readonly ropeYarnBetaSlow: number;
  readonly embdScale: number;
  readonly queryScale: number;
  readonly scoreScale: number;
  readonly layerWindow: readonly number[];
  readonly ropeFreqBaseSwa: number;
  readonly ropeFreqScaleSwa: number;
  readonly ropeAttnFactor: number;
  readonly nCtxOrig: number;
  readonly attnSoftcap: number;
  readonly finalSoftcap: number;
  /** Mixture of experts: experts per layer, used per token, an expert's width (0 when dense). */
  readonly nExpert: number;
  readonly nExpertUsed: number;
  readonly nFfExp: number;
}

/** One tensor as the addon maps it: ne0 is the row length, ne1 the number of rows. */
export interface NativeTensorDesc {
  readonly name: string;
  readonly type: number;
  readonly ne0: number;
  readonly ne1: number;
  readonly offset: number;
  readonly nBytes: number;
}

export interface WindowInfo {
  readonly firstLayer: number;
  readonly endLayer: number;
  readonly ctx: number;
  readonly maxBatch: number;
  /** Positions [0, filled) of the KV cache hold data. */
  readonly filled: number;
  /** KV cache + scratch: the window's anonymous memory. */
  readonly anonBytes: number;
  /** The KV cache's own bytes: K and V rows in their types (a sliding-window layer holds a ring of its window and a batch, model/'s kvCacheRows). */
  readonly kvBytes: number;
  /** The KV cache's element types (ggml type ids: F16, Q8_0 or Q4_0; | 0x100 when rotated). */
  readonly cacheTypeK: number;
  readonly cacheTypeV: number;
  /** Mixture of experts: per layer of the window, the tokens each expert has run since it was made. */
  readonly expertHits?: readonly (readonly number[])[];
  /** Mixture of experts: the expert prefetch's predictions against the routing, since the window was
   * made (expertPrefetch; all zero while it was never on). */
  readonly expertPrefetch?: ExpertPrefetchCounters;
}

/** A window's expert prefetch: each predicted MoE layer pass advises the union of its tokens' predicted
 * experts (native/src/expert_prefetch.h). */
export interface ExpertPrefetchCounters {
  /** MoE layer passes predicted. */
  readonly layers: number;
  /** Experts predicted, and of them routed to (hits); routed to but not predicted (misses). */
  readonly predicted: number;
  readonly hits: number;
  readonly misses: number;
  /** Bytes advised (the predicted experts' gate, up and down rows), and of them an expert's that was
   * routed to (used) or not (wasted). */
  readonly advisedBytes: number;
  readonly usedBytes: number;
  readonly wastedBytes: number;
}

/** When a MoE layer's experts are predicted and advised: never; ahead, from the layer's input before
 * its attention (ffn_norm(x) stands in for ffn_norm(x + attention(x))); early, layer l + 1's from
 * layer l's state after its attention (more time to read, a rougher guess); exact, from the router's own
 * input (a check of the predictor: it then predicts the routing itself, too late to hide a read). */
export type ExpertPrefetchMode = "off" | "ahead" | "early" | "exact";

export interface Residency {
  readonly residentBytes: number;
  readonly totalBytes: number;
}

/** MoE layers' experts wholly in memory (every page of its gate, up and down rows), of all of them
 * (one per layer and expert; 0 of 0 for a dense window). */
export interface ExpertResidency {
  readonly expertsResident: number;
  readonly expertsTotal: number;
}

export interface NativeWindow {
  /** Runs the window's layers over nTokens rows of acts (in place) at positions pos..; fills logits
   * (output norm + head of the last row) when given. Rejects with a clear error on bad positions. */
  forward(acts: Float32Array, pos: number, nTokens: number, logits?: Float32Array): Promise<void>;
  /** The same pass on the calling thread: it blocks the event loop while it runs, so only for short
   * calls (engine/quick-forward.ts decides). Throws when an asynchronous pass is still running. */
  forwardNow(acts: Float32Array, pos: number, nTokens: number, logits?: Float32Array): void;
  /** One decode step of several sequences in one pass over this window's weights (continuous
   * batching): row i of acts is the next token of the sequence whose KV cache is windows[i] (distinct
   * windows over the same layers and context), at positions[i]; it attends to that cache alone. This
   * window lends its scratch (windows.length <= its maxBatch) and may be one of them. logits, when
   * given, receives one vocabulary row per sequence, each the bits that sequence gets alone. */
  forwardSeqs(windows: readonly NativeWindow[], acts: Float32Array, positions: Int32Array, logits?: Float32Array): Promise<void>;
  /** MADV_WILLNEED over the window's weights, from its first layer on, at most maxBytes (default all):
   * on a device short of memory, advice past what fits would be evicted before it is used. In the
   * background, the model's advisor thread gives it and this returns at once; a newer background
   * prefetch replaces one not yet done. */
  prefetch(maxBytes?: number, background?: boolean): void;
  /** Drops the window's weight pages (MADV_DONTNEED + POSIX_FADV_DONTNEED). */
  release(): void;
  /** From the next pass on, a window whose weights are more than roomBytes keeps its first bytes (the
   * room less its largest layer and STREAM_MARGIN_BYTES) and drops the rest of each layer right after
   * computing it: it rereads only that tail each pass (native/src/model.h). roomBytes >= its weights:
   * nothing is dropped. A MoE window's layers are not dropped (the page cache keeps the experts tokens
   * use) unless streamExperts: the profiler's stand-in, timing rereads from the disk. */
  streamBeyond(roomBytes: number, streamExperts?: boolean): void;
  /** Predicts each MoE layer's experts with its router and advises their bytes (MADV_WILLNEED) while the
   * layer computes (ExpertPrefetchMode); results never change. A window without experts takes only "off". */
  expertPrefetch(mode: ExpertPrefetchMode): void;
  residency(): Residency;
  /** A mincore per expert: for status reports, not for every token. */
  expertResidency(): ExpertResidency;
  /** MADV_RANDOM (true) or the default read-around (false) on the window's expert tensors, from now on
   * (without it, streamBeyond sets MADV_RANDOM while the window does not fit its room). */
  expertsRandom(random: boolean): void;
  kvClear(): void;
  kvTruncate(pos: number): void;
  /** The largest position <= pos (and <= filled) a forward can continue from: sliding-window layers keep
   * only their last positions, so going back further than they hold restarts at 0. */
  kvResumable(pos: number): number;
  /** Context shift: drops positions [p0, p0 + nDiscard) and moves [p0 + nDiscard, nPast) down by nDiscard,
   * re-rotating their keys (native/src/kv_shift.h). The cache then holds nPast - nDiscard positions. */
  kvShift(p0: number, nDiscard: number, nPast: number): void;
  kvSave(path: string): void;
  kvLoad(path: string): void;
  /** H2O's statistics of a window made with h2o: per position the cache holds, the attention
   * probability every query of every layer and head gave it, summed; null for another window. */
  h2oScores(): Float32Array | null;
  info(): WindowInfo;
  close(): void;
}

export interface NativeModel {
  /** cacheTypeK/V: the KV cache's ggml type ids (F16, Q8_0 or Q4_0, a quantized one | 0x100 to rotate it
   * by a Hadamard matrix as llama.cpp does; default F16). sparse: sparse attention of the full-attention
   * layers (native/src/sparse_attn.h; absent: dense). h2o: gather H2O's attention statistics (h2oScores). */
  window(firstLayer: number, endLayer: number, options: { ctx: number; maxBatch?: number; cacheTypeK?: number; cacheTypeV?: number; sparse?: SparseSettings; h2o?: boolean }): NativeWindow;
  embed(tokens: Int32Array, out: Float32Array): void;
  /** Output norm + head on the last row of acts. */
  logits(acts: Float32Array, out: Float32Array): Promise<void>;
  /** The output norm of every row of acts into out (the final hidden states an embedding pools). */
  outputNorm(acts: Float32Array, out: Float32Array): void;
  /** No pass is coming soon: the compute threads stop spinning and sleep until the next one. */
  relax(): void;
  /** A pass is coming soon: sleeping compute threads wake and spin for it. */
  prewake(): void;
  /** null while the mapped file is the one that was opened (size, inode, mtime) and every read of it
   * succeeded; else why not, naming the file. Once the file changed, every pass fails with this. */
  fileProblem(): string | null;
  close(): void;
}

export interface NativeModelOptions {
  readonly threads: number;
  /** How long idle compute threads spin for the next call before sleeping (default 300 us: a token
   * loop's next call comes at once; a ring device waits for the whole ring, so it should not spin). */
  readonly idleSpinUs?: number;
  /** Hold the compute threads on distinct CPUs during each pass (default false): for threads that
   * sleep between passes, as a ring device's do (see prima_pool_spread). */
  readonly spreadThreads?: boolean;
}

/** Room a streamed window leaves unused beyond its largest layer (native/src/model.h
 * PRIMA_STREAM_MARGIN_BYTES), which Halda prices as its own STREAM_MARGIN_BYTES. */
export const NATIVE_STREAM_MARGIN_BYTES = addon.streamMarginBytes as number;

type ModelCtor = new (path: string, tensors: readonly NativeTensorDesc[], hparams: NativeHParams, options: NativeModelOptions) => NativeModel;

/** Maps the GGUF at path; throws an Error naming the problem (missing tensor, bad offset, ...). */
export function openNativeModel(path: string, tensors: readonly NativeTensorDesc[], hparams: NativeHParams, options: NativeModelOptions): NativeModel {
  const Ctor = addon.NativeModel as ModelCtor;
  return new Ctor(path, tensors, hparams, options);
}
