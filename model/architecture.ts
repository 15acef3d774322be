// From a GGUF header to what the engine needs: hyper-parameters and a checked tensor table.
// Supports the `llama` family (Llama 2/3, TinyLlama, SmolLM, Mistral) and `qwen2` (QKV bias,
// NeoX RoPE, tied embeddings). Everything else is refused by name.

import { GgufError, metaNumber, metaString, type GgufFile, type GgufTensorInfo } from "./gguf.js";
import { printable } from "../base/index.js";
import { ggmlTypeInfo, ggmlTypeName } from "./ggml-types.js";

export type Architecture = "llama" | "qwen2";
export const supportedArchitectures: readonly Architecture[] = ["llama", "qwen2"];

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
  /** true: rotate pairs (i, i + d/2) (NeoX, qwen2); false: adjacent pairs (i, i + 1) (llama). */
  readonly ropeNeox: boolean;
  /** Llama 3.1-style per-dimension frequency factors come from the `rope_freqs.weight` tensor. */
  readonly hasRopeFreqs: boolean;
  readonly hasQkvBias: boolean;
  /** output.weight absent: the head reuses token_embd.weight. */
  readonly tiedEmbeddings: boolean;
}

/** One tensor the engine maps: where it is in the file and what it is. */
export interface TensorRef {
  readonly name: string;
  readonly type: number;
  readonly dims: readonly number[];
  readonly offset: number;
  readonly nBytes: number;
}

export interface LayerTensors {
  readonly attnNorm: TensorRef;
  readonly wq: TensorRef;
  readonly wk: TensorRef;
  readonly wv: TensorRef;
  readonly wo: TensorRef;
  readonly bq?: TensorRef;
  readonly bk?: TensorRef;
  readonly bv?: TensorRef;
  readonly ffnNorm: TensorRef;
  readonly wGate: TensorRef;
  readonly wUp: TensorRef;
  readonly wDown: TensorRef;
}

export interface ModelTensors {
  readonly tokenEmbd: TensorRef;
  readonly outputNorm: TensorRef;
  /** token_embd when the embeddings are tied. */
  readonly output: TensorRef;
  readonly ropeFreqs?: TensorRef;
  readonly layers: readonly LayerTensors[];
}

export interface ModelDescription {
  readonly path: string;
  readonly fileBytes: number;
  readonly hparams: HParams;
  readonly tensors: ModelTensors;
}

const MAX_DIM = 1 << 20; // hidden sizes, heads and layers above this are not real models

function positiveInt(f: GgufFile, key: string, v: number, max = MAX_DIM): number {
  if (!Number.isInteger(v) || v < 1 || v > max) throw new GgufError(`${f.path}: ${key} = ${v} is out of range (1..${max})`);
  return v;
}

export function readHParams(f: GgufFile): HParams {
  const archName = metaString(f, "general.architecture");
  if (archName === undefined) throw new GgufError(`${f.path}: missing general.architecture`);
  if (!(supportedArchitectures as readonly string[]).includes(archName)) {
    throw new GgufError(`${f.path}: architecture "${printable(archName, 80)}" is not supported (supported: ${supportedArchitectures.join(", ")})`);
  }
  const arch = archName as Architecture;
  const k = (s: string) => `${arch}.${s}`;
  const int = (key: string, dflt?: number, max?: number) => {
    const v = metaNumber(f, k(key)) ?? dflt;
    if (v === undefined) throw new GgufError(`${f.path}: missing metadata ${k(key)}`);
    return positiveInt(f, k(key), v, max);
  };
  const nEmbd = int("embedding_length");
  const nLayers = int("block_count", undefined, 4096);
  const nHead = int("attention.head_count");
  const nHeadKv = int("attention.head_count_kv", nHead);
  const nFf = int("feed_forward_length");
  if (nHead % nHeadKv !== 0) throw new GgufError(`${f.path}: ${nHead} heads is not a multiple of ${nHeadKv} KV heads`);
  if (nEmbd % nHead !== 0 && metaNumber(f, k("attention.key_length")) === undefined) {
    throw new GgufError(`${f.path}: embedding ${nEmbd} is not divisible by ${nHead} heads`);
  }
  const headDimK = int("attention.key_length", nEmbd / nHead);
  const headDimV = int("attention.value_length", headDimK);
  if (headDimK !== headDimV) throw new GgufError(`${f.path}: key length ${headDimK} differs from value length ${headDimV}; not supported`);
  const ropeDims = int("rope.dimension_count", headDimK);
  if (ropeDims > headDimK || ropeDims % 2 !== 0) throw new GgufError(`${f.path}: rope dimension ${ropeDims} is invalid for head size ${headDimK}`);
  const normEps = metaNumber(f, k("attention.layer_norm_rms_epsilon")) ?? 1e-5;
  if (!(normEps > 0 && normEps < 1)) throw new GgufError(`${f.path}: rms norm epsilon ${normEps} is out of range`);
  const ropeFreqBase = metaNumber(f, k("rope.freq_base")) ?? 10000;
  if (!(ropeFreqBase > 1 && Number.isFinite(ropeFreqBase))) throw new GgufError(`${f.path}: rope.freq_base ${ropeFreqBase} is out of range`);
  const scalingType = metaString(f, k("rope.scaling.type")) ?? "none";
  let ropeFreqScale = 1;
  if (scalingType === "linear") {
    const factor = metaNumber(f, k("rope.scaling.factor")) ?? metaNumber(f, k("rope.scale_linear")) ?? 1;
    if (!(factor > 0)) throw new GgufError(`${f.path}: rope scaling factor ${factor} is invalid`);
    ropeFreqScale = 1 / factor;
  } else if (scalingType !== "none") {
    // llama3-style scaling is carried by rope_freqs.weight with type "none"; yarn/longrope need more.
    throw new GgufError(`${f.path}: RoPE scaling type "${printable(scalingType, 80)}" is not supported`);
  } else {
    const lin = metaNumber(f, k("rope.scale_linear"));
    if (lin !== undefined && lin > 0) ropeFreqScale = 1 / lin;
  }
  const nCtxTrain = metaNumber(f, k("context_length")) ?? 2048;

  const embd = f.tensors.find((t) => t.name === "token_embd.weight");
  const tokens = f.metadata.get("tokenizer.ggml.tokens");
  const nVocab = embd ? embd.dims[1] ?? 0 : tokens && typeof tokens.value === "object" ? tokens.value.items.length : 0;
  positiveInt(f, "vocabulary size", nVocab, 1 << 24);
  return {
    arch, nVocab, nEmbd, nLayers, nHead, nHeadKv, headDimK, headDimV, nFf, nCtxTrain, normEps,
    ropeDims, ropeFreqBase, ropeFreqScale,
    ropeNeox: arch === "qwen2",
    hasRopeFreqs: f.tensors.some((t) => t.name === "rope_freqs.weight"),
    hasQkvBias: f.tensors.some((t) => t.name === "blk.0.attn_q.bias"),
    tiedEmbeddings: !f.tensors.some((t) => t.name === "output.weight"),
  };
}

/** Checks every tensor the architecture needs: present, supported type, expected shape. */
export function readModelTensors(f: GgufFile, hp: HParams): ModelTensors {
  const byName = new Map<string, GgufTensorInfo>(f.tensors.map((t) => [t.name, t]));
  const get = (name: string, dims: readonly number[], opts: { optional?: boolean; f32Only?: boolean } = {}): TensorRef | undefined => {
    const t = byName.get(name);
    if (!t) {
      if (opts.optional) return undefined;
      throw new GgufError(`${f.path}: missing tensor ${name}`);
    }
    const info = ggmlTypeInfo(t.type);
    if (!info?.supported) throw new GgufError(`${f.path}: tensor ${name} has type ${ggmlTypeName(t.type)}, which prima does not support`);
    if (opts.f32Only && t.type !== 0) throw new GgufError(`${f.path}: tensor ${name} must be F32, is ${ggmlTypeName(t.type)}`);
    const shapeOk = t.dims.length >= dims.length && dims.every((d, i) => t.dims[i] === d) && t.dims.slice(dims.length).every((d) => d === 1);
    if (!shapeOk) throw new GgufError(`${f.path}: tensor ${name} has shape [${t.dims.join(", ")}], expected [${dims.join(", ")}]`);
    return { name, type: t.type, dims: t.dims, offset: t.offset, nBytes: t.nBytes };
  };
  const must = (name: string, dims: readonly number[], f32Only = false) => get(name, dims, { f32Only })!;
  const E = hp.nEmbd, qDim = hp.nHead * hp.headDimK, kvDim = hp.nHeadKv * hp.headDimK;
  const tokenEmbd = must("token_embd.weight", [E, hp.nVocab]);
  const outputNorm = must("output_norm.weight", [E], true);
  const output = get("output.weight", [E, hp.nVocab], { optional: true }) ?? tokenEmbd;
  const ropeFreqs = get("rope_freqs.weight", [hp.ropeDims / 2], { optional: true, f32Only: true });
  checkLayerCount(f, hp.nLayers);
  const layers: LayerTensors[] = [];
  for (let i = 0; i < hp.nLayers; i++) {
    const p = `blk.${i}.`;
    const bias = (n: string, d: number) => (hp.hasQkvBias ? must(`${p}${n}.bias`, [d], true) : undefined);
    layers.push({
      attnNorm: must(`${p}attn_norm.weight`, [E], true),
      wq: must(`${p}attn_q.weight`, [E, qDim]),
      wk: must(`${p}attn_k.weight`, [E, kvDim]),
      wv: must(`${p}attn_v.weight`, [E, kvDim]),
      wo: must(`${p}attn_output.weight`, [qDim, E]),
      bq: bias("attn_q", qDim),
      bk: bias("attn_k", kvDim),
      bv: bias("attn_v", kvDim),
      ffnNorm: must(`${p}ffn_norm.weight`, [E], true),
      wGate: must(`${p}ffn_gate.weight`, [E, hp.nFf]),
      wUp: must(`${p}ffn_up.weight`, [E, hp.nFf]),
      wDown: must(`${p}ffn_down.weight`, [hp.nFf, E]),
    });
  }
  return { tokenEmbd, outputNorm, output, ropeFreqs, layers };
}

/** block_count must agree with the blk.N tensors: a file that says fewer layers than it holds would
 * run part of the model silently, one that says more would fail later on a missing tensor. */
function checkLayerCount(f: GgufFile, nLayers: number): void {
  let top = -1;
  let topName = "";
  for (const t of f.tensors) {
    const m = /^blk\.(\d+)\./.exec(t.name);
    if (m && Number(m[1]) > top) {
      top = Number(m[1]);
      topName = t.name;
    }
  }
  const key = `${f.metadata.get("general.architecture")?.value}.block_count`;
  if (top >= nLayers) {
    throw new GgufError(`${f.path}: ${key} says ${nLayers} layers, but the file has tensors of layer ${top} (${topName}); the header is wrong or hostile`);
  }
  if (top < nLayers - 1) {
    throw new GgufError(`${f.path}: ${key} says ${nLayers} layers, but the file has tensors of ${top + 1} (no blk.${top + 1}.* tensor)`);
  }
}

export function describeModel(f: GgufFile): ModelDescription {
  const hparams = readHParams(f);
  return { path: f.path, fileBytes: f.fileBytes, hparams, tensors: readModelTensors(f, hparams) };
}
