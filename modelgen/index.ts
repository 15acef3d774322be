// The model generator: random-weight GGUF files in llama and qwen2 shapes, of any weight type or
// llama-quantize type mix, readable by llama.cpp and by our engine alike; and a trained model's twin
// with wider heads (pad-heads.ts).
export { generateModel, resolveShape, ModelGenError } from "./generate.js";
export type { GenerateOptions, GenerateResult, GeneratedTensor } from "./generate.js";
export { padHeads, type PadHeadsResult } from "./pad-heads.js";
// Shapes and type mixes are model/ facts (model/shapes.ts, model/quant-mix.ts): import them from there.
