// Expert residency of a MoE window (native Residency's expertsResident / expertsTotal, on the dashboard
// and /metrics): an expert of a layer counts as resident when every page of its gate, up and down rows
// is in memory. Checked on a generated tiny MoE model against the routing itself: after the window's
// pages are released none is resident, after a run every expert the run routed to is, and the total is
// the MoE layers times the experts; a dense window reports 0 of 0. A MoE window short of room is not
// streamed (its routed experts stay after a pass; a dense window's later layers are dropped).
import { closeSync, fsyncSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { LocalModel } from "../../engine/index.js";
import { Tokenizer, modelShapeByName } from "../../model/index.js";
import { generateModel } from "../../modelgen/index.js";

const dir = mkdtempSync(join(tmpdir(), "prima-expert-residency-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const moe = join(dir, "tiny-qwen3moe.gguf"), dense = join(dir, "tiny-llama.gguf");

beforeAll(async () => {
  await generateModel({ shape: "tiny-qwen3moe", type: "Q8_0", out: moe, pure: true, seed: 5, weightStd: 0.05 });
  await generateModel({ shape: "tiny-llama", type: "Q8_0", out: dense, pure: true, seed: 5 });
  // written pages are dirty until written back, and only clean pages can be dropped by the release
  for (const p of [moe, dense]) { const fd = openSync(p, "r"); fsyncSync(fd); closeSync(fd); }
}, 120_000);

it("counts the experts wholly in memory: none after a release, at least every routed one after a run", async () => {
  const m = LocalModel.open(moe, { threads: 2 });
  const w = m.window(0, m.nLayers, { ctx: 64 });
  try {
    w.release();
    const cold = w.expertResidency();
    // one row per MoE layer, one entry per expert
    const perLayer = w.info().expertHits ?? [];
    expect(perLayer.length).toBeGreaterThan(0);
    expect(cold.expertsTotal).toBe(perLayer.reduce((a, row) => a + row.length, 0));
    expect(cold.expertsResident).toBe(0);

    const prompt = Int32Array.from([1, ...Tokenizer.fromGguf(moe).encode("The cat sat on the mat and looked at the door.")]);
    await w.forward(m.embed(prompt), 0, prompt.length, new Float32Array(m.nVocab));
    const warm = w.expertResidency();
    const routed = (w.info().expertHits ?? []).flat().filter((n) => n > 0).length;
    expect(routed).toBeGreaterThan(0);
    expect(warm.expertsTotal).toBe(cold.expertsTotal);
    expect(warm.expertsResident).toBeGreaterThanOrEqual(routed);
    expect(warm.expertsResident).toBeLessThanOrEqual(warm.expertsTotal);

    w.release();
    expect(w.expertResidency().expertsResident).toBe(0);
  } finally {
    w.close();
    m.close();
  }
}, 60_000);

/** tiny-qwen3moe with experts of about half a MiB a slice (nEmbd 512, 1024 wide), written back to disk:
 * only clean pages can be dropped by a release. */
async function widerMoe(name: string, nLayers: number, seed: number) {
  const shape = { ...modelShapeByName("tiny-qwen3moe")!, name, nEmbd: 512, nLayers, nFfExp: 1024 };
  const path = join(dir, `${name}.gguf`);
  await generateModel({ shape, type: "Q8_0", out: path, pure: true, seed, weightStd: 0.05 });
  const fd = openSync(path, "r");
  fsyncSync(fd);
  closeSync(fd);
  return { shape, path };
}

it("a window short of room is not streamed: its routed experts stay in memory after a pass", async () => {
  // experts of 3 MiB a layer (tiny-qwen3moe's are too small for a drop, which works in 2 MiB blocks)
  const { path } = await widerMoe("moe-stream", 3, 5);
  const m = LocalModel.open(path, { threads: 2 });
  const w = m.window(0, m.nLayers, { ctx: 64 });
  try {
    const prompt = Int32Array.from({ length: 16 }, (_, i) => 1 + ((i * 37) % (m.nVocab - 1)));
    await w.forward(m.embed(prompt), 0, prompt.length, new Float32Array(m.nVocab));
    const before = w.residency().residentBytes;
    // no room: a dense window would drop each layer once computed (test/native/paging.test.ts);
    // here the page cache, not a drop after each pass, decides which experts stay (what Halda prices)
    w.streamBeyond(1);
    await w.forward(m.embed(prompt.subarray(0, 1)), prompt.length, 1, new Float32Array(m.nVocab));
    expect(w.residency().residentBytes).toBeGreaterThan(before * 0.9);
    expect(w.expertResidency().expertsResident).toBeGreaterThan(0);
  } finally {
    w.close();
    m.close();
  }
}, 120_000);

it("a window short of room reads each routed expert whole and no other: no read-around, no huge pages", async () => {
  const { shape, path } = await widerMoe("moe-routed", 2, 9);
  const m = LocalModel.open(path, { threads: 2 });
  const w = m.window(0, m.nLayers, { ctx: 64 });
  try {
    w.streamBeyond(1); // no room: the experts are read as routed
    w.release();
    expect(w.expertResidency().expertsResident).toBe(0);
    await w.forward(m.embed(Int32Array.of(7)), 0, 1, new Float32Array(m.nVocab));
    const routed = (w.info().expertHits ?? []).flat().filter((n) => n > 0).length;
    expect(routed).toBeGreaterThanOrEqual(shape.nExpertUsed!);
    // each routed expert's slices read whole (MADV_WILLNEED on them), hardly any of their neighbours
    // (at most one a layer, where the page cache's folio at a slice's edge completes one): with the
    // mapping's huge pages, all 16 were resident after this one token
    const { expertsResident, expertsTotal } = w.expertResidency();
    expect(expertsResident).toBeGreaterThanOrEqual(routed);
    expect(expertsResident).toBeLessThanOrEqual(routed + shape.nLayers);
    expect(expertsResident).toBeLessThan(expertsTotal);
  } finally {
    w.close();
    m.close();
  }
}, 120_000);

it("reports 0 of 0 experts for a dense window", () => {
  const m = LocalModel.open(dense, { threads: 2 });
  try {
    const w = m.window(0, m.nLayers, { ctx: 64 });
    expect(w.expertResidency()).toEqual({ expertsResident: 0, expertsTotal: 0 });
    expect(w.residency().totalBytes).toBeGreaterThan(0);
    w.close();
  } finally {
    m.close();
  }
});

/** VmFlags of the process's mappings of `path` (smaps): one string per mapping. */
function mappingFlags(path: string): string[] {
  const out: string[] = [];
  let mine = false;
  for (const line of readFileSync("/proc/self/smaps", "utf8").split("\n")) {
    if (/^[0-9a-f]+-[0-9a-f]+ /.test(line)) mine = line.endsWith(path);
    else if (mine && line.startsWith("VmFlags:")) out.push(line);
  }
  return out;
}

it("reads the experts without read-around (MADV_RANDOM) while the window does not fit its room", () => {
  const m = LocalModel.open(moe, { threads: 2 });
  const w = m.window(0, m.nLayers, { ctx: 64 });
  try {
    const random = () => mappingFlags(moe).some((f) => / rr( |$)/.test(f));
    // and without huge pages there: 2 MiB folios would read and keep several experts for one
    const noHuge = () => mappingFlags(moe).some((f) => / rr /.test(f) && / nh( |$)/.test(f));
    expect(mappingFlags(moe).length).toBeGreaterThan(0);
    expect(random()).toBe(false);
    w.streamBeyond(1);
    expect(random()).toBe(true);
    expect(noHuge()).toBe(true);
    w.streamBeyond(2 ** 52);
    expect(random()).toBe(false);
    expect(mappingFlags(moe).some((f) => / nh( |$)/.test(f))).toBe(false);
    w.expertsRandom(true); // pinned by the caller: streamBeyond leaves it
    w.streamBeyond(2 ** 52);
    expect(random()).toBe(true);
  } finally {
    w.close();
    m.close();
  }
});
