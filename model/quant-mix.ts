// Which ggml type each tensor gets for a file type, as llama.cpp's llama-quantize decides
// (src/llama-quant.cpp: tensor_allows_quantization, llama_tensor_get_type_impl, tensor_type_fallback),
// for the llama and qwen2 architectures without an importance matrix (so no Q2_K_S, which llama.cpp
// refuses to make without one). test/modelgen checks these
// choices against llama.cpp's own llama_model_quantize.
// Pure (no native addon): the generator writes these tables, the planner profiles them unwritten.
import { GgmlType as GgmlTypeId } from "./ggml-types.js";
import type { ModelShape } from "./shapes.js";
import { familyOf, shapeHParams } from "./arch/index.js";

/** llama_ftype values (include/llama.h) and the default weight type of each. */
export const FILE_TYPES = {
  F32: { ftype: 0, base: GgmlTypeId.F32 },
  F16: { ftype: 1, base: GgmlTypeId.F16 },
  BF16: { ftype: 32, base: GgmlTypeId.BF16 },
  Q4_0: { ftype: 2, base: GgmlTypeId.Q4_0 },
  Q4_1: { ftype: 3, base: GgmlTypeId.Q4_1 },
  Q5_0: { ftype: 8, base: GgmlTypeId.Q5_0 },
  Q5_1: { ftype: 9, base: GgmlTypeId.Q5_1 },
  Q8_0: { ftype: 7, base: GgmlTypeId.Q8_0 },
  Q2_K: { ftype: 10, base: GgmlTypeId.Q2_K },
  Q3_K_S: { ftype: 11, base: GgmlTypeId.Q3_K },
  Q3_K_M: { ftype: 12, base: GgmlTypeId.Q3_K },
  Q3_K_L: { ftype: 13, base: GgmlTypeId.Q3_K },
  Q4_K_S: { ftype: 14, base: GgmlTypeId.Q4_K },
  Q4_K_M: { ftype: 15, base: GgmlTypeId.Q4_K },
  Q5_K_S: { ftype: 16, base: GgmlTypeId.Q5_K },
  Q5_K_M: { ftype: 17, base: GgmlTypeId.Q5_K },
  Q6_K: { ftype: 18, base: GgmlTypeId.Q6_K },
  IQ4_NL: { ftype: 25, base: GgmlTypeId.IQ4_NL },
  IQ4_XS: { ftype: 30, base: GgmlTypeId.IQ4_XS },
  /** gpt-oss's release format: experts MXFP4, every other quantizable weight Q8_0. */
  MXFP4_MOE: { ftype: 38, base: GgmlTypeId.MXFP4 },
} as const;
export type FileTypeName = keyof typeof FILE_TYPES;
export const FILE_TYPE_NAMES = Object.keys(FILE_TYPES) as FileTypeName[];

/** llama-quantize's aliases: a bare K type names its _M mix. */
const ALIASES: Record<string, FileTypeName> = { Q3_K: "Q3_K_M", Q4_K: "Q4_K_M", Q5_K: "Q5_K_M" };

export function parseFileType(name: string): FileTypeName | undefined {
  const up = name.toUpperCase();
  if (up in FILE_TYPES) return up as FileTypeName;
  return ALIASES[up];
}

/** What llama-quantize calls a tensor (tensor_get_category). */
export type TensorCategory =
  | "output" | "token_embd" | "attn_v" | "attn_k" | "attn_q" | "attn_output" | "ffn_up" | "ffn_gate" | "ffn_down" | "other";

export function tensorCategory(name: string): TensorCategory {
  if (name === "output.weight") return "output";
  if (name === "token_embd.weight") return "token_embd";
  for (const c of ["attn_v", "attn_k", "attn_q", "attn_output"] as const) if (name.includes(`${c}.weight`)) return c;
  for (const c of ["ffn_up", "ffn_gate", "ffn_down"] as const) if (name.includes(c)) return c;
  return "other";
}

const BLOCK: Record<number, number> = {
  [GgmlTypeId.F32]: 1, [GgmlTypeId.F16]: 1, [GgmlTypeId.BF16]: 1, [GgmlTypeId.Q4_0]: 32, [GgmlTypeId.Q4_1]: 32,
  [GgmlTypeId.Q5_0]: 32, [GgmlTypeId.Q5_1]: 32, [GgmlTypeId.Q8_0]: 32, [GgmlTypeId.Q2_K]: 256, [GgmlTypeId.Q3_K]: 256,
  [GgmlTypeId.Q4_K]: 256, [GgmlTypeId.Q5_K]: 256, [GgmlTypeId.Q6_K]: 256, [GgmlTypeId.IQ4_NL]: 32, [GgmlTypeId.IQ4_XS]: 256,
  [GgmlTypeId.MXFP4]: 32,
};
const isQuantized = (t: number) => BLOCK[t] > 1;

/** One tensor as the type choice sees it: its name, dims (dims[0] = row length) and its layer. */
export interface TensorForTyping {
  readonly name: string;
  readonly dims: readonly number[];
  /** Layer index for blk.N tensors (the order llama-quantize counts attn_v / ffn_down in), else -1. */
  readonly layer: number;
}

/** tensor_type_fallback: a row that does not fit the type's block gets a 32-block type, then F16. */
function fallback(type: number, rowElems: number): number {
  if (rowElems % BLOCK[type] === 0) return type;
  const next: Record<number, number> = {
    [GgmlTypeId.Q2_K]: GgmlTypeId.Q4_0, [GgmlTypeId.Q3_K]: GgmlTypeId.Q4_0, [GgmlTypeId.Q4_K]: GgmlTypeId.Q5_0,
    [GgmlTypeId.Q5_K]: GgmlTypeId.Q5_1, [GgmlTypeId.Q6_K]: GgmlTypeId.Q8_0, [GgmlTypeId.IQ4_XS]: GgmlTypeId.IQ4_NL,
  };
  const t = next[type] ?? type;
  return rowElems % BLOCK[t] === 0 ? t : GgmlTypeId.F16;
}

/** The ggml type llama-quantize gives `t` in a file of type `fileType` (pure: every weight the base type). */
export function tensorTypeFor(fileType: FileTypeName, t: TensorForTyping, shape: ModelShape, pure = false): number {
  const { base } = FILE_TYPES[fileType];
  // tensor_allows_quantization: 2-D tensors whose name ends in "weight", norms excepted
  // (and never the experts' router, ffn_gate_inp)
  const quantizable = t.dims.length >= 2 && t.name.endsWith("weight") && !t.name.includes("_norm.weight") && !t.name.includes("ffn_gate_inp.weight");
  if (!quantizable) return GgmlTypeId.F32;
  if (!isQuantized(base)) return base;
  if (pure) return fallback(base, t.dims[0]);

  const n = shape.nLayers, i = t.layer;
  const moreBits = (l: number) => l < Math.floor(n / 8) || l >= Math.floor((7 * n) / 8) || (l - Math.floor(n / 8)) % 3 === 2;
  const gqa = shape.nHead / shape.nHeadKv;
  const is70B = n === 80 && (shape.arch === "qwen2" || shape.nHead !== shape.nHeadKv);
  const category = tensorCategory(t.name);
  let type: number = base;
  // 8 experts (Mixtral 8x7B's count): llama-quantize spends more bits on attention
  const eightExperts = shape.nExpert === 8;

  if (fileType === "MXFP4_MOE") {
    // llama-quantize: the output (and tied embeddings) Q8_0; the experts (3-D) MXFP4, the rest Q8_0
    const experts = (t.dims[2] ?? 1) > 1 && category !== "output" && !(shape.tiedEmbeddings && category === "token_embd");
    return fallback(experts ? GgmlTypeId.MXFP4 : GgmlTypeId.Q8_0, t.dims[0]);
  }
  if (category === "output" || (shape.tiedEmbeddings && category === "token_embd")) {
    if (t.dims[0] % BLOCK[type] !== 0) type = GgmlTypeId.Q8_0;
    else if (type !== GgmlTypeId.Q8_0) type = GgmlTypeId.Q6_K;
  } else if (category === "attn_v") {
    // llama-quantize counts attn_v tensors in file order: with one per layer, the count is the layer
    if (fileType === "Q2_K") type = gqa >= 4 ? GgmlTypeId.Q4_K : GgmlTypeId.Q3_K;
    else if (fileType === "Q3_K_M") type = i < 2 ? GgmlTypeId.Q5_K : GgmlTypeId.Q4_K;
    else if (fileType === "Q3_K_L") type = GgmlTypeId.Q5_K;
    else if ((fileType === "IQ4_NL" || fileType === "IQ4_XS") && gqa >= 4) type = GgmlTypeId.Q5_K;
    else if ((fileType === "Q4_K_M" || fileType === "Q5_K_M") && moreBits(i)) type = GgmlTypeId.Q6_K;
    else if (fileType === "Q4_K_S" && i < 4) type = GgmlTypeId.Q5_K;
    if (is70B && (type === GgmlTypeId.Q3_K || type === GgmlTypeId.Q4_K)) type = GgmlTypeId.Q5_K;
    if (eightExperts) type = GgmlTypeId.Q8_0;
  } else if (category === "attn_k" && eightExperts) {
    type = GgmlTypeId.Q8_0;
  } else if (category === "ffn_down") {
    if (fileType === "Q2_K") type = GgmlTypeId.Q3_K;
    else if (fileType === "Q3_K_M") type = i < Math.floor(n / 16) ? GgmlTypeId.Q5_K : GgmlTypeId.Q4_K;
    else if (fileType === "Q3_K_L") type = GgmlTypeId.Q5_K;
    else if (fileType === "Q4_K_M") { if (moreBits(i)) type = GgmlTypeId.Q6_K; }
    else if ((fileType === "IQ4_NL" || fileType === "IQ4_XS") && i < Math.floor(n / 8)) type = GgmlTypeId.Q5_K; // (no imatrix)
    else if (fileType === "Q5_K_M" && moreBits(i)) type = GgmlTypeId.Q6_K;
    else if (fileType === "Q4_K_S" && i < Math.floor(n / 8)) type = GgmlTypeId.Q5_K;
  } else if (category === "attn_output" && eightExperts) {
    if (["Q2_K", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ4_XS"].includes(fileType)) type = GgmlTypeId.Q5_K;
  } else if (category === "attn_output") {
    if (fileType === "Q2_K") type = GgmlTypeId.Q3_K;
    else if (fileType === "Q3_K_M") type = GgmlTypeId.Q4_K;
    else if (fileType === "Q3_K_L") type = GgmlTypeId.Q5_K;
  }
  return fallback(type, t.dims[0]);
}

export interface PlannedTensor {
  readonly name: string;
  readonly dims: readonly number[];
  readonly type: number;
  /** What fills it: weights (normal), ones (norms) or biases (small normal). */
  readonly fill: "weight" | "ones" | "bias" | "factors" | "sinks";
}

/** The tensors of a shape, in the order convert_hf_to_gguf-style files hold them, with their types:
 * the family's own table (model/arch/), so generated files have what the reader requires. */
export function planTensors(shape: ModelShape, fileType: FileTypeName, pure = false): PlannedTensor[] {
  const hp = shapeHParams(shape.arch, shape);
  const family = familyOf(shape.arch)!;
  const E = shape.nEmbd;
  const out: PlannedTensor[] = [];
  const add = (name: string, dims: number[], layer: number, fill: PlannedTensor["fill"]) =>
    out.push({ name, dims, fill, type: tensorTypeFor(fileType, { name, dims, layer }, shape, pure) });
  add("token_embd.weight", [E, shape.nVocab], -1, "weight");
  for (let i = 0; i < shape.nLayers; i++) {
    const written = new Set<string>(); // a fused tensor is several slots' views, written once
    for (const slot of family.layer) {
      if ((slot.when && !slot.when(hp)) || written.has(slot.name)) continue;
      written.add(slot.name);
      add(`blk.${i}.${slot.name}`, [...slot.dims(hp)], i, slot.fill);
    }
  }
  if (family.longRope && shape.ropeOrigContext) {
    add("rope_factors_long.weight", [hp.ropeDims / 2], -1, "factors");
    add("rope_factors_short.weight", [hp.ropeDims / 2], -1, "factors");
  }
  add("output_norm.weight", [E], -1, "ones");
  if (!shape.tiedEmbeddings) add("output.weight", [E, shape.nVocab], -1, "weight");
  return out;
}
