// Disk read throughput where the model lives (HALDA.md §1.1 diskSeqReadBytesPerS/diskRandReadBytesPerS):
// a scratch file next to the model, read from the disk (never from cached pages), sequentially in
// blocks of the device's read-ahead size and at random in pages (native/src/profile.c). prima.cpp runs
// fio with O_DIRECT at iodepth 1; the profile reads as the engine does instead, through the page cache
// after dropping the file's pages (`buffered`), so the kernel's read-ahead keeps several reads in
// flight, as it does for the engine's mapped weights. On this project's VM that is 3.3-3.5 GB/s where
// O_DIRECT, one block at a time, reads 1.3-2.1.
import { accessSync, constants, readFileSync, statfsSync, statSync } from "node:fs";
import { platform } from "node:os";
import { join } from "node:path";
import { benchDisk } from "../native/index.js";
import { removeLeftOverScratch } from "./scratch-files.js";
import { diskThrottle, type DiskThrottle } from "./system.js";

export interface DiskMeasurement {
  /** The directory the scratch file was in, and its block device (major:minor, "" if unknown). */
  readonly dir: string;
  readonly device: string;
  readonly seqReadBytesPerS: number;
  /** CPU seconds of the reading thread per second of sequential reading (native DiskBench.seqCpuShare):
   * whether reading ahead in the background leaves the CPU to others (ring/'s prefetch choice).
   * Absent in profiles cached before it was measured. */
  readonly seqReadCpuShare?: number;
  readonly randReadBytesPerS: number;
  readonly seqBlockBytes: number;
  readonly randBlockBytes: number;
  /** O_DIRECT (or F_NOCACHE) rather than buffered reads after dropping the cached pages. */
  readonly direct: boolean;
  /** Bytes of the scratch file read (less than asked for where the disk was short). */
  readonly fileBytes?: number;
  /** cgroup read throttling on that device when the measurement was made. */
  readonly throttle: DiskThrottle;
}

/** major:minor of the block device holding path (Linux dev_t encoding), or "" when unknown. */
export function blockDeviceOf(path: string): string {
  try {
    const d = BigInt(statSync(path).dev);
    const major = ((d >> 8n) & 0xfffn) | ((d >> 32n) & 0xfffff000n);
    const minor = (d & 0xffn) | ((d >> 12n) & 0xffffff00n);
    return `${major}:${minor}`;
  } catch {
    return "";
  }
}

/** The read-ahead size of a block device in bytes (the mmap's sequential read unit), default 128 KiB. */
export function readAheadBytes(device: string): number {
  for (const p of [`/sys/dev/block/${device}/queue/read_ahead_kb`, `/sys/dev/block/${device}/../queue/read_ahead_kb`]) {
    try {
      const kb = Number(readFileSync(p, "utf8").trim());
      if (kb > 0) return kb * 1024;
    } catch {
      // a partition has its queue one level up; a virtual device may have none
    }
  }
  return 128 * 1024;
}

/** The first writable directory among the candidates (the model's own first). */
export function scratchDir(candidates: readonly string[]): string | undefined {
  for (const d of candidates) {
    try {
      accessSync(d, constants.W_OK);
      if (statSync(d).isDirectory()) return d;
    } catch {
      // not writable: next
    }
  }
  return undefined;
}

/** The smallest scratch file worth reading: 8 blocks of the smallest read-ahead (128 KiB). */
export const MIN_PROBE_BYTES = 1 << 20;

/** What the profile may write under dir for a while (a scratch file, a stand-in's layers): half of
 * what is free, so that a device short of disk keeps room for its model. */
export function scratchRoomBytes(dir: string): number {
  return Math.floor(freeBytes(dir) / 2);
}

function freeBytes(dir: string): number {
  const fs = statfsSync(dir);
  return fs.bavail * fs.bsize;
}

/**
 * The scratch file's size for a probe in dir: `wanted`, or less where the disk is short, never more
 * than half of what is free (the probe must not fill a disk the device needs for its model). Throws,
 * naming the bytes needed and free, when not even MIN_PROBE_BYTES fit.
 */
export function probeBytes(dir: string, wanted: number): number {
  const free = freeBytes(dir);
  const fit = scratchRoomBytes(dir);
  if (fit < MIN_PROBE_BYTES) {
    throw new Error(`too little disk under ${dir} for the disk probe: ${2 * MIN_PROBE_BYTES} bytes needed free ` +
      `(a ${MIN_PROBE_BYTES}-byte scratch file and as much to spare), ${free} bytes free`);
  }
  return Math.min(wanted, fit);
}

export interface DiskBenchOptions {
  readonly seqSeconds: number;
  readonly randSeconds: number;
  /** Scratch file size; default 64 MiB, less where the disk is short (probeBytes). */
  readonly fileBytes?: number;
  /** Read through the page cache after dropping the file's pages (what happens where O_DIRECT is refused). */
  readonly buffered?: boolean;
}

/** Cache key of a disk measurement: the device and any throttle on it. */
export function diskKey(dir: string): string {
  const device = blockDeviceOf(dir);
  const t = diskThrottle(device);
  return `${device || dir}|bps=${t.readBytesPerS ?? "-"}|iops=${t.readIops ?? "-"}`;
}

export function measureDisk(dir: string, o: DiskBenchOptions): DiskMeasurement {
  const device = blockDeviceOf(dir);
  const apple = platform() === "darwin";
  const fileBytes = probeBytes(dir, o.fileBytes ?? 64 << 20);
  // Sequential reads of the read-ahead size (1-8 MiB keeps the first read short on a slow disk), at
  // least 8 of them in the file (a smaller file where the disk is short: smaller blocks).
  const fit = Math.floor(fileBytes / 8 / 4096) * 4096;
  const seqBlock = Math.min(8 << 20, fit, Math.max(128 << 10, apple ? 1 << 20 : readAheadBytes(device)));
  const randBlock = Math.min(seqBlock, apple ? 16384 : 4096);
  removeLeftOverScratch(dir, ".prima-disk-probe-");
  const path = join(dir, `.prima-disk-probe-${process.pid}-${Date.now()}.tmp`);
  const r = benchDisk(path, { fileBytes, seqBlock, randBlock, seqSeconds: o.seqSeconds, randSeconds: o.randSeconds, buffered: o.buffered });
  return {
    dir, device,
    seqReadBytesPerS: r.seqBytesPerS, seqReadCpuShare: r.seqCpuShare, randReadBytesPerS: r.randBytesPerS,
    seqBlockBytes: seqBlock, randBlockBytes: randBlock,
    direct: r.direct, fileBytes, throttle: diskThrottle(device),
  };
}
