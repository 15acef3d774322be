// Model identity covers the weights: the fingerprint hashes only the header, so a copy with the same
// header and other tensor bytes (a different fine-tune, a corrupted download) would join and compute
// wrong text silently. The coordinator sends, with each assignment, the digest of every chunk holding
// the device's windows; the device hashes the same chunks of its own file (once per file identity,
// kept on disk) and refuses to run them on other bytes, naming the chunk and the layers in it.
import { createHash } from "node:crypto";
import { mkdirSync, readFileSync, realpathSync, statSync } from "node:fs";
import { open } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { ChunkHash } from "../control/index.js";
import type { GgufFile } from "../model/index.js";
import { CHUNK_DIGEST, chunkDigest, defaultModelCacheDir, writeFileAtomic } from "../transfer/index.js";

export class WeightsMismatchError extends Error {
  override name = "WeightsMismatchError";
  constructor(message: string, readonly chunks: readonly number[]) {
    super(message);
  }
}

/** The layers whose tensors lie (partly) in bytes [s, e) of the file. */
function layersIn(file: GgufFile, s: number, e: number): number[] {
  const ts = [...file.tensors].sort((a, b) => a.offset - b.offset);
  const out = new Set<number>();
  for (let i = 0; i < ts.length; i++) {
    const end = i + 1 < ts.length ? ts[i + 1].offset : file.fileBytes;
    const m = /^blk\.(\d+)\./.exec(ts[i].name);
    if (m && ts[i].offset < e && end > s) out.add(Number(m[1]));
  }
  return [...out].sort((a, b) => a - b);
}

/** Hashes of a model file's chunks, computed when first asked for. With `persist`, kept on disk per
 * file identity (path, device, inode, size, mtime: any change of the file makes a new identity);
 * without (a sparse copy that fetching rewrites), in memory, and forget() drops rewritten chunks. */
export class ChunkHasher {
  private readonly hashes = new Map<number, string>();
  private identity = "";
  private dirty = false;

  constructor(private readonly path: string, private readonly persist: boolean) {}

  private cacheFile(): string {
    return join(dirname(defaultModelCacheDir()), "chunk-hashes", `local-${createHash("sha256").update(this.identity).digest("hex").slice(0, 32)}.json`);
  }

  /** Starts over when the file or the chunk size is not what the kept hashes were made for. */
  private sync(chunkBytes: number): void {
    const st = statSync(this.path);
    const identity = this.persist ? `${realpathSync(this.path)}|${st.dev}|${st.ino}|${st.size}|${st.mtimeMs}|${chunkBytes}|${CHUNK_DIGEST}` : `${this.path}|${chunkBytes}`;
    if (identity === this.identity) return;
    this.identity = identity;
    this.hashes.clear();
    if (!this.persist) return;
    try {
      const saved = JSON.parse(readFileSync(this.cacheFile(), "utf8")) as { identity?: string; hashes?: Record<string, string> };
      if (saved.identity === identity && saved.hashes) {
        for (const [k, v] of Object.entries(saved.hashes)) if (/^[0-9a-f]{64}$/.test(v)) this.hashes.set(Number(k), v);
      }
    } catch {
      // none kept yet
    }
  }

  forget(chunks: Iterable<number>): void {
    for (const c of chunks) this.hashes.delete(c);
  }

  private save(): void {
    if (!this.persist || !this.dirty) return;
    this.dirty = false;
    const f = this.cacheFile();
    try {
      mkdirSync(dirname(f), { recursive: true });
      writeFileAtomic(f, JSON.stringify({ identity: this.identity, hashes: Object.fromEntries(this.hashes) }));
    } catch {
      // not kept: hashed again next time
    }
  }

  /**
   * Checks the file's chunks against the coordinator's hashes; throws a WeightsMismatchError naming
   * the chunks that differ and the layers in them. Progress is reported as chunks are hashed.
   * Resolves with how many chunks it hashed now (the others were known); `stop` ends it between chunks.
   */
  async verify(expected: readonly ChunkHash[], chunkBytes: number, file: GgufFile, progress?: (fraction: number, stage: string) => void, stop?: AbortSignal): Promise<number> {
    if (!(chunkBytes > 0) || expected.length === 0) throw new Error("the assignment carries no hashes of this device's weights (is the coordinator older than this worker?)");
    this.sync(chunkBytes);
    const todo = expected.filter((c) => !this.hashes.has(c.index));
    if (todo.length > 0) {
      const fh = await open(this.path, "r");
      try {
        const buf = Buffer.allocUnsafe(chunkBytes);
        let done = 0;
        for (const c of todo) {
          if (stop?.aborted) throw new Error("the weights check was stopped (a newer assignment came)");
          const start = c.index * chunkBytes;
          let got = 0;
          for (;;) {
            const { bytesRead } = await fh.read(buf, got, chunkBytes - got, start + got);
            if (bytesRead === 0) break;
            got += bytesRead;
            if (got === chunkBytes) break;
          }
          this.hashes.set(c.index, chunkDigest(buf.subarray(0, got)));
          this.dirty = true;
          if (++done % 16 === 0) progress?.(done / todo.length, `checking this device's weights: ${done} of ${todo.length} chunks hashed`);
        }
      } finally {
        await fh.close();
      }
      this.save();
    }
    const bad = expected.filter((c) => this.hashes.get(c.index) !== Buffer.from(c.digest).toString("hex"));
    if (bad.length === 0) return todo.length;
    const first = bad[0].index;
    const layers = layersIn(file, first * chunkBytes, (first + 1) * chunkBytes);
    throw new WeightsMismatchError(
      `this device's copy of the model (${this.path}) has other weights than the coordinator's: ${bad.length} of ${expected.length} chunks differ, ` +
      `the first bytes ${first * chunkBytes}..${(first + 1) * chunkBytes} (${layers.length ? `layers ${layers.join(", ")}` : "no layer's tensors: the header or the output"}); ` +
      "the header is the same, so it would compute wrong text: refusing to run these layers", bad.map((c) => c.index));
  }
}
