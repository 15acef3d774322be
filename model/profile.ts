// The model profile Halda plans with (HALDA.md §1.2), computed from the tensor table alone: no weight
// is read. Bytes come from each tensor's type and shape; FLOPs per token from the shapes and the
// hyper-parameters. Also a small table of named shapes, so a model that is not on disk (llama3-70b)
// can be profiled from a synthetic tensor table typed the way llama-quantize would type it.

import type { HParams, LayerTensors, ModelDescription, ModelTensors, TensorRef } from "./architecture.js";
import { ggmlTypeInfo, ggmlTypeName } from "./ggml-types.js";
import { DEFAULT_KV_CACHE_TYPES, kvBytesPerTokenLayer, type KvCacheTypes } from "./kv-cache.js";
import { planTensors, type FileTypeName } from "./quant-mix.js";
import type { ModelShape } from "./shapes.js";
import { familyOf, layerFromTable, shapeHParams } from "./arch/index.js";

/** FLOPs (or bytes) keyed by ggml weight-type name ("Q4_K", "F16", "F32", ...). */
export type PerWeightType = Readonly<Record<string, number>>;

export interface ModelProfile {
  readonly name: string;
  readonly arch: string;
  readonly nLayers: number;
  readonly nVocab: number;
  readonly nEmbd: number;
  readonly nHead: number;
  readonly nHeadKv: number;
  readonly headDimK: number;
  readonly headDimV: number;
  readonly nFf: number;
  /** KV capacity in tokens this profile was built for; Halda's b' = layerBytes + kvBytesPerLayer(profile). */
  readonly nCtx: number;
  /** Mean rows a layer's KV cache holds: nCtx, less when sliding-window layers keep a ring of their
   * window (kvCacheRows); nCtx when absent. */
  readonly kvTokensPerLayer?: number;
  /** Cache length the attention FLOPs were counted with. */
  readonly nKvForFlops: number;
  /** b: mean bytes per layer (all blk.i.* tensors, plus rope_freqs once, divided by nLayers). */
  readonly layerBytes: number;
  /** Bytes of each layer's own tensors, for reporting a window's real size. */
  readonly layerBytesEach: readonly number[];
  /** F_q: mean FLOPs per layer per token, by the type of the operand that dominates the op. */
  readonly layerFlops: PerWeightType;
  /** b_i: bytes of token_embd.weight (one row is read per token). */
  readonly inputBytes: number;
  /** b_o: bytes of output_norm.weight + output.weight (token_embd when the embeddings are tied). */
  readonly outputBytes: number;
  /** F^out_q: FLOPs per token of the output norm, the output matmul and the softmax. */
  readonly outputFlops: PerWeightType;
  /** Bytes of one token's K and V rows in one layer, in the cache's types (model/kv-cache.ts). */
  readonly kvBytesPerTokenLayer: number;
  /** The KV cache's types the profile counts (f16 when absent). */
  readonly kvCacheTypes?: KvCacheTypes;
  /** Every tensor's bytes: the size of the weights a device maps when it holds everything. */
  readonly weightBytesTotal: number;
  /** Mixture of experts (absent for a dense model): what a token reads of a layer, and how skewed the
   * routing is (docs/HALDA.md "Mixture of experts"). */
  readonly moe?: MoeProfile;
}

/** A layer of n experts of which each token runs k: layerBytes holds all n, a token reads k. */
export interface MoeProfile {
  readonly nExpert: number;
  readonly nExpertUsed: number;
  /** e: mean bytes of one expert (its gate, up and down slices) in a layer. */
  readonly expertBytes: number;
  /** Bytes one token reads of a layer's weights: everything but the experts, and k experts. */
  readonly activeLayerBytes: number;
  /** p̄: the share of token-expert assignments of each expert rank, hottest first, averaged over the
   * layers (each layer sorted on its own); sums to 1. Uniform (1/n each) until measured. */
  readonly routingShare: readonly number[];
  /** "uniform": not measured, every expert assumed equally used; "measured": from the engine's per-expert
   * hit counts over `routingTokens` tokens (measureExpertRouting in profiler/). */
  readonly routing: "uniform" | "measured";
  readonly routingTokens?: number;
  /** Each layer's own shares, hottest first (p_{j,(i)}; each sums to 1), where measured: Halda then
   * prices a window by the layers it names (docs/HALDA.md MoE-3), since layers differ in skew. */
  readonly routingShareByLayer?: readonly (readonly number[])[];
}

/** Bytes a token reads of one layer's weights: all of them for a dense layer, the active part for experts. */
export function layerReadBytes(p: ModelProfile): number {
  return p.moe?.activeLayerBytes ?? p.layerBytes;
}

/**
 * p̄ from per-layer expert hit counts (window.info().expertHits): each layer's counts as shares, sorted
 * hottest first, then averaged rank by rank over the layers that saw tokens. Ranks, not expert ids:
 * which expert is hot differs by layer, and a device keeps whichever is hot in each of its layers.
 */
export function routingShareFromHits(hits: readonly (readonly number[])[]): number[] {
  const routed = layerSharesFromHits(hits).filter((s): s is number[] => s !== null);
  if (routed.length === 0) throw new Error("expert hits: no layer routed any token");
  const n = routed[0].length;
  return Array.from({ length: n }, (_, i) => routed.reduce((a, s) => a + s[i], 0) / routed.length);
}

/** Each layer's hit counts as shares, hottest first; null for a layer that routed no token. */
function layerSharesFromHits(hits: readonly (readonly number[])[]): (number[] | null)[] {
  const n = hits.find((l) => l.length > 0)?.length ?? 0;
  return hits.map((layer) => {
    if (layer.length !== n) throw new Error(`expert hits: a layer has ${layer.length} experts, another ${n}`);
    if (layer.some((h) => !(h >= 0) || !Number.isFinite(h))) throw new Error("expert hits: a count is not a finite number >= 0");
    const total = layer.reduce((a, b) => a + b, 0);
    return total > 0 ? layer.map((h) => h / total).sort((a, b) => b - a) : null;
  });
}

/** The profile with a measured routing distribution (from `routingShareFromHits`) over `tokens` tokens. */
export function withMeasuredRouting(p: ModelProfile, hits: readonly (readonly number[])[], tokens: number): ModelProfile {
  if (!p.moe) throw new Error(`${p.name} has no experts: there is no routing to measure`);
  const share = routingShareFromHits(hits);
  if (share.length !== p.moe.nExpert) throw new Error(`expert hits count ${share.length} experts, the model has ${p.moe.nExpert}`);
  if (hits.length !== p.nLayers) throw new Error(`expert hits count ${hits.length} layers, the model has ${p.nLayers}`);
  // a layer no token reached (none in one pass through every layer) keeps the mean
  const byLayer = layerSharesFromHits(hits).map((s) => s ?? share);
  return { ...p, moe: { ...p.moe, routingShare: share, routing: "measured", routingTokens: tokens, routingShareByLayer: byLayer } };
}

export interface ModelProfileOptions {
  /** KV capacity in tokens (llama.cpp's -c). */
  readonly nCtx: number;
  /** Rows per pass (the engine's batch, default 128): a sliding-window layer's ring holds its window and a batch. */
  readonly maxBatch?: number;
  /** Tokens generated per request; the attention FLOPs use a cache of roundup(nPredict, pad) tokens,
   *  capped at nCtx. Default nCtx: attention over the full cache, the worst case. */
  readonly nPredict?: number;
  /** Flash attention pads the cache to 256 tokens, otherwise 32 (llama.cpp). Default false. */
  readonly flashAttention?: boolean;
  /** A label for reports; default the file path. */
  readonly name?: string;
  /** The KV cache's types (--cache-type-k/-v); default f16. */
  readonly kvCacheTypes?: KvCacheTypes;
}

/** Rows of K (and of V) each layer's KV cache holds: nCtx, or for a sliding-window layer a ring of its
 * window and a batch, as llama.cpp's iSWA cache (native/src/model.c kv_layout: the window's kvBytes
 * equals this, test/engine/swa-ring.test.ts). */
export function kvCacheRows(layerWindow: readonly number[], nCtx: number, maxBatch: number): number[] {
  return layerWindow.map((w) => (w > 0 && w + maxBatch < nCtx ? w + maxBatch : nCtx));
}

/** native prima_window_kv_resumable for a cache tracked from outside (the ring's head): the largest
 * position <= pos a forward can continue from, given `kvEnd`, the end of the furthest write since the
 * cache last started at 0 (a ring holds at most [kvEnd - rows, kvEnd)), and `kvFloor`, below which a
 * context shift left a ring nothing (kvAfterShift). Same rule, held together by
 * test/engine/swa-ring.test.ts. */
export function kvResumablePosition(pos: number, kvEnd: number, layerWindow: readonly number[], rows: readonly number[], nCtx: number, kvFloor = 0): number {
  if (pos <= 0) return 0;
  for (let l = 0; l < layerWindow.length; l++) {
    if (rows[l] === nCtx) continue;
    const need = pos > layerWindow[l] ? pos - layerWindow[l] + 1 : 0;
    if (need < kvEnd - rows[l] || need < kvFloor) return 0;
  }
  return pos;
}

/** native prima_window_kv_shift's effect on kvEnd and kvFloor (native/src/kv_shift.c): a ring held
 * [max(kvEnd - rows, kvFloor), kvEnd); after positions [p0, p0 + nDiscard) of nPast are dropped it
 * holds from the lowest of those kept, in the new numbering, to nPast - nDiscard. */
export function kvAfterShift(
  kv: { readonly kvEnd: number; readonly kvFloor: number }, p0: number, nDiscard: number, nPast: number,
  layerWindow: readonly number[], rows: readonly number[], nCtx: number,
): { kvEnd: number; kvFloor: number } {
  let floor = kv.kvFloor, rings = false;
  for (let l = 0; l < layerWindow.length; l++) {
    if (rows[l] === nCtx) continue;
    rings = true;
    const low = Math.max(0, kv.kvEnd - rows[l], kv.kvFloor);
    floor = Math.max(floor, low <= p0 ? low : low <= p0 + nDiscard ? p0 : low - nDiscard);
  }
  return rings ? { kvEnd: nPast - nDiscard, kvFloor: floor } : { kvEnd: kv.kvEnd, kvFloor: kv.kvFloor };
}

/** The one rule for a layer's KV bytes in a plan (Halda's b' = layerBytes + this): its mean rows times a row's K and V. */
export function kvBytesPerLayer(p: Pick<ModelProfile, "kvBytesPerTokenLayer" | "nCtx" | "kvTokensPerLayer">): number {
  return p.kvBytesPerTokenLayer * (p.kvTokensPerLayer ?? p.nCtx);
}

function addTo(acc: Record<string, number>, typeName: string, flops: number): void {
  if (flops !== 0) acc[typeName] = (acc[typeName] ?? 0) + flops;
}

/** 2·in·out FLOPs per token for a weight matrix: one multiply and one add per element. */
function matmulFlops(t: TensorRef): number {
  let n = 1;
  for (const d of t.dims) n *= d;
  return 2 * n;
}

/** Every tensor of a layer, whatever its family has. */
function layerTensorList(l: LayerTensors): TensorRef[] {
  return (Object.values(l) as (TensorRef | undefined)[]).filter((t): t is TensorRef => t !== undefined);
}

/** Bytes of one layer's tensors in the file. */
export function layerWeightBytes(l: LayerTensors): number {
  return layerTensorList(l).reduce((s, x) => s + x.nBytes, 0);
}

/** FLOPs of one layer for one token, by operand type (HALDA.md §1.2, llama_model_n_flops's terms). */
function layerFlopsOf(l: LayerTensors, hp: HParams, nKvCache: number, window: number): Record<string, number> {
  // a sliding-window layer attends to at most its window
  const nKv = window > 0 ? Math.min(window, nKvCache) : nKvCache;
  const acc: Record<string, number> = {};
  for (const w of [l.wq, l.wk, l.wv, l.wo, l.wGate, l.wUp, l.wDown, l.ffnGateInp]) if (w) addTo(acc, ggmlTypeName(w.type), matmulFlops(w));
  // a token runs nExpertUsed of the nExpert experts: that share of the expert tensors' FLOPs
  const used = hp.nExpert > 0 ? hp.nExpertUsed / hp.nExpert : 0;
  for (const w of [l.ffnGateExps, l.ffnUpExps, l.ffnDownExps]) if (w) addTo(acc, ggmlTypeName(w.type), matmulFlops(w) * used);
  const ffWidth = hp.nExpert > 0 ? hp.nExpertUsed * hp.nFfExp : hp.nFf;
  const E = hp.nEmbd, qDim = hp.nHead * hp.headDimK, kvDim = hp.nHeadKv * hp.headDimK;
  let f32 = 0;
  f32 += 2 * (4 * E + 1); // two RMSNorms: square, sum, scale, multiply by the weight
  f32 += 2.5 * (qDim + kvDim); // RoPE on the Q and K rows
  f32 += 7 * hp.nHead * nKv; // scale, mask and softmax over the cache
  f32 += 8 * ffWidth + ffWidth; // SiLU, then the gate product
  if (hp.nExpert > 0) f32 += 5 * hp.nExpert + 2 * hp.nExpertUsed * E; // the router's softmax, the experts' weighted sum
  f32 += E; // residual
  if (l.bq && l.bk && l.bv) f32 += qDim + 2 * kvDim; // qwen2's QKV bias adds (not in prima.cpp's count)
  if (l.qNorm) f32 += 4 * (qDim + kvDim); // qwen3/gemma3's per-head Q/K norms
  if (l.attnPostNorm) f32 += 4 * E + E; // gemma3's post-norms and their residual adds
  if (l.ffnPostNorm) f32 += 4 * E + E;
  addTo(acc, "F32", f32);
  // Attention over the F16 cache: KQ and KQV, each 2·d·H·n_kv (prima.cpp multiplies by a further
  // H_kv, an over-count HALDA.md §1.2 tells us not to copy).
  addTo(acc, "F16", 2 * (2 * hp.headDimK * hp.nHead * nKv));
  return acc;
}

export function modelProfile(desc: ModelDescription, opts: ModelProfileOptions): ModelProfile {
  const hp = desc.hparams;
  const t = desc.tensors;
  if (!Number.isInteger(opts.nCtx) || opts.nCtx < 1) throw new Error(`nCtx must be a positive integer, got ${opts.nCtx}`);
  const nPredict = opts.nPredict ?? opts.nCtx;
  if (!Number.isInteger(nPredict) || nPredict < 1) throw new Error(`nPredict must be a positive integer, got ${nPredict}`);
  const pad = opts.flashAttention ? 256 : 32;
  const nKv = Math.min(opts.nCtx, Math.max(pad, Math.ceil(nPredict / pad) * pad));
  if (t.layers.length !== hp.nLayers) throw new Error(`model has ${t.layers.length} layer tensor sets for ${hp.nLayers} layers`);

  const layerBytesEach = t.layers.map(layerWeightBytes);
  const ropeBytes = (t.ropeFreqs?.nBytes ?? 0) + (t.ropeFactorsLong?.nBytes ?? 0) + (t.ropeFactorsShort?.nBytes ?? 0);
  const layerBytes = (layerBytesEach.reduce((s, x) => s + x, 0) + ropeBytes) / hp.nLayers;

  const flopsSum: Record<string, number> = {};
  t.layers.forEach((l, i) => {
    for (const [k, v] of Object.entries(layerFlopsOf(l, hp, nKv, hp.layerWindow[i] ?? 0))) addTo(flopsSum, k, v);
  });
  const layerFlops: Record<string, number> = {};
  for (const [k, v] of Object.entries(flopsSum)) layerFlops[k] = v / hp.nLayers;

  const outputFlops: Record<string, number> = {};
  addTo(outputFlops, "F32", 4 * hp.nEmbd + 1 + 5 * hp.nVocab); // output norm, softmax over the vocabulary
  addTo(outputFlops, ggmlTypeName(t.output.type), matmulFlops(t.output));

  let moe: MoeProfile | undefined;
  if (hp.nExpert > 0) {
    let expertSum = 0;
    for (const l of t.layers) for (const w of [l.ffnGateExps, l.ffnUpExps, l.ffnDownExps]) if (w) expertSum += w.nBytes;
    const expertBytes = expertSum / (hp.nLayers * hp.nExpert);
    moe = {
      nExpert: hp.nExpert, nExpertUsed: hp.nExpertUsed, expertBytes,
      activeLayerBytes: layerBytes - (hp.nExpert - hp.nExpertUsed) * expertBytes,
      routingShare: new Array<number>(hp.nExpert).fill(1 / hp.nExpert),
      routing: "uniform",
    };
  }

  const tiedOutput = t.output === t.tokenEmbd || t.output.name === t.tokenEmbd.name;
  const weightBytesTotal = layerBytesEach.reduce((s, x) => s + x, 0) + ropeBytes + t.tokenEmbd.nBytes + t.outputNorm.nBytes + (tiedOutput ? 0 : t.output.nBytes);
  return {
    name: opts.name ?? desc.path,
    arch: hp.arch,
    nLayers: hp.nLayers,
    nVocab: hp.nVocab,
    nEmbd: hp.nEmbd,
    nHead: hp.nHead,
    nHeadKv: hp.nHeadKv,
    headDimK: hp.headDimK,
    headDimV: hp.headDimV,
    nFf: hp.nFf,
    nCtx: opts.nCtx,
    kvTokensPerLayer: kvCacheRows(hp.layerWindow, opts.nCtx, opts.maxBatch ?? 128).reduce((a, b) => a + b, 0) / hp.nLayers,
    nKvForFlops: nKv,
    layerBytes,
    layerBytesEach,
    layerFlops,
    inputBytes: t.tokenEmbd.nBytes,
    outputBytes: t.outputNorm.nBytes + t.output.nBytes,
    outputFlops,
    kvBytesPerTokenLayer: kvBytesPerTokenLayer(hp, opts.kvCacheTypes),
    kvCacheTypes: opts.kvCacheTypes ?? DEFAULT_KV_CACHE_TYPES,
    weightBytesTotal,
    ...(moe ? { moe } : {}),
  };
}

// ---- synthetic tensor tables ------------------------------------------------------------------

/** A ModelDescription for a named shape typed as llama-quantize would type `fileType`; no file behind
 * it (for planning models that are not on disk). Offsets are laid out as a file would hold them. */
export function syntheticModelDescription(shape: ModelShape, fileType: FileTypeName): ModelDescription {
  let offset = 0;
  const refs = new Map<string, TensorRef>();
  for (const t of planTensors(shape, fileType)) {
    const info = ggmlTypeInfo(t.type)!;
    const nBytes = (t.dims.reduce((a, b) => a * b, 1) / info.blockElems) * info.blockBytes;
    refs.set(t.name, { name: t.name, type: t.type, dims: t.dims, offset, nBytes });
    offset += Math.ceil(nBytes / 32) * 32;
  }
  const hparams = shapeHParams(shape.arch, shape);
  const layers: LayerTensors[] = [];
  for (let i = 0; i < shape.nLayers; i++) layers.push(layerFromTable(familyOf(shape.arch)!.layer, hparams, i, (name) => refs.get(name)));
  const tokenEmbd = refs.get("token_embd.weight")!;
  const tensors: ModelTensors = { tokenEmbd, outputNorm: refs.get("output_norm.weight")!, output: refs.get("output.weight") ?? tokenEmbd, layers };
  return { path: `synthetic:${shape.name}-${fileType}`, fileBytes: offset, hparams, tensors };
}

