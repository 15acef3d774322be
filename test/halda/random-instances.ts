// Seeded random clusters and models for the exactness and validity suites: 2–4 devices, up to 32
// layers, every OS, with and without GPUs, memory from starved to ample, disks on both sides of the
// overload threshold, measured or estimated compute buffers; optionally a head that must overload (little
// memory, a disk fast enough to stream: where the old priority factor chose plans up to 10x too slow).

import type { DeviceProfile, ModelProfile } from "../../halda/index.js";

export { mulberry32 } from "../helpers/random.js";
import { mulberry32 } from "../helpers/random.js";

const GiB = 2 ** 30;

export interface Instance {
  readonly devices: DeviceProfile[];
  readonly model: ModelProfile;
  readonly registerLoadTerms: boolean;
}

export interface InstanceShape {
  /** The head gets memory for a small share of its fair part of the model, no GPU and a disk of 0.1-1 GB/s. */
  readonly headOverloaded?: boolean;
  /** A mixture of experts: 4-16 experts holding 50-95 % of a layer, 1-4 used per token, routed
   * uniformly or with a Zipf-like skew (shuffled, so the planner must sort it). */
  readonly moe?: "uniform" | "skewed";
}

/** `layerChoices`: draw L from these (divisor-rich counts exercise k > 1); default any of M..maxLayers. */
export function randomInstance(rand: () => number, maxDevices = 4, maxLayers = 32, layerChoices?: readonly number[], shape: InstanceShape = {}): Instance {
  const pick = <T,>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)];
  const between = (lo: number, hi: number) => lo + (hi - lo) * rand();
  const logBetween = (lo: number, hi: number) => Math.exp(between(Math.log(lo), Math.log(hi)));
  const M = 2 + Math.floor(rand() * (maxDevices - 1));
  const L = layerChoices ? pick(layerChoices) : M + Math.floor(rand() * (maxLayers - M + 1));
  const E = pick([512, 1024, 2048, 4096]);
  const H = E / 64;
  const Hkv = H / pick([1, 2, 4]);
  const V = pick([32000, 128256]);
  const nCtx = pick([256, 1024, 4096]);
  const layerBytes = Math.round(logBetween(20e6, 600e6));
  const kvBytesPerTokenLayer = 2 * (2 * Hkv * 64);
  const layerParams = layerBytes / 0.6;
  const model: ModelProfile = {
    name: "random", arch: "llama", nLayers: L, nVocab: V, nEmbd: E, nHead: H, nHeadKv: Hkv, headDimK: 64, headDimV: 64, nFf: 3 * E,
    nCtx, nKvForFlops: nCtx, layerBytes, layerBytesEach: Array.from({ length: L }, () => layerBytes),
    layerFlops: { Q4_K: 1.7 * layerParams, Q6_K: 0.3 * layerParams, F16: 4 * 64 * H * nCtx, F32: 20 * E },
    inputBytes: Math.round(V * E * 0.5625), outputBytes: Math.round(V * E * 0.8203125) + 4 * E,
    outputFlops: { Q6_K: 2 * E * V, F32: 4 * E + 1 + 5 * V },
    kvBytesPerTokenLayer, weightBytesTotal: L * layerBytes,
  };
  const bp = layerBytes + kvBytesPerTokenLayer * nCtx;
  const share = (L * bp) / M;
  const registerLoadTerms = rand() < 0.2;
  const devices: DeviceProfile[] = [];
  for (let i = 0; i < M; i++) {
    const os = pick(["linux", "linux", "macos", "android"] as const);
    const gpuBackend = os === "linux" ? pick(["cuda", "none"] as const) : os === "macos" ? pick(["metal", "none"] as const) : "none";
    const hasGpu = gpuBackend !== "none";
    const flops = (lo: number, hi: number): Record<string, number> =>
      rand() < 0.5 ? { "*": logBetween(lo, hi) } : { Q4_K: logBetween(lo, hi), Q6_K: logBetween(lo, hi), F16: logBetween(lo, hi), F32: logBetween(lo, hi) };
    const disk = logBetween(0.03e9, 4e9);
    const measuredBuffers = rand() < 0.5;
    devices.push({
      name: `dev${i}`,
      os,
      gpuBackend,
      cpuFlopsPerS: flops(20e9, 300e9),
      gpuFlopsPerS: hasGpu ? flops(150e9, 3000e9) : undefined,
      kvCopyCpuMs: between(0, 0.1),
      kvCopyGpuMs: hasGpu ? between(0, 0.1) : undefined,
      ramReadBytesPerS: registerLoadTerms ? logBetween(5e9, 100e9) : undefined,
      vramReadBytesPerS: registerLoadTerms && hasGpu ? logBetween(100e9, 900e9) : undefined,
      ramToVramMs: hasGpu && gpuBackend !== "metal" ? between(0, 0.5) : undefined,
      vramToRamMs: hasGpu && gpuBackend !== "metal" ? between(0, 0.5) : undefined,
      ramAvailableBytes: between(0.02, 1.6) * share + between(0, 0.6) * GiB,
      swappableBytes: os === "android" ? between(0, 1) * GiB : undefined,
      gpuFreeBytes: hasGpu ? between(0, 1.6) * share + between(0, 1.2) * GiB : undefined,
      gpuMemCapBytes: hasGpu && rand() < 0.15 ? between(0.5, 1.5) * share : undefined,
      diskSeqReadBytesPerS: rand() < 0.9 ? disk : undefined,
      diskRandReadBytesPerS: disk * between(0.3, 1),
      linkLatencyMs: rand() < 0.5 ? 0 : between(0, 3),
      cpuComputeBufferBytes: measuredBuffers ? between(0, 0.5) * GiB : undefined,
      gpuComputeBufferBytes: measuredBuffers && hasGpu ? between(0, 0.9) * GiB : undefined,
      outputLayerMs: rand() < 0.3 ? between(0, 20) : undefined, // the head's output layer as measured
    });
  }
  if (shape.moe) {
    // Drawn after the devices, so the other shapes of a seed stay as they were.
    const X = pick([4, 8, 16]);
    const k = 1 + Math.floor(rand() * Math.min(4, X / 2));
    const expertBytes = (between(0.5, 0.95) * layerBytes) / X;
    let share = new Array<number>(X).fill(1 / X);
    if (shape.moe === "skewed") {
      const z = share.map((_, i) => (i + 1) ** -between(0.5, 2));
      const sum = z.reduce((a, b) => a + b, 0);
      const zn = z.map((x) => x / sum);
      // a token's k experts are distinct: no expert takes more than 1/k of the assignments
      const lambda = zn[0] > 1 / k ? (1 / k - 1 / X) / (zn[0] - 1 / X) : 1;
      share = zn.map((x) => lambda * x + (1 - lambda) / X);
      for (let i = X - 1; i > 0; i--) { const j = Math.floor(rand() * (i + 1)); [share[i], share[j]] = [share[j], share[i]]; }
    }
    Object.assign(model, {
      arch: "qwen3moe",
      moe: { nExpert: X, nExpertUsed: k, expertBytes, activeLayerBytes: layerBytes - (X - k) * expertBytes, routingShare: share, routing: shape.moe === "skewed" ? "measured" : "uniform" },
    });
  }
  if (shape.headOverloaded) {
    // Drawn after the rest, so the other instances of a seed stay as they were.
    const disk = logBetween(0.1e9, 1e9);
    devices[0] = {
      ...devices[0], gpuBackend: "none", gpuFlopsPerS: undefined, gpuFreeBytes: undefined, gpuMemCapBytes: undefined, gpuComputeBufferBytes: undefined,
      kvCopyGpuMs: undefined, ramToVramMs: undefined, vramToRamMs: undefined, vramReadBytesPerS: undefined,
      ramAvailableBytes: between(0.02, 0.4) * share, diskSeqReadBytesPerS: disk, diskRandReadBytesPerS: disk,
    };
  }
  return { devices, model, registerLoadTerms };
}
