// The device's side: a local cache of models keyed by their fingerprint. Each model is a sparse file
// laid out as the GGUF is (holes where other devices' layers are), so the engine maps it like any
// model and never touches the holes; beside it, the list of chunks already verified, so a transfer
// cut off halfway resumes where it stopped. The cache has a size limit and drops the least recently
// used models first.
import { closeSync, existsSync, ftruncateSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, statfsSync, statSync, unlinkSync, utimesSync, writeFileSync, writeSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { chunkCount, chunkRange, sha256, type ModelInfo } from "./chunks.js";

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
  private fd: number | undefined;

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

  /** Writes a chunk if it matches its hash; false (nothing written) when it does not. */
  write(index: number, data: Uint8Array, expectedSha256: string): boolean {
    if (!Number.isInteger(index) || index < 0 || index >= chunkCount(this.info)) throw new TransferError(`chunk ${index} is outside the model`);
    const [s, e] = chunkRange(index, this.info);
    if (data.length !== e - s || sha256(data) !== expectedSha256) return false;
    this.fd ??= openSync(this.path, "r+");
    let off = 0;
    while (off < data.length) off += writeSync(this.fd, data, off, data.length - off, s + off);
    this.done.add(index);
    this.persistSoon();
    return true;
  }

  private persistTimer: NodeJS.Timeout | undefined;

  private persistSoon(): void {
    if (this.persistTimer) return;
    this.persistTimer = setTimeout(() => {
      this.persistTimer = undefined;
      this.persist();
    }, 200);
    this.persistTimer.unref();
  }

  /** Records the verified chunks (atomically), so a restart resumes after them. */
  persist(): void {
    clearTimeout(this.persistTimer);
    this.persistTimer = undefined;
    writeFileSync(`${this.path}.chunks.tmp`, JSON.stringify([...this.done].sort((a, b) => a - b)));
    renameSync(`${this.path}.chunks.tmp`, `${this.path}.chunks`);
  }

  close(): void {
    this.persist();
    if (this.fd !== undefined) closeSync(this.fd);
    this.fd = undefined;
  }
}
