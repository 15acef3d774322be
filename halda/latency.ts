// The latency model evaluated on any plan (HALDA.md §2.1, §2.6): classify each device from the plan
// itself, then add up compute, memory, disk and communication. This is written from the piecewise
// terms, not from the ILP's linear coefficients, so the tests can check one against the other.

import { resolveDevice, type ResolvedDevice } from "./devices.js";
import {
  conservativeFlags, deviceTerms, flagsFromPlan, modelTerms, moeRereadBytes, resolveOptions, streamExtraBytes,
  type BufferFlags, type DeviceTerms, type ModelTerms, type ResolvedOptions,
} from "./terms.js";
import { namedLayers, pricedByName, rereadOfRates, windowRates, type WindowRates } from "./named-reread.js";
import { hiddenReadsLatencyMs, type PricedDevice } from "./overlap.js";
import { HaldaError, type DeviceLatencyMs, type DeviceProfile, type DeviceSet, type HaldaOptions, type ModelProfile } from "./types.js";

export interface DeviceEvaluation {
  readonly set: DeviceSet;
  readonly latency: DeviceLatencyMs;
  readonly reloadBytesPerToken: number;
  /** Constraint violations of this device under the plan (slow-disk overload, VRAM overflow, guard). */
  readonly problems: string[];
}

/** One device's share of the token latency for k cycles of windows of w layers, n of them on the GPU.
 * `moeReread` prices an overloaded MoE window's rereads in its stead (MoE-3: a window of named layers). */
export function evaluateDevice(t: DeviceTerms, k: number, w: number, n: number, m: ModelTerms, o: ResolvedOptions,
  moeReread?: (ramLayers: number, capBytes: number) => number): DeviceEvaluation {
  const d = t.dev;
  const l = k * w, g = k * n;
  const bp = m.layerBytesWithKv;
  const ramLayers = t.gpuLayersLeaveRam ? l - g : l; // r: layers whose weights sit RAM-side
  const overloaded = ramLayers * bp > t.capBytes;
  let reload = 0;
  if (overloaded) {
    // Metal drops the whole mapping once memory runs out; elsewhere only the excess is reloaded, or
    // ("window") every RAM-side weight of the device, as cyclic access under LRU does.
    const headBytes = t.isHead ? m.outputBytes + m.inputRowBytes : 0;
    // A mixture of experts reads back only what a token touches: the routed experts not resident
    // ("excess", docs/HALDA.md ρ), or its share a/b of each streamed or reread layer.
    reload = d.isMetal ? l * m.layerBytes + headBytes
      : o.overloadReload === "window" ? ramLayers * m.layerReadBytes + headBytes
      : o.overloadReload === "excess" && m.moe ? (moeReread ?? ((r, c) => moeRereadBytes(m.moe!, r, c)))(ramLayers, t.capBytes)
      : (ramLayers * bp - t.capBytes + (o.overloadReload === "stream" ? streamExtraBytes(m) : 0)) * (o.overloadReload === "stream" ? m.layerReadBytes / m.layerBytes : 1);
  } else if (t.isHead) {
    reload = m.inputRowBytes; // the one embedding row per token
  }
  const computeMs = (l - g) * t.tCpuMs + g * t.tGpuMs + t.headComputeMs;
  const memoryMs = (l - g) * t.cpuLayerMemMs + g * t.gpuLayerMemMs + k * t.deviceCopyMs + t.headReadMs;
  const diskMs = reload * t.deltaMsPerByte;
  const commMs = k * d.linkLatencyMs;
  const problems: string[] = [];
  const who = `${d.name}`;
  if (overloaded && !t.mayOverload) {
    problems.push(`${who} holds more than its memory (${fmtGiB(ramLayers * bp)} of layers, room for ${fmtGiB(Math.max(0, t.capBytes))}) but its disk (${(d.diskBytesPerS / 1e9).toFixed(2)} GB/s) is below the ${(o.minDiskBytesPerS / 1e9).toFixed(2)} GB/s overload threshold`);
  }
  if (g * bp > t.capGpuBytes + 1e-6) problems.push(`${who} has ${g} GPU layers (${fmtGiB(g * bp)}) but room for ${fmtGiB(t.capGpuBytes)} in GPU memory`);
  if (o.prefetchGuard && overloaded) {
    const windowRam = t.gpuLayersLeaveRam ? w - n : w;
    if (windowRam * bp > t.capBytes + 1e-6) problems.push(`${who}'s window (${windowRam} RAM-side layers) does not fit its RAM: prefetching would evict it (prefetch guard)`);
  }
  return {
    set: overloaded ? t.overloadSet : "M4",
    latency: { computeMs, memoryMs, diskMs, commMs, totalMs: computeMs + memoryMs + diskMs + commMs },
    reloadBytesPerToken: reload,
    problems,
  };
}

/** A device's evaluation with its window named (MoE-3): offset is its first layer within each cycle;
 * rates: the window's experts' rates (windowRates), where the caller has them. */
export function evaluateNamed(t: DeviceTerms, k: number, w: number, offset: number, m: ModelTerms, o: ResolvedOptions, rates?: WindowRates): DeviceEvaluation {
  const mt = m.moe!;
  const cycleLayers = m.nLayers / k;
  const p = rates ?? windowRates(mt, namedLayers(k, cycleLayers, offset, w));
  return evaluateDevice(t, k, w, 0, m, o, (r, room) => rereadOfRates(mt, p, r, room));
}

export function fmtGiB(bytes: number): string {
  return `${(bytes / 2 ** 30).toFixed(2)} GiB`;
}

/** A layer assignment to evaluate: k cycles; per input device a window and its GPU layers (0, 0 = not in the ring). */
export interface Assignment {
  readonly k: number;
  readonly windowLayers: readonly number[];
  readonly gpuLayers: readonly number[];
}

/** The compute buffers to evaluate with: exact mode's conservative ones, the plan's own, or given bytes per device. */
export type ComputeBufferChoice = "conservative" | "fromPlan" | readonly { readonly cpuBytes: number; readonly gpuBytes: number }[];

export interface LatencyPrediction {
  readonly latencyMs: number;
  /** Per input device; null for devices with no layers (not in the ring). */
  readonly devices: readonly (DeviceEvaluation | null)[];
  readonly problems: readonly string[];
}

/** Terms for devices whose buffers are given in bytes rather than estimated. */
function termsWithBuffers(d: ResolvedDevice, isHead: boolean, flags: BufferFlags, m: ModelTerms, o: ResolvedOptions, given?: { cpuBytes: number; gpuBytes: number }): DeviceTerms {
  const dd: ResolvedDevice = given ? { ...d, cpuComputeBufferBytes: given.cpuBytes, gpuComputeBufferBytes: given.gpuBytes } : d;
  return deviceTerms(dd, isHead, flags, m, o);
}

/** Each device's first layer within a cycle, its windows laid out in ring order (o.ringOrder). */
function ringOffsets(windowLayers: readonly number[], ringOrder: readonly number[]): number[] {
  const offsets = new Array<number>(windowLayers.length).fill(0);
  let at = 0;
  for (const i of ringOrder) { offsets[i] = at; at += windowLayers[i]; }
  return offsets;
}

/** Internal form on resolved inputs; `active` devices are those with w > 0, plus the head. A MoE model
 * with each layer's routing measured prices each window by the layers it names (MoE-3). */
export function predictResolved(devs: readonly ResolvedDevice[], a: Assignment, m: ModelTerms, o: ResolvedOptions, buffers: ComputeBufferChoice = "conservative"): LatencyPrediction {
  if (a.windowLayers.length !== devs.length || a.gpuLayers.length !== devs.length) {
    throw new HaldaError(`assignment has ${a.windowLayers.length} windows and ${a.gpuLayers.length} GPU counts for ${devs.length} devices`, "invalid-input");
  }
  if (!Number.isInteger(a.k) || a.k < 1) throw new HaldaError(`k must be a positive integer, got ${a.k}`, "invalid-input");
  const out: (DeviceEvaluation | null)[] = [];
  const problems: string[] = [];
  if (o.ringOrder && o.ringOrder.length !== devs.length) throw new HaldaError(`ringOrder lists ${o.ringOrder.length} devices, there are ${devs.length}`, "invalid-input");
  const named = pricedByName(m, o, a.gpuLayers) && Number.isInteger(m.nLayers / a.k);
  const offsets = named ? ringOffsets(a.windowLayers, o.ringOrder ?? devs.map((_, i) => i)) : [];
  let total = 0, layers = 0;
  const priced: PricedDevice[] = [];
  devs.forEach((d, i) => {
    const w = a.windowLayers[i], n = a.gpuLayers[i];
    if (!Number.isInteger(w) || !Number.isInteger(n) || w < 0 || n < 0 || n > w) {
      throw new HaldaError(`${d.name}: window ${w} with ${n} GPU layers is not a valid assignment (integers, 0 <= n <= w)`, "invalid-input");
    }
    if (w === 0 && i !== 0) { out.push(null); return; }
    const flags = buffers === "fromPlan" ? flagsFromPlan(w, n) : conservativeFlags(d);
    const given = typeof buffers === "object" ? buffers[i] : undefined;
    const t = termsWithBuffers(d, i === 0, flags, m, o, given);
    const ev = named ? evaluateNamed(t, a.k, w, offsets[i], m, o) : evaluateDevice(t, a.k, w, n, m, o);
    out.push(ev);
    problems.push(...ev.problems);
    total += ev.latency.totalMs;
    layers += a.k * w;
    priced.push({ dev: d, ev, ramLayers: a.k * (t.gpuLayersLeaveRam ? w - n : w), deltaMsPerByte: t.deltaMsPerByte });
  });
  if (layers !== m.nLayers) problems.push(`the windows cover ${layers} layers per token, the model has ${m.nLayers}`);
  // devices that read ahead, overloaded at k > 1, read while the others compute (HALDA.md §4.9)
  return { latencyMs: hiddenReadsLatencyMs(a.k, priced, m) ?? total, devices: out, problems };
}

/**
 * The model's token latency for any assignment (HALDA.md §2.6). Devices with a zero window are left
 * out of the ring (the head never is). Compute buffers default to exact mode's conservative estimate.
 */
export function predictLatency(devices: readonly DeviceProfile[], model: ModelProfile, a: Assignment, options: HaldaOptions & { computeBuffers?: ComputeBufferChoice } = {}): LatencyPrediction {
  const o = resolveOptions(options);
  const devs = devices.map((d, i) => resolveDevice(d, i));
  return predictResolved(devs, a, modelTerms(model, o), o, options.computeBuffers ?? "conservative");
}

export function predictLatencyMs(devices: readonly DeviceProfile[], model: ModelProfile, a: Assignment, options: HaldaOptions & { computeBuffers?: ComputeBufferChoice } = {}): number {
  return predictLatency(devices, model, a, options).latencyMs;
}
