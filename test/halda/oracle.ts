// An independent evaluation of HALDA.md's latency model, written from §1.4 and §2.1 (the piecewise
// terms) without halda/'s code, and a brute-force search over every k, window and GPU-layer count.
// The tests hold Halda's ILP answers against it.

import { STREAM_MARGIN_BYTES, type DeviceProfile, type ModelProfile } from "../../halda/index.js";

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
  /** What an overloaded non-Metal device rereads per token: the excess (paper), all its RAM-side
   * weights, or the excess, one layer's weights and STREAM_MARGIN_BYTES (prima's engine streaming the
   * rest of its window). */
  readonly overloadReload: "excess" | "window" | "stream";
}

export const defaultOracleOptions: OracleOptions = {
  masterPriority: 1, minDiskBytesPerS: 1e8, prefetchGuard: false, keepOutputInMetal: true,
  nUbatch: 512, registerLoadTerms: false, headComputeTerm: "outputLayer", k: 0, overloadReload: "excess",
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
  const tOut = isHead ? (opt.headComputeTerm === "outputLayer" ? dev.outputLayerMs ?? time(model.outputFlops, dev.cpuFlopsPerS) : tCpu) : 0;
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
  // what a token reads of a layer: all of it, or for a mixture of experts the rest and k experts
  const readBytes = model.moe ? b - (model.moe.nExpert - model.moe.nExpertUsed) * model.moe.expertBytes : b;
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
    if (overloaded) {
      diskBytes = metal ? r * b + (isHead ? bo + row : 0)
        : opt.overloadReload === "window" ? r * readBytes + (isHead ? bo + row : 0)
        : opt.overloadReload === "excess" && model.moe ? moeReread(model, r, D - bcio)
        : (r * bp + bcio - D + (opt.overloadReload === "stream" ? b + STREAM_MARGIN_BYTES : 0)) * (opt.overloadReload === "stream" ? readBytes / b : 1);
    } else if (isHead) diskBytes = row;
    const latencyMs =
      (l - g) * tCpu + g * tGpu + tOut +
      (l - g) * (kvCpu + regCpu) + g * (kvGpu + regGpu) + k * copy + regHead +
      diskBytes * msPerByte +
      k * link;
    let scaledMs = latencyMs;
    if (isHead) {
      const a0 = !overloaded ? alpha : metal ? alpha + b * msPerByte : opt.overloadReload === "window" ? alpha + readBytes * msPerByte
        : opt.overloadReload === "excess" && model.moe ? alpha // the reread is not a per-window coefficient
        : alpha + bp * msPerByte * (opt.overloadReload === "stream" ? readBytes / b : 1);
      scaledMs -= (1 - 1 / opt.masterPriority) * k * a0 * w;
    }
    return { valid, latencyMs, scaledMs, overloaded };
  };
}

/**
 * Expected bytes a mixture of experts rereads per token with r RAM-side layers and `room` bytes for
 * them, when the page cache keeps the hottest of what a token touches: every layer's dense part and KV
 * first (touched by every token), then whole experts by their routing share, r of each rank (the
 * layers share one averaged distribution), the last partly. An expert of share p is touched by k·p of
 * the tokens; each miss reads its e bytes. Written as a greedy fill, apart from halda/'s closed form.
 */
export function moeReread(model: ModelProfile, r: number, room: number): number {
  const x = model.moe!;
  const bp = model.layerBytes + model.kvBytesPerTokenLayer * model.nCtx;
  const e = x.expertBytes, k = x.nExpertUsed;
  const total = x.routingShare.reduce((a, c) => a + c, 0);
  const shares = x.routingShare.map((p) => p / total).sort((p, q) => q - p);
  const dense = bp - x.nExpert * e;
  let left = room - r * dense;
  if (left < 0) return r * dense - room + r * k * e; // the dense parts overflow: they and every routed expert
  let missed = 0;
  for (const p of shares) {
    const fit = Math.min(r, Math.max(0, left / e)); // copies of this rank that stay resident
    left -= fit * e;
    missed += (r - fit) * k * p * e;
  }
  return missed;
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
  readonly latencyMs: number;
  readonly k: number;
  readonly w: number[];
  readonly n: number[];
  /** k·w of the head. */
  readonly headLayers: number;
}

/** Latencies this close (relative) are equal, as HALDA.md §3 says. */
export const tieMs = (latencyMs: number) => 1e-9 * Math.max(1, Math.abs(latencyMs));

/**
 * The model's optimum by exhaustion (HALDA.md §3's order): the least latency over every k, every
 * composition w of L/k into positive windows and every n (0..w); among plans within tieMs of it, the
 * most layers per token on the head (when `opt.masterPriority` > 1), then the smaller k. The cost is a
 * sum of per-device terms and validity is per device, so for a given (k, w) the best n of each device
 * is found on its own: this is the exhaustive minimum over the product, without its size.
 */
export function bruteForce(devices: readonly DeviceProfile[], model: ModelProfile, opt: OracleOptions): BruteForceResult | null {
  const L = model.nLayers, M = devices.length;
  const fns = devices.map((d, i) => deviceCostFn(d, i === 0, model, opt));
  // The least latency for each (k, head window): the head's priority then picks among them.
  const byHead: BruteForceResult[] = [];
  for (const k of kCandidates(L, M, opt.k)) {
    const W = L / k;
    // table[m][w] = least latency of device m with window w, and its n.
    const table = fns.map((f) => {
      const row: ({ lat: number; n: number } | null)[] = [null];
      for (let w = 1; w <= W; w++) {
        let cell: { lat: number; n: number } | null = null;
        for (let n = 0; n <= w; n++) {
          const c = f(k, w, n);
          if (c.valid && (!cell || c.latencyMs < cell.lat)) cell = { lat: c.latencyMs, n };
        }
        row.push(cell);
      }
      return row;
    });
    const w = new Array<number>(M).fill(0);
    const walk = (m: number, left: number, lat: number) => {
      if (m === M - 1) {
        const cell = table[m][left];
        if (left < 1 || !cell) return;
        w[m] = left;
        const total = lat + cell.lat;
        const key = k * L + w[0];
        if (!byHead[key] || total < byHead[key].latencyMs) {
          byHead[key] = { latencyMs: total, k, w: [...w], n: w.map((x, i) => table[i][x]!.n), headLayers: k * w[0] };
        }
        return;
      }
      for (let x = 1; x <= left - (M - 1 - m); x++) {
        const cell = table[m][x];
        if (!cell) continue;
        w[m] = x;
        walk(m + 1, left - x, lat + cell.lat);
      }
    };
    walk(0, W, 0);
  }
  const found = byHead.filter((x) => x !== undefined);
  if (found.length === 0) return null;
  const least = Math.min(...found.map((x) => x.latencyMs));
  let best: BruteForceResult | null = null;
  for (const x of found) {
    if (opt.masterPriority > 1) {
      if (x.latencyMs > least + tieMs(least)) continue;
      if (!best || x.headLayers > best.headLayers || (x.headLayers === best.headLayers && x.k < best.k)) best = x;
    } else if (!best || x.latencyMs < best.latencyMs) best = x;
  }
  return best;
}

/** The least latency over subsets of the devices that keep the head (device 0), by `bruteForce` on each. */
export function bruteForceSubsets(devices: readonly DeviceProfile[], model: ModelProfile, opt: OracleOptions): { subset: number[]; result: BruteForceResult }[] {
  const out: { subset: number[]; result: BruteForceResult }[] = [];
  for (let mask = 0; mask < 2 ** (devices.length - 1); mask++) {
    const subset = [0, ...devices.slice(1).map((_, j) => j + 1).filter((i) => (mask & (1 << (i - 1))) !== 0)];
    const result = bruteForce(subset.map((i) => devices[i]), model, opt);
    if (result) out.push({ subset, result });
  }
  return out;
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
