// An independent evaluation of HALDA.md's latency model, written from §1.4 and §2.1 (the piecewise
// terms) without halda/'s code, and a brute-force search over every k, window and GPU-layer count.
// The tests hold Halda's ILP answers against it.

import type { DeviceProfile, ModelProfile } from "../../halda/index.js";

export interface OracleOptions {
  readonly masterPriority: number;
  readonly minDiskBytesPerS: number;
  readonly prefetchGuard: boolean;
  readonly keepOutputInMetal: boolean;
  readonly nUbatch: number;
  readonly registerLoadTerms: boolean;
  readonly headComputeTerm: "outputLayer" | "oneLayer";
  /** 0 = every valid k. */
  readonly k: number;
}

export const defaultOracleOptions: OracleOptions = {
  masterPriority: 1, minDiskBytesPerS: 1e8, prefetchGuard: false, keepOutputInMetal: true,
  nUbatch: 512, registerLoadTerms: false, headComputeTerm: "outputLayer", k: 0,
};

export interface DeviceCost {
  /** false: the plan breaks a hard constraint (VRAM, slow-disk overload, the guard). */
  readonly valid: boolean;
  readonly latencyMs: number;
  /** latencyMs with the head's window cost divided by masterPriority, as the ILP sees it. */
  readonly scaledMs: number;
  readonly overloaded: boolean;
}

const MiB = 2 ** 20;

/** Per-device cost function for exact mode's (conservative) compute buffers. */
export function deviceCostFn(dev: DeviceProfile, isHead: boolean, model: ModelProfile, opt: OracleOptions): (k: number, w: number, n: number) => DeviceCost {
  const gpu = dev.gpuBackend ?? "none";
  const hasGpu = gpu !== "none";
  const metal = gpu === "metal";
  const uma = dev.uma ?? metal;
  const s = dev.os === "linux" ? (dev.diskSeqReadBytesPerS ?? dev.diskRandReadBytesPerS)! : (dev.diskRandReadBytesPerS ?? dev.diskSeqReadBytesPerS)!;
  const time = (flops: Readonly<Record<string, number>>, tput: Readonly<Record<string, number>>) =>
    Object.entries(flops).reduce((acc, [q, f]) => acc + (f === 0 ? 0 : (1000 * f) / (tput[q] ?? tput["*"])), 0);
  const tCpu = time(model.layerFlops, dev.cpuFlopsPerS);
  const tGpu = hasGpu ? time(model.layerFlops, dev.gpuFlopsPerS!) : 0;
  const tOut = isHead ? (opt.headComputeTerm === "outputLayer" ? time(model.outputFlops, dev.cpuFlopsPerS) : tCpu) : 0;
  const b = model.layerBytes;
  const bp = b + model.kvBytesPerTokenLayer * model.nCtx;
  const row = Math.floor(model.inputBytes / model.nVocab);
  const bo = model.outputBytes;
  const u = opt.nUbatch, c = model.nCtx, E = model.nEmbd;
  const act = 4 * (E * u + u + c * u + u + E * u + 2 * E * u + c * u * model.nHead);
  const inpOut = 4 * (u + E * u) + 4 * (E * u + model.nVocab * u);
  const cCpu = dev.cpuComputeBufferBytes ?? (isHead ? inpOut : 0) + act; // offload assumed: act always
  const cGpu = hasGpu ? dev.gpuComputeBufferBytes ?? act + (gpu === "cuda" ? 700 : 300) * MiB : 0;
  const dGpu = hasGpu ? Math.min(dev.gpuFreeBytes!, dev.gpuMemCapBytes ?? Infinity) : 0;
  const D = metal ? dGpu : dev.os === "android" ? dev.ramAvailableBytes + (dev.swappableBytes ?? 0) : dev.ramAvailableBytes;
  const bcio = (isHead ? row + bo : 0) + cCpu;
  const capGpu = hasGpu ? Math.max(0, dGpu - cGpu - (metal && isHead && opt.keepOutputInMetal ? bo : 0)) : 0;
  const kvCpu = dev.kvCopyCpuMs ?? 0, kvGpu = dev.kvCopyGpuMs ?? 0;
  const regCpu = opt.registerLoadTerms ? (1000 * bp) / dev.ramReadBytesPerS! : 0;
  const regGpu = opt.registerLoadTerms && hasGpu ? (1000 * bp) / dev.vramReadBytesPerS! : 0;
  const regHead = opt.registerLoadTerms && isHead ? (1000 * (row + bo)) / dev.ramReadBytesPerS! : 0;
  const copy = hasGpu && !uma ? (dev.ramToVramMs ?? 0) + (dev.vramToRamMs ?? 0) : 0;
  const link = dev.linkLatencyMs ?? 0;
  const alpha = tCpu + kvCpu + regCpu;
  const msPerByte = 1000 / s;

  return (k, w, n) => {
    const l = k * w, g = k * n;
    const r = dev.os === "macos" ? l : l - g;
    let valid = n <= w && (hasGpu || n === 0) && g * bp <= capGpu * (1 + 1e-12);
    const ramNeed = r * bp + bcio + (metal ? cGpu : 0);
    const overloaded = ramNeed > D;
    if (overloaded && s < opt.minDiskBytesPerS) valid = false;
    if (overloaded && opt.prefetchGuard) {
      const rw = dev.os === "macos" ? w : w - n;
      if (rw * bp + bcio + (metal ? cGpu : 0) > D * (1 + 1e-12)) valid = false;
    }
    let diskBytes = 0;
    if (overloaded) diskBytes = metal ? l * b + (isHead ? bo + row : 0) : r * bp + bcio - D;
    else if (isHead) diskBytes = row;
    const latencyMs =
      (l - g) * tCpu + g * tGpu + tOut +
      (l - g) * (kvCpu + regCpu) + g * (kvGpu + regGpu) + k * copy + regHead +
      diskBytes * msPerByte +
      k * link;
    let scaledMs = latencyMs;
    if (isHead) {
      const a0 = !overloaded ? alpha : metal ? alpha + b * msPerByte : alpha + bp * msPerByte;
      scaledMs -= (1 - 1 / opt.masterPriority) * k * a0 * w;
    }
    return { valid, latencyMs, scaledMs, overloaded };
  };
}

export function kCandidates(L: number, M: number, userK: number): number[] {
  const out: number[] = [];
  for (let k = 1; k <= L; k++) {
    if (L % k !== 0 || L / k < M) continue;
    if (userK > 0 ? k === userK : k === 1 || k <= L / 2) out.push(k);
  }
  return out;
}

export interface BruteForceResult {
  readonly objectiveMs: number;
  readonly latencyMs: number;
  readonly k: number;
  readonly w: number[];
  readonly n: number[];
}

/**
 * The minimum over every k, every composition w of L/k into positive windows and every n (0..w) of
 * the objective (the latency with the head's window cost scaled by 1/masterPriority). The cost is a
 * sum of per-device terms and validity is per device, so for a given (k, w) the best n of each
 * device is found on its own: this is the exhaustive minimum over the product, without its size.
 */
export function bruteForce(devices: readonly DeviceProfile[], model: ModelProfile, opt: OracleOptions): BruteForceResult | null {
  const L = model.nLayers, M = devices.length;
  const fns = devices.map((d, i) => deviceCostFn(d, i === 0, model, opt));
  let best: BruteForceResult | null = null;
  for (const k of kCandidates(L, M, opt.k)) {
    const W = L / k;
    // table[m][w] = best (objective, latency, n) of device m with window w.
    const table = fns.map((f) => {
      const row: ({ obj: number; lat: number; n: number } | null)[] = [null];
      for (let w = 1; w <= W; w++) {
        let cell: { obj: number; lat: number; n: number } | null = null;
        for (let n = 0; n <= w; n++) {
          const c = f(k, w, n);
          if (c.valid && (!cell || c.scaledMs < cell.obj)) cell = { obj: c.scaledMs, lat: c.latencyMs, n };
        }
        row.push(cell);
      }
      return row;
    });
    const w = new Array<number>(M).fill(0);
    const walk = (m: number, left: number, obj: number, lat: number) => {
      if (m === M - 1) {
        const cell = table[m][left];
        if (left < 1 || !cell) return;
        w[m] = left;
        const total = obj + cell.obj;
        if (!best || total < best.objectiveMs) {
          best = { objectiveMs: total, latencyMs: lat + cell.lat, k, w: [...w], n: w.map((x, i) => table[i][x]!.n) };
        }
        return;
      }
      for (let x = 1; x <= left - (M - 1 - m); x++) {
        const cell = table[m][x];
        if (!cell) continue;
        w[m] = x;
        walk(m + 1, left - x, obj + cell.obj, lat + cell.lat);
      }
    };
    walk(0, W, 0, 0);
  }
  return best;
}

/** The plan's cost under the oracle (for the sanity cases' expected plans). */
export function oracleCost(devices: readonly DeviceProfile[], model: ModelProfile, opt: OracleOptions, k: number, w: readonly number[], n: readonly number[]): { latencyMs: number; objectiveMs: number; valid: boolean; overloaded: boolean[] } {
  let latencyMs = 0, objectiveMs = 0, valid = w.reduce((s, x) => s + x, 0) * k === model.nLayers;
  const overloaded: boolean[] = [];
  devices.forEach((d, i) => {
    const c = deviceCostFn(d, i === 0, model, opt)(k, w[i], n[i]);
    latencyMs += c.latencyMs;
    objectiveMs += c.scaledMs;
    valid &&= c.valid && w[i] >= 1;
    overloaded.push(c.overloaded);
  });
  return { latencyMs, objectiveMs, valid, overloaded };
}
