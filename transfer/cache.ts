// The device's side: a local cache of models keyed by their fingerprint. Each model is a sparse file
// laid out as the GGUF is (holes where other devices' layers are), so the engine maps it like any
// model and never touches the holes; beside it, the list of chunks already verified, so a transfer
// cut off halfway resumes where it stopped. The cache has a size limit and drops the least recently
// used models first.
import { closeSync, existsSync, ftruncateSync, mkdirSync, openSync, readdirSync, readFileSync, statfsSync, statSync, unlinkSync, utimesSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { Worker } from "node:worker_threads";
import { alignGap } from "../native/index.js";
import { DIGEST_MODULE, chunkCount, chunkRange, type ModelInfo } from "./chunks.js";
import { Debounced, writeFileAtomic } from "./persist.js";

export class TransferError extends Error {
  override name = "TransferError";
}

/** ~/.cache/prima/models (XDG_CACHE_HOME honoured). */
export function defaultModelCacheDir(): string {
  return join(process.env.XDG_CACHE_HOME || join(homedir(), ".cache"), "prima", "models");
}

const MiB = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;

export class ModelCache {
  constructor(readonly dir = defaultModelCacheDir(), readonly limitBytes = Infinity) {}

  pathFor(fingerprint: string): string {
    if (!/^[0-9a-f]{16,128}$/.test(fingerprint)) throw new TransferError(`"${fingerprint.slice(0, 80)}" is not a model fingerprint`);
    return join(this.dir, `${fingerprint}.gguf`);
  }

  /** The cached model for `info`: created (as a sparse file of the model's size) if new. */
  open(info: ModelInfo): CachedModel {
    if (!Number.isSafeInteger(info.fileBytes) || info.fileBytes <= 0 || info.fileBytes > 2 ** 50) throw new TransferError(`model size ${info.fileBytes} is not plausible`);
    if (!Number.isInteger(info.chunkBytes) || info.chunkBytes < 4096 || info.chunkBytes > 1 << 30) throw new TransferError(`chunk size ${info.chunkBytes} is not plausible`);
    if (!Number.isInteger(info.dataOffset) || info.dataOffset <= 0 || info.dataOffset > info.fileBytes) throw new TransferError(`header size ${info.dataOffset} is not plausible`);
    mkdirSync(this.dir, { recursive: true });
    const path = this.pathFor(info.fingerprint);
    const fresh = !existsSync(path) || statSync(path).size !== info.fileBytes;
    if (fresh) {
      const fd = openSync(path, "w");
      try {
        ftruncateSync(fd, info.fileBytes); // all holes: no block is written until a chunk arrives
      } finally {
        closeSync(fd);
      }
      if (existsSync(`${path}.chunks`)) unlinkSync(`${path}.chunks`);
    }
    const now = new Date();
    utimesSync(path, now, now); // "recently used", for the eviction order
    return new CachedModel(path, info, this);
  }

  /** Bytes of blocks the cached models occupy (sparse files count what they hold, not their size). */
  usedBytes(except?: string): number {
    if (!existsSync(this.dir)) return 0;
    return readdirSync(this.dir).filter((f) => f.endsWith(".gguf") && join(this.dir, f) !== except)
      .reduce((a, f) => a + statSync(join(this.dir, f)).blocks * 512, 0);
  }

  /** Drops the least recently used models (not `keep`) until `needBytes` more fit under the limit. */
  makeRoom(needBytes: number, keep: string, log?: (line: string) => void): void {
    if (!Number.isFinite(this.limitBytes)) return;
    const others = readdirSync(this.dir).filter((f) => f.endsWith(".gguf")).map((f) => join(this.dir, f)).filter((p) => p !== keep)
      .map((p) => ({ p, used: statSync(p).mtimeMs, bytes: statSync(p).blocks * 512 })).sort((a, b) => a.used - b.used);
    let total = this.usedBytes();
    for (const o of others) {
      if (total + needBytes <= this.limitBytes) break;
      log?.(`model cache: dropping ${o.p} (${MiB(o.bytes)}, least recently used) to stay under ${MiB(this.limitBytes)}`);
      unlinkSync(o.p);
      if (existsSync(`${o.p}.chunks`)) unlinkSync(`${o.p}.chunks`);
      total -= o.bytes;
    }
    if (total + needBytes > this.limitBytes) {
      throw new TransferError(`the model cache limit is ${MiB(this.limitBytes)}: this device's windows need ${MiB(needBytes)} more and ${MiB(total)} are in use by the model itself`);
    }
  }
}

export class CachedModel {
  /** Chunks written and verified. */
  readonly done: Set<number>;

  constructor(readonly path: string, readonly info: ModelInfo, private readonly cache: ModelCache) {
    this.done = new Set();
    try {
      const list = JSON.parse(readFileSync(`${path}.chunks`, "utf8")) as unknown;
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

  /** Refuses by name when the disk (or the cache limit) cannot take these chunks. */
  checkRoom(chunks: readonly number[], log?: (line: string) => void): void {
    const need = this.bytesOf(this.missing(chunks));
    if (need === 0) return;
    const fs = statfsSync(this.cache.dir);
    const free = fs.bavail * fs.bsize;
    if (need > free) {
      throw new TransferError(`not enough disk space in ${this.cache.dir} for this device's windows: ${need} bytes needed (${MiB(need)}), ${free} bytes free (${MiB(free)})`);
    }
    this.cache.makeRoom(need, this.path, log);
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

  private readonly persistLater = new Debounced(200, () => this.persist());

  private persistSoon(): void {
    this.persistLater.soon();
  }

  /** Records the verified chunks (atomically), so a restart resumes after them. */
  persist(): void {
    this.persistLater.cancel();
    writeFileAtomic(`${this.path}.chunks`, JSON.stringify([...this.done].sort((a, b) => a - b)));
  }

  close(): void {
    this.persist();
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
const fd = openSync(workerData.path, "r+");
let direct = -1;
try { direct = openSync(workerData.path, constants.O_WRONLY | constants.O_DIRECT); } catch {}
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
    return parentPort.postMessage({ id, error: e.message });
  }
  if (!ok) return parentPort.postMessage({ id, ok });
  save(data, position, aligned).then(
    () => parentPort.postMessage({ id, ok }),
    (e) => parentPort.postMessage({ id, error: e.message }),
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
    this.worker.on("message", (m: { id: number; ok?: boolean; error?: string }) => {
      const w = this.waiting.get(m.id);
      this.waiting.delete(m.id);
      if (this.waiting.size === 0) this.worker.unref();
      if (m.error !== undefined) w?.reject(new TransferError(`writing ${path}: ${m.error}`));
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
