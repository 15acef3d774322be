// llama (Llama 2/3, TinyLlama, SmolLM, Mixtral, and the families that are llama with other keys: Mistral,
// Mistral-Nemo, Granite-free llama clones): llama.cpp src/models/llama.cpp. The base every other
// family extends: adjacent-pair RoPE, optional QKV bias, SwiGLU, optional rope_freqs (Llama 3.1).
// With expert_count > 0 (Mixtral) each layer's feed-forward is a mixture of experts of nFf width:
// llama.cpp gates it as qwen3moe (softmax over all experts, top-k, the k weights renormalised, which
// equals Mixtral's softmax over the k chosen logits) and ignores expert_feed_forward_length.
import { denseOrExperts, llamaLayer, refuseMoeExtras } from "./common.js";
import type { ArchFamily } from "./types.js";

export const llama: ArchFamily = {
  name: "llama",
  ropeNeox: false,
  ropeFreqs: true,
  moe: true,
  hparams: (keys, common) => {
    refuseMoeExtras(keys, common);
    return { ...common, nFfExp: common.nExpert > 0 ? common.nFf : 0 };
  },
  layer: denseOrExperts(llamaLayer),
};
