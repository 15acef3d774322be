// gemma3 (Gemma 3 text models, 270M to 27B): llama.cpp src/models/gemma3.cpp. Embeddings scaled by
// sqrt(nEmbd); Q/K per-head norms; a query scale instead of the score scale; GELU (tanh) feed-forward;
// RMS norms after attention and after the feed-forward as well as before; sliding-window attention on
// 5 of every 6 layers (the pattern and window from the file) with its own RoPE base (10000 unless the
// file says). The norm weights already hold gemma's "1 +" (convert_hf_to_gguf adds it).
import { GgufError } from "../gguf.js";
import { gemmaLayer, invSqrtF32, qkNormSlots, rangedKey, slidingLayers, withSlots } from "./common.js";
import type { ArchFamily, HParams, KeyReader } from "./types.js";

const DEFAULT_PATTERN = 6;
const DEFAULT_ROPE_BASE_SWA = 10000;

function hparams(keys: KeyReader, common: HParams): HParams {
  const window = keys.number("attention.sliding_window") ?? 0;
  if (!Number.isInteger(window) || window < 0 || window > 1 << 24) throw new GgufError(`${keys.path}: ${keys.arch}.attention.sliding_window = ${window} is out of range`);
  const sliding = window > 0 ? slidingLayers(keys, common.nLayers, DEFAULT_PATTERN) : new Array<boolean>(common.nLayers).fill(false);
  const ropeFreqBaseSwa = window > 0 ? keys.number("rope.freq_base_swa") ?? DEFAULT_ROPE_BASE_SWA : common.ropeFreqBase;
  if (!(ropeFreqBaseSwa > 1 && Number.isFinite(ropeFreqBaseSwa))) throw new GgufError(`${keys.path}: ${keys.arch}.rope.freq_base_swa ${ropeFreqBaseSwa} is out of range`);
  // gemma_pytorch's query_pre_attn_scalar: nEmbd / nHead for the 27B (62 layers), else the head size
  const queryScale = common.nLayers === 62 ? invSqrtF32(Math.floor(common.nEmbd / common.nHead)) : invSqrtF32(common.headDimK);
  return {
    ...common,
    ffnAct: "gelu",
    embdScale: Math.fround(Math.sqrt(common.nEmbd)),
    queryScale,
    scoreScale: 1,
    layerWindow: sliding.map((s) => (s ? window : 0)),
    ropeFreqBaseSwa,
    ropeFreqScaleSwa: window > 0 ? 1 : common.ropeFreqScale,
    finalSoftcap: rangedKey(keys, "final_logit_softcapping", 0, 1e6),
  };
}

export const gemma3: ArchFamily = {
  name: "gemma3",
  ropeNeox: true,
  hparams,
  layer: withSlots(gemmaLayer, "attnPostNorm", qkNormSlots),
  shapeMetadata: (s) => [
    ...(s.slidingWindow ? [{ key: "attention.sliding_window", type: "u32" as const, value: s.slidingWindow }] : []),
    ...(s.slidingWindowPattern ? [{ key: "attention.sliding_window_pattern", type: "u32" as const, value: s.slidingWindowPattern }] : []),
    ...(s.ropeFreqBaseSwa ? [{ key: "rope.freq_base_swa", type: "f32" as const, value: s.ropeFreqBaseSwa }] : []),
  ],
};
