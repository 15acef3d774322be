// A generated model's hyper-parameters come from the keys the generator writes for its shape, read by
// the same family code that reads a file: what modelgen writes and what the planner assumes cannot drift.
import { commonHParams } from "./common.js";
import { familyOf } from "./index.js";
import type { Architecture, FamilyShape, HParams, KeyReader } from "./types.js";

/** A `<arch>.`-relative metadata key of a generated model. */
export type ShapeKey =
  | { readonly key: string; readonly type: "u32" | "f32"; readonly value: number }
  | { readonly key: string; readonly type: "str"; readonly value: string };

export function shapeKeys(arch: Architecture, s: FamilyShape): ShapeKey[] {
  const family = familyOf(arch);
  if (!family) throw new Error(`no family ${arch}`);
  const hd = s.headDim ?? s.nEmbd / s.nHead;
  return [
    { key: "context_length", type: "u32", value: s.contextLength },
    { key: "embedding_length", type: "u32", value: s.nEmbd },
    { key: "block_count", type: "u32", value: s.nLayers },
    { key: "feed_forward_length", type: "u32", value: s.nFf },
    { key: "attention.head_count", type: "u32", value: s.nHead },
    { key: "attention.head_count_kv", type: "u32", value: s.nHeadKv },
    { key: "rope.freq_base", type: "f32", value: s.ropeFreqBase },
    { key: "attention.layer_norm_rms_epsilon", type: "f32", value: s.normEps },
    { key: "rope.dimension_count", type: "u32", value: s.ropeDims ?? hd },
    { key: "vocab_size", type: "u32", value: s.nVocab },
    ...(s.headDim ? [{ key: "attention.key_length", type: "u32" as const, value: s.headDim }, { key: "attention.value_length", type: "u32" as const, value: s.headDim }] : []),
    ...(s.ropeOrigContext ? [{ key: "rope.scaling.original_context_length", type: "u32" as const, value: s.ropeOrigContext }] : []),
    ...(s.ropeAttnFactor ? [{ key: "rope.scaling.attn_factor", type: "f32" as const, value: s.ropeAttnFactor }] : []),
    ...(s.ropeYarnFactor ? [
      { key: "rope.scaling.type", type: "str" as const, value: "yarn" },
      { key: "rope.scaling.factor", type: "f32" as const, value: s.ropeYarnFactor },
    ] : []),
    ...(s.nExpert ? [
      { key: "expert_count", type: "u32" as const, value: s.nExpert },
      { key: "expert_used_count", type: "u32" as const, value: s.nExpertUsed ?? 2 },
      ...(s.nFfExp ? [{ key: "expert_feed_forward_length", type: "u32" as const, value: s.nFfExp }] : []),
    ] : []),
    ...(family.shapeMetadata?.(s) ?? []),
  ];
}

/** The hyper-parameters a generated model of this shape has when read back. */
export function shapeHParams(arch: Architecture, s: FamilyShape): HParams {
  const family = familyOf(arch);
  if (!family) throw new Error(`no family ${arch}`);
  const keys = new Map<string, number | string>(shapeKeys(arch, s).map((k) => [k.key, k.value]));
  const tensors = new Set<string>();
  if (!s.tiedEmbeddings) tensors.add("output.weight");
  if (s.qkvBias) tensors.add("blk.0.attn_q.bias");
  const reader: KeyReader = {
    path: `shape:${arch}`,
    arch,
    number: (k) => { const v = keys.get(k); return typeof v === "number" ? v : undefined; },
    string: (k) => { const v = keys.get(k); return typeof v === "string" ? v : undefined; },
    array: () => undefined,
    hasTensor: (n) => tensors.has(n),
  };
  return family.hparams(reader, commonHParams(reader, arch, family.ropeNeox, s.nVocab, family.yarn));
}
