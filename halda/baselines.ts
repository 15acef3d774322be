// Planners to compare Halda against, with the same inputs and the same Plan out, scored by the same
// latency model:
//   even    every device the same window;
//   memory  windows proportional to memory (VRAM for GPU devices, else RAM), GPU layers capped by
//           VRAM and the overflow left on the CPU: exo's split as prima.cpp improved it, the
//           "prima.cpp w/o halda" planner (HALDA.md §4.7);
//   flops   windows proportional to each device's speed on this model's layers (GPU if it has one).

import { resolveDevice, type ResolvedDevice } from "./devices.js";
import { initialWindows, memoryBudget } from "./faithful.js";
import { evaluateDevice } from "./latency.js";
import { conservativeFlags, deviceTerms, modelTerms, resolveOptions } from "./terms.js";
import { HaldaError, type DevicePlan, type DeviceProfile, type HaldaOptions, type ModelProfile, type Plan } from "./types.js";

export type BaselineName = "even" | "memory" | "flops";
export const baselineNames: readonly BaselineName[] = ["even", "memory", "flops"];

function evenWindows(W: number, M: number): number[] {
  return Array.from({ length: M }, (_, i) => Math.floor(W / M) + (i < W % M ? 1 : 0));
}

/** A baseline's plan at k = options.k (default 1). Every device keeps at least one layer; nothing is dropped. */
export function baselinePlan(name: BaselineName, devices: readonly DeviceProfile[], model: ModelProfile, options: HaldaOptions = {}): Plan {
  const o = resolveOptions(options);
  const m = modelTerms(model, o);
  if (devices.length === 0) throw new HaldaError("no devices to plan for", "invalid-input");
  const devs: ResolvedDevice[] = devices.map((d, i) => resolveDevice(d, i));
  const k = o.userK || 1;
  const L = m.nLayers, M = devs.length;
  if (L % k !== 0 || L / k < M) throw new HaldaError(`baseline ${name}: k = ${k} needs to divide ${L} layers into windows of at least one layer for ${M} devices`, "invalid-input");
  const W = L / k;
  const terms = devs.map((d, i) => deviceTerms(d, i === 0, conservativeFlags(d), m, o));
  let w: number[];
  switch (name) {
    case "even": w = evenWindows(W, M); break;
    case "memory": w = initialWindows(devs.map((d) => (d.hasGpu ? d.gpuFreeBytes : memoryBudget(d))), W); break;
    case "flops": w = initialWindows(terms.map((t) => 1 / (t.dev.hasGpu ? t.tGpuMs + t.gpuLayerMemMs : t.tCpuMs + t.cpuLayerMemMs)), W); break;
    default: throw new HaldaError(`unknown baseline ${JSON.stringify(name)} (known: ${baselineNames.join(", ")})`, "invalid-input");
  }
  const bp = m.layerBytesWithKv;
  const n = terms.map((t, i) => (t.dev.hasGpu ? Math.max(0, Math.min(w[i], Math.floor(t.capGpuBytes / (k * bp) + 1e-9))) : 0));
  const problems: string[] = [];
  const planDevices: DevicePlan[] = terms.map((t, i) => {
    const ev = evaluateDevice(t, k, w[i], n[i], m, o);
    problems.push(...ev.problems);
    return {
      index: i, name: t.dev.name, set: ev.set, windowLayers: w[i], gpuLayers: n[i],
      layersPerToken: k * w[i], gpuLayersPerToken: k * n[i], reloadBytesPerToken: ev.reloadBytesPerToken,
      ramLayerCapacityBytes: t.capBytes, gpuLayerCapacityBytes: t.capGpuBytes,
      cpuComputeBufferBytes: t.cCpuBytes, gpuComputeBufferBytes: t.cGpuBytes, latency: ev.latency,
    };
  });
  const latencyMs = planDevices.reduce((s, d) => s + d.latency.totalMs, 0);
  return { planner: name, nLayers: L, k, devices: planDevices, dropped: [], latencyMs, objectiveMs: latencyMs, runnerUp: null, problems, notes: [] };
}
