// worker/: a device's daemon (prima-worker, cli.ts). It joins a coordinator over the control plane
// (session.ts), measures itself for the plan (profile-command.ts), opens the windows it is assigned on
// its data port and runs them on the ring (device.ts), from its own copy of the model or from layers it
// fetches (remote-model.ts, weights.ts); each way it can end has its own exit code (exit.ts).
export { WorkerDevice, reserveDataPort, type DeviceOptions } from "./device.js";
export { WorkerSession, REFUSED_RETRY_MS, type SessionHandler, type SessionOptions, type CoordinatorLookup } from "./session.js";
export { joinProfile, profileCommand, PROFILE_REFRESH_MS, type JoinProfile } from "./profile-command.js";
export { RemoteModel, type RemoteModelOptions } from "./remote-model.js";
export { ChunkHasher, WeightsMismatchError } from "./weights.js";
export * from "./exit.js";
