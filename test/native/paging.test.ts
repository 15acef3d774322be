// A window's weights can be dropped from memory and paged back in ahead of use (MADV_WILLNEED), and
// mincore residency shows both. The model is copied first so no other test holds its pages.
import { closeSync, copyFileSync, fsyncSync, mkdtempSync, openSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, expect, it } from "vitest";
import { LocalModel } from "../../engine/index.js";
import { STREAM_MARGIN_BYTES } from "../../halda/index.js";
import { NATIVE_STREAM_MARGIN_BYTES } from "../../native/index.js";
import type { ModelShape } from "../../model/index.js";
import { dropFileCache, mappedResidentBytes } from "../../profiler/index.js";
import { PLACEMENT_SHAPE, testModel } from "../profiler/models.js";

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** A copy of the model no other test holds pages of, synced (dirty pages cannot be dropped from the
 * page cache); removed after the file's tests. */
function privateCopy(model: string): string {
  const dir = mkdtempSync(join(tmpdir(), "prima-paging-"));
  dirs.push(dir);
  const path = join(dir, "model.gguf");
  copyFileSync(model, path);
  const fd = openSync(path, "r+");
  fsyncSync(fd);
  closeSync(fd);
  return path;
}

it("release evicts a window's pages; prefetch brings them back before the window runs", async () => {
  const path = privateCopy("models/stories260K.gguf");
  const model = LocalModel.open(path, { threads: 1 });
  const w = model.window(1, 4, { ctx: 8 });
  const total = w.residency().totalBytes;
  // 3 layers of F32 weights, page-aligned
  expect(total).toBeGreaterThan(3 * 64 * (64 + 32 + 32 + 64 + 3 * 172) * 4);
  w.release();
  const evicted = w.residency().residentBytes;
  expect(evicted / total).toBeLessThan(0.2);
  w.prefetch();
  let resident = 0;
  for (let i = 0; i < 200 && resident < total; i++) {
    resident = w.residency().residentBytes;
    if (resident < total) await new Promise((r) => setTimeout(r, 10));
  }
  expect(resident).toBe(total);
  // and the window still computes what it computed before the round trip
  const acts = model.embed(Int32Array.of(1, 403));
  await w.forward(acts, 0, 2);
  expect(acts.every(Number.isFinite)).toBe(true);
  w.close();
  model.close();
});

/** Polls a window's residency until `share` of it is in memory, for at most limitMs; the share reached.
 * (Not all of it: on a loaded machine reclaim may take a few pages back meanwhile.) */
async function residentWithin(w: { residency(): { residentBytes: number; totalBytes: number } }, share: number, limitMs: number): Promise<number> {
  const r = () => w.residency().residentBytes / w.residency().totalBytes;
  for (const t0 = Date.now(); Date.now() - t0 < limitMs && r() < share;) await new Promise((res) => setTimeout(res, 20));
  return r();
}

it("prefetch pages in a window many times the disk's readahead window, here or in the background", async () => {
  // One MADV_WILLNEED call reads at most the disk's readahead window (8 MiB on this project's VM) and
  // skips the rest: the advice goes in pieces (native prima_willneed).
  const path = privateCopy(await testModel(PLACEMENT_SHAPE, "Q8_0"));
  const model = LocalModel.open(path, { threads: 1 });
  const w = model.window(0, model.nLayers, { ctx: 8 });
  try {
    const total = w.residency().totalBytes;
    expect(total).toBeGreaterThan(64 * 2 ** 20);
    for (const background of [false, true]) {
      w.release();
      expect(w.residency().residentBytes / total).toBeLessThan(0.2);
      w.prefetch(undefined, background);
      // one advice call stopped at the readahead window: 8 MiB here, 6% of the window
      expect(await residentWithin(w, 0.95, 60_000)).toBeGreaterThanOrEqual(0.95);
    }
  } finally {
    w.close();
    model.close();
  }
}, 90_000);

it("streamBeyond keeps a window's first bytes and drops the rest of each later layer once a pass has computed it", async () => {
  // Layers of 11 MiB (PLACEMENT_SHAPE, Q8_0), a private copy: no other test holds its pages.
  const path = privateCopy(await testModel(PLACEMENT_SHAPE, "Q8_0"));
  const model = LocalModel.open(path, { threads: 1 });
  const w = model.window(0, 4, { ctx: 8 });
  try {
    const pass = async () => {
      w.kvClear();
      const acts = model.embed(Int32Array.of(1));
      await w.forward(acts, 0, 1);
      return Array.from(acts);
    };
    const first = await pass();
    const total = w.residency().totalBytes;
    expect(w.residency().residentBytes).toBe(total);
    w.streamBeyond(total); // all of it fits: nothing dropped
    expect(await pass()).toEqual(first);
    expect(w.residency().residentBytes).toBe(total);
    // The engine's margin is the one Halda prices.
    expect(NATIVE_STREAM_MARGIN_BYTES).toBe(STREAM_MARGIN_BYTES);
    // Room for two layers and the margin: the layer being read takes a layer and the margin of that
    // room while it is computed, so one is kept and the other three go once computed.
    const layer = total / 4;
    w.streamBeyond(2 * layer + STREAM_MARGIN_BYTES);
    expect(await pass()).toEqual(first);
    let kept = w.residency().residentBytes;
    // give or take a 2 MiB block: the first streamed layer's drop takes the block around its start
    // with it, or (the layers not all of the mean's size) keeps a few bytes of it, to its block's end
    expect(kept).toBeLessThanOrEqual(layer + 2 * 2 ** 20 + 4096);
    expect(kept).toBeGreaterThanOrEqual(layer - 2 * 2 ** 20 - 4096);
    // Room for half a layer more: the second layer's first half stays too (to the end of the 2 MiB
    // block it ends in), so a pass rereads two layers and a half, not three.
    w.streamBeyond(Math.floor(2.5 * layer) + STREAM_MARGIN_BYTES);
    expect(await pass()).toEqual(first); // reads the second layer's first half back in
    expect(await pass()).toEqual(first);
    kept = w.residency().residentBytes;
    expect(kept).toBeGreaterThanOrEqual(1.5 * layer - 4096);
    expect(kept).toBeLessThanOrEqual(1.5 * layer + 2 * 2 ** 20 + 4096);
    // Streaming off: the next pass reads the rest back and memory keeps it.
    w.streamBeyond(2 ** 52);
    expect(await pass()).toEqual(first);
    expect(w.residency().residentBytes).toBe(total);
    expect(() => w.streamBeyond(-1)).toThrow(/byte count/);
  } finally {
    w.close();
    model.close();
  }
});

it("an untied embedding table costs the head the pages of the rows it reads, not the folios around them", async () => {
  // 32000 rows of 256 (Q8_0: 272 bytes a row, 8.3 MiB), one layer; a private copy, its pages dropped.
  const shape: ModelShape = {
    name: "embed-rows", arch: "llama", nEmbd: 256, nLayers: 1, nHead: 4, nHeadKv: 4, nFf: 512, nVocab: 32000,
    tiedEmbeddings: false, qkvBias: false, contextLength: 256, ropeFreqBase: 10000, normEps: 1e-5, defaultVocab: "stories260K",
  };
  const path = privateCopy(await testModel(shape, "Q8_0"));
  dropFileCache(path);
  const model = LocalModel.open(path, { threads: 1 });
  try {
    const before = mappedResidentBytes(path);
    const rows = 20;
    model.embed(Int32Array.from({ length: rows }, (_, i) => 7 + i * 1597)); // rows far apart
    const grown = mappedResidentBytes(path) - before;
    expect(grown).toBeGreaterThan(0);
    // each row a few pages (the file system's small folios); readahead would have brought 128 KiB or,
    // under the mapping's huge-page advice, 2 MiB per row (measured: 6.5 MB for these 20 rows)
    expect(grown).toBeLessThanOrEqual(rows * 32 * 1024);
  } finally {
    model.close();
  }
});
