// Device profiles in, checked and with defaults filled: the JSON a profiler writes (deploy/README.md)
// becomes a ResolvedDevice Halda can use without further checks. Every error names the device and field.

import { HaldaError, type DeviceOs, type DeviceProfile, type GpuBackend } from "./types.js";

export interface ResolvedDevice {
  readonly index: number;
  readonly name: string;
  readonly os: DeviceOs;
  readonly gpu: GpuBackend;
  readonly hasGpu: boolean;
  readonly isMetal: boolean;
  readonly uma: boolean;
  readonly cpuFlopsPerS: Readonly<Record<string, number>>;
  readonly gpuFlopsPerS: Readonly<Record<string, number>>;
  readonly kvCopyCpuMs: number;
  readonly kvCopyGpuMs: number;
  readonly ramReadBytesPerS: number | undefined;
  readonly vramReadBytesPerS: number | undefined;
  readonly ramToVramMs: number;
  readonly vramToRamMs: number;
  readonly ramAvailableBytes: number;
  readonly swappableBytes: number;
  /** After the user cap; 0 without a GPU. */
  readonly gpuFreeBytes: number;
  /** s: sequential read on Linux (mmap advised sequential), random read on macOS and Android. */
  readonly diskBytesPerS: number;
  readonly linkLatencyMs: number;
  readonly outputLayerMs: number | undefined;
  readonly cpuComputeBufferBytes: number | undefined;
  readonly gpuComputeBufferBytes: number | undefined;
  readonly prefetches: boolean;
}

const OSES: readonly DeviceOs[] = ["macos", "linux", "android"];
const GPUS: readonly GpuBackend[] = ["metal", "cuda", "none"];
const KNOWN_FIELDS = new Set([
  "name", "id", "os", "gpuBackend", "uma", "cpuFlopsPerS", "gpuFlopsPerS", "kvCopyCpuMs", "kvCopyGpuMs",
  "ramReadBytesPerS", "vramReadBytesPerS", "ramToVramMs", "vramToRamMs", "ramTotalBytes", "ramAvailableBytes",
  "swappableBytes", "swapTotalBytes", "swapAvailableBytes", "gpuFreeBytes", "gpuMemCapBytes",
  "diskSeqReadBytesPerS", "diskRandReadBytesPerS", "linkLatencyMs", "outputLayerMs", "cpuComputeBufferBytes", "gpuComputeBufferBytes",
  "prefetches",
]);

function fail(where: string, msg: string): never {
  throw new HaldaError(`${where}: ${msg}`, "invalid-input");
}

function nonNegative(where: string, field: string, v: unknown, required: boolean): number | undefined {
  if (v === undefined || v === null) {
    if (required) fail(where, `missing ${field}`);
    return undefined;
  }
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0) fail(where, `${field} must be a finite number >= 0, got ${JSON.stringify(v)}`);
  return v;
}

function flopsTable(where: string, field: string, v: unknown, required: boolean): Record<string, number> {
  if (v === undefined || v === null) {
    if (required) fail(where, `missing ${field} (FLOP/s per weight type, e.g. {"Q4_K": 1.2e11, "F32": 9e10, "*": 1e11})`);
    return {};
  }
  if (typeof v !== "object" || Array.isArray(v)) fail(where, `${field} must be an object of FLOP/s per weight type`);
  const out: Record<string, number> = {};
  for (const [k, x] of Object.entries(v as Record<string, unknown>)) {
    if (k !== "*" && !/^[A-Za-z0-9_]+$/.test(k)) fail(where, `${field} has a key ${JSON.stringify(k)} that is not a weight type name`);
    if (typeof x !== "number" || !Number.isFinite(x) || x < 0) fail(where, `${field}.${k} must be a finite number >= 0 (FLOP/s), got ${JSON.stringify(x)}`);
    out[k === "*" ? "*" : k.toUpperCase()] = x;
  }
  return out;
}

/** s_m (HALDA.md §1.1): the disk speed a device's reloads are priced at: sequential on Linux (the mmap
 * is advised sequential), random elsewhere, either where only one is given (undefined: neither). */
export function effectiveDiskBytesPerS(p: Pick<DeviceProfile, "os" | "diskSeqReadBytesPerS" | "diskRandReadBytesPerS">): number | undefined {
  const seq = p.diskSeqReadBytesPerS, rand = p.diskRandReadBytesPerS;
  return p.os === "linux" ? (seq ?? rand) : (rand ?? seq);
}

/** Checks one profile and fills the defaults. `index` is its position in the ring (0 = head). */
export function resolveDevice(p: DeviceProfile, index: number): ResolvedDevice {
  if (typeof p !== "object" || p === null || Array.isArray(p)) fail(`device #${index}`, "must be an object");
  const name = typeof p.name === "string" && p.name.length > 0 ? p.name : fail(`device #${index}`, "missing name (a non-empty string)");
  const where = `device #${index} (${name})`;
  if (!OSES.includes(p.os)) fail(where, `os must be one of ${OSES.join(", ")}, got ${JSON.stringify(p.os)}`);
  const gpu = p.gpuBackend ?? "none";
  if (!GPUS.includes(gpu)) fail(where, `gpuBackend must be one of ${GPUS.join(", ")}, got ${JSON.stringify(p.gpuBackend)}`);
  if (gpu === "metal" && p.os !== "macos") fail(where, `gpuBackend "metal" needs os "macos"`);
  if (gpu === "cuda" && p.os === "macos") fail(where, `gpuBackend "cuda" is not available on macos`);
  if (p.uma !== undefined && typeof p.uma !== "boolean") fail(where, "uma must be true or false");
  if (p.prefetches !== undefined && typeof p.prefetches !== "boolean") fail(where, "prefetches must be true or false");
  const hasGpu = gpu !== "none";
  const num = (field: keyof DeviceProfile, required = false) => nonNegative(where, field, p[field], required);
  const seq = num("diskSeqReadBytesPerS");
  const rand = num("diskRandReadBytesPerS");
  if (seq === undefined && rand === undefined) fail(where, "missing disk speed: give diskSeqReadBytesPerS and/or diskRandReadBytesPerS (B/s)");
  const diskBytesPerS = effectiveDiskBytesPerS({ os: p.os, diskSeqReadBytesPerS: seq, diskRandReadBytesPerS: rand })!;
  if (!(diskBytesPerS > 0)) fail(where, "disk read speed must be > 0 B/s");
  const gpuFree = num("gpuFreeBytes", hasGpu) ?? 0;
  const cap = num("gpuMemCapBytes");
  const cpuFlopsPerS = flopsTable(where, "cpuFlopsPerS", p.cpuFlopsPerS, true);
  const gpuFlopsPerS = flopsTable(where, "gpuFlopsPerS", p.gpuFlopsPerS, hasGpu);
  for (const f of ["ramTotalBytes", "swapTotalBytes", "swapAvailableBytes"] as const) num(f);
  return {
    index, name, os: p.os, gpu, hasGpu, isMetal: gpu === "metal",
    uma: p.uma ?? gpu === "metal",
    cpuFlopsPerS, gpuFlopsPerS: hasGpu ? gpuFlopsPerS : {},
    kvCopyCpuMs: num("kvCopyCpuMs") ?? 0,
    kvCopyGpuMs: num("kvCopyGpuMs") ?? 0,
    ramReadBytesPerS: num("ramReadBytesPerS"),
    vramReadBytesPerS: num("vramReadBytesPerS"),
    ramToVramMs: num("ramToVramMs") ?? 0,
    vramToRamMs: num("vramToRamMs") ?? 0,
    ramAvailableBytes: num("ramAvailableBytes", true)!,
    swappableBytes: num("swappableBytes") ?? 0,
    gpuFreeBytes: hasGpu ? (cap === undefined ? gpuFree : Math.min(gpuFree, cap)) : 0,
    diskBytesPerS,
    linkLatencyMs: num("linkLatencyMs") ?? 0,
    outputLayerMs: num("outputLayerMs"),
    cpuComputeBufferBytes: num("cpuComputeBufferBytes"),
    gpuComputeBufferBytes: num("gpuComputeBufferBytes"),
    prefetches: p.prefetches ?? false,
  };
}

export interface ParsedDevices {
  readonly devices: DeviceProfile[];
  /** Unknown fields are kept out of the profile and reported here (a typo such as "ramAvailabeBytes"). */
  readonly warnings: string[];
}

/**
 * Validates a parsed devices file: either an array of profiles or `{ "devices": [...] }`. Throws
 * HaldaError naming the device and field on anything wrong.
 */
export function parseDeviceProfiles(json: unknown): ParsedDevices {
  const list = Array.isArray(json) ? json : typeof json === "object" && json !== null && Array.isArray((json as { devices?: unknown }).devices) ? (json as { devices: unknown[] }).devices : undefined;
  if (!list) throw new HaldaError(`devices file: expected an array of device profiles or {"devices": [...]}`, "invalid-input");
  if (list.length === 0) throw new HaldaError("devices file: no devices", "invalid-input");
  const warnings: string[] = [];
  const names = new Set<string>();
  const devices = list.map((raw, i) => {
    if (typeof raw !== "object" || raw === null || Array.isArray(raw)) fail(`device #${i}`, "must be an object");
    const clean: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(raw as Record<string, unknown>)) {
      if (KNOWN_FIELDS.has(k)) clean[k] = v;
      else warnings.push(`device #${i}: unknown field ${JSON.stringify(k)} ignored`);
    }
    const profile = clean as unknown as DeviceProfile;
    resolveDevice(profile, i); // throws on anything invalid
    if (names.has(profile.name)) fail(`device #${i}`, `name ${JSON.stringify(profile.name)} is used twice`);
    names.add(profile.name);
    return profile;
  });
  return { devices, warnings };
}
