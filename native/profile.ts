// Typed surface of the device micro-benchmarks (bind_profile.cc, src/profile.h), used by profiler/.
import { addon } from "./binding.js";

export interface MatmulBench {
  /** Mean seconds of one step over all its matrices. */
  readonly secondsPerPass: number;
  readonly passes: number;
  /** Copies of the matrix cycled through to fill the working set. */
  readonly copies: number;
}

export interface DiskBench {
  readonly seqBytesPerS: number;
  /** The reading thread's CPU seconds per second of sequential reading: near 1 where reading is the
   * CPU's work (a disk served from a host's cache), near 0 where the CPU waits for the disk. */
  readonly seqCpuShare: number;
  readonly randBytesPerS: number;
  readonly seqBytesRead: number;
  readonly randReads: number;
  /** true: O_DIRECT (F_NOCACHE on macOS); false: buffered reads after dropping the file's pages. */
  readonly direct: boolean;
}

interface ProfileAddon {
  matmul(matrices: readonly MatrixSpec[], nTokens: number, threads: number, workingSetBytes: number, minSeconds: number): MatmulBench;
  memRead(bytes: number, threads: number, minSeconds: number): number;
  kvCopy(kvFloats: number, nCtx: number, minSeconds: number): number;
  disk(path: string, fileBytes: number, seqBlock: number, randBlock: number, seqSeconds: number, randSeconds: number, allowDirect: boolean): DiskBench;
  dropCache(path: string): void;
  createPool(threads: number): PoolHandle;
  wakePool(pool: PoolHandle): Promise<void>;
  closePool(pool: PoolHandle): void;
  releaseFreeMemory(): void;
  pressMemory(bytes: number): Promise<boolean>;
  forgetRange(fd: number, offset: number, length: number): void;
  threadClock(): ThreadClock;
  descheduledMs(before: ThreadClock, after: ThreadClock, wallMs: number): number;
}

/** An opaque thread pool handle (native). */
declare const poolBrand: unique symbol;
type PoolHandle = { readonly [poolBrand]: true };

const p = addon.profile as ProfileAddon;

/** A weight matrix: ggml type id, row length ne0, rows ne1. */
export interface MatrixSpec {
  readonly type: number;
  readonly ne0: number;
  readonly ne1: number;
}

/** Times one matmul step of the forward pass (up to 8 matrices run together, as q, k and v are) with
 *  our kernels on random weights, on `threads`. */
export function benchMatmul(matrices: readonly MatrixSpec[], o: { nTokens?: number; threads: number; workingSetBytes: number; minSeconds: number }): MatmulBench {
  return p.matmul(matrices, o.nTokens ?? 1, o.threads, o.workingSetBytes, o.minSeconds);
}

/** Read bandwidth in B/s over a buffer of `bytes`. */
export function benchMemRead(bytes: number, threads: number, minSeconds: number): number {
  return p.memRead(bytes, threads, minSeconds);
}

/** Seconds to write one token's K and V rows (kvFloats values, F16) into a cache of nCtx positions. */
export function benchKvCopy(kvFloats: number, nCtx: number, minSeconds: number): number {
  return p.kvCopy(kvFloats, nCtx, minSeconds);
}

/** Disk read throughput on a scratch file at `path` (created, read with the page cache bypassed, removed).
 *  `buffered`: drop the file's cached pages and read through the cache, as where O_DIRECT is refused. */
export function benchDisk(path: string, o: { fileBytes: number; seqBlock: number; randBlock: number; seqSeconds: number; randSeconds: number; buffered?: boolean }): DiskBench {
  return p.disk(path, o.fileBytes, o.seqBlock, o.randBlock, o.seqSeconds, o.randSeconds, !o.buffered);
}

/** Holds `bytes` (>= 1) more of anonymous memory for a moment, off the JS thread (mapped, populated,
 * unmapped); false where the system would not give them. */
export function pressMemory(bytes: number): Promise<boolean> {
  return p.pressMemory(bytes);
}

/** Frees garbage (V8's low-memory collection, which also shrinks the young generation) and returns the
 * C heap's free pages to the system (glibc's malloc_trim). */
export function releaseFreeMemory(): void {
  p.releaseFreeMemory();
}

/** The calling thread's CPU ms and its involuntary and voluntary context switches. */
export type ThreadClock = readonly [cpuMs: number, involuntary: number, voluntary: number];

export function threadClock(): ThreadClock {
  return p.threadClock();
}

/** ms of `wallMs` between two readings the thread spent preempted (native threadpool.h's rule, the
 * lane's too): wall less CPU time where it was only switched out involuntarily; else 0. */
export function descheduledMs(before: ThreadClock, after: ThreadClock, wallMs: number): number {
  return p.descheduledMs(before, after, wallMs);
}

/** Writes back and drops a file's pages from the page cache. */
export function dropFileCache(path: string): void {
  p.dropCache(path);
}

/** Drops the page cache of bytes [offset, offset + length) of an open file, where nothing maps them. */
export function forgetFileRange(fd: number, offset: number, length: number): void {
  p.forgetRange(fd, offset, length);
}

/**
 * ms to dispatch one call to a thread pool whose threads sleep between calls, as a window's forward
 * is dispatched on a ring device (JS -> libuv thread -> pool wake-up -> promise): the median of
 * `calls` calls spaced `gapMs` apart.
 */
export async function benchDispatchMs(threads: number, calls: number, gapMs: number): Promise<number> {
  const pool = p.createPool(threads);
  try {
    const times: number[] = [];
    await p.wakePool(pool);
    for (let i = 0; i < calls; i++) {
      await new Promise((r) => setTimeout(r, gapMs));
      const t0 = performance.now();
      await p.wakePool(pool);
      times.push(performance.now() - t0);
    }
    times.sort((a, b) => a - b);
    return times[Math.floor(times.length / 2)];
  } finally {
    p.closePool(pool);
  }
}
