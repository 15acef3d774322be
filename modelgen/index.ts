// The model generator: random-weight GGUF files in llama and qwen2 shapes, of any weight type or
// llama-quantize type mix, readable by llama.cpp and by our engine alike.
export { generateModel, planTensors, resolveShape, ModelGenError } from "./generate.js";
export type { GenerateOptions, GenerateResult, GeneratedTensor } from "./generate.js";
export { GEN_SHAPES, genShapeByName, shapeProblems } from "./shapes.js";
export type { GenShape, GenArchitecture } from "./shapes.js";
export { FILE_TYPES, FILE_TYPE_NAMES, parseFileType, tensorTypeFor, tensorCategory } from "./quant-mix.js";
export type { FileTypeName, TensorCategory, TensorForTyping } from "./quant-mix.js";
