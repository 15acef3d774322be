// halda/: the layer-to-device scheduler (HALDA.md). Pure: no I/O; imports only types from model/.
export { halda, selectDevices } from "./planner.js";
export { SELECTION_EXACT_MAX_DEVICES } from "./selection.js";
export { assignmentPlan, baselinePlan, baselineNames, type BaselineName } from "./baselines.js";
export { predictLatency, predictLatencyMs, type Assignment, type ComputeBufferChoice, type DeviceEvaluation, type LatencyPrediction } from "./latency.js";
export { effectiveDiskBytesPerS, parseDeviceProfiles, resolveDevice, type ParsedDevices, type ResolvedDevice } from "./devices.js";
export { validKs, STREAM_MARGIN_BYTES, MAX_ROUTING_SEGMENTS, moeRereadBytes, moeRereadLines, moeTermsOf, routingSegments, type MoeTerms } from "./terms.js";
export { moeNamedRereadBytes } from "./named-reread.js";
export {
  HaldaError,
  type DeviceLatencyMs, type DeviceOs, type DevicePlan, type DeviceProfile, type DeviceSet, type DroppedDevice,
  type GpuBackend, type HaldaOptions, type ModelProfile, type OverloadReload, type PerWeightType, type Plan, type PlannerName,
} from "./types.js";
