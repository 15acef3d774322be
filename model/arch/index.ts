// model/arch/: one file per model family (its keys, its switches of the native shared blocks, its
// tensor table), as llama.cpp's src/models/<arch>.cpp; this index is the list of families prima runs.
import { gemma2 } from "./gemma2.js";
import { gemma3 } from "./gemma3.js";
import { gptOss } from "./gpt-oss.js";
import { llama } from "./llama.js";
import { mistral3 } from "./mistral3.js";
import { phi3 } from "./phi3.js";
import { qwen2 } from "./qwen2.js";
import { qwen3 } from "./qwen3.js";
import { qwen3moe } from "./qwen3moe.js";
import type { ArchFamily, Architecture } from "./types.js";

export const families: readonly ArchFamily[] = [llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, mistral3, phi3, gptOss];
export const supportedArchitectures: readonly Architecture[] = families.map((f) => f.name);

export function familyOf(name: string): ArchFamily | undefined {
  return families.find((f) => f.name === name);
}

export { commonHParams, moeSlots, fileVocabSize, invSqrtF32, keyReader, layerFromTable } from "./common.js";
export { shapeHParams, shapeKeys, type ShapeKey } from "./shape.js";
export type {
  ArchFamily, Architecture, FamilyShape, HParams, KeyReader, LayerSlot, LayerTensors, ModelDescription, ModelTensors, TensorRef,
} from "./types.js";
