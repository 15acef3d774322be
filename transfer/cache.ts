// The device's side: a local cache of models keyed by their fingerprint. Each model is a sparse file
// laid out as the GGUF is (holes where other devices' layers are), so the engine maps it like any
// model and never touches the holes; beside it, the list of chunks already verified, so a transfer
// cut off halfway resumes where it stopped. The cache has a size limit and drops the least recently
// used models first.
//
// The cache owns only what it wrote (its manifest, manifest.ts): it evicts only those models, and
// only when that makes enough room (else it evicts nothing and says what is missing). It never
// follows a symbolic link: a link under a model's name is refused, never written through, and a cache
// folder that is itself a link is refused unless the user allows it (the folder may be one of theirs).
import { closeSync, constants, fstatSync, ftruncateSync, futimesSync, lstatSync, mkdirSync, openSync, readlinkSync, statfsSync, statSync, type Stats } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { Worker } from "node:worker_threads";
import { printable } from "../model/index.js";
import { alignGap } from "../native/index.js";
import { DIGEST_MODULE, chunkCount, chunkRange, type ModelInfo } from "./chunks.js";
import { CacheManifest } from "./manifest.js";
import { Debounced, NO_FOLLOW, readFileNoFollow, unlinkIfPresent, writeFileAtomic } from "./persist.js";

export class TransferError extends Error {
  override name = "TransferError";
  /** The system's error code behind it, where there is one (ENOSPC: the disk is full). */
  readonly code: string | undefined;

  constructor(message: string, code?: string) {
    super(message);
    this.code = code;
  }
}

/** The cache refuses its folder or a file in it (a link, a file it did not write), or a model that
 * no real model could be: waiting does not change it. */
export class CacheError extends TransferError {
  override name = "CacheError";
}

/** The cache cannot take what a fetch needs, even after evicting every model it may evict. */
export class NoRoomError extends TransferError {
  override name = "NoRoomError";
  constructor(
    message: string,
    readonly neededBytes: number,
    readonly freeBytes: number,
    /** What is short: the disk (it may free up) or the cache's own limit (--cache-limit). */
    readonly short: "disk" | "limit",
  ) {
    super(message);
  }
}

/** ~/.cache/prima/models (XDG_CACHE_HOME honoured). */
export function defaultModelCacheDir(): string {
  return join(process.env.XDG_CACHE_HOME || join(homedir(), ".cache"), "prima", "models");
}

const MiB = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;
const bytesAndMiB = (b: number) => `${b} bytes (${MiB(b)})`;

function lstatOrUndefined(path: string): Stats | undefined {
  try {
    return lstatSync(path);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw e;
  }
}

function kindOf(st: Stats): string {
  return st.isSymbolicLink() ? "a symbolic link" : st.isDirectory() ? "a folder" : "not a regular file";
}

/** Bytes the disk under dir has free for this user. */
export function freeDiskBytes(dir: string): number {
  const fs = statfsSync(dir);
  return fs.bavail * fs.bsize;
}

export interface ModelCacheOptions {
  /** Most bytes of disk the cache's own models may take (default: no limit but the disk). */
  readonly limitBytes?: number;
  /** Use a cache folder that is a symbolic link (--allow-cache-link). */
  readonly allowLink?: boolean;
}

interface Entry {
  readonly fingerprint: string;
  readonly path: string;
  readonly usedMs: number;
  readonly bytes: number;
}

export class ModelCache {
  readonly limitBytes: number;
  private readonly allowLink: boolean;
  private readonly manifest: CacheManifest;

  constructor(readonly dir = defaultModelCacheDir(), o: ModelCacheOptions = {}) {
    this.limitBytes = o.limitBytes ?? Infinity;
    this.allowLink = o.allowLink ?? false;
    this.manifest = new CacheManifest(dir);
  }

  pathFor(fingerprint: string): string {
    if (!/^[0-9a-f]{16,128}$/.test(fingerprint)) throw new CacheError(`"${printable(fingerprint, 80)}" is not a model fingerprint`);
    return join(this.dir, `${fingerprint}.gguf`);
  }

  /** The cache folder, made if missing; refused (CacheError) if it is a link, unless allowed, or
   * not a folder. */
  checkFolder(): void {
    mkdirSync(this.dir, { recursive: true });
    const st = lstatSync(this.dir);
    const where = printable(this.dir, 300);
    if (st.isSymbolicLink()) {
      if (!this.allowLink) {
        throw new CacheError(`the model cache ${where} is a symbolic link (to ${printable(readlinkSync(this.dir), 300)}): refused, since the cache ` +
          "writes and evicts files in its folder and that folder may hold files of yours; give another --model-cache, or --allow-cache-link to use it");
      }
      if (!statSync(this.dir).isDirectory()) throw new CacheError(`the model cache ${where} links to something that is not a folder`);
    } else if (!st.isDirectory()) {
      throw new CacheError(`the model cache ${where} is not a folder`);
    }
  }

  /** The cached model for `info`: created (as a sparse file of the model's size) if new. */
  open(info: ModelInfo): CachedModel {
    if (!Number.isSafeInteger(info.fileBytes) || info.fileBytes <= 0 || info.fileBytes > 2 ** 50) throw new CacheError(`model size ${info.fileBytes} is not plausible`);
    if (!Number.isInteger(info.chunkBytes) || info.chunkBytes < 4096 || info.chunkBytes > 1 << 30) throw new CacheError(`chunk size ${info.chunkBytes} is not plausible`);
    if (!Number.isInteger(info.dataOffset) || info.dataOffset <= 0 || info.dataOffset > info.fileBytes) throw new CacheError(`header size ${info.dataOffset} is not plausible`);
    const path = this.pathFor(info.fingerprint);
    this.checkFolder();
    const st = lstatOrUndefined(path);
    if (st && !st.isFile()) throw new CacheError(`${printable(path, 300)} is ${kindOf(st)}, not a model this cache wrote: refused (never written through); remove it`);
    if (st && !this.manifest.has(info.fingerprint)) {
      throw new CacheError(`${printable(path, 300)} was not written by this model cache (it is not in its manifest): refused, so that a file of yours is never overwritten; move it away or give another --model-cache`);
    }
    let fd: number;
    if (st) fd = openSync(path, constants.O_RDWR | NO_FOLLOW);
    else {
      this.manifest.add(info.fingerprint);
      fd = openSync(path, constants.O_RDWR | constants.O_CREAT | constants.O_EXCL | NO_FOLLOW, 0o644);
    }
    let fresh = !st;
    try {
      const now = fstatSync(fd);
      if (!now.isFile()) throw new CacheError(`${printable(path, 300)} is not a regular file: refused`);
      // A hard link shares its bytes with a file elsewhere, which writing would change.
      if (now.nlink > 1) throw new CacheError(`${printable(path, 300)} has other names (hard links): refused, so that the file they name is never written`);
      if (now.size !== info.fileBytes) {
        // Another size: another model under this name (or a cut-off creation); started over.
        ftruncateSync(fd, 0);
        ftruncateSync(fd, info.fileBytes); // all holes: no block is written until a chunk arrives
        fresh = true;
      }
      const at = new Date();
      futimesSync(fd, at, at); // "recently used", for the eviction order
    } finally {
      closeSync(fd);
    }
    if (fresh) unlinkIfPresent(`${path}.chunks`);
    return new CachedModel(path, info, this);
  }

  /** The models this cache wrote that are still there (regular files only). */
  private entries(): Entry[] {
    const out: Entry[] = [];
    for (const fingerprint of this.manifest.read()) {
      const path = join(this.dir, `${fingerprint}.gguf`);
      const st = lstatOrUndefined(path);
      if (st?.isFile()) out.push({ fingerprint, path, usedMs: st.mtimeMs, bytes: st.blocks * 512 });
    }
    return out;
  }

  /** Bytes of blocks the cache's own models occupy (sparse files count what they hold, not their size). */
  usedBytes(): number {
    return this.entries().reduce((a, e) => a + e.bytes, 0);
  }

  /**
   * Makes room for `needBytes` more in `keep` (a model being fetched): on the disk and under the
   * limit. Evicts the least recently used of the cache's own models (never `keep`, never a file it
   * did not write) only when that makes enough room; otherwise evicts nothing and throws a
   * NoRoomError naming the bytes needed and free.
   */
  makeRoom(needBytes: number, keep: string, log?: (line: string) => void): void {
    if (needBytes <= 0) return;
    const disk = freeDiskBytes(this.dir);
    const all = this.entries();
    const used = all.reduce((a, e) => a + e.bytes, 0);
    // Room once `freed` bytes of other models are gone: what the disk and what the limit allow.
    const room = (freed: number) => Math.min(disk + freed, this.limitBytes - (used - freed));
    if (needBytes <= room(0)) return;
    const others = all.filter((e) => e.path !== keep).sort((a, b) => a.usedMs - b.usedMs);
    const evict: Entry[] = [];
    let freed = 0;
    for (const o of others) {
      if (needBytes <= room(freed)) break;
      evict.push(o);
      freed += o.bytes;
    }
    if (needBytes > room(freed)) {
      const short = disk + freed < this.limitBytes - (used - freed) ? "disk" : "limit";
      const free = Math.max(0, room(0));
      const where = short === "disk" ? `on the disk of ${printable(this.dir, 300)}` : `under the model cache limit of ${bytesAndMiB(this.limitBytes)} (--cache-limit)`;
      throw new NoRoomError(
        `not enough room for this device's windows: ${bytesAndMiB(needBytes)} needed, ${bytesAndMiB(free)} free ${where}; ` +
        `the other models this cache wrote hold ${bytesAndMiB(others.reduce((a, e) => a + e.bytes, 0))}, too little to make the room, so none was evicted`,
        needBytes, free, short);
    }
    for (const o of evict) {
      log?.(`model cache: dropping ${o.path} (${MiB(o.bytes)}, least recently used) to make room for ${MiB(needBytes)}`);
      unlinkIfPresent(o.path);
      unlinkIfPresent(`${o.path}.chunks`);
    }
    this.manifest.remove(evict.map((o) => o.fingerprint));
  }
}

export class CachedModel {
  /** Chunks written and verified. */
  readonly done: Set<number>;

  constructor(readonly path: string, readonly info: ModelInfo, private readonly cache: ModelCache) {
    this.done = new Set();
    try {
      const list = JSON.parse(readFileNoFollow(`${path}.chunks`, 64 * (chunkCount(info) + 16)) ?? "[]") as unknown;
      if (Array.isArray(list)) for (const i of list) if (Number.isInteger(i) && i >= 0 && i < chunkCount(info)) this.done.add(i);
    } catch {
      // nothing verified yet
    }
  }

  missing(chunks: readonly number[]): number[] {
    return chunks.filter((c) => !this.done.has(c));
  }

  bytesOf(chunks: readonly number[]): number {
    return chunks.reduce((a, c) => {
      const [s, e] = chunkRange(c, this.info);
      return a + e - s;
    }, 0);
  }

  /** Makes room for these chunks on the disk and under the cache limit, or refuses by name
   * (NoRoomError: the bytes needed and free). */
  checkRoom(chunks: readonly number[], log?: (line: string) => void): void {
    this.cache.makeRoom(this.bytesOf(this.missing(chunks)), this.path, log);
  }

  private sink: ChunkSink | undefined;

  /**
   * Writes a chunk if it matches its digest, on a thread of its own: the digest and the write take as
   * much CPU as receiving the chunk does, so they run beside the next chunk's arrival. `data` must stay
   * unchanged until the promise settles (shared memory is read in place; other memory is copied to the
   * thread). False (nothing written) when it does not match; the chunk counts as done only once its
   * digest matched and its bytes are in the file.
   */
  async writeVerified(index: number, data: Uint8Array, expectedDigest: string): Promise<boolean> {
    if (!Number.isInteger(index) || index < 0 || index >= chunkCount(this.info)) throw new TransferError(`chunk ${index} is outside the model`);
    const [s, e] = chunkRange(index, this.info);
    if (data.length !== e - s) return false;
    this.sink ??= new ChunkSink(this.path);
    if (!(await this.sink.write(data, s, expectedDigest))) return false;
    this.done.add(index);
    this.persistSoon();
    return true;
  }

  // In a timer nothing may throw (it would end the process): a failed write (a full disk) is thrown by
  // the next persist() its caller makes (fetchChunks' last one).
  private readonly persistLater = new Debounced(200, () => {
    try {
      this.persist();
    } catch {
      // said by the next persist()
    }
  });

  private persistSoon(): void {
    this.persistLater.soon();
  }

  /** Records the verified chunks (atomically), so a restart resumes after them. */
  persist(): void {
    this.persistLater.cancel();
    writeFileAtomic(`${this.path}.chunks`, JSON.stringify([...this.done].sort((a, b) => a - b)));
  }

  /** Records the verified chunks and stops the writing thread. Never throws: a list that cannot be
   * written (a full disk, which the fetch has reported) costs only a fetch of those chunks again. */
  close(): void {
    try {
      this.persist();
    } catch {
      // see above
    }
    this.sink?.close();
    this.sink = undefined;
  }
}

/** Alignment of a direct write's memory, file offset and length (a page: the most any disk asks). */
export const DIRECT_WRITE_ALIGN = 4096;

/**
 * Shared memory for a received chunk that the sink can write directly (its start aligned for
 * O_DIRECT): JS does not align what it allocates, so a page more is taken and the aligned part used.
 */
export function chunkBuffer(bytes: number): Buffer {
  const b = Buffer.from(new SharedArrayBuffer(bytes + DIRECT_WRITE_ALIGN));
  const gap = alignGap(b, DIRECT_WRITE_ALIGN);
  return b.subarray(gap, gap + bytes);
}

// The thread's code (CommonJS, eval'd: no file of its own beside the compiled one or a test's
// source). Per message: hash, compare, and only a match is written, at its offset.
//
// Written directly (O_DIRECT) where the file system allows it: a fetched window is written once and
// read later through the engine's mapping, so a copy into the page cache gains nothing, and on a
// device short of memory it would push out what the device is using. It also costs a fifth of the
// CPU: 0.09 s per GB against 0.2-1.3 for fresh page-cache pages on this project's VMs, while the
// fetch is CPU-bound. A chunk's unaligned tail (the file's last bytes), and everything on a file
// system that refuses direct writes, goes through the page cache as before.
const SINK_SOURCE = `
const { parentPort, workerData } = require("node:worker_threads");
const digest = require(workerData.digest);
const { constants, openSync, write } = require("node:fs");
const ALIGN = workerData.align;
// Never through a link put under the file's name after the cache checked it.
const NO_FOLLOW = constants.O_NOFOLLOW || 0;
const fd = openSync(workerData.path, constants.O_RDWR | NO_FOLLOW);
let direct = -1;
try { direct = openSync(workerData.path, constants.O_WRONLY | constants.O_DIRECT | NO_FOLLOW); } catch {}
// Written on libuv's threads, so the next chunk is hashed while this one goes to the disk (a direct
// write waits for the device).
function writeAll(f, data, from, to, position) {
  return new Promise((resolve, reject) => {
    const more = (off) => {
      if (off >= to) return resolve();
      write(f, data, off, to - off, position + off, (e, n) => (e ? reject(e) : more(off + n)));
    };
    more(from);
  });
}
async function save(data, position, aligned) {
  let done = 0;
  if (direct >= 0 && aligned && position % ALIGN === 0) {
    const whole = data.length - (data.length % ALIGN);
    try {
      await writeAll(direct, data, 0, whole, position);
      done = whole;
    } catch (e) {
      if (e.code !== "EINVAL") throw e;
      direct = -1; // the file system refuses direct writes after all
    }
  }
  await writeAll(fd, data, done, data.length, position);
}
// Messages wait for the digest (compiled first where only its WebAssembly build runs), in order.
parentPort.on("message", (m) => void digest.ready.then(() => take(m)));
function take({ id, data, position, digest: expected, aligned }) {
  let ok;
  try {
    ok = digest.blake3Hex(data) === expected;
  } catch (e) {
    return parentPort.postMessage({ id, error: e.message, code: e.code });
  }
  if (!ok) return parentPort.postMessage({ id, ok });
  save(data, position, aligned).then(
    () => parentPort.postMessage({ id, ok }),
    (e) => parentPort.postMessage({ id, error: e.message, code: e.code }),
  );
}
`;

/** A thread that verifies chunks and writes them into one cached model file. */
class ChunkSink {
  private readonly worker: Worker;
  private readonly waiting = new Map<number, { resolve: (ok: boolean) => void; reject: (e: Error) => void }>();
  private nextId = 0;
  private dead: Error | undefined;

  constructor(path: string) {
    this.worker = new Worker(SINK_SOURCE, { eval: true, workerData: { path, align: DIRECT_WRITE_ALIGN, digest: DIGEST_MODULE } });
    this.worker.on("message", (m: { id: number; ok?: boolean; error?: string; code?: string }) => {
      const w = this.waiting.get(m.id);
      this.waiting.delete(m.id);
      if (this.waiting.size === 0) this.worker.unref();
      if (m.error !== undefined) w?.reject(new TransferError(`writing ${path}: ${m.error}`, m.code));
      else w?.resolve(m.ok === true);
    });
    const die = (e: Error) => {
      this.dead ??= e;
      for (const w of this.waiting.values()) w.reject(this.dead);
      this.waiting.clear();
    };
    this.worker.on("error", (e) => die(new TransferError(`writing ${path}: ${e.message}`)));
    this.worker.on("exit", () => die(new TransferError(`writing ${path}: the writing thread exited`)));
    this.worker.unref();
  }

  write(data: Uint8Array, position: number, digest: string): Promise<boolean> {
    if (this.dead) return Promise.reject(this.dead);
    const id = this.nextId++;
    // Held while a write is pending (a process waiting only for it must not exit), idle otherwise.
    if (this.waiting.size === 0) this.worker.ref();
    return new Promise((resolve, reject) => {
      this.waiting.set(id, { resolve, reject });
      // Only the caller's thread can see where the memory lies (a view's offset says nothing of it).
      this.worker.postMessage({ id, data, position, digest, aligned: alignGap(data, DIRECT_WRITE_ALIGN) === 0 });
    });
  }

  close(): void {
    void this.worker.terminate();
  }
}
