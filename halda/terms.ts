// Everything Halda derives from the inputs before deciding anything (HALDA.md §1.4 and §2.3):
// per-layer bytes b and b', compute buffers, capacities, per-layer times and the coefficients
// α, β, ξ, δ, then the objective coefficients a, b and the constant κ of each set.

import type { ResolvedDevice } from "./devices.js";
import { HaldaError, type DeviceSet, type HaldaOptions, type ModelProfile, type OverloadReload, type PerWeightType } from "./types.js";
import { kvBytesPerLayer } from "../model/index.js";

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
  readonly overRoomMargin: number;
  readonly keepAll: boolean;
  readonly overloadReload: OverloadReload;
  /** Input device indices in ring order (HaldaOptions.ringOrder); absent: as given. */
  readonly ringOrder?: readonly number[];
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
    overRoomMargin: o.overRoomMargin ?? 0.15,
    keepAll: o.keepAll ?? false,
    overloadReload: o.overloadReload ?? "excess",
    ...(o.ringOrder ? { ringOrder: [...o.ringOrder] } : {}),
  };
  if (r.mode !== "exact" && r.mode !== "prima") bad(`mode must be "exact" or "prima", got ${JSON.stringify(r.mode)}`);
  if (!Number.isInteger(r.userK) || r.userK < 0) bad(`k must be a non-negative integer, got ${r.userK}`);
  if (!(r.masterPriority > 0) || !Number.isFinite(r.masterPriority)) bad(`masterPriority must be > 0, got ${r.masterPriority}`);
  if (!(r.minDiskBytesPerS >= 0)) bad(`minDiskBytesPerS must be >= 0, got ${r.minDiskBytesPerS}`);
  if (!Number.isInteger(r.nUbatch) || r.nUbatch < 1) bad(`nUbatch must be a positive integer, got ${r.nUbatch}`);
  if (r.selection !== "best" && r.selection !== "paper") bad(`selection must be "best" or "paper", got ${JSON.stringify(r.selection)}`);
  if (!["excess", "window", "stream"].includes(r.overloadReload)) bad(`overloadReload must be "excess", "window" or "stream", got ${JSON.stringify(r.overloadReload)}`);
  if (!(r.overRoomMargin >= 0 && r.overRoomMargin < 1)) bad(`overRoomMargin must be in [0, 1), got ${r.overRoomMargin}`);
  if (typeof r.keepAll !== "boolean") bad(`keepAll must be true or false, got ${JSON.stringify(r.keepAll)}`);
  if (!Number.isInteger(r.dropWindowLayers) || r.dropWindowLayers < 0) bad(`dropWindowLayers must be a non-negative integer, got ${r.dropWindowLayers}`);
  const ring = r.ringOrder;
  if (ring && (!ring.every((i) => Number.isInteger(i) && i >= 0 && i < ring.length) || new Set(ring).size !== ring.length)) {
    bad(`ringOrder must list each device index once (0..${ring.length - 1}), got ${JSON.stringify(ring)}`);
  }
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
  /** a: bytes a token reads of one layer's weights (b for a dense layer). */
  readonly layerReadBytes: number;
  /** Mixture of experts; absent for a dense model. */
  readonly moe?: MoeTerms;
}

/** At most this many routing segments (groups of expert ranks with one share each): each is one row of
 * the ILP per overloaded device, and beyond this the plan barely moves (docs/HALDA.md). */
export const MAX_ROUTING_SEGMENTS = 16;

/** A mixture-of-experts layer as Halda prices it (docs/HALDA.md "Mixture of experts"). */
export interface MoeTerms {
  readonly nExpert: number;
  /** k_e: experts each token runs in a layer. */
  readonly nUsed: number;
  /** e: bytes of one expert. */
  readonly expertBytes: number;
  /** d': the rest of a layer, with its KV cache: b' − n·e. */
  readonly denseBytesWithKv: number;
  /** p̄ in groups of consecutive ranks, hottest first: `count` experts with `share` each. */
  readonly segments: readonly { readonly count: number; readonly share: number }[];
  /** Each layer's shares, hottest first, where measured: a plan's windows are then priced by the layers
   * they name (MoE-3, named.ts). */
  readonly layerShares?: readonly (readonly number[])[];
  /** Assignments per layer the measurement saw (tokens · k_e): MoE-3 smooths the shares by it. */
  readonly routingAssignments?: number;
}

/** p̄ as at most `max` segments: equal neighbours merge exactly; beyond `max`, ranks are grouped evenly
 * and averaged (the chord of a concave F: a little more reread, never less). */
export function routingSegments(share: readonly number[], max = MAX_ROUTING_SEGMENTS): { count: number; share: number }[] {
  const sorted = [...share].sort((a, b) => b - a);
  const total = sorted.reduce((a, b) => a + b, 0);
  const p = sorted.map((x) => x / total);
  const merge = (groups: { count: number; share: number }[]) => {
    const out: { count: number; share: number }[] = [];
    for (const g of groups) {
      const last = out[out.length - 1];
      if (last && Math.abs(last.share - g.share) <= 1e-12 * Math.max(last.share, g.share)) out[out.length - 1] = { count: last.count + g.count, share: (last.share * last.count + g.share * g.count) / (last.count + g.count) };
      else out.push({ ...g });
    }
    return out;
  };
  const exact = merge(p.map((x) => ({ count: 1, share: x })));
  if (exact.length <= max) return exact;
  const groups: { count: number; share: number }[] = [];
  for (let gi = 0, i = 0; gi < max; gi++) {
    const end = Math.round(((gi + 1) * p.length) / max);
    let sum = 0;
    for (let j = i; j < end; j++) sum += p[j];
    if (end > i) groups.push({ count: end - i, share: sum / (end - i) });
    i = end;
  }
  return merge(groups);
}

/**
 * ρ: expected bytes an overloaded device (excess pricing, page cache keeping the hottest that fits)
 * rereads per token, with r RAM-side layers and room C bytes for them (docs/HALDA.md, eq. MoE-1).
 * Dense parts are touched every token, so they are resident first; the experts fill what is left,
 * hottest rank first, the same number in every layer (layers share one averaged p̄).
 */
export function moeRereadBytes(mt: MoeTerms, r: number, roomBytes: number): number {
  const dense = r * mt.denseBytesWithKv;
  const expertRoom = roomBytes - dense;
  if (expertRoom <= 0) return Math.max(0, dense + r * mt.nUsed * mt.expertBytes - roomBytes);
  if (r <= 0) return 0;
  let j = expertRoom / (r * mt.expertBytes); // experts resident per layer
  let missed = 1; // G(j): the share of assignments that go to experts not resident
  for (const s of mt.segments) {
    if (j <= 0) break;
    const take = Math.min(j, s.count);
    missed -= take * s.share;
    j -= take;
  }
  return r * mt.nUsed * mt.expertBytes * Math.max(0, missed);
}

/** ρ as the maximum of lines in r (and 0): ρ(r) = max(0, max_i slope_i·r + intercept_i), for a room C.
 * The perspective of a convex piecewise-linear G is the maximum of its segments' lines, linear in r. */
export function moeRereadLines(mt: MoeTerms, roomBytes: number): { slope: number; intercept: number }[] {
  const k = mt.nUsed, e = mt.expertBytes, d = mt.denseBytesWithKv;
  const lines = [{ slope: d + k * e, intercept: -roomBytes }]; // no room even for the dense parts
  let i0 = 0, before = 0; // rank where the segment starts, F(i0)
  for (const s of mt.segments) {
    lines.push({ slope: k * (e * (1 - before + s.share * i0) + s.share * d), intercept: -k * s.share * roomBytes });
    i0 += s.count;
    before += s.count * s.share;
  }
  return lines;
}

/** Bytes per RAM-side layer an overloaded device pays at least, right past its room (a bound for device
 * selection): the slope of its reread there. */
export function overloadSlopeBytes(m: ModelTerms, reload: OverloadReload): number {
  if (reload === "window") return m.layerReadBytes;
  if (reload === "stream") return m.layerBytesWithKv * (m.layerReadBytes / m.layerBytes);
  if (!m.moe) return m.layerBytesWithKv;
  const last = m.moe.segments[m.moe.segments.length - 1];
  return m.moe.nUsed * last.share * m.layerBytesWithKv;
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
  let moe: MoeTerms | undefined;
  if (m.moe) {
    const x = m.moe;
    if (!Number.isInteger(x.nExpert) || x.nExpert < 1 || !Number.isInteger(x.nExpertUsed) || x.nExpertUsed < 1 || x.nExpertUsed > x.nExpert) bad(`moe: ${x.nExpertUsed} of ${x.nExpert} experts is not a valid routing`);
    pos(x.expertBytes, "moe.expertBytes");
    if (x.nExpert * x.expertBytes > m.layerBytes * (1 + 1e-9)) bad(`moe: ${x.nExpert} experts of ${x.expertBytes} B exceed the layer's ${m.layerBytes} B`);
    if (x.routingShare.length !== x.nExpert || x.routingShare.some((p) => !(p >= 0) || !Number.isFinite(p)) || !(x.routingShare.reduce((a, b) => a + b, 0) > 0)) bad(`moe: routingShare must be ${x.nExpert} non-negative shares`);
    const segments = routingSegments(x.routingShare);
    // A token picks k distinct experts: no expert takes more than 1/k of the assignments.
    if (segments[0].share > (1 + 1e-9) / x.nExpertUsed) bad(`moe: the hottest expert takes ${segments[0].share.toFixed(4)} of the assignments, more than 1/${x.nExpertUsed}`);
    const layerBytesWithKv = m.layerBytes + kvBytesPerLayer(m);
    const byLayer = x.routingShareByLayer;
    if (byLayer) {
      if (byLayer.length !== m.nLayers) bad(`moe: routingShareByLayer has ${byLayer.length} layers, the model ${m.nLayers}`);
      for (const [j, p] of byLayer.entries()) {
        const sum = p.length === x.nExpert && p.every((v) => v >= 0 && Number.isFinite(v)) ? p.reduce((a, b) => a + b, 0) : NaN;
        if (!(Math.abs(sum - 1) <= 1e-6)) bad(`moe: layer ${j}'s routing shares must be ${x.nExpert} non-negative shares summing to 1`);
        if (p.some((v, i) => i > 0 && v > p[i - 1])) bad(`moe: layer ${j}'s routing shares must be sorted hottest first`);
        if (p[0] > (1 + 1e-9) / x.nExpertUsed) bad(`moe: layer ${j}'s hottest expert takes ${p[0].toFixed(4)} of the assignments, more than 1/${x.nExpertUsed}`);
      }
    }
    moe = {
      nExpert: x.nExpert, nUsed: x.nExpertUsed, expertBytes: x.expertBytes, denseBytesWithKv: Math.max(0, layerBytesWithKv - x.nExpert * x.expertBytes), segments,
      ...(byLayer ? { layerShares: byLayer } : {}),
      ...(byLayer && x.routingTokens && x.routingTokens > 0 ? { routingAssignments: x.routingTokens * x.nExpertUsed } : {}),
    };
  }
  return {
    nLayers: m.nLayers,
    nCtx: m.nCtx,
    layerBytes: m.layerBytes,
    layerBytesWithKv: m.layerBytes + kvBytesPerLayer(m),
    inputRowBytes: Math.floor(m.inputBytes / m.nVocab),
    outputBytes: m.outputBytes,
    layerFlops: m.layerFlops,
    outputFlops: m.outputFlops,
    actBufferBytes: act,
    headIoBufferBytes: inp + out,
    layerReadBytes: m.moe ? m.layerBytes - (m.moe.nExpert - m.moe.nExpertUsed) * m.moe.expertBytes : m.layerBytes,
    ...(moe ? { moe } : {}),
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

/** Objective coefficients of one device in one set (HALDA.md §2.3): T_m = k·(a·w + b·n + ξ) + κ, plus,
 * for a mixture of experts overloaded under "excess" pricing, δ·ρ(r) with r = k·(w + ramN·n). */
export interface SetCoefficients {
  readonly a: number;
  readonly b: number;
  readonly kappa: number;
  readonly reread?: MoeReread;
}

/** The layers a window of w (n of them on a GPU that takes them out of RAM) holds each token beyond the
 * device's room for layers, to the nearest layer (at most the layers it holds, where there is no room at
 * all): a window past its room runs slower than priced (the reclaim at a memory limit, HALDA.md §4.4), so
 * planning weighs these (ResolvedOptions.overRoomMargin). */
export function layersBeyondRoom(t: DeviceTerms, k: number, w: number, n: number, m: ModelTerms): number {
  const ramLayers = k * (w - (t.gpuLayersLeaveRam ? n : 0));
  return Math.min(ramLayers, Math.round(Math.max(0, ramLayers * m.layerBytesWithKv - t.capBytes) / m.layerBytesWithKv));
}

/** The disk term δ·ρ(r) of an overloaded MoE device (docs/HALDA.md): the ILP bounds an auxiliary
 * variable below by each line (in ms), the evaluation takes ρ itself. */
export interface MoeReread {
  /** r = k·(w + ramN·n): −1 when GPU layers leave RAM. */
  readonly ramN: number;
  readonly linesMs: readonly { readonly slope: number; readonly intercept: number }[];
  readonly ms: (r: number) => number;
}

export function setCoefficients(t: DeviceTerms, set: DeviceSet, m: ModelTerms, reload: OverloadReload = "excess"): SetCoefficients {
  const bp = m.layerBytesWithKv, delta = t.deltaMsPerByte, gpu = t.dev.hasGpu;
  let kappa = t.headComputeMs + t.headReadMs;
  const overloaded = set === "M1" || set === "M3";
  if (reload === "window" && overloaded) {
    // Every RAM-side layer's weights a token reads (not its KV cache, which is anonymous) come back each
    // token, and on the head its output layer and embedding row: the M2 formula without Metal.
    if (t.isHead) kappa += (m.outputBytes + m.inputRowBytes) * delta;
    const a = t.alphaMs + m.layerReadBytes * delta;
    return { a, b: set === "M3" && gpu && t.gpuLayersLeaveRam ? t.betaMs - m.layerReadBytes * delta : 0, kappa };
  }
  if (overloaded && reload === "excess" && m.moe) {
    // Only routed experts that are not resident come back: ρ(r), convex in r (docs/HALDA.md).
    const mt = m.moe, room = t.capBytes;
    return {
      a: t.alphaMs, b: set === "M3" && gpu ? t.betaMs : 0, kappa,
      reread: {
        ramN: t.gpuLayersLeaveRam ? -1 : 0,
        linesMs: moeRereadLines(mt, room).map((l) => ({ slope: l.slope * delta, intercept: l.intercept * delta })),
        ms: (r) => moeRereadBytes(mt, r, room) * delta,
      },
    };
  }
  // "stream" (the engine drops what it streams): each streamed byte of a layer is read back as the
  // layer's share a/b, the bytes a token touches; 1 for a dense layer.
  const f = reload === "stream" ? m.layerReadBytes / m.layerBytes : 1;
  if (t.isHead && (set === "M2" || set === "M4")) kappa += m.inputRowBytes * delta;
  if (t.isHead && set === "M2") kappa += m.outputBytes * delta;
  if (overloaded) kappa += (t.bcioBytes - t.ramCapacityBytes + (reload === "stream" ? streamExtraBytes(m) : 0)) * delta * f;
  switch (set) {
    case "M1": return { a: t.alphaMs + bp * delta * f, b: 0, kappa };
    case "M2": return { a: t.alphaMs + m.layerBytes * delta, b: t.betaMs, kappa };
    case "M3": return { a: t.alphaMs + bp * delta * f, b: gpu ? t.betaMs - bp * delta * f : 0, kappa };
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

/** The MoE terms Halda prices a model profile with (undefined for a dense model). */
export function moeTermsOf(model: ModelProfile): MoeTerms | undefined {
  return modelTerms(model, resolveOptions()).moe;
}
