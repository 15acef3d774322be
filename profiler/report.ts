// A device's profile as it travels (Join.profile_json) and prints: Halda's DeviceProfile, plus the
// details behind it. Parsing a report from the wire checks it the way Halda will, so a broken worker
// is named at join time rather than failing the plan.
import { resolveDevice, type DeviceProfile } from "../halda/index.js";
import type { StepTiming } from "./compute.js";
import type { DiskMeasurement } from "./disk.js";
import type { ForwardCalibration } from "./forward.js";
import type { GpuInfo } from "./gpu.js";
import type { MemoryReading } from "./memory.js";
import type { SystemInfo } from "./system.js";

export const REPORT_VERSION = 1;

export { RAM_AVAILABLE_FRACTION } from "./memory.js";

export interface DeviceDetails {
  readonly system: SystemInfo;
  readonly threads: number;
  readonly simd: string;
  /** CPUs the cgroup allows (quota / period), when limited. */
  readonly cpuQuota?: number;
  readonly memory: MemoryReading;
  readonly gpus: readonly GpuInfo[];
  /** The model the kernels were timed for, and each shape's timing. */
  readonly workload: string;
  readonly kernels: readonly StepTiming[];
  readonly memReadBytesPerS: number;
  readonly kvCopyMs: number;
  /** ms to dispatch one window's forward to sleeping compute threads and get it back (per window). */
  readonly windowCallMs: number;
  /** The engine's pass over a stand-in of the model's first layers, which the CPU FLOP/s are scaled to. */
  readonly forward?: ForwardCalibration;
  /** The head's: ms to hand a token's activations to its ring successor after a pass (profiler/link.ts
   * timeHandOff), which Halda adds to its hop. A worker's report carries none (it hands off in C). */
  readonly handOffMs?: number;
  readonly disk: DiskMeasurement;
  readonly cacheKey: string;
  readonly cacheFile?: string;
  /** What was measured now rather than taken from the cache. */
  readonly measured: readonly string[];
  readonly profileMs: number;
}

/** What a window costs Halda besides its layers and its hop: waking the compute threads. Where the
 * forward pass was applied that wake is in the layer time already (calibrateForward), and a ring device
 * runs one-token passes inline on its lane, with no call to wait for. */
export function windowOverheadMs(d: Pick<DeviceDetails, "windowCallMs" | "forward">): number {
  return d.forward?.applied ? 0 : d.windowCallMs ?? 0; // a peer's report may lack it
}

export interface DeviceReport {
  readonly version: number;
  readonly profile: DeviceProfile;
  readonly details: DeviceDetails;
  /** Port of the device's link probe (profiler/link.ts), for the coordinator to measure the hop. */
  readonly linkProbePort?: number;
  /** The probe's link key (64 hex digits): it answers only whoever holds it. */
  readonly linkProbeKey?: string;
}

/** Parses and checks a report from Join.profile_json; throws an Error saying what is wrong. */
export function parseDeviceReport(json: string): DeviceReport {
  if (!json) throw new Error("no profile (the worker sent none)");
  let r: DeviceReport;
  try {
    r = JSON.parse(json) as DeviceReport;
  } catch (e) {
    throw new Error(`the profile is not JSON: ${(e as Error).message}`);
  }
  const failed = (r as { error?: unknown } | null)?.error;
  if (typeof failed === "string") throw new Error(`the device could not profile itself: ${failed}`);
  if (typeof r !== "object" || r === null || r.version !== REPORT_VERSION) throw new Error(`profile version ${(r as { version?: unknown })?.version} is not ${REPORT_VERSION}`);
  if (typeof r.profile !== "object" || r.profile === null) throw new Error("the profile has no device profile");
  resolveDevice(r.profile, 1); // throws HaldaError naming the field
  checkPlausible(r);
  if (r.linkProbePort !== undefined && !(Number.isInteger(r.linkProbePort) && r.linkProbePort > 0 && r.linkProbePort < 65536)) {
    throw new Error(`link probe port ${r.linkProbePort} is invalid`);
  }
  if (r.linkProbeKey !== undefined && !(typeof r.linkProbeKey === "string" && /^[0-9a-f]{64}$/.test(r.linkProbeKey))) {
    throw new Error("the link probe's key is not 64 hex digits");
  }
  return r;
}

/** Beyond any device a profile may describe: a claim past these is a lie or a broken measurement, and
 * Halda would hand that device most of the model (issue #18: 1e18 FLOP/s took 4 of 5 layers). */
export const PLAUSIBLE = {
  /** FLOP/s of one weight type (a top GPU's dense FP16 is ~1e15; our CPU kernels are far below). */
  flopsPerS: 1e15,
  /** RAM of one device (16 TiB). */
  ramBytes: 2 ** 44,
  /** Disk read speed (100 GB/s). */
  diskBytesPerS: 1e11,
  /** Memory read speed (10 TB/s). */
  memReadBytesPerS: 1e13,
} as const;

/** Throws an Error naming the first field of the report that no real device could have. Halda's own
 * check (resolveDevice) already refuses negative and non-numeric fields. */
export function checkPlausible(r: DeviceReport): void {
  const p = r.profile;
  const over = (field: string, v: number | undefined, limit: number, unit: string) => {
    if (v === undefined || v === null) return;
    if (typeof v !== "number" || !Number.isFinite(v) || v < 0) throw new Error(`${field} = ${String(v)} is not a number >= 0`);
    if (v > limit) throw new Error(`${field} = ${v.toExponential(2)} ${unit} is more than any device has (limit ${limit.toExponential(0)})`);
  };
  for (const [table, t] of [["cpuFlopsPerS", p.cpuFlopsPerS], ["gpuFlopsPerS", p.gpuFlopsPerS]] as const) {
    for (const [type, f] of Object.entries(t ?? {})) over(`${table}.${type}`, f, PLAUSIBLE.flopsPerS, "FLOP/s");
  }
  for (const f of ["ramTotalBytes", "ramAvailableBytes", "swapTotalBytes", "swappableBytes", "gpuFreeBytes"] as const) over(f, p[f], PLAUSIBLE.ramBytes, "bytes");
  for (const f of ["diskSeqReadBytesPerS", "diskRandReadBytesPerS"] as const) over(f, p[f], PLAUSIBLE.diskBytesPerS, "B/s");
  for (const f of ["ramReadBytesPerS", "vramReadBytesPerS"] as const) over(f, p[f], PLAUSIBLE.memReadBytesPerS, "B/s");
  if (p.ramTotalBytes !== undefined && p.ramAvailableBytes > p.ramTotalBytes) {
    throw new Error(`ramAvailableBytes (${p.ramAvailableBytes}) is more than ramTotalBytes (${p.ramTotalBytes})`);
  }
  const m = (r.details as Partial<DeviceDetails> | undefined)?.memory as Partial<MemoryReading> | undefined;
  if (m && typeof m === "object") {
    for (const f of ["totalBytes", "availableBytes", "physicalTotalBytes", "physicalAvailableBytes"] as const) over(`details.memory.${f}`, m[f], PLAUSIBLE.ramBytes, "bytes");
    if (m.availableBytes !== undefined && m.totalBytes !== undefined && m.availableBytes > m.totalBytes) {
      throw new Error(`details.memory.availableBytes (${m.availableBytes}) is more than details.memory.totalBytes (${m.totalBytes})`);
    }
  }
  over("details.memReadBytesPerS", (r.details as Partial<DeviceDetails> | undefined)?.memReadBytesPerS, PLAUSIBLE.memReadBytesPerS, "B/s");
}

const gib = (b: number | undefined) => (b === undefined ? "-" : `${(b / 2 ** 30).toFixed(2)} GiB`);
const mbps = (b: number | undefined) => (b === undefined ? "-" : `${(b / 1e6).toFixed(0)} MB/s`);
const gflops = (f: number) => `${(f / 1e9).toFixed(2)} GFLOP/s`;

/** The report as a two-column table (what `prima-worker profile` prints). */
export function formatReport(r: DeviceReport): string {
  const p = r.profile, d = r.details, m = d.memory;
  const rows: [string, string][] = [
    ["device", `${p.name} (id ${p.id ?? "-"})`],
    ["os", `${p.os} (${d.system.platform} ${d.system.arch}, kernel ${d.system.kernelRelease})`],
    ["cpu", `${d.system.cpuModel}, ${d.system.logicalCpus} logical CPUs, ${d.threads} threads, ${d.simd}${d.cpuQuota ? `, cgroup quota ${d.cpuQuota.toFixed(2)} CPUs` : ""}`],
    ["gpu", d.gpus.length ? d.gpus.map((g) => `${g.kind} ${g.name}, ${gib(g.freeBytes)} free of ${gib(g.totalBytes)} (not used: kernels are CPU-only)`).join("; ") : "none"],
  ];
  for (const [type, f] of Object.entries(p.cpuFlopsPerS)) rows.push([`cpu ${type}`, gflops(f)]);
  for (const k of d.kernels) rows.push([`  ${k.label}`, `${gflops(k.flopsPerS)} (${(k.secondsPerStep * 1000).toFixed(3)} ms per token)`]);
  rows.push(
    ["memory read", `${(d.memReadBytesPerS / 1e9).toFixed(2)} GB/s`],
    ["kv copy", `${(d.kvCopyMs * 1000).toFixed(2)} us per token and layer`],
    ["window call", `${(d.windowCallMs * 1000).toFixed(0)} us per window (waking the compute threads)${d.forward?.applied ? "; in the forward pass below, not added" : ""}`],
    ["forward pass", d.forward ? `${d.forward.windowMs.toFixed(2)} ms for the model's first ${d.forward.layers} layers (kernels alone ${d.forward.kernelMs.toFixed(2)} ms): ` +
      (d.forward.applied ? `cpu FLOP/s above are the kernels' / ${d.forward.scale.toFixed(2)}` : "implausible, not applied") : "not timed (no model given)"],
    ...(p.outputLayerMs !== undefined ? [["output layer", `${p.outputLayerMs.toFixed(2)} ms (a one-layer pass with the whole vocabulary's output, less the same pass without: what the head's output costs)`] as [string, string]] : []),
    ["ram total", `${gib(m.totalBytes)}${m.cgroup ? ` (cgroup v${m.cgroup.version} limit; machine ${gib(m.physicalTotalBytes)})` : ""}`],
    ["ram available", `${gib(m.availableBytes)} (Halda plans with ${gib(p.ramAvailableBytes)})`],
    ["swap", `${gib(m.swapTotalBytes)} total, ${gib(m.swapFreeBytes)} free, ${gib(m.swappableBytes)} swappable`],
    ["disk sequential", d.forward?.streamedBytesPerS ? `${mbps(p.diskSeqReadBytesPerS)} (streamed layers reread by the forward pass; ${mbps(d.disk.seqReadBytesPerS)} in ${d.disk.seqBlockBytes >> 10} KiB reads)`
      : `${mbps(p.diskSeqReadBytesPerS)} (${d.disk.seqBlockBytes >> 10} KiB reads)`],
    ["disk random", `${mbps(p.diskRandReadBytesPerS)} (${d.disk.randBlockBytes >> 10} KiB reads)`],
    ["disk", `${d.disk.device || "?"} under ${d.disk.dir}, ${d.disk.direct ? "O_DIRECT" : "page cache dropped"}${d.disk.throttle.readBytesPerS ? `, cgroup throttle ${mbps(d.disk.throttle.readBytesPerS)}` : ""}` +
      (d.disk.seqReadCpuShare !== undefined ? `, reading takes ${(100 * d.disk.seqReadCpuShare).toFixed(0)}% of a CPU` : "")],
    ["measured now", d.measured.length ? d.measured.join(", ") : "nothing (all from the cache)"],
    ["cache", d.cacheFile ?? d.cacheKey],
  );
  const w = Math.max(...rows.map(([k]) => k.length));
  return rows.map(([k, v]) => `${k.padEnd(w)}  ${v}`).join("\n");
}
