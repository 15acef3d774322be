// The types Halda shares with the rest of the system: what a device measured (DeviceProfile), what the
// model costs (ModelProfile, from model/), the knobs (HaldaOptions) and the answer (Plan).
// Symbols in comments are HALDA.md's.

export type { ModelProfile, PerWeightType } from "../model/index.js";

export type DeviceOs = "macos" | "linux" | "android";
/** GPU usable for layers. Vulkan, SYCL and the rest count as "none" (HALDA.md §1.1). */
export type GpuBackend = "metal" | "cuda" | "none";

/**
 * One device as the profiler measures it (HALDA.md §1.1). Throughputs are keyed by ggml weight-type
 * name ("Q4_K", "F16", "F32", ...); the key "*" applies to every type not listed. Optional fields and
 * their defaults are listed in deploy/README.md and in `resolveDevice` (halda/devices.ts).
 */
export interface DeviceProfile {
  readonly name: string;
  readonly id?: string;
  readonly os: DeviceOs;
  /** Default "none". */
  readonly gpuBackend?: GpuBackend;
  /** CPU and GPU share memory (Apple Silicon). Default: true for Metal, false otherwise. */
  readonly uma?: boolean;
  /** CPU FLOP/s per weight type, times F32 activations. */
  readonly cpuFlopsPerS: Readonly<Record<string, number>>;
  /** GPU FLOP/s per weight type; required with a GPU backend. */
  readonly gpuFlopsPerS?: Readonly<Record<string, number>>;
  /** ms to write one token's K and V rows of one layer into the cache. Default 0. */
  readonly kvCopyCpuMs?: number;
  readonly kvCopyGpuMs?: number;
  /** Read bandwidths; used only with `registerLoadTerms` (paper terms the code leaves out). */
  readonly ramReadBytesPerS?: number;
  readonly vramReadBytesPerS?: number;
  /** ms to copy one token's hidden state across the bus each way (paper ξ). Default 0. */
  readonly ramToVramMs?: number;
  readonly vramToRamMs?: number;
  /** Informational. */
  readonly ramTotalBytes?: number;
  /** d_avail: RAM the app may use. */
  readonly ramAvailableBytes: number;
  /** d_swap: other apps' memory the OS swaps out before dropping our pages (Android). Default 0. */
  readonly swappableBytes?: number;
  /** Informational. */
  readonly swapTotalBytes?: number;
  readonly swapAvailableBytes?: number;
  /** d_gpu: usable GPU memory (Metal: recommendedMaxWorkingSetSize − allocated, d_metal). Required with a GPU. */
  readonly gpuFreeBytes?: number;
  /** User cap on gpuFreeBytes (prima.cpp's --gpu-mem). */
  readonly gpuMemCapBytes?: number;
  /** Disk read throughput; at least one of the two. The missing one defaults to the other. */
  readonly diskSeqReadBytesPerS?: number;
  readonly diskRandReadBytesPerS?: number;
  /** ms to send one token's activations to the successor (ξ). Default 0. */
  readonly linkLatencyMs?: number;
  /** ms of the head's output layer (its norm, the vocabulary's matmul, the logits out) as measured on
   * this device's CPU. Default: the output's FLOPs at cpuFlopsPerS. A layer's kernels and the output's
   * one long matmul do not run at one rate (on this project's VM the output took ~1.3x its FLOPs' time). */
  readonly outputLayerMs?: number;
  /** Measured scratch memory of the forward pass (c_cpu, c_gpu). Default: prima.cpp's estimate (HALDA.md §1.4). */
  readonly cpuComputeBufferBytes?: number;
  readonly gpuComputeBufferBytes?: number;
  /** It reads its next window ahead while the others compute (the coordinator's prefetch choice):
   * plans of k > 1 are also priced with its rereads hidden (HALDA.md §4.9). Default false. */
  readonly prefetches?: boolean;
}

export type DeviceSet = "M1" | "M2" | "M3" | "M4";

/** What an overloaded device rereads per token (HaldaOptions.overloadReload). */
export type OverloadReload = "excess" | "window" | "stream";

export interface HaldaOptions {
  /** "exact" (default): enumerate set assignments, global optimum of the model. "prima": Algorithm 1 as prima.cpp runs it. */
  readonly mode?: "exact" | "prima";
  /** Number of ring cycles; 0 or undefined = choose. */
  readonly k?: number;
  /** The head's priority (HALDA.md §3). Exact mode: above 1, among plans of equal predicted latency
   *  (within 1e-9 relative) the one with most layers on the head; it never trades latency for that.
   *  Faithful mode: the head's window coefficient is divided by it, as prima.cpp does. Default 1.01. */
  readonly masterPriority?: number;
  /** s_thr: a disk slower than this never overloads (M4 only). Default 1e8 B/s (0.1 GB/s). */
  readonly minDiskBytesPerS?: number;
  /** A Metal head keeps output.weight in Metal memory. Default true. */
  readonly keepOutputInMetal?: boolean;
  /** Physical batch for the compute-buffer estimate. Default 512. */
  readonly nUbatch?: number;
  /** One overloaded window must fit in RAM (prefetch-release guard, HALDA.md §4.6). Default false. */
  readonly prefetchGuard?: boolean;
  /** What an overloaded device (M1, M3) reads back from disk per token. "excess" (default, the paper's
   *  model): only what does not fit, r·b' + b_cio − D. "window": every RAM-side weight byte it runs, as
   *  an mmap'd window read in the same order every token does under the kernel's LRU (each page is
   *  evicted before its next use; a head also rereads its output layer and embedding row). Measured on
   *  our engine: a head 3.3 layers short of room reread its 8 layers and the output layer every token
   *  (bench/history/2026-11-24-capped-s1.md). "stream" [EXT]: the excess, one layer and STREAM_MARGIN_BYTES
   *  more, as prima's engine streams a window larger than its room (native streamBeyond): it keeps the
   *  window's first bytes and reads the rest in each pass, dropping each layer's share right after
   *  use, and the layer being read shares the room with the kept bytes, so they get the room less a
   *  layer and the margin. Metal (M2) always drops the whole mapping. */
  readonly overloadReload?: OverloadReload;
  /** Include the paper's RAM/VRAM read terms in α, β and κ (the code leaves them out). Default false. */
  readonly registerLoadTerms?: boolean;
  /** The head's output-layer compute: the paper's output layer (default) or the code's one-layer term. */
  readonly headComputeTerm?: "outputLayer" | "oneLayer";
  /** Device selection (HALDA.md §4.4). "best" (default in exact mode): the subset of devices, head kept,
   *  with the least predicted latency, over every subset up to SELECTION_EXACT_MAX_DEVICES devices (beyond:
   *  prima.cpp's rule, then single-device add/drop moves: a local optimum). "paper" (default in faithful
   *  mode): prima.cpp's rule, drop every device left with a window of at most dropWindowLayers and plan again. */
  readonly selection?: "best" | "paper";
  /** Place layers on every device, even where device selection would drop some (no selection; a device
   *  that cannot hold one layer is then an error). Default false. */
  readonly keepAll?: boolean;
  /** The "paper" rule's threshold: drop non-head devices left with this many layers or fewer. 0: no
   *  device selection at all, as keepAll. Default 1. */
  readonly dropWindowLayers?: number;
  /** "best" selection: among device subsets priced within this fraction of the fastest, the one whose
   *  windows hold the fewest layers' bytes beyond the devices' rooms (HALDA.md §4.4 [EXT]; the reclaim a
   *  window past its room costs is unpriced). 0: the fastest-priced subset only. Default 0.15. */
  readonly overRoomMargin?: number;
  /** "paper" rule: drop only when the smaller ring is predicted faster (HALDA.md §4.4 [EXT]). Default false. */
  readonly dropOnlyIfFaster?: boolean;
  /** The devices' indices in ring order: the first runs each cycle's first layers. Default: as given
   *  (the head first). Halda's counts do not depend on it; a MoE model with each layer's routing
   *  measured prices windows by the layers they name (MoE-3), and then they do. */
  readonly ringOrder?: readonly number[];
}

export interface DeviceLatencyMs {
  /** Layer compute on CPU and GPU, plus the output layer on the head. */
  readonly computeMs: number;
  /** KV writes, RAM<->VRAM copies and (with registerLoadTerms) weight reads from RAM/VRAM. */
  readonly memoryMs: number;
  /** Re-reading evicted weights from disk. */
  readonly diskMs: number;
  /** Sending activations to the successor, once per window. */
  readonly commMs: number;
  readonly totalMs: number;
}

export interface DevicePlan {
  /** Index into the devices given to the planner. */
  readonly index: number;
  readonly name: string;
  readonly set: DeviceSet;
  /** w: layers per cycle. */
  readonly windowLayers: number;
  /** n: of those, the last n run on the GPU. */
  readonly gpuLayers: number;
  /** k·w and k·n: layers per token. */
  readonly layersPerToken: number;
  readonly gpuLayersPerToken: number;
  /** Bytes read back from disk per token. */
  readonly reloadBytesPerToken: number;
  /** cap and capGpu: bytes of layers that fit RAM-side and in VRAM without overload. */
  readonly ramLayerCapacityBytes: number;
  /** The layers its window holds beyond its room, to the nearest layer (terms.ts layersBeyondRoom): a
   * window past its room runs slower than priced (HALDA.md §4.4). */
  readonly layersBeyondRoom: number;
  readonly gpuLayerCapacityBytes: number;
  /** The compute buffers the latency was computed with. */
  readonly cpuComputeBufferBytes: number;
  readonly gpuComputeBufferBytes: number;
  readonly latency: DeviceLatencyMs;
}

export interface DroppedDevice {
  readonly index: number;
  readonly name: string;
  /** Why, with this device's own figures (a sentence to show as is). */
  readonly reason: string;
  /** Predicted ms per token of the best plan found with this device in the ring (best selection: over
   *  every subset that has it; otherwise the chosen ring with it added back); null: no feasible plan has it. */
  readonly latencyWithMs: number | null;
  /** Predicted ms per token of the chosen plan, without it. */
  readonly latencyWithoutMs: number;
}

export type PlannerName = "halda" | "halda-prima" | "even" | "memory" | "flops";

export interface Plan {
  readonly planner: PlannerName;
  readonly nLayers: number;
  /** k: cycles per token. */
  readonly k: number;
  /** The devices that hold layers, in ring order (the head first). */
  readonly devices: readonly DevicePlan[];
  readonly dropped: readonly DroppedDevice[];
  /** Predicted token latency: the sum of every device's total. */
  readonly latencyMs: number;
  /** What Halda minimised: in exact mode latencyMs itself; in faithful mode latencyMs with the head's window
   *  cost divided by masterPriority, as prima.cpp scales it. Baselines optimise nothing; for them it equals latencyMs. */
  readonly objectiveMs: number;
  /** The best other k and its predicted latency, when one is feasible. */
  readonly runnerUp: { readonly k: number; readonly latencyMs: number } | null;
  /** Constraint violations (baselines may overload a slow disk or overfill VRAM); empty for Halda. */
  readonly problems: readonly string[];
  /** How the plan was reached (fallbacks, calibration steps, selection decisions). */
  readonly notes: readonly string[];
}

/** Bad input or no feasible plan; the message says which and what to change. */
export class HaldaError extends Error {
  override name = "HaldaError";
  constructor(message: string, readonly reason: "invalid-input" | "infeasible") {
    super(message);
  }
}
