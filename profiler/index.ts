// profiler/: what a device is: memory, and (as it lands) kernel throughput, disk and links.
export * from "./memory.js";
