// qwen2 (Qwen2, Qwen2.5): llama.cpp src/models/qwen2.cpp. llama with NeoX RoPE and QKV biases, which
// the qwen2 build always has (its load_arch_tensors requires them).
import { GgufError } from "../gguf.js";
import { llamaLayer } from "./common.js";
import type { ArchFamily } from "./types.js";

export const qwen2: ArchFamily = {
  name: "qwen2",
  ropeNeox: true,
  hparams: (keys, common) => {
    if (!common.hasQkvBias) throw new GgufError(`${keys.path}: missing tensor blk.0.attn_q.bias (qwen2 has QKV biases)`);
    return common;
  },
  layer: llamaLayer,
};
