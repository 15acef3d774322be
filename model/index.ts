// model/: what a GGUF file says (header, hyper-parameters, tensor table), with no side effects.
export * from "./gguf.js";
export * from "./ggml-types.js";
export * from "./architecture.js";
export { modelProfile, modelShapes, modelShapeByName, syntheticModelDescription, syntheticFileTypes, parseSyntheticFileType } from "./profile.js";
export type { ModelProfile, ModelProfileOptions, ModelShape, PerWeightType, SyntheticFileType } from "./profile.js";
export { modelFingerprint } from "./fingerprint.js";
