// HALDA.md §7's fixtures: the paper's six devices with illustrative throughputs, and the three model
// profiles (Llama 3-8B, Llama 1-30B, Llama 3-70B at Q4_K_M) given by their bytes and FLOPs.
// Two compute-buffer variants: "ref" (prima.cpp's estimate, HALDA.md §1.4) and "const".

import type { DeviceProfile, ModelProfile } from "../../halda/index.js";

export const GiB = 2 ** 30;
export const GB = 1e9;

interface FixtureDevice {
  readonly os: DeviceProfile["os"];
  readonly gpu: "metal" | "cuda" | "none";
  readonly cpuGflops: number;
  readonly gpuGflops?: number;
  readonly ramGiB: number;
  readonly gpuGiB?: number;
  readonly diskGBps: number;
}

export const FIXTURE_DEVICES: Readonly<Record<string, FixtureDevice>> = {
  D1: { os: "macos", gpu: "metal", cpuGflops: 120, gpuGflops: 250, ramGiB: 2.4, gpuGiB: 5.3, diskGBps: 0.72 },
  D2: { os: "linux", gpu: "cuda", cpuGflops: 150, gpuGflops: 1100, ramGiB: 4.1, gpuGiB: 8, diskGBps: 2.98 },
  D3: { os: "linux", gpu: "cuda", cpuGflops: 200, gpuGflops: 1300, ramGiB: 9.7, gpuGiB: 11, diskGBps: 3.17 },
  D4: { os: "linux", gpu: "none", cpuGflops: 70, ramGiB: 1.9, diskGBps: 1.37 },
  D5: { os: "linux", gpu: "none", cpuGflops: 80, ramGiB: 5.1, diskGBps: 2.0 },
  D6: { os: "macos", gpu: "none", cpuGflops: 40, ramGiB: 6.8, diskGBps: 0.39 },
};

export type BufferVariant = "ref" | "const";

/** A fixture device as a DeviceProfile; `head` matters only for the "const" compute buffers. */
export function fixtureDevice(id: string, head: boolean, c: BufferVariant): DeviceProfile {
  const f = FIXTURE_DEVICES[id];
  const gpu = f.gpu !== "none";
  const profile: DeviceProfile = {
    name: id,
    os: f.os,
    gpuBackend: f.gpu,
    cpuFlopsPerS: { "*": f.cpuGflops * 1e9 },
    gpuFlopsPerS: gpu ? { "*": f.gpuGflops! * 1e9 } : undefined,
    kvCopyCpuMs: 0.02,
    kvCopyGpuMs: gpu ? 0.05 : undefined,
    ramAvailableBytes: f.ramGiB * GiB,
    gpuFreeBytes: gpu ? f.gpuGiB! * GiB : undefined,
    diskSeqReadBytesPerS: f.diskGBps * GB,
    diskRandReadBytesPerS: f.diskGBps * GB,
  };
  if (c === "ref") return profile;
  return {
    ...profile,
    cpuComputeBufferBytes: (head ? 0.5 : 0.25) * GiB,
    gpuComputeBufferBytes: f.gpu === "cuda" ? 0.9 * GiB : f.gpu === "metal" ? 0.5 * GiB : 0,
  };
}

/** Devices in ring order; the first is the head. */
export function fixtureCluster(ids: readonly string[], c: BufferVariant = "ref"): DeviceProfile[] {
  return ids.map((id, i) => fixtureDevice(id, i === 0, c));
}

interface FixtureModel {
  readonly L: number;
  readonly E: number;
  readonly nFf: number;
  readonly H: number;
  readonly Hkv: number;
  readonly V: number;
  readonly b: number;
  readonly bPrime: number;
  readonly bi: number;
  readonly bo: number;
  readonly flopsPerLayer: number;
}

const MODELS: Readonly<Record<string, FixtureModel>> = {
  "F-8B": { L: 32, E: 4096, nFf: 14336, H: 32, Hkv: 8, V: 128256, b: 130_826_240, bPrime: 135_020_544, bi: 295_501_824, bo: 430_956_544, flopsPerLayer: 0.47e9 },
  "F-30B": { L: 60, E: 6656, nFf: 17920, H: 52, Hkv: 52, V: 32000, b: 322_097_152, bPrime: 349_360_128, bi: 119_808_000, bo: 174_746_624, flopsPerLayer: 1.4249e9 },
  "F-70B": { L: 80, E: 8192, nFf: 28672, H: 64, Hkv: 8, V: 128256, b: 512_720_896, bPrime: 516_915_200, bi: 591_003_648, bo: 861_913_088, flopsPerLayer: 1.7789e9 },
};

export const N_CTX = 1024;

export function fixtureModel(name: "F-8B" | "F-30B" | "F-70B"): ModelProfile {
  const f = MODELS[name];
  const hd = f.E / f.H;
  return {
    name, arch: "llama", nLayers: f.L, nVocab: f.V, nEmbd: f.E, nHead: f.H, nHeadKv: f.Hkv, headDimK: hd, headDimV: hd, nFf: f.nFf,
    nCtx: N_CTX, nKvForFlops: N_CTX,
    layerBytes: f.b,
    layerBytesEach: Array.from({ length: f.L }, () => f.b),
    layerFlops: { Q4_K: f.flopsPerLayer },
    inputBytes: f.bi,
    outputBytes: f.bo,
    outputFlops: { F32: 4 * f.E + 1 + 5 * f.V, Q6_K: 2 * f.E * f.V },
    kvBytesPerTokenLayer: (f.bPrime - f.b) / N_CTX,
    weightBytesTotal: f.L * f.b + f.bi + f.bo,
  };
}
