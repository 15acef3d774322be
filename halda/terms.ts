// Everything Halda derives from the inputs before deciding anything (HALDA.md §1.4 and §2.3):
// per-layer bytes b and b', compute buffers, capacities, per-layer times and the coefficients
// α, β, ξ, δ, then the objective coefficients a, b and the constant κ of each set.

import type { ResolvedDevice } from "./devices.js";
import { HaldaError, type DeviceSet, type HaldaOptions, type ModelProfile, type OverloadReload, type PerWeightType } from "./types.js";

const MiB = 1024 * 1024;

export interface ResolvedOptions {
  readonly mode: "exact" | "prima";
  readonly userK: number;
  readonly masterPriority: number;
  readonly minDiskBytesPerS: number;
  readonly keepOutputInMetal: boolean;
  readonly nUbatch: number;
  readonly prefetchGuard: boolean;
  readonly registerLoadTerms: boolean;
  readonly headComputeTerm: "outputLayer" | "oneLayer";
  readonly dropWindowLayers: number;
  readonly dropOnlyIfFaster: boolean;
  readonly selection: "best" | "paper";
  readonly keepAll: boolean;
  readonly overloadReload: OverloadReload;
}

export function resolveOptions(o: HaldaOptions = {}): ResolvedOptions {
  const bad = (msg: string): never => { throw new HaldaError(`options: ${msg}`, "invalid-input"); };
  const r: ResolvedOptions = {
    mode: o.mode ?? "exact",
    userK: o.k ?? 0,
    masterPriority: o.masterPriority ?? 1.01,
    minDiskBytesPerS: o.minDiskBytesPerS ?? 1e8,
    keepOutputInMetal: o.keepOutputInMetal ?? true,
    nUbatch: o.nUbatch ?? 512,
    prefetchGuard: o.prefetchGuard ?? false,
    registerLoadTerms: o.registerLoadTerms ?? false,
    headComputeTerm: o.headComputeTerm ?? "outputLayer",
    dropWindowLayers: o.dropWindowLayers ?? 1,
    dropOnlyIfFaster: o.dropOnlyIfFaster ?? false,
    selection: o.selection ?? (o.mode === "prima" ? "paper" : "best"),
    keepAll: o.keepAll ?? false,
    overloadReload: o.overloadReload ?? "excess",
  };
  if (r.mode !== "exact" && r.mode !== "prima") bad(`mode must be "exact" or "prima", got ${JSON.stringify(r.mode)}`);
  if (!Number.isInteger(r.userK) || r.userK < 0) bad(`k must be a non-negative integer, got ${r.userK}`);
  if (!(r.masterPriority > 0) || !Number.isFinite(r.masterPriority)) bad(`masterPriority must be > 0, got ${r.masterPriority}`);
  if (!(r.minDiskBytesPerS >= 0)) bad(`minDiskBytesPerS must be >= 0, got ${r.minDiskBytesPerS}`);
  if (!Number.isInteger(r.nUbatch) || r.nUbatch < 1) bad(`nUbatch must be a positive integer, got ${r.nUbatch}`);
  if (r.selection !== "best" && r.selection !== "paper") bad(`selection must be "best" or "paper", got ${JSON.stringify(r.selection)}`);
  if (!["excess", "window", "stream"].includes(r.overloadReload)) bad(`overloadReload must be "excess", "window" or "stream", got ${JSON.stringify(r.overloadReload)}`);
  if (typeof r.keepAll !== "boolean") bad(`keepAll must be true or false, got ${JSON.stringify(r.keepAll)}`);
  if (!Number.isInteger(r.dropWindowLayers) || r.dropWindowLayers < 0) bad(`dropWindowLayers must be a non-negative integer, got ${r.dropWindowLayers}`);
  return r;
}

/** Room the engine's streamed window leaves unused beyond the layer being read (native/src/model.h
 * PRIMA_STREAM_MARGIN_BYTES: release blocks, and slack for the room's reading; test/native/paging.test.ts
 * holds the two equal). */
export const STREAM_MARGIN_BYTES = 12 * 2 ** 20;

/** What an overloaded device rereads per token beyond its excess under "stream": a layer (the engine
 * leaves room for its largest; Halda knows the mean) and the margin. */
export function streamExtraBytes(m: ModelTerms): number {
  return m.layerBytes + STREAM_MARGIN_BYTES;
}

/** Model quantities Halda uses (HALDA.md §1.2, §1.4). */
export interface ModelTerms {
  readonly nLayers: number;
  /** KV capacity in tokens that b' includes. */
  readonly nCtx: number;
  /** b: weight bytes per layer. */
  readonly layerBytes: number;
  /** b': weights plus the layer's whole KV cache. */
  readonly layerBytesWithKv: number;
  /** b_i / V, integer division as in prima.cpp: the one embedding row read per token. */
  readonly inputRowBytes: number;
  /** b_o. */
  readonly outputBytes: number;
  readonly layerFlops: PerWeightType;
  readonly outputFlops: PerWeightType;
  /** prima.cpp's compute-buffer estimate (paper era): activations, and the head's input+output buffers. */
  readonly actBufferBytes: number;
  readonly headIoBufferBytes: number;
}

export function modelTerms(m: ModelProfile, o: ResolvedOptions): ModelTerms {
  const bad = (msg: string): never => { throw new HaldaError(`model profile: ${msg}`, "invalid-input"); };
  const pos = (v: number, what: string) => { if (!(v > 0) || !Number.isFinite(v)) bad(`${what} must be > 0, got ${v}`); };
  if (!Number.isInteger(m.nLayers) || m.nLayers < 1) bad(`nLayers must be a positive integer, got ${m.nLayers}`);
  pos(m.layerBytes, "layerBytes");
  pos(m.nVocab, "nVocab");
  pos(m.nEmbd, "nEmbd");
  pos(m.nHead, "nHead");
  pos(m.nCtx, "nCtx");
  if (!(m.kvBytesPerTokenLayer >= 0) || !(m.inputBytes >= 0) || !(m.outputBytes >= 0)) bad("byte counts must be >= 0");
  for (const [k, v] of [...Object.entries(m.layerFlops), ...Object.entries(m.outputFlops)]) {
    if (!(v >= 0) || !Number.isFinite(v)) bad(`FLOPs for ${k} must be >= 0, got ${v}`);
  }
  const u = o.nUbatch, c = m.nCtx, E = m.nEmbd;
  const act = 4 * (E * u + u + c * u + u + E * u + 2 * E * u + c * u * m.nHead);
  const inp = 4 * (u + E * u);
  const out = 4 * (E * u + m.nVocab * u);
  return {
    nLayers: m.nLayers,
    nCtx: m.nCtx,
    layerBytes: m.layerBytes,
    layerBytesWithKv: m.layerBytes + m.kvBytesPerTokenLayer * m.nCtx,
    inputRowBytes: Math.floor(m.inputBytes / m.nVocab),
    outputBytes: m.outputBytes,
    layerFlops: m.layerFlops,
    outputFlops: m.outputFlops,
    actBufferBytes: act,
    headIoBufferBytes: inp + out,
  };
}

/** What the compute-buffer estimate depends on: does the device run layers on its CPU, on its GPU. */
export interface BufferFlags {
  readonly offload: boolean;
  readonly hasGpuLayers: boolean;
}

/** Exact mode's flags: the largest buffers a device can need (HALDA.md §4.5). */
export function conservativeFlags(d: ResolvedDevice): BufferFlags {
  return { offload: true, hasGpuLayers: d.hasGpu };
}

/** Flags from a plan (prima.cpp computes them from the previous iterate). */
export function flagsFromPlan(w: number, n: number): BufferFlags {
  return { offload: w > n, hasGpuLayers: n > 0 };
}

/** Per-device quantities for one role (head or not) and one set of buffer flags. */
export interface DeviceTerms {
  readonly dev: ResolvedDevice;
  readonly isHead: boolean;
  readonly tCpuMs: number;
  readonly tGpuMs: number;
  /** The head's output layer on its CPU; 0 elsewhere. */
  readonly headComputeMs: number;
  /** With registerLoadTerms, the head's reads of its embedding row and output layer from RAM; 0 elsewhere. */
  readonly headReadMs: number;
  /** Parts of α and β, kept apart for the latency breakdown. */
  readonly cpuLayerMemMs: number;
  readonly gpuLayerMemMs: number;
  readonly alphaMs: number;
  readonly betaMs: number;
  /** Per-window RAM<->VRAM copy and link latency. */
  readonly deviceCopyMs: number;
  readonly xiMs: number;
  /** ms per byte read from disk. */
  readonly deltaMsPerByte: number;
  readonly cCpuBytes: number;
  readonly cGpuBytes: number;
  /** b_cio: the head's embedding row and output layer plus the CPU compute buffer. */
  readonly bcioBytes: number;
  /** D: RAM-side capacity (d_avail; d_metal with Metal; d_avail + d_swap on Android). */
  readonly ramCapacityBytes: number;
  /** cap: bytes of layers that fit RAM-side. */
  readonly capBytes: number;
  /** capGpu: bytes of layers that fit in GPU memory. */
  readonly capGpuBytes: number;
  /** GPU layers leave RAM (Linux/Android with a GPU); on macOS every layer stays in RAM-side memory. */
  readonly gpuLayersLeaveRam: boolean;
  /** s >= s_thr. */
  readonly mayOverload: boolean;
  /** M1, M2 or M3, by OS and Metal. */
  readonly overloadSet: DeviceSet;
}

function timeMs(flops: PerWeightType, tput: Readonly<Record<string, number>>, d: ResolvedDevice, field: string): number {
  let ms = 0;
  for (const [q, f] of Object.entries(flops)) {
    if (f === 0) continue;
    const r = tput[q] ?? tput["*"];
    if (r === undefined || r <= 0) {
      throw new HaldaError(`device #${d.index} (${d.name}): ${field} has no throughput for weight type ${q}, which the model uses (${f.toExponential(3)} FLOP per layer); measure it or add a "*" entry`, "invalid-input");
    }
    ms += (1000 * f) / r;
  }
  return ms;
}

export function deviceTerms(d: ResolvedDevice, isHead: boolean, flags: BufferFlags, m: ModelTerms, o: ResolvedOptions): DeviceTerms {
  const bp = m.layerBytesWithKv;
  const tCpuMs = timeMs(m.layerFlops, d.cpuFlopsPerS, d, "cpuFlopsPerS");
  const tGpuMs = d.hasGpu ? timeMs(m.layerFlops, d.gpuFlopsPerS, d, "gpuFlopsPerS") : 0;
  let cpuLayerMemMs = d.kvCopyCpuMs;
  let gpuLayerMemMs = d.kvCopyGpuMs;
  let headReadMs = 0;
  let headComputeMs = 0;
  if (isHead) headComputeMs = o.headComputeTerm === "outputLayer" ? d.outputLayerMs ?? timeMs(m.outputFlops, d.cpuFlopsPerS, d, "cpuFlopsPerS") : tCpuMs;
  if (o.registerLoadTerms) {
    const need = (v: number | undefined, field: string) => {
      if (!v) throw new HaldaError(`device #${d.index} (${d.name}): registerLoadTerms needs ${field} > 0`, "invalid-input");
      return v;
    };
    const ram = need(d.ramReadBytesPerS, "ramReadBytesPerS");
    cpuLayerMemMs += (1000 * bp) / ram;
    if (d.hasGpu) gpuLayerMemMs += (1000 * bp) / need(d.vramReadBytesPerS, "vramReadBytesPerS");
    if (isHead) headReadMs = (1000 * (m.inputRowBytes + m.outputBytes)) / ram;
  }
  const alphaMs = tCpuMs + cpuLayerMemMs;
  const betaMs = d.hasGpu ? tGpuMs + gpuLayerMemMs - alphaMs : 0;
  const deviceCopyMs = d.hasGpu && !d.uma ? d.ramToVramMs + d.vramToRamMs : 0;

  // Compute buffers: the device's measured working set, else prima.cpp's estimate (HALDA.md §1.4).
  const reserve = d.gpu === "cuda" ? 700 * MiB : d.gpu === "metal" ? 300 * MiB : 0;
  const cCpuBytes = d.cpuComputeBufferBytes ?? (isHead ? m.headIoBufferBytes : 0) + (!d.hasGpu || flags.offload ? m.actBufferBytes : 0);
  const cGpuBytes = d.hasGpu ? (d.gpuComputeBufferBytes ?? (flags.hasGpuLayers ? m.actBufferBytes + reserve : 0)) : 0;
  const bcioBytes = (isHead ? m.inputRowBytes + m.outputBytes : 0) + cCpuBytes;
  const ramCapacityBytes = d.isMetal ? d.gpuFreeBytes : d.os === "android" ? d.ramAvailableBytes + d.swappableBytes : d.ramAvailableBytes;
  const capBytes = ramCapacityBytes - bcioBytes - (d.isMetal ? cGpuBytes : 0);
  const capGpuBytes = d.hasGpu ? Math.max(0, d.gpuFreeBytes - cGpuBytes - (d.isMetal && isHead && o.keepOutputInMetal ? m.outputBytes : 0)) : 0;
  return {
    dev: d, isHead, tCpuMs, tGpuMs, headComputeMs, headReadMs, cpuLayerMemMs, gpuLayerMemMs, alphaMs, betaMs,
    deviceCopyMs, xiMs: deviceCopyMs + d.linkLatencyMs,
    deltaMsPerByte: 1000 / d.diskBytesPerS,
    cCpuBytes, cGpuBytes, bcioBytes, ramCapacityBytes, capBytes, capGpuBytes,
    gpuLayersLeaveRam: d.os !== "macos" && d.hasGpu,
    mayOverload: d.diskBytesPerS >= o.minDiskBytesPerS,
    overloadSet: d.os === "macos" ? (d.isMetal ? "M2" : "M1") : "M3",
  };
}

/** Objective coefficients of one device in one set (HALDA.md §2.3): T_m = k·(a·w + b·n + ξ) + κ. */
export interface SetCoefficients {
  readonly a: number;
  readonly b: number;
  readonly kappa: number;
}

export function setCoefficients(t: DeviceTerms, set: DeviceSet, m: ModelTerms, reload: OverloadReload = "excess"): SetCoefficients {
  const bp = m.layerBytesWithKv, delta = t.deltaMsPerByte, gpu = t.dev.hasGpu;
  let kappa = t.headComputeMs + t.headReadMs;
  if (reload === "window" && (set === "M1" || set === "M3")) {
    // Every RAM-side layer's weights (not its KV cache, which is anonymous) come back each token, and on
    // the head its output layer and embedding row: the M2 formula without Metal.
    if (t.isHead) kappa += (m.outputBytes + m.inputRowBytes) * delta;
    const a = t.alphaMs + m.layerBytes * delta;
    return { a, b: set === "M3" && gpu && t.gpuLayersLeaveRam ? t.betaMs - m.layerBytes * delta : 0, kappa };
  }
  if (t.isHead && (set === "M2" || set === "M4")) kappa += m.inputRowBytes * delta;
  if (t.isHead && set === "M2") kappa += m.outputBytes * delta;
  if (set === "M1" || set === "M3") kappa += (t.bcioBytes - t.ramCapacityBytes + (reload === "stream" ? streamExtraBytes(m) : 0)) * delta;
  switch (set) {
    case "M1": return { a: t.alphaMs + bp * delta, b: 0, kappa };
    case "M2": return { a: t.alphaMs + m.layerBytes * delta, b: t.betaMs, kappa };
    case "M3": return { a: t.alphaMs + bp * delta, b: gpu ? t.betaMs - bp * delta : 0, kappa };
    case "M4": return { a: t.alphaMs, b: gpu ? t.betaMs : 0, kappa };
  }
}

/** The sets a device may be in: M4, and its overload set when its disk is fast enough. */
export function allowedSets(t: DeviceTerms): DeviceSet[] {
  return t.mayOverload ? ["M4", t.overloadSet] : ["M4"];
}

/** k values with full windows: L = k·W, at least one layer per device per window (HALDA.md §4.1 step 3). */
export function validKs(nLayers: number, nDevices: number, userK: number): number[] {
  if (userK > 0) return nLayers % userK === 0 && nLayers / userK >= nDevices ? [userK] : [];
  const ks: number[] = [];
  for (let k = 1; k <= nLayers / 2 || k === 1; k++) if (nLayers % k === 0 && nLayers / k >= nDevices) ks.push(k);
  return ks;
}
