// gemma2 (Gemma 2): llama.cpp src/models/gemma2.cpp. gemma3's pieces without the Q/K norms, plus the
// soft-caps: attention scores and the final logits pass through cap * tanh(x / cap) (50 and 30 unless
// the file says). Every second layer slides (a 4096-token window unless the file says), at the full
// layers' RoPE base unless rope.freq_base_swa is given; the output is always the embedding matrix
// (llama.cpp ignores an output.weight).
import { GgufError } from "../gguf.js";
import { gemmaLayer, invSqrtF32, rangedKey, slidingLayers } from "./common.js";
import type { ArchFamily, HParams, KeyReader } from "./types.js";

function hparams(keys: KeyReader, common: HParams): HParams {
  const window = keys.number("attention.sliding_window") ?? 4096;
  if (!Number.isInteger(window) || window < 1 || window > 1 << 24) throw new GgufError(`${keys.path}: gemma2.attention.sliding_window = ${window} is out of range`);
  const sliding = slidingLayers(keys, common.nLayers, 2);
  const ropeFreqBaseSwa = keys.number("rope.freq_base_swa") ?? common.ropeFreqBase;
  if (!(ropeFreqBaseSwa > 1 && Number.isFinite(ropeFreqBaseSwa))) throw new GgufError(`${keys.path}: gemma2.rope.freq_base_swa ${ropeFreqBaseSwa} is out of range`);
  return {
    ...common,
    tiedEmbeddings: true,
    ffnAct: "gelu",
    embdScale: Math.fround(Math.sqrt(common.nEmbd)),
    // gemma_pytorch's query_pre_attn_scalar: nEmbd / nHead for the 27B (46 layers), else the head size
    queryScale: common.nLayers === 46 ? invSqrtF32(Math.floor(common.nEmbd / common.nHead)) : invSqrtF32(common.headDimK),
    scoreScale: 1,
    layerWindow: sliding.map((s) => (s ? window : 0)),
    ropeFreqBaseSwa,
    ropeFreqScaleSwa: common.ropeFreqScale,
    attnSoftcap: rangedKey(keys, "attn_logit_softcapping", 50, 1e6),
    finalSoftcap: rangedKey(keys, "final_logit_softcapping", 30, 1e6),
  };
}

export const gemma2: ArchFamily = {
  name: "gemma2",
  ropeNeox: true,
  hparams,
  layer: gemmaLayer,
  shapeMetadata: (s) => [
    ...(s.slidingWindow ? [{ key: "attention.sliding_window", type: "u32" as const, value: s.slidingWindow }] : []),
    ...(s.slidingWindowPattern ? [{ key: "attention.sliding_window_pattern", type: "u32" as const, value: s.slidingWindowPattern }] : []),
    ...(s.attnSoftcap ? [{ key: "attn_logit_softcapping", type: "f32" as const, value: s.attnSoftcap }] : []),
    ...(s.finalSoftcap ? [{ key: "final_logit_softcapping", type: "f32" as const, value: s.finalSoftcap }] : []),
  ],
};
