// What the families share: the hyper-parameters every llama-like GGUF has, and the llama layer's
// tensor table the others extend (llama.cpp's llama_model_base::load_hparams and LLM_TENSOR_* names).
import { GgufError, metaNumber, metaString, metaValue, type GgufFile } from "../gguf.js";
import { printable } from "../../base/index.js";
import type { Architecture, HParams, KeyReader, LayerSlot, LayerTensors, TensorRef } from "./types.js";

const MAX_DIM = 1 << 20; // hidden sizes, heads and layers above this are not real models
const MAX_EXPERTS = 1024; // llama.cpp's LLAMA_MAX_EXPERTS

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
export function commonHParams(r: KeyReader, arch: Architecture, ropeNeox: boolean, nVocab: number, yarn = false): HParams {
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
  } else if (scalingType === "yarn" && yarn) {
    const factor = r.number("rope.scaling.factor") ?? 1;
    if (!(factor >= 1 && factor < 1e6)) throw new GgufError(`${f.path}: ${k("rope.scaling.factor")} ${factor} is out of range for YaRN (1..1e6)`);
    ropeFreqScale = Math.fround(1 / factor);
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

  // YaRN as llama.cpp's context sets it up (llama_context: ext_factor 1, the betas 32 and 1, and an
  // attention factor get_mscale(factor) / (1 + 0.1 ln factor) that ggml's rope multiplies back)
  const isYarn = scalingType === "yarn";
  let attnFactor = ropeAttnFactor;
  if (isYarn) {
    const factor = Math.fround(1 / ropeFreqScale), lnF = Math.fround(Math.log(factor));
    const mscale = factor <= 1 ? 1 : Math.fround(Math.fround(0.1 * lnF) + 1);
    attnFactor = Math.fround(Math.fround(mscale * Math.fround(1 / Math.fround(1 + Math.fround(0.1 * lnF)))) * ropeAttnFactor);
  }

  positiveInt(f.path, "vocabulary size", nVocab, 1 << 24);
  // Mixture of experts (llama.cpp reads these for every family; the families with MoE layers use them).
  const nExpert = r.number("expert_count") ?? 0;
  if (!Number.isInteger(nExpert) || nExpert < 0 || nExpert > MAX_EXPERTS) throw new GgufError(`${f.path}: ${k("expert_count")} = ${nExpert} is out of range (0..${MAX_EXPERTS})`);
  let nExpertUsed = 0, nFfExp = 0;
  if (nExpert > 0) {
    if (r.array("expert_used_count")) throw new GgufError(`${f.path}: ${k("expert_used_count")} per layer is not supported (one count for every layer is)`);
    nExpertUsed = int("expert_used_count", undefined, nExpert);
    nFfExp = int("expert_feed_forward_length", nFf);
  }
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
    ropeAttnFactor: attnFactor,
    nCtxOrig,
    attnSoftcap: 0,
    finalSoftcap: 0,
    nExpert,
    nExpertUsed,
    nFfExp,
    moeGating: "softmax-norm",
    ropeYarnExtFactor: isYarn ? 1 : 0,
    ropeYarnBetaFast: 32,
    ropeYarnBetaSlow: 1,
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

/** A mixture-of-experts layer's feed-forward (llama.cpp build_moe_ffn with separate gate and up): the
 * router, then each expert's gate, up and down as one 3-D tensor, expert-major (an expert's matrix is
 * a run of nFfExp, or nEmbd, rows). The router stays F32 (llama-quantize never quantizes it). */
export const moeSlots: readonly LayerSlot[] = [
  { field: "ffnGateInp", name: "ffn_gate_inp.weight", dims: (hp) => [hp.nEmbd, hp.nExpert], when: (hp) => hp.nExpert > 0, fill: "weight" },
  { field: "ffnGateExps", name: "ffn_gate_exps.weight", dims: (hp) => [hp.nEmbd, hp.nFfExp, hp.nExpert], when: (hp) => hp.nExpert > 0, fill: "weight" },
  { field: "ffnUpExps", name: "ffn_up_exps.weight", dims: (hp) => [hp.nEmbd, hp.nFfExp, hp.nExpert], when: (hp) => hp.nExpert > 0, fill: "weight" },
  { field: "ffnDownExps", name: "ffn_down_exps.weight", dims: (hp) => [hp.nFfExp, hp.nEmbd, hp.nExpert], when: (hp) => hp.nExpert > 0, fill: "weight" },
];

/** A table whose dense feed-forward becomes the experts when the model has them (llama's n_expert
 * switch): the dense slots only without experts, the expert slots after ffn_norm. */
export function denseOrExperts(base: readonly LayerSlot[]): LayerSlot[] {
  const dense = new Set<LayerSlot["field"]>(["wGate", "wUp", "wDown"]);
  const table = base.map((s) => (dense.has(s.field) ? { ...s, when: (hp: HParams) => hp.nExpert === 0 && (s.when?.(hp) ?? true) } : s));
  return withSlots(table, "ffnNorm", moeSlots);
}

/** What llama.cpp's build_moe_ffn does beyond the plain routing prima runs (softmax over all experts,
 * top-k, the chosen weights renormalised): refused by name, not met later as a missing tensor. */
export function refuseMoeExtras(keys: KeyReader, hp: HParams): void {
  if (hp.nExpert === 0) {
    if (keys.hasTensor("blk.0.ffn_gate_inp.weight")) throw new GgufError(`${keys.path}: the file has expert tensors (blk.0.ffn_gate_inp.weight) but no ${keys.arch}.expert_count`);
    return;
  }
  const shared = keys.number("expert_shared_count") ?? 0, sharedFf = keys.number("expert_shared_feed_forward_length") ?? 0;
  if (shared > 0 || sharedFf > 0 || keys.hasTensor("blk.0.ffn_gate_shexp.weight") || keys.hasTensor("blk.0.ffn_up_shexp.weight")) {
    throw new GgufError(`${keys.path}: shared experts (ffn_*_shexp, as Granite-MoE, Qwen2-MoE, DeepSeek) are not supported`);
  }
  const groups = keys.number("expert_group_count") ?? 0;
  if (groups > 1) throw new GgufError(`${keys.path}: ${keys.arch}.expert_group_count = ${groups}: grouped expert selection (DeepSeek-V3) is not supported`);
  if (keys.hasTensor("blk.0.ffn_gate_up_exps.weight")) throw new GgufError(`${keys.path}: fused gate-up expert tensors (ffn_gate_up_exps) are not supported`);
  if (keys.hasTensor("blk.0.exp_probs_b.bias")) throw new GgufError(`${keys.path}: an expert selection bias (exp_probs_b, DeepSeek-V3) is not supported`);
  if (keys.hasTensor("blk.0.ffn_up_exps.weight") && !keys.hasTensor("blk.0.ffn_gate_exps.weight")) {
    throw new GgufError(`${keys.path}: experts without a gate (no ffn_gate_exps) are not supported`);
  }
}

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
      layer[slot.field] = slot.as ? { ...t, name: `blk.${i}.${slot.as}` } : t;
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
