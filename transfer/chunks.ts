// A model file as fixed-size chunks, each with a BLAKE3 digest: the unit a device fetches, verifies and
// records as done. Which chunks a device needs follows from its windows: the GGUF header (the engine
// reads the tensor table and tokenizer from it) and every tensor of its layers.
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { GgufFile } from "../model/index.js";

/** 4 MiB: large enough that per-chunk overhead is small, small enough that a retry costs little. */
export const CHUNK_BYTES = 4 << 20;

export interface ModelInfo {
  readonly fingerprint: string;
  readonly fileBytes: number;
  /** Bytes of the header (metadata and tensor table) before the tensor data. */
  readonly dataOffset: number;
  readonly chunkBytes: number;
  readonly name: string;
}

export const chunkCount = (info: Pick<ModelInfo, "fileBytes" | "chunkBytes">): number => Math.ceil(info.fileBytes / info.chunkBytes);

/** The chunk digest's name, kept beside saved digests: digests of another kind are computed again. */
export const CHUNK_DIGEST = "blake3";

/** transfer/digest.cjs (plain CommonJS, so that the sink's worker thread loads the same file), found
 * from here whether this runs compiled (dist/transfer/) or from source. */
export const DIGEST_MODULE = ((): string => {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    for (const p of [join(dir, "digest.cjs"), join(dir, "transfer", "digest.cjs")]) if (existsSync(p)) return p;
    const up = dirname(dir);
    if (up === dir) throw new Error("prima: transfer/digest.cjs not found");
    dir = up;
  }
})();

const digest = createRequire(import.meta.url)(DIGEST_MODULE) as { ready: Promise<void>; blake3Hex(data: Uint8Array): string; native: boolean };
// Without a native binary for this platform, the WebAssembly build is compiled first (milliseconds).
await digest.ready;

/** Whether chunk digests use the native BLAKE3 (else WebAssembly). */
export const NATIVE_DIGEST = digest.native;

/**
 * A chunk's digest (hex). BLAKE3 rather than SHA-256: a receiver hashes every byte it fetches, and
 * BLAKE3 costs a fifth of SHA-NI's SHA-256 per GB on one core (0.1 against 0.46 s/GB on this
 * project's AVX-512 host), with the same 256-bit strength.
 */
export function chunkDigest(data: Uint8Array): string {
  return digest.blake3Hex(data);
}

/** Byte ranges [start, end) a device with these layers reads: the header and its layers' tensors. */
export function rangesForLayers(file: GgufFile, layers: Iterable<number>): [number, number][] {
  const wanted = new Set(layers);
  const ranges: [number, number][] = [[0, file.dataOffset]];
  const ts = [...file.tensors].sort((a, b) => a.offset - b.offset);
  for (let i = 0; i < ts.length; i++) {
    const m = /^blk\.(\d+)\./.exec(ts[i].name);
    if (!m || !wanted.has(Number(m[1]))) continue;
    // A tensor runs to the next one's start (alignment padding included), or to the end of the file.
    const end = i + 1 < ts.length ? ts[i + 1].offset : file.fileBytes;
    ranges.push([ts[i].offset, end]);
  }
  return ranges;
}

/** The chunks that cover the ranges, in file order. */
export function chunksFor(ranges: readonly [number, number][], info: Pick<ModelInfo, "fileBytes" | "chunkBytes">): number[] {
  const out = new Set<number>();
  const last = chunkCount(info) - 1;
  for (const [s, e] of ranges) {
    if (e <= s) continue;
    for (let c = Math.floor(s / info.chunkBytes); c <= Math.min(last, Math.floor((e - 1) / info.chunkBytes)); c++) out.add(c);
  }
  return [...out].sort((a, b) => a - b);
}

/** Byte range of chunk i. */
export function chunkRange(i: number, info: Pick<ModelInfo, "fileBytes" | "chunkBytes">): [number, number] {
  const s = i * info.chunkBytes;
  return [s, Math.min(info.fileBytes, s + info.chunkBytes)];
}
