// The model profile Halda plans with (HALDA.md §1.2), computed from the tensor table alone: no weight
// is read. Bytes come from each tensor's type and shape; FLOPs per token from the shapes and the
// hyper-parameters. Also a small table of named shapes, so a model that is not on disk (llama3-70b)
// can be profiled from a synthetic tensor table typed the way llama-quantize would type it.

import type { HParams, LayerTensors, ModelDescription, ModelTensors, TensorRef } from "./architecture.js";
import { GgmlType, ggmlTypeInfo, ggmlTypeName } from "./ggml-types.js";

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
  /** KV capacity in tokens this profile was built for; Halda's b' = layerBytes + kvBytesPerTokenLayer * nCtx. */
  readonly nCtx: number;
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
  /** Bytes of one token's K and V rows in one layer (F16 cache). */
  readonly kvBytesPerTokenLayer: number;
  /** Every tensor's bytes: the size of the weights a device maps when it holds everything. */
  readonly weightBytesTotal: number;
}

export interface ModelProfileOptions {
  /** KV capacity in tokens (llama.cpp's -c). */
  readonly nCtx: number;
  /** Tokens generated per request; the attention FLOPs use a cache of roundup(nPredict, pad) tokens,
   *  capped at nCtx. Default nCtx: attention over the full cache, the worst case. */
  readonly nPredict?: number;
  /** Flash attention pads the cache to 256 tokens, otherwise 32 (llama.cpp). Default false. */
  readonly flashAttention?: boolean;
  /** A label for reports; default the file path. */
  readonly name?: string;
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

function layerTensorList(l: LayerTensors): TensorRef[] {
  const list = [l.attnNorm, l.wq, l.wk, l.wv, l.wo, l.ffnNorm, l.wGate, l.wUp, l.wDown];
  for (const b of [l.bq, l.bk, l.bv]) if (b) list.push(b);
  return list;
}

/** FLOPs of one layer for one token, by operand type (HALDA.md §1.2, llama_model_n_flops's terms). */
function layerFlopsOf(l: LayerTensors, hp: HParams, nKv: number): Record<string, number> {
  const acc: Record<string, number> = {};
  for (const w of [l.wq, l.wk, l.wv, l.wo, l.wGate, l.wUp, l.wDown]) addTo(acc, ggmlTypeName(w.type), matmulFlops(w));
  const E = hp.nEmbd, qDim = hp.nHead * hp.headDimK, kvDim = hp.nHeadKv * hp.headDimK;
  let f32 = 0;
  f32 += 2 * (4 * E + 1); // two RMSNorms: square, sum, scale, multiply by the weight
  f32 += 2.5 * (qDim + kvDim); // RoPE on the Q and K rows
  f32 += 7 * hp.nHead * nKv; // scale, mask and softmax over the cache
  f32 += 8 * hp.nFf + hp.nFf; // SiLU, then the gate product
  f32 += E; // residual
  if (l.bq && l.bk && l.bv) f32 += qDim + 2 * kvDim; // qwen2's QKV bias adds (not in prima.cpp's count)
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

  const layerBytesEach = t.layers.map((l) => layerTensorList(l).reduce((s, x) => s + x.nBytes, 0));
  const ropeBytes = t.ropeFreqs?.nBytes ?? 0;
  const layerBytes = (layerBytesEach.reduce((s, x) => s + x, 0) + ropeBytes) / hp.nLayers;

  const flopsSum: Record<string, number> = {};
  for (const l of t.layers) for (const [k, v] of Object.entries(layerFlopsOf(l, hp, nKv))) addTo(flopsSum, k, v);
  const layerFlops: Record<string, number> = {};
  for (const [k, v] of Object.entries(flopsSum)) layerFlops[k] = v / hp.nLayers;

  const outputFlops: Record<string, number> = {};
  addTo(outputFlops, "F32", 4 * hp.nEmbd + 1 + 5 * hp.nVocab); // output norm, softmax over the vocabulary
  addTo(outputFlops, ggmlTypeName(t.output.type), matmulFlops(t.output));

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
    nKvForFlops: nKv,
    layerBytes,
    layerBytesEach,
    layerFlops,
    inputBytes: t.tokenEmbd.nBytes,
    outputBytes: t.outputNorm.nBytes + t.output.nBytes,
    outputFlops,
    kvBytesPerTokenLayer: 2 * (hp.nHeadKv * hp.headDimK + hp.nHeadKv * hp.headDimV),
    weightBytesTotal,
  };
}

// ---- named shapes and synthetic tensor tables ------------------------------------------------
// A stopgap: the model generator (modelgen/) will own the shape table; this one exists so that
// `prima-coord plan --shape llama3-70b --type Q4_K_M` works before it lands.

export interface ModelShape {
  readonly name: string;
  readonly arch: "llama" | "qwen2";
  readonly nEmbd: number;
  readonly nLayers: number;
  readonly nHead: number;
  readonly nHeadKv: number;
  readonly nFf: number;
  readonly nVocab: number;
  readonly tiedEmbeddings: boolean;
  readonly hasQkvBias: boolean;
  /** Llama 3.1-style rope_freqs tensor (64 F32 values for head size 128). */
  readonly hasRopeFreqs: boolean;
}

export const modelShapes: readonly ModelShape[] = [
  { name: "tinyllama-1.1b", arch: "llama", nEmbd: 2048, nLayers: 22, nHead: 32, nHeadKv: 4, nFf: 5632, nVocab: 32000, tiedEmbeddings: false, hasQkvBias: false, hasRopeFreqs: false },
  { name: "llama3-8b", arch: "llama", nEmbd: 4096, nLayers: 32, nHead: 32, nHeadKv: 8, nFf: 14336, nVocab: 128256, tiedEmbeddings: false, hasQkvBias: false, hasRopeFreqs: false },
  { name: "llama1-30b", arch: "llama", nEmbd: 6656, nLayers: 60, nHead: 52, nHeadKv: 52, nFf: 17920, nVocab: 32000, tiedEmbeddings: false, hasQkvBias: false, hasRopeFreqs: false },
  { name: "llama3-70b", arch: "llama", nEmbd: 8192, nLayers: 80, nHead: 64, nHeadKv: 8, nFf: 28672, nVocab: 128256, tiedEmbeddings: false, hasQkvBias: false, hasRopeFreqs: false },
  { name: "qwen2.5-0.5b", arch: "qwen2", nEmbd: 896, nLayers: 24, nHead: 14, nHeadKv: 2, nFf: 4864, nVocab: 151936, tiedEmbeddings: true, hasQkvBias: true, hasRopeFreqs: false },
];

export function modelShapeByName(name: string): ModelShape | undefined {
  return modelShapes.find((s) => s.name === name.toLowerCase());
}

/** File types a synthetic table can be typed as: pure types, and the K-quant mixes llama-quantize makes. */
export const syntheticFileTypes = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q6_K", "Q4_K_M", "Q5_K_M"] as const;
export type SyntheticFileType = (typeof syntheticFileTypes)[number];

type TensorRole = "token_embd" | "output" | "attn_q" | "attn_k" | "attn_v" | "attn_output" | "ffn_gate" | "ffn_up" | "ffn_down";

/** Row length not divisible by the type's block: llama-quantize falls back to a 32-block type, then F16. */
function fallbackType(type: number, rowElems: number): number {
  const info = ggmlTypeInfo(type)!;
  if (rowElems % info.blockElems === 0) return type;
  const next: Record<number, number> = { [GgmlType.Q4_K]: GgmlType.Q5_0, [GgmlType.Q5_K]: GgmlType.Q5_1, [GgmlType.Q6_K]: GgmlType.Q8_0, [GgmlType.Q2_K]: GgmlType.Q4_0, [GgmlType.Q3_K]: GgmlType.Q4_0 };
  const fb = next[type] ?? type;
  return rowElems % ggmlTypeInfo(fb)!.blockElems === 0 ? fb : GgmlType.F16;
}

/** The type llama-quantize gives a 2-D weight (llama-quant.cpp, llama_tensor_get_type), for our ftypes. */
function quantizedType(ftype: SyntheticFileType, role: TensorRole, layer: number, shape: ModelShape, rowElems: number): number {
  const float: Record<string, number> = { F32: GgmlType.F32, F16: GgmlType.F16, BF16: GgmlType.BF16 };
  if (ftype in float) return float[ftype];
  const base: Record<string, number> = { Q8_0: GgmlType.Q8_0, Q4_0: GgmlType.Q4_0, Q5_0: GgmlType.Q5_0, Q6_K: GgmlType.Q6_K, Q4_K_M: GgmlType.Q4_K, Q5_K_M: GgmlType.Q5_K };
  let t = base[ftype];
  const n = shape.nLayers;
  const moreBits = layer < Math.floor(n / 8) || layer >= Math.floor((7 * n) / 8) || (layer - Math.floor(n / 8)) % 3 === 2;
  const km = ftype === "Q4_K_M" || ftype === "Q5_K_M";
  const isOutput = role === "output" || (role === "token_embd" && shape.tiedEmbeddings);
  if (isOutput) {
    // The output matrix gets Q6_K unless the file is Q8_0 or its rows do not fit 256-blocks.
    if (rowElems % ggmlTypeInfo(t)!.blockElems !== 0) t = GgmlType.Q8_0;
    else if (t !== GgmlType.Q8_0) t = GgmlType.Q6_K;
  } else if (role === "attn_v") {
    if (km && moreBits) t = GgmlType.Q6_K;
    // llama3-70b-like (80 layers, GQA): attn_v is 8x smaller than attn_q, so it gets 5 bits for free.
    const is70B = shape.arch === "llama" && n === 80 && shape.nHead !== shape.nHeadKv;
    if (is70B && t === GgmlType.Q4_K) t = GgmlType.Q5_K;
  } else if (role === "ffn_down") {
    if (km && moreBits) t = GgmlType.Q6_K;
  }
  return fallbackType(t, rowElems);
}

/** A ModelDescription for a named shape typed as llama-quantize would type `fileType`; no file behind it. */
export function syntheticModelDescription(shape: ModelShape, fileType: SyntheticFileType): ModelDescription {
  const E = shape.nEmbd, hd = E / shape.nHead, qDim = E, kvDim = shape.nHeadKv * hd;
  let offset = 0;
  const tensor = (name: string, type: number, dims: number[]): TensorRef => {
    const info = ggmlTypeInfo(type)!;
    const n = dims.reduce((a, b) => a * b, 1);
    const nBytes = (n / info.blockElems) * info.blockBytes;
    const ref = { name, type, dims, offset, nBytes };
    offset += Math.ceil(nBytes / 32) * 32;
    return ref;
  };
  const weight = (name: string, role: TensorRole, layer: number, dims: number[]) => tensor(name, quantizedType(fileType, role, layer, shape, dims[0]), dims);
  const f32 = (name: string, dims: number[]) => tensor(name, GgmlType.F32, dims);
  const tokenEmbd = weight("token_embd.weight", "token_embd", -1, [E, shape.nVocab]);
  const layers: LayerTensors[] = [];
  for (let i = 0; i < shape.nLayers; i++) {
    const p = `blk.${i}.`;
    layers.push({
      attnNorm: f32(`${p}attn_norm.weight`, [E]),
      wq: weight(`${p}attn_q.weight`, "attn_q", i, [E, qDim]),
      wk: weight(`${p}attn_k.weight`, "attn_k", i, [E, kvDim]),
      wv: weight(`${p}attn_v.weight`, "attn_v", i, [E, kvDim]),
      wo: weight(`${p}attn_output.weight`, "attn_output", i, [qDim, E]),
      bq: shape.hasQkvBias ? f32(`${p}attn_q.bias`, [qDim]) : undefined,
      bk: shape.hasQkvBias ? f32(`${p}attn_k.bias`, [kvDim]) : undefined,
      bv: shape.hasQkvBias ? f32(`${p}attn_v.bias`, [kvDim]) : undefined,
      ffnNorm: f32(`${p}ffn_norm.weight`, [E]),
      wGate: weight(`${p}ffn_gate.weight`, "ffn_gate", i, [E, shape.nFf]),
      wUp: weight(`${p}ffn_up.weight`, "ffn_up", i, [E, shape.nFf]),
      wDown: weight(`${p}ffn_down.weight`, "ffn_down", i, [shape.nFf, E]),
    });
  }
  const outputNorm = f32("output_norm.weight", [E]);
  const output = shape.tiedEmbeddings ? tokenEmbd : weight("output.weight", "output", -1, [E, shape.nVocab]);
  const ropeFreqs = shape.hasRopeFreqs ? f32("rope_freqs.weight", [hd / 2]) : undefined;
  const tensors: ModelTensors = { tokenEmbd, outputNorm, output, ropeFreqs, layers };
  const hparams: HParams = {
    arch: shape.arch, nVocab: shape.nVocab, nEmbd: E, nLayers: shape.nLayers, nHead: shape.nHead, nHeadKv: shape.nHeadKv,
    headDimK: hd, headDimV: hd, nFf: shape.nFf, nCtxTrain: 8192, normEps: 1e-5, ropeDims: hd,
    ropeFreqBase: shape.arch === "qwen2" ? 1_000_000 : 500_000, ropeFreqScale: 1, ropeNeox: shape.arch === "qwen2",
    hasRopeFreqs: shape.hasRopeFreqs, hasQkvBias: shape.hasQkvBias, tiedEmbeddings: shape.tiedEmbeddings,
  };
  return { path: `synthetic:${shape.name}-${fileType}`, fileBytes: offset, hparams, tensors };
}

/** Parses a --type argument; undefined when unknown. */
export function parseSyntheticFileType(name: string): SyntheticFileType | undefined {
  const up = name.toUpperCase();
  return (syntheticFileTypes as readonly string[]).includes(up) ? (up as SyntheticFileType) : undefined;
}
