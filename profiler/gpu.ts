// GPU presence and free memory: NVIDIA through nvidia-smi, Apple Silicon's Metal by platform. Our
// kernels are CPU-only today, so a GPU is reported (so the plan can say what it leaves unused) but
// not offered to Halda.
import { spawnSync } from "node:child_process";
import { arch, platform, totalmem } from "node:os";

export interface GpuInfo {
  readonly kind: "cuda" | "metal";
  readonly name: string;
  readonly totalBytes?: number;
  readonly freeBytes?: number;
  /** Shares memory with the CPU (Apple Silicon). */
  readonly uma: boolean;
}

/** Parses `nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader,nounits` (MiB). */
export function parseNvidiaSmi(text: string): GpuInfo[] {
  const out: GpuInfo[] = [];
  for (const line of text.split("\n")) {
    const parts = line.split(",").map((s) => s.trim());
    if (parts.length < 3 || !parts[0]) continue;
    const total = Number(parts[1]), free = Number(parts[2]);
    if (!Number.isFinite(total) || !Number.isFinite(free) || total <= 0 || free < 0) continue;
    out.push({ kind: "cuda", name: parts[0], totalBytes: total * 2 ** 20, freeBytes: free * 2 ** 20, uma: false });
  }
  return out;
}

/** GPUs on this device; an empty list when there are none (or nvidia-smi is missing or stuck). */
export function detectGpus(plat: string = platform(), cpuArch: string = arch()): GpuInfo[] {
  if (plat === "darwin") {
    // Every Apple Silicon Mac has a Metal GPU on unified memory. Its working-set limit needs the Metal
    // API; about three quarters of RAM is what macOS recommends by default.
    if (cpuArch === "arm64") return [{ kind: "metal", name: "Apple GPU (Metal)", totalBytes: totalmem(), freeBytes: Math.floor(totalmem() * 0.75), uma: true }];
    return [];
  }
  const r = spawnSync("nvidia-smi", ["--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"], { encoding: "utf8", timeout: 3000 });
  if (r.error || r.status !== 0) return [];
  return parseNvidiaSmi(r.stdout);
}
