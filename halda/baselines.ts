// Planners to compare Halda against, with the same inputs and the same Plan out, scored by the same
// latency model:
//   even    every device the same window;
//   memory  windows proportional to memory (VRAM for GPU devices, else RAM), GPU layers capped by
//           VRAM and the overflow left on the CPU: exo's split as prima.cpp improved it, the
//           "prima.cpp w/o halda" planner (HALDA.md §4.7);
//   flops   windows proportional to each device's speed on this model's layers (GPU if it has one).
// And any given windows as a Plan (assignmentPlan): a plan kept in force is priced so.

import { resolveDevice, type ResolvedDevice } from "./devices.js";
import { initialWindows, memoryBudget } from "./faithful.js";
import { predictResolved, type Assignment } from "./latency.js";
import { conservativeFlags, deviceTerms, layersBeyondRoom, modelTerms, resolveOptions } from "./terms.js";
import { HaldaError, type DevicePlan, type DeviceProfile, type HaldaOptions, type ModelProfile, type Plan, type PlannerName } from "./types.js";

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
  return assignmentPlan(devices, model, { k, windowLayers: w, gpuLayers: n }, options, name);
}

/** These windows as a Plan, priced by the same latency model as Halda's (HALDA.md §2.6; a MoE model's
 * windows by the layers they name where its routing is measured). A device given no layer (the head
 * always has one) is listed as dropped. Its problems say what it violates; throws on an assignment
 * that is not one (window counts, integers). */
export function assignmentPlan(devices: readonly DeviceProfile[], model: ModelProfile, a: Assignment, options: HaldaOptions = {}, planner: PlannerName = "halda"): Plan {
  const o = resolveOptions(options);
  const m = modelTerms(model, o);
  const devs: ResolvedDevice[] = devices.map((d, i) => resolveDevice(d, i));
  const prediction = predictResolved(devs, a, m, o);
  const planDevices: DevicePlan[] = [];
  devs.forEach((d, i) => {
    const ev = prediction.devices[i];
    if (!ev) return;
    const t = deviceTerms(d, i === 0, conservativeFlags(d), m, o);
    const w = a.windowLayers[i], n = a.gpuLayers[i];
    planDevices.push({
      index: i, name: d.name, set: ev.set, windowLayers: w, gpuLayers: n,
      layersPerToken: a.k * w, gpuLayersPerToken: a.k * n, reloadBytesPerToken: ev.reloadBytesPerToken,
      ramLayerCapacityBytes: t.capBytes, gpuLayerCapacityBytes: t.capGpuBytes, layersBeyondRoom: layersBeyondRoom(t, a.k, w, n, m),
      cpuComputeBufferBytes: t.cCpuBytes, gpuComputeBufferBytes: t.cGpuBytes, latency: ev.latency,
    });
  });
  const latencyMs = prediction.latencyMs;
  const dropped = devs.flatMap((d, i) => (prediction.devices[i] ? [] : [{ index: i, name: d.name, reason: "these windows give it no layers", latencyWithMs: null, latencyWithoutMs: latencyMs }]));
  return { planner, nLayers: m.nLayers, k: a.k, devices: planDevices, dropped, latencyMs, objectiveMs: latencyMs, runnerUp: null, problems: prediction.problems, notes: [] };
}
