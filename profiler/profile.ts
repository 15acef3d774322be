// Measures this device for Halda: each step says what it does; speeds come from the cache unless
// asked to measure again. A few seconds the first time on a device, milliseconds afterwards.
import { createHash } from "node:crypto";
import { tmpdir } from "node:os";
import type { DeviceProfile } from "../halda/index.js";
import type { GgufFile, ModelDescription } from "../model/index.js";
import { simdLevel } from "../native/index.js";
import { cacheKey, defaultCacheDir, loadSpeeds, nativeBuildId, recentPassScales, RECENT_PASS_MS, saveSpeeds } from "./cache.js";
import {
  describeStep, flopsPerType, measureKvCopyMs, measureMemoryBandwidth, measureWindowCallMs, modelWorkload, stepKey, timeStep, type ModelWorkload, type StepTiming,
} from "./compute.js";
import { diskKey, measureDisk, probeBytes, scratchDir, scratchRoomBytes } from "./disk.js";
import { calibrateForward, forwardKey, kernelWindowMs, median, standInBytes, standInLayers, standInMinBytes, timeForward, type ForwardCalibration, type ForwardTiming } from "./forward.js";
import { detectGpus } from "./gpu.js";
import { layerRoomBytes, mappedResidentBytes, readMemory, settleMemory, type MemoryReading } from "./memory.js";
import { REPORT_VERSION, type DeviceReport } from "./report.js";
import { cgroupPaths, cpuQuota, lastLevelCacheBytes, systemInfo } from "./system.js";

/** What the profile times: a model (its header: the kernels on its shapes, and the engine's own
 * forward pass on a stand-in of its first layers, profiler/forward.ts, which the kernels' FLOP/s are
 * scaled to), or, with no model at hand, a workload's shapes alone (profiler/compute.ts). */
export type ProfileTarget =
  | { readonly model: { readonly gguf: GgufFile; readonly desc: ModelDescription }; readonly workload?: undefined }
  | { readonly workload: ModelWorkload; readonly model?: undefined };

export type ProfileOptions = ProfileTarget & {
  /** Device name in plans and logs. */
  readonly name: string;
  /** Time the model's output layer too (the head's, which only the coordinator runs): the profile's
   * outputLayerMs. */
  readonly outputLayer?: boolean;
  /** With `outputLayer`: also time the head's hand-off of a token to its ring successor after such a
   * pass (DeviceDetails.handOffMs): before a ring plan, not for a device running alone. */
  readonly handOff?: boolean;
  /** Compute threads, as the engine will use them. */
  readonly threads: number;
  /** Directories to put the disk's scratch file in, best first (the model's own directory). */
  readonly diskDirs?: readonly string[];
  /** KV cache length for the KV-write timing (default 1024). */
  readonly nCtx?: number;
  /** Measure again even when the cache has the numbers. */
  readonly reprofile?: boolean;
  /** Shorter timings (tests). */
  readonly quick?: boolean;
  /** Take a cached one-token pass as it is, and leave the output layer and hand-off untimed: for a
   * profile that a ring plan times again before it plans with it (a worker's join, the coordinator's
   * start). Without a cached pass, it is timed as usual. */
  readonly passFromCache?: boolean;
  /** Default: defaultCacheDir(). */
  readonly cacheDir?: string;
  readonly progress?: (line: string) => void;
};

/** Stable identity of the hardware: machine id, CPU model and count. */
export function hardwareId(): string {
  const s = systemInfo();
  return createHash("sha256").update(`${s.machineId}|${s.cpuModel}|${s.logicalCpus}|${s.arch}`).digest("hex").slice(0, 16);
}

const fmtFlops = (f: number) => `${(f / 1e9).toFixed(2)} GFLOP/s`;

/** Most bytes of stand-in layers the profile writes to the disk to time rereads. */
const MAX_STREAMED_BYTES = 256 << 20;

export async function profileDevice(options: ProfileOptions): Promise<DeviceReport> {
  const o = { ...options, workload: options.workload ?? modelWorkload(options.model!.desc) };
  const t0 = performance.now();
  const say = o.progress ?? (() => {});
  const sys = systemInfo();
  const quota = cpuQuota(cgroupPaths());
  const simd = simdLevel();
  const identity = {
    cpu: sys.cpuModel, cpus: sys.logicalCpus, arch: sys.arch, os: sys.os, kernel: `${sys.kernelRelease} ${sys.kernelVersion}`,
    machine: sys.machineId, native: nativeBuildId(), simd, threads: o.threads, cpuQuota: quota ?? "none",
  };
  const key = cacheKey(identity);
  const dir = o.cacheDir ?? defaultCacheDir();
  const speeds = loadSpeeds(dir, key, identity);
  const measured: string[] = [];
  const quick = o.quick ?? false;
  say(`profiling ${o.name}: ${sys.os}, ${sys.cpuModel}, ${o.threads} threads (${simd})${quota ? `, cgroup CPU quota ${quota.toFixed(2)}` : ""}`);

  // Memory and GPUs first: the benchmarks below size their buffers from what is free.
  const memory = readMemory(sys.os === "android");
  say(`memory: ${(memory.availableBytes / 2 ** 30).toFixed(2)} GiB available of ${(memory.totalBytes / 2 ** 30).toFixed(2)} GiB${memory.cgroup ? ` (cgroup v${memory.cgroup.version} limit)` : ""}`);
  const gpus = detectGpus();
  say(`gpu: ${gpus.length ? gpus.map((g) => `${g.kind} ${g.name}`).join(", ") + " (reported; kernels run on the CPU)" : "none"}`);
  // A working set past the last-level cache, as a model's layers are; never more than a quarter of
  // what is free (a memory-limited device must survive its own profile).
  const budget = Math.max(4 << 20, Math.floor(memory.availableBytes / 4));
  const workingSetBytes = Math.max(1 << 20, Math.min(o.workload.weightBytes, 64 << 20, budget));

  const diskDir = scratchDir([...(o.diskDirs ?? []), dir, tmpdir()]);
  if (!diskDir) throw new Error(`no writable directory for the disk's scratch file (tried ${[...(o.diskDirs ?? []), dir, tmpdir()].join(", ")})`);
  // The probe's room, before anything is timed: a device short of disk is told so at once, naming the
  // bytes (and its worker's next try, once room is made, has timed nothing in vain). 128 MiB: a few
  // hundred ms of reading on a fast disk, where 64 MiB was over before read-ahead had ramped up
  // (1.3-1.5 GB/s on this project's VM against 2.0 with 256 MiB, O_DIRECT); less where the disk is short.
  const dk = diskKey(diskDir);
  const wantedProbe = quick ? 32 << 20 : 128 << 20;
  const probe = o.reprofile || speeds.disks[dk] === undefined ? probeBytes(diskDir, wantedProbe) : wantedProbe;

  const kernels: StepTiming[] = [];
  const steps = o.workload.steps;
  steps.forEach((st, i) => {
    const k = stepKey(st);
    let t = o.reprofile ? undefined : speeds.kernels[k];
    const step = `kernels ${i + 1}/${steps.length}: ${describeStep(st)}`;
    if (t) say(`${step}: ${fmtFlops(t.flopsPerS)} (cached)`);
    else {
      t = timeStep(st, { threads: o.threads, workingSetBytes, minSeconds: quick ? 0.04 : 0.12 });
      speeds.kernels[k] = t;
      measured.push(k);
      say(`${step}: ${fmtFlops(t.flopsPerS)}`);
    }
    kernels.push(t);
  });
  const timings = new Map(kernels.map((t) => [t.key, t]));
  const kernelFlopsPerS = flopsPerType(o.workload, timings);

  /** A cached speed, or measured now (and noted for the cache); either way said. */
  const cachedOr = async <T>(what: string, cached: T | undefined, measure: () => T | Promise<T>, describe: (v: T) => string): Promise<T> => {
    if (cached !== undefined && !o.reprofile) {
      say(`${what}: ${describe(cached)} (cached)`);
      return cached;
    }
    const v = await measure();
    measured.push(what);
    say(`${what}: ${describe(v)}`);
    return v;
  };

  const memRead = speeds.memReadBytesPerS = await cachedOr("memory read", speeds.memReadBytesPerS,
    () => measureMemoryBandwidth(Math.min(100 << 20, Math.max(8 << 20, budget)), o.threads, quick ? 0.05 : 0.15),
    (v) => `${(v / 1e9).toFixed(2)} GB/s`);
  const kvKey = String(o.workload.kvFloats);
  const kvCopyMs = speeds.kvCopyMs[kvKey] = await cachedOr("kv copy", speeds.kvCopyMs[kvKey],
    () => measureKvCopyMs(o.workload.kvFloats, o.nCtx ?? 1024, quick ? 0.01 : 0.03),
    (v) => `${(v * 1000).toFixed(2)} us per token and layer`);
  const windowCallMs = speeds.windowCallMs = await cachedOr("window call", speeds.windowCallMs,
    () => measureWindowCallMs(o.threads, quick ? 10 : 30),
    (v) => `${(v * 1000).toFixed(0)} us to wake ${o.threads} sleeping thread${o.threads === 1 ? "" : "s"}`);

  const disk = speeds.disks[dk] = await cachedOr("disk", speeds.disks[dk], () => {
    const size = probe < wantedProbe ? `a ${(probe / 2 ** 20).toFixed(1)} MiB scratch file (the disk is short of room)` : "a scratch file";
    say(`disk: reading ${size} under ${diskDir} from the disk, as the engine reads weights (its cached pages dropped first)`);
    return measureDisk(diskDir, quick ? { seqSeconds: 0.15, randSeconds: 0.1, fileBytes: probe, buffered: true } : { seqSeconds: 0.4, randSeconds: 0.3, fileBytes: probe, buffered: true });
  }, (d) => `${(d.seqReadBytesPerS / 1e6).toFixed(0)} MB/s sequential, ${(d.randReadBytesPerS / 1e6).toFixed(1)} MB/s random`);

  // The engine's pass over the model's first layers: what Halda's layer time should be, and the same
  // layers streamed from the model's disk: what Halda prices rereads at (profiler/forward.ts).
  let forward: ForwardCalibration | undefined;
  let scalesAdded = false;
  let outputLayerMs: number | undefined;
  let handOffMs: number | undefined;
  // Layers until past the last-level cache's reach, as a ring's windows are, within half of what is
  // free: the stand-in's pages are page cache, given back when it is deleted.
  const standInBytesWanted = standInMinBytes(lastLevelCacheBytes());
  const layers = o.model ? standInLayers(o.model.desc, standInBytesWanted, Math.floor(memory.availableBytes / 2)) : 0;
  if (o.model && layers > 0) {
    const { gguf, desc } = o.model;
    // Streamed passes over as many layers as the stand-in would hold with room to spare (they need
    // none: each goes once computed), but no more than the disk reads in ~0.2 s (one at least: a slow
    // disk's profile must not take minutes), written out for it; none where one layer is more than
    // MAX_STREAMED_BYTES to write (a 70B model's), and the scratch file's reads stand. A pass that
    // streams pays a few ms before the reads run at full speed: over the 3 layers a 200 MiB device's
    // stand-in holds, the benchmark model's rereads ran at 2.8-3.0 GB/s, over 7 at 3.1-3.25, and the
    // model's own 7 layers at 3.3-3.4 (`npm run bench -- --only standin`).
    const wanted = standInLayers(desc, standInBytesWanted, Infinity);
    const meanLayerBytes = standInBytes(desc, wanted) / wanted;
    // And no more than half of the disk's free room holds (none where not one layer fits: the
    // scratch file's reads stand), so that a short disk is not written full.
    const roomLayers = Math.floor(scratchRoomBytes(diskDir) / meanLayerBytes);
    if (roomLayers < 1) say(`disk: too little room under ${diskDir} to stream a layer of the stand-in from it: the scratch file's reads stand for rereads`);
    const streamedLayers = standInBytes(desc, 1) > MAX_STREAMED_BYTES || roomLayers < 1 ? 0
      : Math.max(1, Math.min(wanted, roomLayers, Math.floor((0.2 * disk.seqReadBytesPerS) / meanLayerBytes)));
    // Keyed by the streamed layers, not by the layers timed in memory: those follow the free memory,
    // which moves between a worker's join and a plan, and the streamed figures do not (re-measuring
    // them writes the layers out again).
    const fk = `${forwardKey(desc, streamedLayers)}|${dk}|streamed ${streamedLayers}`;
    // As a ring device runs its passes: after its idle gap, or back to back under a CPU quota.
    const passOptions = { dir: diskDir, threads: o.threads, passes: quick ? 8 : 21, gapMs: quick ? 4 : 10, slices: quick ? 1 : 3, sustained: quota !== undefined && quota < o.threads };
    const time = (streamed: boolean) => timeForward(gguf, desc, layers, { ...passOptions, streamedLayers: streamed ? streamedLayers : 0 });
    const describe = (t: ForwardTiming) => `${t.windowMs.toFixed(2)} ms for ${t.layers} layer${t.layers === 1 ? "" : "s"} (the engine's one-token pass on a stand-in of the model)` +
      (t.streamedMs !== undefined ? `, ${t.streamedMs.toFixed(2)} ms read from the disk` : "");
    try {
      const cached = o.reprofile ? undefined : speeds.forward[fk];
      let timing: ForwardTiming;
      // A start-up profile's pass: ~0.6 s of timing (63 passes with their idle gaps), which the plan
      // that uses it repeats anyway.
      const timedNow = !(o.passFromCache && cached?.layers === layers);
      if (!timedNow) {
        timing = cached!;
        say(`forward pass: ${describe(timing)} (cached; timed again before a plan)`);
      } else if (cached) {
        // The pass is timed again on every profile (a quarter of a second): a device's speed moves
        // with its load and its heat, and a pass cached an hour before predicted a ring 9% fast on
        // this project's VM. The streamed passes, which write layers out, stay cached.
        const windowMs = await time(false).then((t) => t.windowMs, (e: unknown) => {
          if (cached.layers !== layers) throw e; // the cached pass is of other layers
          say(`forward pass: could not be timed now (${e instanceof Error ? e.message : String(e)}): the cached pass used`);
          return cached.windowMs;
        });
        timing = { ...cached, layers, windowMs };
        say(`forward pass: ${describe(timing)} (timed now; the streamed passes cached)`);
      } else {
        // Streaming writes the stand-in's layers out: where that fails (a full disk), the pass alone.
        timing = speeds.forward[fk] = await time(true).catch((e: unknown) => {
          say(`forward pass: the layers could not be streamed from the disk (${e instanceof Error ? e.message : String(e)}): timed in memory only`);
          return time(false);
        });
        measured.push("forward pass");
        say(`forward pass: ${describe(timing)}`);
      }
      forward = calibrateForward(timing, kernelWindowMs(desc, layers, timings), kvCopyMs);
      if (forward.applied) {
        // The figure is the median of this device's recent timings (this one among them), as scales of
        // the kernels: they hold across the layers timed, which follow free memory.
        const now = Date.now();
        const recent = recentPassScales(o.reprofile ? [] : speeds.passScales?.[fk], timedNow ? [{ scale: forward.scale, atMs: now }] : [], now);
        (speeds.passScales ??= {})[fk] = recent;
        scalesAdded = timedNow;
        const scale = recent.length ? median(recent.map((p) => p.scale)) : forward.scale;
        if (recent.length > (timedNow ? 1 : 0) && scale !== forward.scale) {
          timing = { ...timing, windowMs: scale * forward.kernelMs + layers * kvCopyMs };
          forward = calibrateForward(timing, forward.kernelMs, kvCopyMs);
        }
        // Said whenever there were others, also when this timing is their median: a reader of the log
        // can tell a lone timing from an outvoted or confirmed one.
        if (recent.length > 1) say(`forward pass: ${timing.windowMs.toFixed(2)} ms, the median of this device's last ${recent.length} timings within ${RECENT_PASS_MS / 60_000} minutes`);
      }
      say(forward.applied ? `compute: the kernels' FLOP/s scaled by 1/${forward.scale.toFixed(2)} to the engine's pass (${forward.kernelMs.toFixed(2)} ms of kernels)`
        : `compute: the forward pass (${timing.windowMs.toFixed(2)} ms) is implausible against the kernels (${forward.kernelMs.toFixed(2)} ms; a model this small is mostly waking the threads): kernel FLOP/s used as timed, and the window call priced per window`);
      if (forward.streamedBytesPerS) say(`disk: ${(forward.streamedBytesPerS / 1e6).toFixed(0)} MB/s as the engine rereads streamed layers (what Halda prices rereads at)`);
      // The head's output layer: one layer's stand-in with the whole vocabulary's output, timed with
      // and without it, once the layers' stand-in is gone (both at once did not fit beside a 256 MiB
      // head's own memory, and the output's pages were refaulted every pass). Timed every time, never
      // cached: a worker's profile must not carry a head's figure. In one slice each: the two timings
      // are a difference taken back to back, and slicing them cost every plan 1.2 s more.
      if (o.outputLayer && forward.applied && timedNow) {
        const need = standInBytes(desc, 1) + desc.tensors.output.nBytes;
        if (need > memory.availableBytes / 2) say(`output layer: not timed (it and one layer need ${(need / 2 ** 20).toFixed(0)} MiB, over half of what is free): its FLOPs at the layers' rate`);
        else {
          const t = await timeForward(gguf, desc, 1, { ...passOptions, output: true, handOff: o.handOff, slices: 1 })
            .catch((e: unknown) => say(`output layer: could not be timed (${e instanceof Error ? e.message : String(e)}): its FLOPs at the layers' rate`));
          if (t?.outputMs !== undefined) {
            outputLayerMs = t.outputMs;
            say(`output layer: ${t.outputMs.toFixed(2)} ms (the engine's pass with it, less the pass without)`);
          }
          if (t?.handOffMs !== undefined) {
            handOffMs = t.handOffMs;
            say(`hand-off: ${t.handOffMs.toFixed(2)} ms to send a token's activations on after such a pass`);
          }
          if (t?.handOffFailure !== undefined) say(`hand-off: could not be timed (${t.handOffFailure}): the hop priced without it`);
        }
      }
    } catch (e) {
      say(`compute: the forward pass could not be timed (${e instanceof Error ? e.message : String(e)}): kernel FLOP/s used as timed`);
    }
  } else if (o.model) say("compute: not one layer fits in half of free memory: kernel FLOP/s used as timed");
  const cpuFlopsPerS = forward?.applied ? Object.fromEntries(Object.entries(kernelFlopsPerS).map(([t, f]) => [t, f / forward!.scale])) : kernelFlopsPerS;

  let cacheFile: string | undefined;
  if (measured.length || scalesAdded) {
    try {
      cacheFile = saveSpeeds(dir, speeds);
    } catch (e) {
      say(`could not cache the profile in ${dir}: ${(e as Error).message}`);
    }
  }
  const profile: DeviceProfile = {
    name: o.name,
    id: hardwareId(),
    os: sys.os,
    gpuBackend: "none",
    cpuFlopsPerS,
    kvCopyCpuMs: kvCopyMs,
    ramReadBytesPerS: memRead,
    ...memoryFields(memory),
    diskSeqReadBytesPerS: forward?.streamedBytesPerS ?? disk.seqReadBytesPerS,
    diskRandReadBytesPerS: disk.randReadBytesPerS,
    ...(outputLayerMs !== undefined ? { outputLayerMs } : {}),
  };
  const profileMs = performance.now() - t0;
  // The measurements' matrices and buffers are garbage now: freed, so that the memory readings the
  // planner takes later see what this process holds, not what profiling left.
  settleMemory();
  say(`profile done in ${(profileMs / 1000).toFixed(1)} s${measured.length ? "" : " (from the cache)"}`);
  return {
    version: REPORT_VERSION,
    profile,
    details: {
      system: sys, threads: o.threads, simd, ...(quota ? { cpuQuota: quota } : {}), memory, gpus,
      workload: o.workload.name, kernels, memReadBytesPerS: memRead, kvCopyMs, windowCallMs, ...(forward ? { forward } : {}),
      ...(handOffMs !== undefined ? { handOffMs } : {}), disk,
      cacheKey: key, ...(cacheFile ? { cacheFile } : {}), measured, profileMs,
    },
  };
}

/** The profile's memory fields from a reading (ownWeightBytes: see layerRoomBytes). */
function memoryFields(memory: MemoryReading, ownWeightBytes = 0) {
  return {
    ramTotalBytes: memory.totalBytes,
    ramAvailableBytes: layerRoomBytes(memory, ownWeightBytes),
    swappableBytes: memory.swappableBytes,
    swapTotalBytes: memory.swapTotalBytes,
    swapAvailableBytes: memory.swapFreeBytes,
  };
}

/** The same report with memory read again (it changes all the time; speeds do not); `modelPath`: the
 * model this process maps, whose resident pages are the next plan's to place. */
export function refreshMemory(r: DeviceReport, modelPath?: string): DeviceReport {
  const memory = readMemory(r.profile.os === "android");
  const own = modelPath ? mappedResidentBytes(modelPath) : 0;
  return { ...r, profile: { ...r.profile, ...memoryFields(memory, own) }, details: { ...r.details, memory } };
}
