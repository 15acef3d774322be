// The native core's public surface: the model and its windows, and the kernels.
export * from "./model.js";
export * from "./lane.js";
export {
  GgmlTypeId, MAX_NC, WEIGHT_TYPES, benchDot, dequantize, dot, dotRows, fp32ToHalf, gemm, geglu, halfToFp32, kvAttend, kvAttendBench, kvAttendRows, kvAttendSparse, kvStore, quantizeAct, quantizeRef, rowBytes,
  simdLevel, simdLevels, sparseLandmarks, sparseSelect, typeInfo, type SparseSelection, type SparseSettings, type GgmlTypeName, type KernelTypeInfo, type SimdLevel,
} from "./kernels.js";
export { alignGap, streamSeal, type StreamSeal } from "./io.js";
export * from "./profile.js";
