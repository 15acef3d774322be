// coordinator/: the head of a cluster (prima-coord, cli.ts). It takes workers' joins (registry.ts),
// plans the ring with Halda from their profiles (plan-ring.ts, placement.ts), wires it and runs requests
// on it (cluster.ts and its rooms: placing.ts, request-run.ts, queue.ts, devices.ts), and serves them:
// the OpenAI API and the dashboard's state (http-server.ts, embeddings.ts), or one prompt (run-command.ts). The map of
// its files is in docs/DESIGN.md ("Inside coordinator/").
export { Cluster } from "./cluster.js";
export type { ClusterOptions, LayerWindowsArg } from "./cluster-options.js";
export type { GenerationRequest, GenerationOutcome, DeviceDecodeRow } from "./request-run.js";
export { QueueFullError, CancelledError } from "./queue.js";
export { placeRing, priceRingWindows, haldaIndexAt, formatPlan, type Placement } from "./placement.js";
export { planRing, type RingPlan } from "./plan-ring.js";
export { predictionReport, formatPrediction, costPerStep, type PredictionReport } from "./prediction.js";
export { ApiServer, type ApiServerOptions } from "./http-server.js";
export type * from "./state.js";
export { STATE_VERSION } from "./state.js";
export { choosePrefetch, CPU_BOUND_READ_SHARE, type PrefetchChoice, type PrefetchDevice, type PrefetchMode } from "./prefetch-choice.js";
export { computeSharing, describeSharing, machineOf, pooledTwins, twinKey, type ComputeDevice, type ComputeSharing } from "./compute-sharing.js";
