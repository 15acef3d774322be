// gpt-oss (OpenAI's gpt-oss-20b and -120b): llama.cpp src/models/openai-moe.cpp (LLM_ARCH_OPENAI_MOE).
// Attention with biases on Q, K, V and the output, a learned sink logit per head in the softmax, and
// every second layer a sliding window (even layers slide; attention.sliding_window, 128 in the real
// models), NeoX RoPE with YaRN (rope.scaling.type "yarn") on every layer, scores scaled by
// 1/sqrt(rope dims). The feed-forward is a mixture of experts after an RMS norm the file calls
// post_attention_norm: router logits plus a bias, the top k logits and a softmax over those k, each
// expert's gate and up plus their biases through the clamped SwiGLU (swiglu_oai), its down plus its
// bias, weighted and summed. Experts are MXFP4 in the released files. A tensor the family does not read
// is refused by name (strictTensors), not ignored.
import { GgufError } from "../gguf.js";
import { invSqrtF32, llamaLayer, moeSlots, refuseMoeExtras, slidingLayers, withSlots } from "./common.js";
import type { ArchFamily, HParams, KeyReader, LayerSlot } from "./types.js";

function hparams(keys: KeyReader, common: HParams): HParams {
  const p = keys.path, a = keys.arch;
  if (common.nExpert === 0) throw new GgufError(`${p}: ${a}.expert_count is missing or 0 (gpt-oss's feed-forward is a mixture of experts)`);
  refuseMoeExtras(keys, common);
  if (keys.number("expert_feed_forward_length") === undefined) throw new GgufError(`${p}: missing metadata ${a}.expert_feed_forward_length`);
  if (keys.array("attention.head_count") || keys.array("attention.head_count_kv")) throw new GgufError(`${p}: head counts per layer are not supported`);
  if (common.tiedEmbeddings) throw new GgufError(`${p}: missing tensor output.weight (gpt-oss has its own output matrix)`);
  const window = keys.number("attention.sliding_window");
  if (window === undefined) throw new GgufError(`${p}: missing metadata ${a}.attention.sliding_window`);
  if (!Number.isInteger(window) || window < 1 || window > 1 << 24) throw new GgufError(`${p}: ${a}.attention.sliding_window = ${window} is out of range`);
  const ropeFreqBaseSwa = keys.number("rope.freq_base_swa") ?? common.ropeFreqBase;
  if (!(ropeFreqBaseSwa > 1 && Number.isFinite(ropeFreqBaseSwa))) throw new GgufError(`${p}: ${a}.rope.freq_base_swa ${ropeFreqBaseSwa} is out of range`);
  return {
    ...common,
    ffnAct: "swiglu-oai",
    moeGating: "topk-softmax",
    scoreScale: invSqrtF32(common.ropeDims),
    // llama.cpp: load_swa_pattern(ml, 2), every layer but each second slides (layer 0 slides)
    layerWindow: slidingLayers(keys, common.nLayers, 2).map((s) => (s ? window : 0)),
    ropeFreqBaseSwa,
    ropeFreqScaleSwa: common.ropeFreqScale,
  };
}

const E = (hp: HParams) => hp.nEmbd;
const always = (hp: HParams) => hp.nExpert > 0;

/** llama's attention (Q/K/V biases optional, as create_tensor_qkv), then the output bias and the sinks;
 * the feed-forward's norm (post_attention_norm in the file) and the experts, each with its bias. */
const layer: readonly LayerSlot[] = withSlots(
  withSlots(
    withSlots(
      llamaLayer.filter((s) => !["wGate", "wUp", "wDown", "ffnNorm"].includes(s.field)),
      "wo",
      [
        { field: "bo", name: "attn_output.bias", dims: (hp) => [E(hp)], f32: true, fill: "bias" },
        { field: "attnSinks", name: "attn_sinks.weight", dims: (hp) => [hp.nHead], f32: true, fill: "sinks" },
        { field: "ffnNorm", name: "post_attention_norm.weight", as: "ffn_norm.weight", dims: (hp) => [E(hp)], f32: true, fill: "ones" },
      ],
    ),
    "ffnNorm",
    moeSlots,
  ),
  "ffnDownExps",
  [
    { field: "ffnGateInpB", name: "ffn_gate_inp.bias", dims: (hp) => [hp.nExpert], when: always, f32: true, fill: "bias" },
    { field: "ffnGateExpsB", name: "ffn_gate_exps.bias", dims: (hp) => [hp.nFfExp, hp.nExpert], when: always, f32: true, fill: "bias" },
    { field: "ffnUpExpsB", name: "ffn_up_exps.bias", dims: (hp) => [hp.nFfExp, hp.nExpert], when: always, f32: true, fill: "bias" },
    { field: "ffnDownExpsB", name: "ffn_down_exps.bias", dims: (hp) => [E(hp), hp.nExpert], when: always, f32: true, fill: "bias" },
  ],
);

export const gptOss: ArchFamily = {
  name: "gpt-oss",
  ropeNeox: true,
  moe: true,
  yarn: true,
  strictTensors: true,
  hparams,
  layer,
  shapeMetadata: (s) => [
    ...(s.slidingWindow ? [{ key: "attention.sliding_window", type: "u32" as const, value: s.slidingWindow }] : []),
  ],
};
