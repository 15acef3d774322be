// phi3 (Phi-3 / Phi-3.5 mini and medium, Phi-4-mini): llama.cpp src/models/phi3.cpp. Q, K and V in
// one attn_qkv tensor and gate and up in one ffn_up tensor (gate the first half of its rows), which
// the engine maps as views of their rows; NeoX RoPE over rope.dimension_count dims of each head
// (partial for Phi-4-mini); the query scaled instead of the scores; LongRoPE (the 128k models): the
// rope_factors_long/short tensors, chosen by the window's context against
// rope.scaling.original_context_length, and rope.scaling.attn_factor on cos and sin. llama.cpp
// switches phi3's sliding window off (its "Phi SWA is currently disabled"), and so do we.
import { invSqrtF32, llamaLayer } from "./common.js";
import type { ArchFamily, HParams, LayerSlot } from "./types.js";

const qDim = (hp: HParams) => hp.nHead * hp.headDimK;
const kvDim = (hp: HParams) => hp.nHeadKv * hp.headDimK;
const qkvDims = (hp: HParams) => [hp.nEmbd, qDim(hp) + 2 * kvDim(hp)];
const upDims = (hp: HParams) => [hp.nEmbd, 2 * hp.nFf];

const fused: Partial<Record<LayerSlot["field"], LayerSlot>> = {
  wq: { field: "wq", name: "attn_qkv.weight", dims: qkvDims, fill: "weight", view: { as: "attn_q.weight", rows: (hp) => [0, qDim(hp)] } },
  wk: { field: "wk", name: "attn_qkv.weight", dims: qkvDims, fill: "weight", view: { as: "attn_k.weight", rows: (hp) => [qDim(hp), kvDim(hp)] } },
  wv: { field: "wv", name: "attn_qkv.weight", dims: qkvDims, fill: "weight", view: { as: "attn_v.weight", rows: (hp) => [qDim(hp) + kvDim(hp), kvDim(hp)] } },
  wGate: { field: "wGate", name: "ffn_up.weight", dims: upDims, fill: "weight", view: { as: "ffn_gate.weight", rows: (hp) => [0, hp.nFf] } },
  wUp: { field: "wUp", name: "ffn_up.weight", dims: upDims, fill: "weight", view: { as: "ffn_up.weight", rows: (hp) => [hp.nFf, hp.nFf] } },
};

export const phi3: ArchFamily = {
  name: "phi3",
  ropeNeox: true,
  longRope: true,
  hparams: (_keys, common) => ({
    ...common,
    queryScale: invSqrtF32(common.headDimK),
    scoreScale: 1,
  }),
  // llama's table, its QKV biases dropped (phi3 has none), the fused tensors in place of the separate ones
  layer: llamaLayer.filter((s) => !s.when).map((s) => fused[s.field] ?? s),
};
