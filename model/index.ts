// model/: what a GGUF file says (header, hyper-parameters, tensor table), with no side effects.
export * from "./gguf.js";
export * from "./gguf-writer.js";
export * from "./ggml-types.js";
export * from "./kv-cache.js";
export * from "./attention.js";
export * from "./architecture.js";
export { shapeHParams, shapeKeys, type ShapeKey } from "./arch/index.js";
export { modelProfile, kvCacheRows, kvBytesPerLayer, kvResumablePosition, kvAfterShift, syntheticModelDescription, layerWeightBytes, layerReadBytes, routingShareFromHits, withMeasuredRouting } from "./profile.js";
export type { ModelProfile, ModelProfileOptions, MoeProfile, PerWeightType } from "./profile.js";
export { modelShapes, modelShapeByName, shapeProblems, type ModelShape } from "./shapes.js";
export {
  FILE_TYPES, FILE_TYPE_NAMES, parseFileType, planTensors, tensorCategory, tensorTypeFor,
  type FileTypeName, type PlannedTensor, type TensorCategory, type TensorForTyping,
} from "./quant-mix.js";
export { modelFingerprint } from "./fingerprint.js";
export { printable } from "../base/index.js";
export { Tokenizer, StreamingDecoder, TokenizerError, TokenAttr, TokenType, SUPPORTED_PRE_TOKENIZERS } from "./tokenizer.js";
export type { EncodeOptions, DecodeOptions, DetokenizeOptions, TokenizerModel } from "./tokenizer.js";
export { tokenizerMetadataFromGguf, tokenizerMetadataFromTokenizerJson } from "./tokenizer-export.js";
export type { HfTokenizerJson, HfTokenizerConfig, TokenizerJsonOptions } from "./tokenizer-export.js";
export { spmMetadataFromTokenizerJson } from "./tokenizer-export-spm.js";
export { bundledVocab, padVocab, BUNDLED_VOCAB_NAMES, goldenTokenizerDir } from "./tokenizer-bundled.js";
export type { BundledVocab, BundledVocabName, BundledVocabOptions } from "./tokenizer-bundled.js";
export { ChatTemplate, ChatTemplateError, renderChat, CHATML_TEMPLATE, LLAMA2_TEMPLATE, DEFAULT_TEMPLATE_LIMITS } from "./chat-template.js";
export type { ChatMessage, ChatFallback, ChatTemplateOptions, RenderOptions, TemplateLimits } from "./chat-template.js";
