// llama (Llama 2/3, TinyLlama, SmolLM, and the families that are llama with other keys: Mistral,
// Mistral-Nemo, Granite-free llama clones): llama.cpp src/models/llama.cpp. The base every other
// family extends: adjacent-pair RoPE, optional QKV bias, SwiGLU, optional rope_freqs (Llama 3.1).
import { llamaLayer } from "./common.js";
import type { ArchFamily } from "./types.js";

export const llama: ArchFamily = {
  name: "llama",
  ropeNeox: false,
  ropeFreqs: true,
  hparams: (_keys, common) => common,
  layer: llamaLayer,
};
