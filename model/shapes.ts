// Model shapes known by name (the generator writes them, the planner profiles them) (../shared/models/README.md), plus small test shapes whose
// every dimension is a multiple of 256, so that every quantization type applies to every matrix.

import type { Architecture, FamilyShape } from "./arch/index.js";

export interface ModelShape extends FamilyShape {
  readonly name: string;
  readonly arch: Architecture;
  /** The vocabulary written when none is asked for (a bundled vocabulary name, see model/). */
  readonly defaultVocab: "llama-spm" | "llama-bpe" | "qwen2" | "gemma3" | "stories260K";
}

export const modelShapes: readonly ModelShape[] = [
  {
    name: "tinyllama-1.1b", arch: "llama", nEmbd: 2048, nLayers: 22, nHead: 32, nHeadKv: 4, nFf: 5632, nVocab: 32000,
    tiedEmbeddings: false, qkvBias: false, contextLength: 2048, ropeFreqBase: 10000, normEps: 1e-5, defaultVocab: "llama-spm",
  },
  {
    name: "llama3-8b", arch: "llama", nEmbd: 4096, nLayers: 32, nHead: 32, nHeadKv: 8, nFf: 14336, nVocab: 128256,
    tiedEmbeddings: false, qkvBias: false, contextLength: 8192, ropeFreqBase: 500000, normEps: 1e-5, defaultVocab: "llama-bpe",
  },
  {
    name: "llama1-30b", arch: "llama", nEmbd: 6656, nLayers: 60, nHead: 52, nHeadKv: 52, nFf: 17920, nVocab: 32000,
    tiedEmbeddings: false, qkvBias: false, contextLength: 2048, ropeFreqBase: 10000, normEps: 1e-6, defaultVocab: "llama-spm",
  },
  {
    name: "llama3-70b", arch: "llama", nEmbd: 8192, nLayers: 80, nHead: 64, nHeadKv: 8, nFf: 28672, nVocab: 128256,
    tiedEmbeddings: false, qkvBias: false, contextLength: 8192, ropeFreqBase: 500000, normEps: 1e-5, defaultVocab: "llama-bpe",
  },
  {
    name: "qwen2.5-0.5b", arch: "qwen2", nEmbd: 896, nLayers: 24, nHead: 14, nHeadKv: 2, nFf: 4864, nVocab: 151936,
    tiedEmbeddings: true, qkvBias: true, contextLength: 32768, ropeFreqBase: 1000000, normEps: 1e-6, defaultVocab: "qwen2",
  },
  {
    name: "qwen3-0.6b", arch: "qwen3", nEmbd: 1024, nLayers: 28, nHead: 16, nHeadKv: 8, headDim: 128, nFf: 3072, nVocab: 151936,
    tiedEmbeddings: true, qkvBias: false, contextLength: 40960, ropeFreqBase: 1000000, normEps: 1e-6, defaultVocab: "qwen2",
  },
  {
    name: "qwen3-8b", arch: "qwen3", nEmbd: 4096, nLayers: 36, nHead: 32, nHeadKv: 8, headDim: 128, nFf: 12288, nVocab: 151936,
    tiedEmbeddings: false, qkvBias: false, contextLength: 40960, ropeFreqBase: 1000000, normEps: 1e-6, defaultVocab: "qwen2",
  },
  {
    name: "gemma2-2b", arch: "gemma2", nEmbd: 2304, nLayers: 26, nHead: 8, nHeadKv: 4, headDim: 256, nFf: 9216, nVocab: 256000,
    tiedEmbeddings: true, qkvBias: false, contextLength: 8192, ropeFreqBase: 10000, normEps: 1e-6, defaultVocab: "llama-spm",
    slidingWindow: 4096, attnSoftcap: 50, finalSoftcap: 30,
  },
  {
    name: "gemma3-1b", arch: "gemma3", nEmbd: 1152, nLayers: 26, nHead: 4, nHeadKv: 1, headDim: 256, nFf: 6912, nVocab: 262144,
    tiedEmbeddings: true, qkvBias: false, contextLength: 32768, ropeFreqBase: 1000000, normEps: 1e-6, defaultVocab: "gemma3",
    slidingWindow: 512, slidingWindowPattern: 6, ropeFreqBaseSwa: 10000,
  },
  {
    name: "gemma3-4b", arch: "gemma3", nEmbd: 2560, nLayers: 34, nHead: 8, nHeadKv: 4, headDim: 256, nFf: 10240, nVocab: 262208,
    tiedEmbeddings: true, qkvBias: false, contextLength: 131072, ropeFreqBase: 1000000, normEps: 1e-6, defaultVocab: "gemma3",
    slidingWindow: 1024, slidingWindowPattern: 6, ropeFreqBaseSwa: 10000,
  },
  {
    name: "phi3-mini", arch: "phi3", nEmbd: 3072, nLayers: 32, nHead: 32, nHeadKv: 32, nFf: 8192, nVocab: 32064,
    tiedEmbeddings: false, qkvBias: false, contextLength: 4096, ropeFreqBase: 10000, normEps: 1e-5, defaultVocab: "llama-spm",
  },
  {
    name: "qwen3-30b-a3b", arch: "qwen3moe", nEmbd: 2048, nLayers: 48, nHead: 32, nHeadKv: 4, headDim: 128, nFf: 6144, nVocab: 151936,
    tiedEmbeddings: false, qkvBias: false, contextLength: 40960, ropeFreqBase: 1000000, normEps: 1e-6, defaultVocab: "qwen2",
    nExpert: 128, nExpertUsed: 8, nFfExp: 768,
  },
  {
    name: "mixtral-8x7b", arch: "llama", nEmbd: 4096, nLayers: 32, nHead: 32, nHeadKv: 8, nFf: 14336, nVocab: 32000,
    tiedEmbeddings: false, qkvBias: false, contextLength: 32768, ropeFreqBase: 1000000, normEps: 1e-5, defaultVocab: "llama-spm",
    nExpert: 8, nExpertUsed: 2,
  },
  {
    // gpt-oss-20b (MXFP4_MOE is its release format); o200k_harmony's 201088 tokens, padded from llama-bpe's
    name: "gpt-oss-20b", arch: "gpt-oss", nEmbd: 2880, nLayers: 24, nHead: 64, nHeadKv: 8, headDim: 64, nFf: 2880, nVocab: 201088,
    tiedEmbeddings: false, qkvBias: true, contextLength: 131072, ropeFreqBase: 150000, normEps: 1e-5, defaultVocab: "llama-bpe",
    nExpert: 32, nExpertUsed: 4, nFfExp: 2880, slidingWindow: 128, ropeYarnFactor: 32, ropeOrigContext: 4096,
  },
  // Test shapes: seconds to make, every dimension a multiple of 256, GQA, stories260K's 512-token vocabulary.
  {
    name: "tiny-llama", arch: "llama", nEmbd: 256, nLayers: 2, nHead: 4, nHeadKv: 2, nFf: 512, nVocab: 512,
    tiedEmbeddings: false, qkvBias: false, contextLength: 512, ropeFreqBase: 10000, normEps: 1e-5, defaultVocab: "stories260K",
  },
  {
    name: "tiny-qwen2", arch: "qwen2", nEmbd: 256, nLayers: 2, nHead: 4, nHeadKv: 2, nFf: 512, nVocab: 512,
    tiedEmbeddings: true, qkvBias: true, contextLength: 512, ropeFreqBase: 1000000, normEps: 1e-6, defaultVocab: "stories260K",
  },
  // qwen3 and gemma3 with a head size that is not nEmbd / nHead, as their real models have; gemma3 with
  // a 4-token window on 2 of its 3 layers, so a 16-token prompt runs past it.
  {
    name: "tiny-qwen3", arch: "qwen3", nEmbd: 256, nLayers: 2, nHead: 4, nHeadKv: 2, headDim: 128, nFf: 512, nVocab: 512,
    tiedEmbeddings: true, qkvBias: false, contextLength: 512, ropeFreqBase: 1000000, normEps: 1e-6, defaultVocab: "stories260K",
  },
  {
    name: "tiny-gemma3", arch: "gemma3", nEmbd: 256, nLayers: 3, nHead: 4, nHeadKv: 1, headDim: 128, nFf: 512, nVocab: 512,
    tiedEmbeddings: true, qkvBias: false, contextLength: 512, ropeFreqBase: 1000000, normEps: 1e-6, defaultVocab: "stories260K",
    slidingWindow: 4, slidingWindowPattern: 2, ropeFreqBaseSwa: 10000,
  },
  // gemma2 with soft-caps small enough to bend random weights' scores and logits, and a 4-token window
  // on every second layer.
  {
    name: "tiny-gemma2", arch: "gemma2", nEmbd: 256, nLayers: 3, nHead: 4, nHeadKv: 2, headDim: 128, nFf: 512, nVocab: 512,
    tiedEmbeddings: true, qkvBias: false, contextLength: 512, ropeFreqBase: 10000, normEps: 1e-6, defaultVocab: "stories260K",
    slidingWindow: 4, attnSoftcap: 0.5, finalSoftcap: 2,
  },
  // mistral3: llama with other keys, and a head size of its own as Ministral's 128 with 3072.
  {
    name: "tiny-mistral3", arch: "mistral3", nEmbd: 256, nLayers: 2, nHead: 4, nHeadKv: 2, headDim: 128, nFf: 512, nVocab: 512,
    tiedEmbeddings: false, qkvBias: false, contextLength: 512, ropeFreqBase: 1000000, normEps: 1e-5, defaultVocab: "stories260K",
  },
  // phi3 with what its family file has to get right: fused QKV and gate/up, 96 of 128 dims rotated
  // (Phi-4-mini's partial rotary), and LongRoPE: an original context of 32, so that every test
  // context takes the long factors, and an attention factor on cos and sin.
  {
    name: "tiny-phi3", arch: "phi3", nEmbd: 256, nLayers: 2, nHead: 2, nHeadKv: 1, nFf: 512, nVocab: 512, ropeDims: 96,
    tiedEmbeddings: false, qkvBias: false, contextLength: 512, ropeFreqBase: 10000, normEps: 1e-5, defaultVocab: "stories260K",
    ropeOrigContext: 32, ropeAttnFactor: 1.19,
  },
  // Mixtures of experts: 8 experts of 256 (qwen3moe) and 4 of 512 (Mixtral: llama with experts), 2 used
  // per token; random routers send different tokens to different experts.
  {
    name: "tiny-qwen3moe", arch: "qwen3moe", nEmbd: 256, nLayers: 2, nHead: 4, nHeadKv: 2, headDim: 128, nFf: 512, nVocab: 512,
    tiedEmbeddings: true, qkvBias: false, contextLength: 512, ropeFreqBase: 1000000, normEps: 1e-6, defaultVocab: "stories260K",
    nExpert: 8, nExpertUsed: 2, nFfExp: 256,
  },
  {
    name: "tiny-mixtral", arch: "llama", nEmbd: 256, nLayers: 2, nHead: 4, nHeadKv: 2, nFf: 512, nVocab: 512,
    tiedEmbeddings: false, qkvBias: false, contextLength: 512, ropeFreqBase: 1000000, normEps: 1e-5, defaultVocab: "stories260K",
    nExpert: 4, nExpertUsed: 2,
  },
  // gpt-oss: gpt-oss-20b's head size, YaRN and original context, 2 of 8 experts used per token (its 4 of 32 is 1 in 8), and a
  // 4-token window on 2 of its 3 layers (layers 0 and 2 slide), so a 16-token prompt runs past it.
  {
    name: "tiny-gpt-oss", arch: "gpt-oss", nEmbd: 256, nLayers: 3, nHead: 8, nHeadKv: 2, headDim: 64, nFf: 256, nVocab: 512,
    tiedEmbeddings: false, qkvBias: true, contextLength: 131072, ropeFreqBase: 150000, normEps: 1e-5, defaultVocab: "stories260K",
    nExpert: 8, nExpertUsed: 2, nFfExp: 256, slidingWindow: 4, ropeYarnFactor: 32, ropeOrigContext: 4096,
  },
  // 8 layers: the layer-dependent type choices of the K-quant mixes (first/last eighth, every third) all
  // occur; 4 heads per KV head: the GQA-dependent ones too.
  {
    name: "small-llama", arch: "llama", nEmbd: 256, nLayers: 8, nHead: 4, nHeadKv: 1, nFf: 512, nVocab: 512,
    tiedEmbeddings: false, qkvBias: false, contextLength: 1024, ropeFreqBase: 10000, normEps: 1e-5, defaultVocab: "stories260K",
  },
];

export function modelShapeByName(name: string): ModelShape | undefined {
  return modelShapes.find((s) => s.name === name.toLowerCase());
}

/** Problems with a shape (an empty list when it can be generated). */
export function shapeProblems(s: ModelShape): string[] {
  const p: string[] = [];
  const pos = (v: number, what: string) => {
    if (!Number.isInteger(v) || v <= 0) p.push(`${what} must be a positive whole number (got ${v})`);
  };
  pos(s.nEmbd, "dims");
  pos(s.nLayers, "layers");
  pos(s.nHead, "heads");
  pos(s.nHeadKv, "kv heads");
  pos(s.nFf, "ffn");
  pos(s.nVocab, "vocab size");
  pos(s.contextLength, "context length");
  if (p.length) return p;
  if (s.headDim !== undefined) pos(s.headDim, "head size");
  if (s.headDim === undefined && s.nEmbd % s.nHead !== 0) p.push(`dims ${s.nEmbd} is not a multiple of heads ${s.nHead}`);
  else if ((s.headDim ?? s.nEmbd / s.nHead) % 2 !== 0) p.push(`head size ${s.headDim ?? s.nEmbd / s.nHead} must be even (RoPE rotates pairs)`);
  if (s.nHead % s.nHeadKv !== 0) p.push(`heads ${s.nHead} is not a multiple of kv heads ${s.nHeadKv}`);
  if (s.nExpert !== undefined) {
    pos(s.nExpert, "experts");
    if (s.nExpertUsed !== undefined && !(Number.isInteger(s.nExpertUsed) && s.nExpertUsed >= 1 && s.nExpertUsed <= s.nExpert)) p.push(`experts used ${s.nExpertUsed} must be 1..${s.nExpert}`);
    if (s.nFfExp !== undefined) pos(s.nFfExp, "expert ffn");
  }
  return p;
}
