// control/: the gRPC control plane shared by the coordinator and the workers.
export * from "./proto.js";
export * from "./limits.js";
