// What the families share: the hyper-parameters every llama-like GGUF has, and the llama layer's
// tensor table the others extend (llama.cpp's llama_model_base::load_hparams and LLM_TENSOR_* names).
import { GgufError, metaNumber, metaString, metaValue, type GgufFile } from "../gguf.js";
import { printable } from "../../base/index.js";
import type { Architecture, HParams, KeyReader, LayerSlot, LayerTensors, TensorRef } from "./types.js";

const MAX_DIM = 1 << 20; // hidden sizes, heads and layers above this are not real models

function positiveInt(path: string, key: string, v: number, max = MAX_DIM): number {
  if (!Number.isInteger(v) || v < 1 || v > max) throw new GgufError(`${path}: ${key} = ${v} is out of range (1..${max})`);
  return v;
}

/** float32 arithmetic as llama.cpp does it: 1.0f / sqrtf(float(n)). */
export const invSqrtF32 = (n: number): number => Math.fround(1 / Math.fround(Math.sqrt(n)));

export function keyReader(f: GgufFile, arch: string): KeyReader {
  const k = (s: string) => `${arch}.${s}`;
  return {
    path: f.path,
    arch,
    number: (key) => metaNumber(f, k(key)),
    string: (key) => metaString(f, k(key)),
    array: (key) => {
      const v = metaValue(f, k(key));
      return v !== undefined && typeof v === "object" ? Array.from(v.items as ArrayLike<number | boolean | bigint | string>) : undefined;
    },
    hasTensor: (name) => f.tensors.some((t) => t.name === name),
  };
}

/** A file's vocabulary size: token_embd's rows, else the tokenizer's token count. */
export function fileVocabSize(f: GgufFile): number {
  const embd = f.tensors.find((t) => t.name === "token_embd.weight");
  const tokens = f.metadata.get("tokenizer.ggml.tokens");
  return embd ? embd.dims[1] ?? 0 : tokens && typeof tokens.value === "object" ? tokens.value.items.length : 0;
}

/** The hyper-parameters of every family, with the llama defaults of the shared blocks' switches. */
export function commonHParams(r: KeyReader, arch: Architecture, ropeNeox: boolean, nVocab: number): HParams {
  const f = { path: r.path };
  const k = (s: string) => `${arch}.${s}`;
  const int = (key: string, dflt?: number, max?: number) => {
    const v = r.number(key) ?? dflt;
    if (v === undefined) throw new GgufError(`${f.path}: missing metadata ${k(key)}`);
    return positiveInt(f.path, k(key), v, max);
  };
  const nEmbd = int("embedding_length");
  const nLayers = int("block_count", undefined, 4096);
  const nHead = int("attention.head_count");
  const nHeadKv = int("attention.head_count_kv", nHead);
  const nFf = int("feed_forward_length");
  if (nHead % nHeadKv !== 0) throw new GgufError(`${f.path}: ${nHead} heads is not a multiple of ${nHeadKv} KV heads`);
  if (nEmbd % nHead !== 0 && r.number("attention.key_length") === undefined) {
    throw new GgufError(`${f.path}: embedding ${nEmbd} is not divisible by ${nHead} heads`);
  }
  const headDimK = int("attention.key_length", nEmbd / nHead);
  const headDimV = int("attention.value_length", headDimK);
  if (headDimK !== headDimV) throw new GgufError(`${f.path}: key length ${headDimK} differs from value length ${headDimV}; not supported`);
  const ropeDims = int("rope.dimension_count", headDimK);
  if (ropeDims > headDimK || ropeDims % 2 !== 0) throw new GgufError(`${f.path}: rope dimension ${ropeDims} is invalid for head size ${headDimK}`);
  const normEps = r.number("attention.layer_norm_rms_epsilon") ?? 1e-5;
  if (!(normEps > 0 && normEps < 1)) throw new GgufError(`${f.path}: rms norm epsilon ${normEps} is out of range`);
  const ropeFreqBase = r.number("rope.freq_base") ?? 10000;
  if (!(ropeFreqBase > 1 && Number.isFinite(ropeFreqBase))) throw new GgufError(`${f.path}: rope.freq_base ${ropeFreqBase} is out of range`);
  const scalingType = r.string("rope.scaling.type") ?? "none";
  let ropeFreqScale = 1;
  if (scalingType === "linear") {
    const factor = r.number("rope.scaling.factor") ?? r.number("rope.scale_linear") ?? 1;
    if (!(factor > 0)) throw new GgufError(`${f.path}: rope scaling factor ${factor} is invalid`);
    ropeFreqScale = 1 / factor;
  } else if (scalingType !== "none") {
    // llama3-style scaling is carried by rope_freqs.weight with type "none"; yarn/longrope need more.
    throw new GgufError(`${f.path}: RoPE scaling type "${printable(scalingType, 80)}" is not supported`);
  } else {
    const lin = r.number("rope.scale_linear");
    if (lin !== undefined && lin > 0) ropeFreqScale = 1 / lin;
  }
  const nCtxTrain = r.number("context_length") ?? 2048;
  const nCtxOrig = r.number("rope.scaling.original_context_length") ?? nCtxTrain;
  if (!Number.isInteger(nCtxOrig) || nCtxOrig < 1 || nCtxOrig > 1 << 24) throw new GgufError(`${f.path}: original context length ${nCtxOrig} is out of range`);
  const ropeAttnFactor = r.number("rope.scaling.attn_factor") ?? 1;
  if (!(ropeAttnFactor > 0 && ropeAttnFactor < 100)) throw new GgufError(`${f.path}: ${k("rope.scaling.attn_factor")} ${ropeAttnFactor} is out of range`);

  positiveInt(f.path, "vocabulary size", nVocab, 1 << 24);
  return {
    arch, nVocab, nEmbd, nLayers, nHead, nHeadKv, headDimK, headDimV, nFf, nCtxTrain, normEps,
    ropeDims, ropeFreqBase, ropeFreqScale, ropeNeox,
    hasRopeFreqs: r.hasTensor("rope_freqs.weight"),
    hasQkvBias: r.hasTensor("blk.0.attn_q.bias"),
    tiedEmbeddings: !r.hasTensor("output.weight"),
    ffnAct: "silu",
    embdScale: 1,
    queryScale: 1,
    scoreScale: invSqrtF32(headDimK),
    layerWindow: new Array<number>(nLayers).fill(0),
    ropeFreqBaseSwa: ropeFreqBase,
    ropeFreqScaleSwa: ropeFreqScale,
    ropeAttnFactor,
    nCtxOrig,
    attnSoftcap: 0,
    finalSoftcap: 0,
  };
}

const qDim = (hp: HParams) => hp.nHead * hp.headDimK;
const kvDim = (hp: HParams) => hp.nHeadKv * hp.headDimK;

/** llama's layer: attention with optional QKV bias, SwiGLU feed-forward. In file order (the order
 * llama-quantize counts tensors in, which the generator keeps). */
export const llamaLayer: readonly LayerSlot[] = [
  { field: "attnNorm", name: "attn_norm.weight", dims: (hp) => [hp.nEmbd], f32: true, fill: "ones" },
  { field: "wq", name: "attn_q.weight", dims: (hp) => [hp.nEmbd, qDim(hp)], fill: "weight" },
  { field: "wk", name: "attn_k.weight", dims: (hp) => [hp.nEmbd, kvDim(hp)], fill: "weight" },
  { field: "wv", name: "attn_v.weight", dims: (hp) => [hp.nEmbd, kvDim(hp)], fill: "weight" },
  { field: "bq", name: "attn_q.bias", dims: (hp) => [qDim(hp)], when: (hp) => hp.hasQkvBias, f32: true, fill: "bias" },
  { field: "bk", name: "attn_k.bias", dims: (hp) => [kvDim(hp)], when: (hp) => hp.hasQkvBias, f32: true, fill: "bias" },
  { field: "bv", name: "attn_v.bias", dims: (hp) => [kvDim(hp)], when: (hp) => hp.hasQkvBias, f32: true, fill: "bias" },
  { field: "wo", name: "attn_output.weight", dims: (hp) => [qDim(hp), hp.nEmbd], fill: "weight" },
  { field: "ffnNorm", name: "ffn_norm.weight", dims: (hp) => [hp.nEmbd], f32: true, fill: "ones" },
  { field: "wGate", name: "ffn_gate.weight", dims: (hp) => [hp.nEmbd, hp.nFf], fill: "weight" },
  { field: "wUp", name: "ffn_up.weight", dims: (hp) => [hp.nEmbd, hp.nFf], fill: "weight" },
  { field: "wDown", name: "ffn_down.weight", dims: (hp) => [hp.nFf, hp.nEmbd], fill: "weight" },
];

/** Per-head Q and K RMS norms (qwen3, gemma3), weights of one head's size. */
export const qkNormSlots: readonly LayerSlot[] = [
  { field: "qNorm", name: "attn_q_norm.weight", dims: (hp) => [hp.headDimK], f32: true, fill: "ones" },
  { field: "kNorm", name: "attn_k_norm.weight", dims: (hp) => [hp.headDimK], f32: true, fill: "ones" },
];

/** Layer i's tensors from a family's table: `lookup` finds (and checks) a whole tensor of the file;
 * a view slot becomes its rows of the fused tensor, named as the separate tensor would be. */
export function layerFromTable(
  slots: readonly LayerSlot[], hp: HParams, i: number,
  lookup: (name: string, dims: readonly number[], f32: boolean) => TensorRef | undefined,
): LayerTensors {
  const layer: Partial<Record<keyof LayerTensors, TensorRef>> = {};
  for (const slot of slots) {
    if (slot.when && !slot.when(hp)) continue;
    const t = lookup(`blk.${i}.${slot.name}`, slot.dims(hp), slot.f32 ?? false);
    if (!t) continue;
    if (!slot.view) {
      layer[slot.field] = t;
      continue;
    }
    const [start, count] = slot.view.rows(hp);
    const rowBytes = t.nBytes / t.dims[1];
    layer[slot.field] = { name: `blk.${i}.${slot.view.as}`, type: t.type, dims: [t.dims[0], count], offset: t.offset + start * rowBytes, nBytes: count * rowBytes };
  }
  return layer as LayerTensors;
}

/** Which layers slide (llama.cpp set_swa_pattern, dense last): the per-layer array of
 * attention.sliding_window_pattern, or every layer but each n-th for its number (default `dflt`). */
export function slidingLayers(keys: KeyReader, nLayers: number, dflt: number): boolean[] {
  const arr = keys.array("attention.sliding_window_pattern");
  if (arr) {
    if (arr.length < nLayers) throw new GgufError(`${keys.path}: ${keys.arch}.attention.sliding_window_pattern has ${arr.length} entries for ${nLayers} layers`);
    return arr.slice(0, nLayers).map((v) => Boolean(v));
  }
  const n = keys.number("attention.sliding_window_pattern") ?? dflt;
  if (!Number.isInteger(n) || n < 0 || n > 1 << 16) throw new GgufError(`${keys.path}: ${keys.arch}.attention.sliding_window_pattern = ${n} is out of range`);
  return Array.from({ length: nLayers }, (_, il) => n === 0 || il % n < n - 1);
}

/** A positive number key within (0, max), or its default; else an error naming the key. */
export function rangedKey(keys: KeyReader, key: string, dflt: number, max: number): number {
  const v = keys.number(key) ?? dflt;
  if (!(v >= 0 && v < max && Number.isFinite(v))) throw new GgufError(`${keys.path}: ${keys.arch}.${key} = ${v} is out of range`);
  return v;
}

/** gemma's layer (gemma2, gemma3): llama's, with RMS norms of the attention and feed-forward outputs. */
export const gemmaLayer: readonly LayerSlot[] = withSlots(
  withSlots(llamaLayer, "wo", [{ field: "attnPostNorm", name: "post_attention_norm.weight", dims: (hp) => [hp.nEmbd], f32: true, fill: "ones" }]),
  "wDown",
  [{ field: "ffnPostNorm", name: "post_ffw_norm.weight", dims: (hp) => [hp.nEmbd], f32: true, fill: "ones" }],
);

/** The table with `extra` slots placed after the slot of field `after`. */
export function withSlots(base: readonly LayerSlot[], after: LayerSlot["field"], extra: readonly LayerSlot[]): LayerSlot[] {
  const i = base.findIndex((s) => s.field === after);
  if (i < 0) throw new Error(`no slot ${after} in the table`);
  return [...base.slice(0, i + 1), ...extra, ...base.slice(i + 1)];
}
