// mistral3 (Ministral 3 / Mistral 3 text models): llama.cpp src/models/mistral3.cpp. llama with other
// keys: the same layer, adjacent-pair RoPE, llama's score scale. What it adds and prima does not run
// (Llama-4-style attention temperature scaling, YaRN, experts) is refused by name.
import { GgufError } from "../gguf.js";
import { llamaLayer } from "./common.js";
import type { ArchFamily } from "./types.js";

export const mistral3: ArchFamily = {
  name: "mistral3",
  ropeNeox: false,
  ropeFreqs: true,
  hparams: (keys, common) => {
    const temp = keys.number("attention.temperature_scale") ?? 0;
    if (temp !== 0) throw new GgufError(`${keys.path}: mistral3.attention.temperature_scale = ${temp}: attention temperature scaling is not supported`);
    const experts = keys.number("expert_count") ?? 0;
    if (experts !== 0) throw new GgufError(`${keys.path}: mistral3.expert_count = ${experts}: mixture-of-experts layers are not supported`);
    return common;
  },
  layer: llamaLayer,
};
