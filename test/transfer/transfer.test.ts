// transfer/: a device's sparse copy of only its windows, verified chunk by chunk, resumable, within
// its disk and cache limits; the engine runs the windows from it exactly as from the whole file.
import { execFileSync } from "node:child_process";
import { closeSync, constants, existsSync, mkdtempSync, openSync, readFileSync, readSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LocalModel } from "../../engine/index.js";
import { alignGap } from "../../native/index.js";
import { modelFingerprint, modelShapeByName, readGguf, type GgufFile } from "../../model/index.js";
import { generateModel } from "../../modelgen/index.js";
import { canMount, tmpfsDir } from "../helpers/temp.js";
import {
  DIGEST_MODULE, DIRECT_WRITE_ALIGN, ModelCache, ModelSource, NATIVE_DIGEST, NoRoomError, chunkBuffer, chunkDigest, chunkRange, chunksFor, fetchChunks, rangesForLayers,
  type Chunk,
  type ModelInfo,
} from "../../transfer/index.js";

const CHUNK = 64 << 10;
let dir: string;
let modelPath: string;
let file: GgufFile;
let fingerprint: string;

function source(o: { corrupt?: string } = {}): ModelSource {
  const before = process.env.PRIMA_TEST_CORRUPT_CHUNKS;
  if (o.corrupt) process.env.PRIMA_TEST_CORRUPT_CHUNKS = o.corrupt;
  else delete process.env.PRIMA_TEST_CORRUPT_CHUNKS;
  try {
    return new ModelSource({ path: modelPath, fileBytes: file.fileBytes, dataOffset: file.dataOffset, fingerprint, name: "t", chunkBytes: CHUNK, hashDir: join(dir, "hashes") });
  } finally {
    if (before === undefined) delete process.env.PRIMA_TEST_CORRUPT_CHUNKS;
    else process.env.PRIMA_TEST_CORRUPT_CHUNKS = before;
  }
}

/** The chunks asked for, read from the source; stops after `limit` chunks when given (a cut transfer). */
function from(src: ModelSource, limit = Infinity): (chunks: number[]) => AsyncIterable<Chunk> {
  return async function* (chunks) {
    let n = 0;
    for (const index of chunks) {
      if (n++ >= limit) throw new Error("connection cut");
      yield { index, ...(await src.read(index)) };
    }
  };
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "prima-transfer-"));
  modelPath = join(dir, "m.gguf");
  await generateModel({ shape: { ...modelShapeByName("small-llama")!, name: "transfer8" }, type: "Q8_0", out: modelPath, seed: 5 });
  file = readGguf(modelPath);
  fingerprint = modelFingerprint(file);
}, 60_000);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("transfer", () => {
  it("fetches only a window's chunks into a sparse file the engine runs exactly like the whole model", async () => {
    const src = source();
    const cache = new ModelCache(join(dir, "cache-a"));
    const cached = cache.open(src.info);
    const layers = [2, 3, 4];
    const wanted = chunksFor(rangesForLayers(file, layers), src.info);
    const r = await fetchChunks(cached, wanted, from(src));
    cached.close();
    const neededBytes = cached.bytesOf(wanted);
    expect(r.fetchedBytes).toBe(neededBytes);
    expect(r.badChunks).toBe(0);
    // The file has the model's size, but only the fetched chunks occupy disk blocks.
    const st = statSync(cached.path);
    expect(st.size).toBe(file.fileBytes);
    expect(st.blocks * 512).toBeLessThanOrEqual(neededBytes + 64 * 1024);
    expect(neededBytes).toBeLessThan(0.7 * file.fileBytes);
    // A hole reads as zeros: a chunk of layer 7 was never written.
    const hole = chunksFor(rangesForLayers(file, [7]), src.info).find((c) => !wanted.includes(c))!;
    const [hs, he] = chunkRange(hole, src.info);
    const buf = Buffer.alloc(Math.min(4096, he - hs));
    const fd = openSync(cached.path, "r");
    readSync(fd, buf, 0, buf.length, hs);
    expect(buf.every((b) => b === 0)).toBe(true);

    // The same window from the sparse copy and from the whole file: the same output, bit for bit.
    const whole = LocalModel.open(modelPath, { threads: 1 });
    const sparse = LocalModel.open(cached.path, { threads: 1 });
    expect(modelFingerprint(sparse.gguf)).toBe(fingerprint);
    const acts = new Float32Array(3 * whole.nEmbd).map((_, i) => Math.sin(i));
    const a = acts.slice(), b = acts.slice();
    const wa = whole.window(2, 5, { ctx: 16 }), wb = sparse.window(2, 5, { ctx: 16 });
    await wa.forward(a, 0, 3);
    await wb.forward(b, 0, 3);
    expect(Buffer.from(b.buffer).equals(Buffer.from(a.buffer))).toBe(true);
    wa.close();
    wb.close();
    whole.close();
    sparse.close();
    await src.close();
  });

  it("writes chunks received into chunk buffers past the page cache, others through it, and both read back exactly", async () => {
    const src = source();
    const cached = new ModelCache(join(dir, "cache-direct")).open(src.info);
    const path = join(dir, "cache-direct", `${src.info.fingerprint}.gguf`);
    expect(existsSync(path)).toBe(true);
    const [a, b, c] = [1, 2, 3];
    for (const i of [a, b]) {
      const { data, digest } = await src.read(i);
      const buf = chunkBuffer(CHUNK);
      expect(alignGap(buf, DIRECT_WRITE_ALIGN)).toBe(0);
      data.copy(buf);
      expect(await cached.writeVerified(i, buf.subarray(0, data.length), digest)).toBe(true);
    }
    // Memory JS allocated as it likes (one byte in, so never aligned) still lands, through the page cache.
    const { data, digest } = await src.read(c);
    const odd = Buffer.alloc(data.length + 1).subarray(1);
    data.copy(odd);
    expect(alignGap(odd, DIRECT_WRITE_ALIGN)).not.toBe(0);
    expect(await cached.writeVerified(c, odd, digest)).toBe(true);
    cached.close();
    // What the page cache holds of the file (util-linux's fincore), before reading it back through it.
    const resident = Number(execFileSync("fincore", ["--bytes", "--noheadings", "--raw", "--output", "RES", path], { encoding: "utf8" }).trim());
    let direct = true;
    try {
      closeSync(openSync(path, constants.O_WRONLY | constants.O_DIRECT));
    } catch {
      direct = false; // a file system without direct writes (tmpfs): everything goes through the page cache
    }
    expect(resident).toBe(direct ? CHUNK : 3 * CHUNK);
    const written = readFileSync(path);
    const whole = readFileSync(modelPath);
    for (const i of [a, b, c]) {
      const [s, e] = chunkRange(i, src.info);
      expect(written.subarray(s, e).equals(whole.subarray(s, e))).toBe(true);
    }
  });

  it("BLAKE3's WebAssembly fallback (platforms without the native binary) gives the native digests", () => {
    expect(NATIVE_DIGEST).toBe(true); // this machine has the binary: the comparison below is against it
    const samples = [Buffer.alloc(0), Buffer.from("abc"), Buffer.alloc(CHUNK + 7, 0x5a), readFileSync(modelPath).subarray(0, 3 * CHUNK)];
    const script = `const d = require(${JSON.stringify(DIGEST_MODULE)}); const fs = require("node:fs");
      d.ready.then(() => console.log(JSON.stringify({ native: d.native, digests: JSON.parse(fs.readFileSync(0, "utf8")).map((h) => d.blake3Hex(Buffer.from(h, "hex"))) })));`;
    const out = JSON.parse(execFileSync(process.execPath, ["-e", script], { input: JSON.stringify(samples.map((b) => b.toString("hex"))), env: { ...process.env, PRIMA_BLAKE3: "wasm" }, encoding: "utf8" }));
    expect(out.native).toBe(false);
    expect(out.digests).toEqual(samples.map((b) => chunkDigest(b)));
    // BLAKE3's published test vector for the empty input.
    expect(chunkDigest(Buffer.alloc(0))).toBe("af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262");
  });

  it("a chunk corrupted in transit is detected and fetched again", async () => {
    const wanted = chunksFor(rangesForLayers(file, [0, 1]), { fileBytes: file.fileBytes, chunkBytes: CHUNK });
    const src = source({ corrupt: `${wanted[0]},${wanted.at(-1)}` });
    const cached = new ModelCache(join(dir, "cache-b")).open(src.info);
    const r = await fetchChunks(cached, wanted, from(src));
    expect(r.badChunks).toBe(2);
    expect(cached.missing(wanted)).toEqual([]);
    cached.close();
    await src.close();
  });

  it("a transfer cut halfway resumes where it stopped after a restart, fetching each chunk about once", async () => {
    const src = source();
    const cache = new ModelCache(join(dir, "cache-c"));
    const wanted = chunksFor(rangesForLayers(file, [0, 1, 2, 3, 4, 5]), src.info);
    const first = cache.open(src.info);
    const half = Math.floor(wanted.length / 2);
    await expect(fetchChunks(first, wanted, from(src, half))).rejects.toThrow(/connection cut/);
    first.close(); // the process ends here; what it verified is on disk
    const again = cache.open(src.info);
    expect(again.done.size).toBe(half);
    const r = await fetchChunks(again, wanted, from(src));
    again.close();
    const total = first.bytesOf(wanted.slice(0, half)) + r.fetchedBytes;
    expect(total).toBe(again.bytesOf(wanted));
    await src.close();
  });

  it("too little disk: a clear error naming the bytes needed and the bytes free", async () => {
    if (!canMount) return void console.warn("transfer: not root, cannot mount a small tmpfs: skipped");
    const small = tmpfsDir("prima-small-disk-", "256k");
    const src = source();
    const cached = new ModelCache(small).open(src.info);
    const wanted = chunksFor(rangesForLayers(file, [0, 1, 2, 3]), src.info);
    expect(() => cached.checkRoom(wanted)).toThrow(NoRoomError);
    expect(() => cached.checkRoom(wanted)).toThrow(/not enough room for this device's windows: \d+ bytes \([\d.]+ MiB\) needed, \d+ bytes \([\d.]+ MiB\) free on the disk of/);
    await src.close();
  });

  it("the cache keeps under its limit by dropping the least recently used model", async () => {
    const cacheDir = join(dir, "cache-d");
    const info = (fp: string): ModelInfo => ({ fingerprint: fp, fileBytes: 1 << 20, dataOffset: 4096, chunkBytes: CHUNK, name: fp });
    const cache = new ModelCache(cacheDir, { limitBytes: 1.5 * (1 << 20) });
    const old = cache.open(info("a".repeat(64)));
    for (let i = 0; i < 16; i++) expect(await old.writeVerified(i, Buffer.alloc(CHUNK, 1), chunkDigest(Buffer.alloc(CHUNK, 1)))).toBe(true);
    old.close();
    const next = cache.open(info("b".repeat(64)));
    next.checkRoom([...Array(16).keys()]);
    expect(existsSync(old.path)).toBe(false);
    expect(existsSync(next.path)).toBe(true);
    // A model larger than the limit on its own is refused by name.
    const huge = new ModelCache(join(dir, "cache-e"), { limitBytes: 256 << 10 }).open(info("c".repeat(64)));
    expect(() => huge.checkRoom([...Array(16).keys()])).toThrow(/free under the model cache limit of 262144 bytes/);
  });

  it("refuses implausible model descriptions from a peer", () => {
    const cache = new ModelCache(join(dir, "cache-f"));
    expect(() => cache.open({ fingerprint: "../../etc", fileBytes: 10, dataOffset: 1, chunkBytes: CHUNK, name: "x" })).toThrow(/fingerprint/);
    expect(() => cache.open({ fingerprint: "a".repeat(64), fileBytes: -1, dataOffset: 1, chunkBytes: CHUNK, name: "x" })).toThrow(/size/);
    expect(() => cache.open({ fingerprint: "a".repeat(64), fileBytes: 1e6, dataOffset: 1, chunkBytes: 3, name: "x" })).toThrow(/chunk size/);
  });
});
