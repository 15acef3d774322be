// engine/: running a model on this device: open a GGUF, make windows, generate and sample.
export { LocalModel, nativeTensorTable, nativeHParams, type OpenOptions, type WindowOptions } from "./local-model.js";
export type { KvCacheTypes } from "../model/index.js";
export { LocalPipeline } from "./local-pipeline.js";
export { INLINE_MAX_MS, NonFiniteError, QuickForward, checkFinite } from "./quick-forward.js";
export { h2oBudget, h2oDrops, h2oEvict, h2oKept } from "./h2o.js";
export { KvJournal, discardFor, replayJournal, resolveKeep, type ContextShift } from "./context-shift.js";
export { generate, type Pipeline, type Embedder, type GenerateOptions, type GenerationResult, type StopReason } from "./generate.js";
export { logSumExp, stepLogprobs, topLogprobs, type StepLogprobs, type TokenLogprob } from "./logprobs.js";
export { Sampler, SamplerError, Rng, argmax, type SamplerOptions, type TokenConstraint } from "./sampler.js";
export {
  KlStats, baseRowSlots, decodeBaseHeader, encodeBaseHeader, encodeBaseRow, negLogProb, perplexity, scoredPerChunk, summarizeKl,
  type BaseHeader, type KlSummary, type PerplexityOptions, type PerplexityResult,
} from "./perplexity.js";
export { SeqSlots, type SeqRow } from "./seq-slots.js";
export { EmbeddingError, POOLINGS, embeddingPooling, normalizeEmbedding, poolRows, type Pooling } from "./embedding.js";
