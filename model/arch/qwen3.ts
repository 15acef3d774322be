// qwen3 (Qwen3 dense, 0.6B to 32B): llama.cpp src/models/qwen3.cpp. qwen2 without QKV biases and with
// a per-head RMS norm on Q and K before RoPE; head size from key_length (128 where nEmbd / nHead is
// not); output tied to the embeddings in the small models, separate in the large.
import { llamaLayer, qkNormSlots, withSlots } from "./common.js";
import type { ArchFamily } from "./types.js";

export const qwen3: ArchFamily = {
  name: "qwen3",
  ropeNeox: true,
  hparams: (_keys, common) => common,
  layer: withSlots(llamaLayer, "wo", qkNormSlots),
};
