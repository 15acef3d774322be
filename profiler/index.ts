// profiler/: what a device is and how fast: our kernels on the model's shapes and the engine's own pass
// over a stand-in of its layers, memory (cgroup limits honoured) and memory pressure, disk as the engine
// rereads it, OS, GPU, and the hop to a peer.
export * from "./memory.js";
export { profileDevice, refreshMemory, hardwareId, type ProfileOptions, type ProfileTarget } from "./profile.js";
export { PLAUSIBLE, parseDeviceReport, formatReport, windowOverheadMs, REPORT_VERSION, type DeviceReport, type DeviceDetails } from "./report.js";
export {
  modelWorkload, genericWorkload, flopsPerType, timeStep, stepKey, describeStep, type ModelWorkload, type MatrixShape, type MatmulStep, type StepTiming,
} from "./compute.js";
export { standInLayers, standInBytes, standInMinBytes, writeStandIn, timeForward, timePasses, forwardKey, kernelWindowMs, calibrateForward, rereadBytesPerS, median, SLICE_GAP_MS, type ForwardTiming, type ForwardCalibration, type PassOptions } from "./forward.js";
export { measureDisk, blockDeviceOf, readAheadBytes, diskKey, probeBytes, MIN_PROBE_BYTES, type DiskMeasurement } from "./disk.js";
export { LinkProbeServer, measureLink, timeHandOff, type HandOffOptions, type LinkMeasurement, type LinkOptions } from "./link.js";
export { detectGpus, parseNvidiaSmi, type GpuInfo } from "./gpu.js";
export { detectOs, systemInfo, cpuName, armCores, type ArmCore, cgroupPaths, cpuQuota, diskThrottle, lastLevelCacheBytes, parseCacheSize, type SystemInfo, type CgroupPaths, type DiskThrottle } from "./system.js";
export { defaultCacheDir, makeDirs, writeJsonAtomically } from "./cache.js";
export { observedRereadBytesPerS, rereadKey, rereadFigure, recentRereads, RereadStore, MIN_OBSERVED_REREAD_BYTES, RECENT_REREAD_MS, type RereadObservation } from "./rereads.js";
export { observedPassRatio, ringPassKey, ringPassFigure, withPassRatio, RingPassStore, RECENT_RING_PASS_MS, MAX_IN_MEMORY_READ_BYTES } from "./ring-passes.js";
export { dropFileCache } from "../native/index.js";
export { measureExpertRouting, cachedExpertRouting, ROUTING_TEXT, type RoutingOptions } from "./routing.js";
