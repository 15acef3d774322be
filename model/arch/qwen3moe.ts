// qwen3moe (Qwen3-30B-A3B, Qwen3-235B-A22B): llama.cpp src/models/qwen3moe.cpp. qwen3's attention
// (per-head Q/K norms, NeoX RoPE, head size from key_length) with every layer's feed-forward a
// mixture of experts: router logits, softmax over all experts, the top k, their weights renormalised
// to sum 1 (norm_topk_prob), the sum of the k SwiGLU experts so weighted. An expert's width is
// expert_feed_forward_length (else feed_forward_length / expert_used_count, as llama.cpp).
import { GgufError } from "../gguf.js";
import { llamaLayer, moeSlots, qkNormSlots, refuseMoeExtras, withSlots } from "./common.js";
import type { ArchFamily } from "./types.js";

export const qwen3moe: ArchFamily = {
  name: "qwen3moe",
  ropeNeox: true,
  moe: true,
  hparams: (keys, common) => {
    if (common.nExpert === 0) throw new GgufError(`${keys.path}: qwen3moe.expert_count is missing or 0 (llama.cpp: n_expert must be > 0 for QWEN3MOE)`);
    refuseMoeExtras(keys, common);
    const ffExp = keys.number("expert_feed_forward_length");
    return { ...common, nFfExp: ffExp !== undefined && ffExp > 0 ? common.nFfExp : Math.floor(common.nFf / common.nExpertUsed) };
  },
  layer: withSlots(withSlots(llamaLayer.filter((s) => !["wGate", "wUp", "wDown"].includes(s.field)), "wo", qkNormSlots), "ffnNorm", moeSlots),
};
