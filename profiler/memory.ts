// Memory readings of this process and this device, from /proc (Linux and Android) and the memory
// cgroup the process runs in (v1 and v2): a container or a cgroup-limited service sees its limit as
// its memory. Other systems get what Node itself reports.
import { closeSync, openSync, readFileSync, readSync, realpathSync } from "node:fs";
import { freemem, totalmem } from "node:os";
import { join } from "node:path";
import { pressMemory, releaseFreeMemory } from "../native/index.js";
import { cgroupPaths, type CgroupPaths } from "./system.js";

/** prima.cpp keeps a fifth of MemAvailable back on Linux (HALDA.md §1.1); we do so where no memory
 * cgroup's hard limit is what binds (layerRoomBytes). */
export const RAM_AVAILABLE_FRACTION = 0.8;

/** Kernel files read again and again (a ring device reads memory a few times a second) stay open and
 * are re-read from offset 0, which makes the kernel generate them afresh: two syscalls instead of
 * four and no path lookup, ~15 us instead of ~50 for /proc/meminfo. Only /proc and cgroup files:
 * an ordinary file may be replaced under its name. */
const openKernelFiles = new Map<string, number>();
const kernelFileBuf = Buffer.allocUnsafe(64 * 1024);

function readText(path: string): string {
  if (!path.startsWith("/proc/") && !path.startsWith("/sys/fs/cgroup/")) return readFileSync(path, "utf8");
  let fd = openKernelFiles.get(path);
  if (fd === undefined) {
    fd = openSync(path, "r");
    openKernelFiles.set(path, fd);
  }
  try {
    const n = readSync(fd, kernelFileBuf, 0, kernelFileBuf.length, 0);
    if (n < kernelFileBuf.length) return kernelFileBuf.toString("utf8", 0, n);
  } catch {
    // the file went away (a removed cgroup): forget it, and let a fresh open say why
  }
  openKernelFiles.delete(path);
  closeSync(fd);
  return readFileSync(path, "utf8");
}

/** The "Key:  123 kB" lines of a /proc file, in bytes (empty when the file cannot be read). */
function procKiBFields(file: string): Map<string, number> {
  const out = new Map<string, number>();
  try {
    for (const m of readText(file).matchAll(/^([^:\n]+):\s+(\d+) kB$/gm)) out.set(m[1]!, Number(m[2]) * 1024);
  } catch {
    // not Linux, or no /proc: callers fall back to what Node reports
  }
  return out;
}

function readNumber(path: string): number | undefined {
  try {
    const s = readText(path).trim();
    if (s === "max") return Infinity;
    const n = Number(s);
    return Number.isFinite(n) ? n : undefined;
  } catch {
    return undefined;
  }
}

function statFields(path: string): Record<string, number> {
  const out: Record<string, number> = {};
  try {
    for (const line of readText(path).split("\n")) {
      const [k, v] = line.split(" ");
      if (k && v !== undefined && Number.isFinite(Number(v))) out[k] = Number(v);
    }
  } catch {
    // no stat file: no reclaimable estimate
  }
  return out;
}

/** Anonymous resident memory of this process (heap, stacks, KV caches; not mmap'd file pages). */
export function anonRssBytes(): number {
  return procKiBFields("/proc/self/status").get("RssAnon") ?? process.memoryUsage().rss;
}

/** Bytes this process has caused to be read from storage since it started (/proc/self/io read_bytes:
 * page faults and read-ahead included), 0 where the kernel does not say. */
export function storageReadBytes(): number {
  try {
    return Number(/^read_bytes: (\d+)$/m.exec(readText("/proc/self/io"))?.[1] ?? 0);
  } catch {
    return 0;
  }
}

/** A memory cgroup's limit and what in it is in use and reclaimable (page cache). */
export interface CgroupMemory {
  readonly version: 1 | 2;
  readonly dir: string;
  /** The smallest limit on the way up the hierarchy (v1: hierarchical_memory_limit). */
  readonly limitBytes: number;
  readonly usageBytes: number;
  /** File pages (active + inactive): the kernel drops these before it runs out. */
  readonly fileBytes: number;
  /** The file pages among them that processes have mapped (program text, libraries, models): in use,
   *  dropped only to be read back at once. */
  readonly mappedFileBytes: number;
  /** The file pages among them that are dirty or being written back: reclaim must wait for the disk. */
  readonly dirtyFileBytes?: number;
}

/** This process's memory cgroup, or undefined when it has no limit (or no cgroups at all). */
export function cgroupMemory(paths: CgroupPaths = cgroupPaths()): CgroupMemory | undefined {
  const g = paths.memory;
  const m = g && memoryGroupState(g);
  // The kernel reports "no limit" as a page-rounded 2^63: anything beyond 2^60 is unlimited.
  return m && m.limitBytes < 2 ** 60 ? m : undefined;
}

/** A memory cgroup's limit (Infinity: none) and what it holds, read from its directory (undefined when
 * it cannot be read); tests read the groups they make with it. */
export function memoryGroupState(g: { version: 1 | 2; dir: string }): CgroupMemory | undefined {
  if (g.version === 1) {
    const stat = statFields(join(g.dir, "memory.stat"));
    const limit = Math.min(readNumber(join(g.dir, "memory.limit_in_bytes")) ?? Infinity, stat.hierarchical_memory_limit ?? Infinity);
    const usage = readNumber(join(g.dir, "memory.usage_in_bytes"));
    if (usage === undefined) return undefined;
    const file = (stat.total_active_file ?? stat.active_file ?? 0) + (stat.total_inactive_file ?? stat.inactive_file ?? 0);
    return {
      version: 1, dir: g.dir, limitBytes: limit, usageBytes: usage, fileBytes: file, mappedFileBytes: stat.total_mapped_file ?? stat.mapped_file ?? 0,
      dirtyFileBytes: (stat.total_dirty ?? stat.dirty ?? 0) + (stat.total_writeback ?? stat.writeback ?? 0),
    };
  }
  // v2: memory.max of this group and of every ancestor (the root group has no memory.max).
  let limit = Infinity;
  for (let dir = g.dir; dir !== "/"; dir = join(dir, "..")) {
    const v = readNumber(join(dir, "memory.max"));
    if (v === undefined) break;
    limit = Math.min(limit, v);
  }
  const usage = readNumber(join(g.dir, "memory.current"));
  if (usage === undefined) return undefined;
  const stat = statFields(join(g.dir, "memory.stat"));
  return {
    version: 2, dir: g.dir, limitBytes: limit, usageBytes: usage, fileBytes: (stat.active_file ?? 0) + (stat.inactive_file ?? 0),
    mappedFileBytes: stat.file_mapped ?? 0, dirtyFileBytes: (stat.file_dirty ?? 0) + (stat.file_writeback ?? 0),
  };
}

export interface MemoryReading {
  /** The device's memory as this process sees it: MemTotal, or the cgroup limit when lower. */
  readonly totalBytes: number;
  /** MemAvailable, or what the cgroup has left (limit - usage + its page cache) when lower. */
  readonly availableBytes: number;
  /** The machine's own MemTotal and MemAvailable. */
  readonly physicalTotalBytes: number;
  readonly physicalAvailableBytes: number;
  readonly cgroup?: CgroupMemory;
  readonly swapTotalBytes: number;
  readonly swapFreeBytes: number;
  /** Anonymous memory of other apps the OS would swap out before dropping our pages (Android only;
   *  HALDA.md §1.1: Active(anon) + Inactive(anon) - Mlocked). */
  readonly swappableBytes: number;
}

/** This process's cgroups change only when something moves it, so readings reuse them for a second:
 * finding them reads two /proc files, and a ring device reads memory a few times a second. */
let recentPaths: { at: number; paths: CgroupPaths } | undefined;
function currentCgroupPaths(): CgroupPaths {
  const now = performance.now();
  if (!recentPaths || now - recentPaths.at > 1000) recentPaths = { at: now, paths: cgroupPaths() };
  return recentPaths.paths;
}

/** Reads memory now (a few small kernel files, kept open: ~0.2 ms here, several times that on a busy
 * virtual machine with cold caches). */
export function readMemory(isAndroid = false, paths?: CgroupPaths): MemoryReading {
  const info = procKiBFields("/proc/meminfo");
  const physicalTotalBytes = info.get("MemTotal") ?? totalmem();
  const physicalAvailableBytes = info.get("MemAvailable") ?? freemem();
  const cg = cgroupMemory(paths ?? currentCgroupPaths());
  let totalBytes = physicalTotalBytes, availableBytes = physicalAvailableBytes;
  if (cg && cg.limitBytes < totalBytes) totalBytes = cg.limitBytes;
  if (cg) availableBytes = Math.min(availableBytes, Math.max(0, Math.min(cg.limitBytes, cg.limitBytes - cg.usageBytes + cg.fileBytes)));
  const anon = (info.get("Active(anon)") ?? 0) + (info.get("Inactive(anon)") ?? 0);
  return {
    totalBytes,
    availableBytes,
    physicalTotalBytes,
    physicalAvailableBytes,
    ...(cg ? { cgroup: cg } : {}),
    swapTotalBytes: info.get("SwapTotal") ?? 0,
    swapFreeBytes: info.get("SwapFree") ?? 0,
    swappableBytes: isAndroid ? Math.max(0, anon - (info.get("Mlocked") ?? 0)) : 0,
  };
}

/** What a ring device's memory grows by between planning and decoding, beyond the KV cache and the
 * window scratch the plan counts itself (V8's young generation growing with the traffic, sockets,
 * the addon's pages). Sampled once from the cgroups' memory.stat on the benchmark model with 8,8,6:
 * +1 to +4 MiB of anonymous memory and up to +5 MiB of newly mapped program pages; the capped tests
 * (test/ring/capped-ring.test.ts, placement.test.ts) are what hold it. */
export const RUNTIME_RESERVE_BYTES = 8 * 2 ** 20;

/** What a memory cgroup holds. */
export type CgroupHeld = Pick<CgroupMemory, "usageBytes" | "fileBytes" | "mappedFileBytes">;

/** Room in memory other programs share (MemAvailable): prima.cpp's fifth stays back for them. */
export function sharedRoomBytes(availableBytes: number): number {
  return Math.floor(availableBytes * RAM_AVAILABLE_FRACTION);
}

/** Whether a memory cgroup's limit binds before the machine's memory does. */
function cgroupBinds(m: MemoryReading): m is MemoryReading & { cgroup: CgroupMemory } {
  return m.cgroup !== undefined && m.cgroup.limitBytes < m.physicalTotalBytes;
}

/** Page cache a cgroup can give up without rereading it at once: its file pages less the mapped ones
 * that are not this device's weights (`ownWeightBytes`: resident pages of its own model mapping,
 * which the next plan decides about). */
function reclaimableFileBytes(cg: CgroupHeld, ownWeightBytes: number): number {
  return Math.max(0, cg.fileBytes - Math.max(0, cg.mappedFileBytes - ownWeightBytes));
}

/**
 * Halda's d_avail: the room this device has for its layers (weights in the page cache, KV caches,
 * scratch), from a reading taken while the process holds no windows. Under a binding memory cgroup it
 * is the room the engine really gets: the limit less what the group holds (anonymous memory, mapped
 * program pages), its other page cache being reclaimable, less RUNTIME_RESERVE_BYTES; prima.cpp's
 * fifth (RAM_AVAILABLE_FRACTION) stays back from the machine's MemAvailable, which other programs
 * share and may take. (Read with the fifth under a cgroup too, 3 x 256 MiB devices lost two layers
 * each and the ring overloaded one device: 0.18x the best hand-made plan. Read without subtracting
 * mapped pages, devices were placed over their limit and thrashed: bench/history/2026-11-24-capped-s1.md
 * and -s2.md.)
 */
export function layerRoomBytes(m: MemoryReading, ownWeightBytes = 0): number {
  const shared = sharedRoomBytes(m.physicalAvailableBytes);
  if (!cgroupBinds(m)) return Math.min(shared, sharedRoomBytes(m.availableBytes));
  const cg = m.cgroup;
  const room = cg.limitBytes - cg.usageBytes + reclaimableFileBytes(cg, ownWeightBytes) - RUNTIME_RESERVE_BYTES;
  return Math.max(0, Math.min(shared, Math.floor(room)));
}

/** The cgroup limit under which layerRoomBytes reads `roomBytes` for a group in this state (tests set
 * devices' memory this way). */
export function cgroupLimitForRoom(cg: CgroupHeld, roomBytes: number): number {
  return Math.ceil(cg.usageBytes - reclaimableFileBytes(cg, 0) + roomBytes + RUNTIME_RESERVE_BYTES);
}

/**
 * Frees what earlier work left behind: garbage and the young generation a burst of allocation grew
 * (a link probe's frames, a profile's matrices), and the C heap's free pages (native releaseFreeMemory).
 * Nothing runs a collection on an idle device otherwise, and a room reading taken before it would count
 * that garbage as held, or, taken before the garbage is made, leave it to crowd the windows out (a
 * worker after the link probe: +12 MiB of anonymous memory; the head: its young generation +23 MiB).
 * It takes a few ms: only where no window is running.
 */
export function settleMemory(): void {
  releaseFreeMemory();
}

/**
 * Under a binding memory cgroup, makes reclaim take the pages the group was charged for long ago and
 * no longer uses (program start-up code, libraries' cold parts, files read once), as a ring's windows do
 * once they fill the group: a room read at rest counts the mapped ones as held. Read at rest, the head
 * of a loopback ring under 256 MiB held 9-13 MiB of mapped pages and read 207-213 MiB of room, less than
 * its 6 layers need; running, it held 3-5 MiB and had room to spare for them
 * (bench/history/2026-11-25-capped-s10.md). It holds, for a moment, anonymous memory of all the group
 * has free and all its page cache but its dirty pages and a margin (native pressMemory: the kernel
 * populates it, no code of ours runs meanwhile, and reclaim can always give it clean file pages; a
 * group pressed past what it can give would kill its largest process, the head); the process's own hot
 * pages come back as it runs on.
 * No file is read: on one machine the devices share the page cache, and pages one reads are charged to
 * it and promoted in its group when another reads them. Returns the bytes it held (0 where no cgroup
 * binds or they could not be had). ~0.1 s per 100 MiB, off the JS thread; only while no window runs.
 * The head runs it before it reads its room for a plan. Workers do not yet: the process's own hot pages
 * go too and are read back from its disk, which on a slow device's disk is seconds, and it has not
 * been measured on separate devices.
 */
export async function reclaimIdlePages(): Promise<number> {
  const m = readMemory();
  if (!cgroupBinds(m)) return 0;
  const cg = m.cgroup;
  const bytes = Math.floor(cg.limitBytes - cg.usageBytes + cg.fileBytes - (cg.dirtyFileBytes ?? 0) - RECLAIM_MARGIN_BYTES);
  return bytes > 0 && (await pressMemory(bytes)) ? bytes : 0;
}

/** Page cache reclaimIdlePages leaves the group. */
const RECLAIM_MARGIN_BYTES = 4 * 2 ** 20;

/** A device's room for layers while it holds no windows (worker status): its model's resident pages
 * (`modelPath`, when it has one yet) count as room. */
export function idleLayerRoomBytes(modelPath: () => string | undefined): number {
  let own = 0;
  try {
    const p = modelPath();
    if (p) own = mappedResidentBytes(p);
  } catch {
    // no model yet (a worker still fetching its windows): nothing of it mapped
  }
  settleMemory();
  return layerRoomBytes(readMemory(), own);
}

/** Resident bytes of this process's mappings of `path` (/proc/self/smaps; 0 where there is none). */
export function mappedResidentBytes(path: string): number {
  let text: string;
  try {
    path = realpathSync(path); // smaps names files by their real path
    text = readFileSync("/proc/self/smaps", "utf8");
  } catch {
    return 0;
  }
  let total = 0, inFile = false;
  for (const line of text.split("\n")) {
    if (/^[0-9a-f]+-[0-9a-f]+ /.test(line)) inFile = line.endsWith(` ${path}`);
    else if (inFile && line.startsWith("Rss:")) total += Number(/(\d+) kB/.exec(line)?.[1] ?? 0) * 1024;
  }
  return total;
}

/** MemTotal and MemAvailable of the device (the memory cgroup's when it is tighter). */
export function deviceMemory(): { totalBytes: number; availableBytes: number } {
  const r = readMemory();
  return { totalBytes: r.totalBytes, availableBytes: r.availableBytes };
}

/** Tracks the peak of anonymous RSS by sampling (cheap enough for every few tokens). */
export function peakAnonTracker(): { sample(): void; peakBytes(): number } {
  let peak = anonRssBytes();
  return {
    sample() {
      const v = anonRssBytes();
      if (v > peak) peak = v;
    },
    peakBytes: () => peak,
  };
}

/** The paper's memory pressure: the largest drop of MemAvailable during a run relative to MemTotal.
 * Samples every second until stopped (and whenever asked); the timer never keeps Node alive. Each
 * reading's event-loop time (readMemory) lands, on a loopback ring, in some device's window. */
export function memoryPressureTracker(intervalMs = 1000): { sample(): void; pressure(): number; stop(): void } {
  const start = deviceMemory();
  let lowest = start.availableBytes;
  const sample = () => {
    const a = deviceMemory().availableBytes;
    if (a < lowest) lowest = a;
  };
  const timer = setInterval(sample, intervalMs);
  timer.unref();
  return {
    sample,
    pressure: () => Math.max(0, start.availableBytes - lowest) / start.totalBytes,
    stop: () => clearInterval(timer),
  };
}

/** What the page cache can hold for a device's weights: under a binding memory cgroup its room as the
 * plan reads it, or what the device has available plus what our windows already hold (they would be
 * counted as used), 10% kept free. Asked before and after every window a ring device runs: a
 * reading (readMemory, and mincore over the windows) took 2-3 ms in situ when
 * profiled, so a reading is reused, and one older than a second is renewed after the current
 * event-loop turn (once the rows have gone on), not on the way to the window, where profiles had
 * found the renewal every few tokens. */
const RENEW_AFTER_MS = 1000;

export class WeightRoom {
  private cached: { at: number; bytes: number } | undefined;
  private renewing = false;

  constructor(private readonly residentWeightBytes: () => number) {}

  bytes(): number {
    if (!this.cached) return this.read();
    if (performance.now() - this.cached.at >= RENEW_AFTER_MS && !this.renewing) {
      this.renewing = true;
      setImmediate(() => {
        this.renewing = false;
        this.read();
      });
    }
    return this.cached.bytes;
  }

  /** The next reading is fresh (new windows were just mapped). */
  forget(): void {
    this.cached = undefined;
  }

  private read(): number {
    const m = readMemory();
    const resident = this.residentWeightBytes();
    // Under a binding cgroup, the rule the plan used (layerRoomBytes), the windows' resident pages
    // counted as room: the limit less anonymous memory (KV caches and scratch among it now) and the
    // program's mapped pages. (The limit less anonymous memory alone, x0.9, kept more of a window than
    // fitted on the worker that paid for the program's pages: it faulted 3x as often as its twin.)
    const bytes = cgroupBinds(m) ? layerRoomBytes(m, resident) : Math.floor((m.availableBytes + resident) * 0.9);
    this.cached = { at: performance.now(), bytes: Math.max(0, bytes) };
    return this.cached.bytes;
  }
}
