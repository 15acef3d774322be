// The native core's public surface: the model and its windows, and the kernels.
export * from "./model.js";
