// The coordinator's side: a model file served chunk by chunk. Each chunk is read when asked for (never
// a whole window in memory) and its digest is computed once, then kept in memory and on disk, so a
// device can verify what it received and a restarted coordinator answers the same hashes.
import { mkdirSync, readFileSync } from "node:fs";
import { open, type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import { CHUNK_BYTES, chunkCount, chunkRange, chunkDigest, CHUNK_DIGEST, type ModelInfo } from "./chunks.js";
import { forgetFileRange } from "../native/index.js";
import { Debounced, writeFileAtomic } from "./persist.js";

export interface SourceOptions {
  readonly path: string;
  readonly fileBytes: number;
  readonly dataOffset: number;
  readonly fingerprint: string;
  readonly name: string;
  /** Where chunk hashes are kept between runs (none: memory only). */
  readonly hashDir?: string;
  readonly chunkBytes?: number;
}

/** PRIMA_TEST_CHUNK_DELAY_MS: each chunk read waits this long (tests cut a transfer halfway). */
const testDelayMs = Number(process.env.PRIMA_TEST_CHUNK_DELAY_MS ?? 0) || 0;

/** PRIMA_TEST_CORRUPT_CHUNKS="3,7": the first send of those chunks carries a flipped byte (tests
 * prove that a device notices and fetches again). */
function corruptOnce(): Set<number> {
  const v = process.env.PRIMA_TEST_CORRUPT_CHUNKS;
  return new Set(v ? v.split(",").map(Number).filter(Number.isInteger) : []);
}

export class ModelSource {
  readonly info: ModelInfo;
  private readonly hashes: (string | undefined)[];
  private fh: Promise<FileHandle> | undefined;
  private readonly corrupt = corruptOnce();
  private savedCount = 0;

  constructor(private readonly o: SourceOptions) {
    this.info = { fingerprint: o.fingerprint, fileBytes: o.fileBytes, dataOffset: o.dataOffset, chunkBytes: o.chunkBytes ?? CHUNK_BYTES, name: o.name };
    this.hashes = new Array(chunkCount(this.info));
    const saved = this.hashFile();
    if (saved) {
      try {
        const j = JSON.parse(readFileSync(saved, "utf8")) as { digest?: string; chunkBytes: number; fileBytes: number; hashes: (string | null)[] };
        if (j.digest === CHUNK_DIGEST && j.chunkBytes === this.info.chunkBytes && j.fileBytes === this.info.fileBytes && j.hashes.length === this.hashes.length) {
          j.hashes.forEach((h, i) => (this.hashes[i] = typeof h === "string" && /^[0-9a-f]{64}$/.test(h) ? h : undefined));
        }
      } catch {
        // no saved hashes (or unreadable): they are computed again
      }
    }
  }

  private hashFile(): string | undefined {
    return this.o.hashDir ? join(this.o.hashDir, `${this.o.fingerprint}.chunks.json`) : undefined;
  }

  /** Chunk i's bytes from the file (into `into` when it is large enough, else a fresh buffer). */
  private async bytesOf(i: number, into?: Buffer): Promise<Buffer> {
    if (!Number.isInteger(i) || i < 0 || i >= this.hashes.length) throw new RangeError(`chunk ${i} does not exist (the model has ${this.hashes.length})`);
    this.fh ??= open(this.o.path, "r");
    const fh = await this.fh;
    const [s, e] = chunkRange(i, this.info);
    const data = into && into.length >= e - s ? into.subarray(0, e - s) : Buffer.allocUnsafe(e - s);
    let got = 0;
    while (got < data.length) {
      const { bytesRead } = await fh.read(data, got, data.length - got, s + got);
      if (bytesRead === 0) throw new Error(`${this.o.path}: the file ended at ${s + got} bytes, ${this.info.fileBytes} expected (was it changed?)`);
      got += bytesRead;
    }
    return data;
  }

  /** The kept hash of chunk i, or data's (then kept). */
  private hashFor(i: number, data: Buffer): string {
    let h = this.hashes[i];
    if (h === undefined) {
      h = this.hashes[i] = chunkDigest(data);
      this.saveSoon();
    } else if (this.verifyEvery && chunkDigest(data) !== h) {
      throw new Error(`${this.o.path}: chunk ${i} changed since it was hashed (the model file was modified)`);
    }
    return h;
  }

  /** Reads chunk i with its hash, into `into` when given (a buffer the caller reuses: a fresh 4 MiB
   * per chunk costs page faults and garbage collection), else into a fresh buffer. */
  async read(i: number, into?: Buffer): Promise<{ data: Buffer; digest: string }> {
    if (testDelayMs > 0) await new Promise((r) => setTimeout(r, testDelayMs));
    const data = await this.bytesOf(i, into);
    const h = this.hashFor(i, data);
    if (this.corrupt.delete(i)) data[data.length >> 1] ^= 0xff;
    return { data, digest: h };
  }

  /** Chunk i's digest: the kept one, or read and hashed now (and kept), into `into` when given (see
   * read); no test delay or corruption. */
  async hashOf(i: number, into?: Buffer): Promise<string> {
    const kept = this.hashes[i];
    if (kept !== undefined) return kept;
    const h = this.hashFor(i, await this.bytesOf(i, into));
    // Read only to be hashed (another device's window, which it reads itself): its pages would stay
    // charged to this device's memory, counted against the room of its own window.
    const [s, e] = chunkRange(i, this.info);
    forgetFileRange((await this.fh!).fd, s, e - s);
    return h;
  }

  /** Check each chunk read against its kept hash (a file changed under a running coordinator). */
  verifyEvery = false;

  private readonly saveLater = new Debounced(1000, () => this.save());

  private saveSoon(): void {
    if (this.hashFile()) this.saveLater.soon();
  }

  /** Writes the hashes known so far (atomically: a temporary file renamed). */
  save(): void {
    const f = this.hashFile();
    const known = this.hashes.filter((h) => h !== undefined).length;
    if (!f || known === this.savedCount) return;
    try {
      mkdirSync(this.o.hashDir!, { recursive: true });
      writeFileAtomic(f, JSON.stringify({ digest: CHUNK_DIGEST, chunkBytes: this.info.chunkBytes, fileBytes: this.info.fileBytes, hashes: this.hashes.map((h) => h ?? null) }));
      this.savedCount = known;
    } catch {
      // a cache that cannot be written costs a recomputation next time, nothing else
    }
  }

  async close(): Promise<void> {
    this.saveLater.cancel();
    this.save();
    const fh = this.fh;
    this.fh = undefined;
    await (await fh)?.close();
  }
}
