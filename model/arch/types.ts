// What every family file (model/arch/<family>.ts) describes, and what the engine gets from it: the
// hyper-parameters with the switches of the native shared blocks, and the checked tensor table.

/** A family name as general.architecture spells it. */
export type Architecture = "llama" | "qwen2" | "qwen3" | "qwen3moe" | "gemma2" | "gemma3" | "mistral3" | "phi3" | "gpt-oss";

export interface HParams {
  readonly arch: Architecture;
  readonly nVocab: number;
  readonly nEmbd: number;
  readonly nLayers: number;
  readonly nHead: number;
  readonly nHeadKv: number;
  readonly headDimK: number;
  readonly headDimV: number;
  readonly nFf: number;
  readonly nCtxTrain: number;
  readonly normEps: number;
  readonly ropeDims: number;
  readonly ropeFreqBase: number;
  /** Multiplies positions (linear RoPE scaling); 1 when none. */
  readonly ropeFreqScale: number;
  /** true: rotate pairs (i, i + d/2) (NeoX: qwen2, qwen3, gemma3); false: adjacent pairs (i, i + 1) (llama). */
  readonly ropeNeox: boolean;
  /** Llama 3.1-style per-dimension frequency factors come from the `rope_freqs.weight` tensor. */
  readonly hasRopeFreqs: boolean;
  readonly hasQkvBias: boolean;
  /** output.weight absent: the head reuses token_embd.weight. */
  readonly tiedEmbeddings: boolean;
  /** The gated feed-forward's activation: silu(gate) * up, gelu_tanh(gate) * up, or gpt-oss's clamped
   * SwiGLU (llama.cpp's swiglu_oai, alpha 1.702, limit 7; experts only). */
  readonly ffnAct: "silu" | "gelu" | "swiglu-oai";
  /** Token embeddings are multiplied by this (gemma: sqrt(nEmbd)); 1 for none. */
  readonly embdScale: number;
  /** Q is multiplied by this before attention (gemma's query scale); 1 for none. */
  readonly queryScale: number;
  /** Attention scores are multiplied by this: 1/sqrt(head size), or 1 when Q was scaled instead. */
  readonly scoreScale: number;
  /** Per layer: 0 full causal attention, else a sliding window of that many tokens. */
  readonly layerWindow: readonly number[];
  /** RoPE base and position scale of the sliding-window layers (the full ones' when there are none). */
  readonly ropeFreqBaseSwa: number;
  readonly ropeFreqScaleSwa: number;
  /** RoPE's cos and sin are multiplied by this (rope.scaling.attn_factor); 1 for none. */
  readonly ropeAttnFactor: number;
  /** The context the model was trained at before extension: a longer window takes phi3's long RoPE
   * factors (rope.scaling.original_context_length, else the training context). */
  readonly nCtxOrig: number;
  /** Attention scores and the final logits become cap * tanh(x / cap) (gemma2); 0 for none. */
  readonly attnSoftcap: number;
  readonly finalSoftcap: number;
  /** Mixture of experts: experts per layer (0: a dense feed-forward), how many each token uses, and an
   * expert's feed-forward width. */
  readonly nExpert: number;
  readonly nExpertUsed: number;
  readonly nFfExp: number;
  /** How the router's logits pick and weigh a token's experts: softmax over all, top k, renormalised
   * (qwen3moe, Mixtral); or the top k logits and a softmax over those (gpt-oss). */
  readonly moeGating: "softmax-norm" | "topk-softmax";
  /** YaRN (rope.scaling.type "yarn", gpt-oss): ggml's ext_factor (0: none) and the correction betas;
   * the original context is nCtxOrig, the attention factor ropeAttnFactor as llama.cpp's context sets it. */
  readonly ropeYarnExtFactor: number;
  readonly ropeYarnBetaFast: number;
  readonly ropeYarnBetaSlow: number;
}

/** One tensor the engine maps: where it is in the file and what it is. */
export interface TensorRef {
  readonly name: string;
  readonly type: number;
  readonly dims: readonly number[];
  readonly offset: number;
  readonly nBytes: number;
}

/** A layer's tensors; the optional ones turn on a shared block (the native prima_layer holds the same). */
export interface LayerTensors {
  readonly attnNorm: TensorRef;
  readonly wq: TensorRef;
  readonly wk: TensorRef;
  readonly wv: TensorRef;
  readonly wo: TensorRef;
  readonly bq?: TensorRef;
  readonly bk?: TensorRef;
  readonly bv?: TensorRef;
  /** Per-head RMS norms of Q and K before RoPE (qwen3, gemma3). */
  readonly qNorm?: TensorRef;
  readonly kNorm?: TensorRef;
  /** RMS norm of the attention output before the residual add (gemma3). */
  readonly attnPostNorm?: TensorRef;
  readonly ffnNorm: TensorRef;
  /** The dense feed-forward (absent in a mixture-of-experts layer). */
  readonly wGate?: TensorRef;
  readonly wUp?: TensorRef;
  readonly wDown?: TensorRef;
  /** Mixture of experts: the router ([nEmbd, nExpert]) and every expert's gate, up and down, one 3-D
   * tensor each ([nEmbd, nFfExp, nExpert], [nFfExp, nEmbd, nExpert]). */
  readonly ffnGateInp?: TensorRef;
  readonly ffnGateExps?: TensorRef;
  readonly ffnUpExps?: TensorRef;
  readonly ffnDownExps?: TensorRef;
  /** RMS norm of the feed-forward output before the residual add (gemma3). */
  readonly ffnPostNorm?: TensorRef;
  /** gpt-oss: the attention output's bias, the per-head sink logits, and the biases of the router and
   * of every expert's gate, up and down ([nFfExp or nEmbd, nExpert]). */
  readonly bo?: TensorRef;
  readonly attnSinks?: TensorRef;
  readonly ffnGateInpB?: TensorRef;
  readonly ffnGateExpsB?: TensorRef;
  readonly ffnUpExpsB?: TensorRef;
  readonly ffnDownExpsB?: TensorRef;
}

export interface ModelTensors {
  readonly tokenEmbd: TensorRef;
  readonly outputNorm: TensorRef;
  /** token_embd when the embeddings are tied. */
  readonly output: TensorRef;
  readonly ropeFreqs?: TensorRef;
  /** phi3's LongRoPE frequency factors: long for a context past nCtxOrig, else short. */
  readonly ropeFactorsLong?: TensorRef;
  readonly ropeFactorsShort?: TensorRef;
  readonly layers: readonly LayerTensors[];
}

export interface ModelDescription {
  readonly path: string;
  readonly fileBytes: number;
  readonly hparams: HParams;
  readonly tensors: ModelTensors;
}

/** One per-layer tensor of a family's table (llama.cpp's create_tensor calls of load_arch_tensors). */
export interface LayerSlot {
  readonly field: keyof LayerTensors;
  /** The name after `blk.N.`. */
  readonly name: string;
  /** ggml dims (row length first) from the hyper-parameters. */
  readonly dims: (hp: HParams) => readonly number[];
  /** Present in this model at all (e.g. QKV biases when the file has them); default always. */
  readonly when?: (hp: HParams) => boolean;
  /** Norms and biases are F32 in every file llama.cpp writes, and so in ours. */
  readonly f32?: boolean;
  /** What the generator fills it with (sinks: logits of about unit size). */
  readonly fill: "weight" | "ones" | "bias" | "sinks";
  /** The engine maps the tensor under this name (after `blk.N.`): the shared block it feeds is named
   * otherwise in this family's files (gpt-oss's post_attention_norm is the feed-forward's norm). */
  readonly as?: string;
  /** The slot is rows [start, start + count) of the fused tensor `name` (phi3's attn_qkv, ffn_up),
   * which the engine maps as the separate tensor `as` would be: no copy, no extra pass. */
  readonly view?: { readonly as: string; readonly rows: (hp: HParams) => readonly [number, number] };
}

/** Reads the family's own keys of a file (`<arch>.` prefixed). */
export interface KeyReader {
  readonly path: string;
  /** The family prefix of its keys. */
  readonly arch: string;
  number(key: string): number | undefined;
  string(key: string): string | undefined;
  /** An array's items (numbers or booleans), undefined when absent or not an array. */
  array(key: string): readonly (number | boolean | bigint | string)[] | undefined;
  hasTensor(name: string): boolean;
}

/** What a generated model of the family is made from (model/shapes.ts's ModelShape, the parts a family reads). */
export interface FamilyShape {
  readonly nEmbd: number;
  readonly nLayers: number;
  readonly nHead: number;
  readonly nHeadKv: number;
  readonly nFf: number;
  readonly nVocab: number;
  readonly tiedEmbeddings: boolean;
  readonly qkvBias: boolean;
  readonly contextLength: number;
  readonly ropeFreqBase: number;
  readonly normEps: number;
  /** Head size when it is not nEmbd / nHead (attention.key_length). */
  readonly headDim?: number;
  /** gemma3: the sliding window and every how many layers one is full (default 6). */
  readonly slidingWindow?: number;
  readonly slidingWindowPattern?: number;
  readonly ropeFreqBaseSwa?: number;
  /** Rotary dims when only part of each head rotates (phi3's partial_rotary_factor). */
  readonly ropeDims?: number;
  /** phi3's LongRoPE: the original context (and rope factor tensors are written) and the attn factor. */
  readonly ropeOrigContext?: number;
  readonly ropeAttnFactor?: number;
  /** gemma2's soft-caps of the attention scores and the logits. */
  readonly attnSoftcap?: number;
  readonly finalSoftcap?: number;
  /** Mixture of experts: experts per layer, used per token, an expert's width (default nFf). */
  readonly nExpert?: number;
  readonly nExpertUsed?: number;
  readonly nFfExp?: number;
  /** YaRN: rope.scaling.factor (with ropeOrigContext as its original context). */
  readonly ropeYarnFactor?: number;
}

/** A family: its keys, its switches of the shared blocks and its tensor table. Adding a family is one
 * such file here (and, when it needs a block the native side lacks, that block in native/src/model.c). */
export interface ArchFamily {
  readonly name: Architecture;
  readonly ropeNeox: boolean;
  /** The family's switches and keys, given the hyper-parameters every family shares. */
  readonly hparams: (keys: KeyReader, common: HParams) => HParams;
  readonly layer: readonly LayerSlot[];
  /** The family reads rope_factors_long/short.weight (llama.cpp creates them for phi3 only). */
  readonly longRope?: boolean;
  /** The family reads Llama 3.1's rope_freqs.weight (llama, mistral3; the others' builds ignore it). */
  readonly ropeFreqs?: boolean;
  /** The family runs mixture-of-experts layers (expert_count > 0); others refuse such a file by name. */
  readonly moe?: boolean;
  /** The family reads YaRN RoPE scaling (rope.scaling.type "yarn"); others refuse it by name. */
  readonly yarn?: boolean;
  /** Every tensor of the file must be one the family's table (or the model's own) reads: anything else
   * is refused by name rather than ignored. */
  readonly strictTensors?: boolean;
  /** Metadata keys a generated model of this family writes beyond the common ones (modelgen/). */
  readonly shapeMetadata?: (shape: FamilyShape) => readonly ({ key: string; type: "u32" | "f32"; value: number } | { key: string; type: "str"; value: string })[];
}
