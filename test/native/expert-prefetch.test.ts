// Expert prefetch (native/src/expert_prefetch.h): a MoE layer's experts predicted with its router and
// advised to the OS before the layer computes. Checked on generated tiny MoE models: prediction never
// changes a result (logits bit-identical with it on and off, prompt and decode); given the router's own
// input ("exact") the prediction is the routing itself (every predicted expert routed, none missed);
// ahead of the attention (or a layer earlier) it reports its hit rate, and its counters add up
// against the routing.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LocalModel } from "../../engine/index.js";
import { modelShapeByName, Tokenizer } from "../../model/index.js";
import { generateModel } from "../../modelgen/index.js";
import type { ExpertPrefetchCounters, ExpertPrefetchMode } from "../../native/index.js";
import { coordinatorService } from "../../control/index.js";
import { RingNode, expertPrefetchStatus } from "../../ring/index.js";

const dir = mkdtempSync(join(tmpdir(), "prima-expert-prefetch-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const TEXT = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";
const DECODE = 12;
const models = new Map<string, string>();

beforeAll(async () => {
  for (const [shape, type] of [["tiny-qwen3moe", "F32"], ["tiny-qwen3moe", "Q8_0"], ["tiny-gpt-oss", "Q8_0"]]) {
    const out = join(dir, `${shape}-${type}.gguf`);
    await generateModel({ shape, type, out, pure: true, seed: 11, weightStd: 0.05 });
    models.set(`${shape} ${type}`, out);
  }
}, 120_000);

interface Run {
  logits: Float32Array[];
  counters: ExpertPrefetchCounters;
  /** Tokens routed to each expert, per layer (the routing itself). */
  hits: readonly (readonly number[])[];
}

/** The prompt in one batch, then DECODE greedy tokens one at a time, with the window's expert prefetch in `mode`. */
async function run(path: string, mode: ExpertPrefetchMode): Promise<Run> {
  const m = LocalModel.open(path, { threads: 2 });
  const w = m.window(0, m.nLayers, { ctx: 128 });
  w.expertPrefetch(mode);
  const prompt = Int32Array.from([1, ...Tokenizer.fromGguf(path).encode(TEXT)]);
  const logits: Float32Array[] = [];
  let out = new Float32Array(m.nVocab);
  await w.forward(m.embed(prompt), 0, prompt.length, out);
  logits.push(out);
  for (let i = 0; i < DECODE; i++) {
    const next = out.indexOf(Math.max(...out));
    out = new Float32Array(m.nVocab);
    await w.forward(m.embed(Int32Array.of(next)), prompt.length + i, 1, out);
    logits.push(out);
  }
  const info = w.info();
  w.close();
  m.close();
  return { logits, counters: info.expertPrefetch!, hits: info.expertHits! };
}

describe.each(["tiny-qwen3moe F32", "tiny-qwen3moe Q8_0", "tiny-gpt-oss Q8_0"])("%s", (name) => {
  it("prefetch never changes a result; exact prediction is the routing; ahead reports its hit rate", async () => {
    const path = models.get(name)!;
    const s = modelShapeByName(name.split(" ")[0])!;
    const K = s.nExpertUsed!, L = s.nLayers;
    const off = await run(path, "off");
    const ahead = await run(path, "ahead");
    const early = await run(path, "early");
    const exact = await run(path, "exact");
    for (const r of [ahead, early, exact]) {
      expect(r.logits.length).toBe(off.logits.length);
      r.logits.forEach((l, i) => expect(Buffer.from(l.buffer).equals(Buffer.from(off.logits[i].buffer)), `logits ${i}`).toBe(true));
      expect(r.hits).toEqual(off.hits);
    }
    expect(off.counters.layers).toBe(0);
    expect(off.counters.advisedBytes).toBe(0);
    // each pass predicts every MoE layer once: the prompt's pass and DECODE one-token passes
    for (const c of [ahead.counters, early.counters, exact.counters]) {
      expect(c.layers).toBe((1 + DECODE) * L);
      const each = c.advisedBytes / c.predicted;
      expect(Number.isInteger(each) && each > 0).toBe(true);
      expect(c.usedBytes).toBe(c.hits * each);
      expect(c.wastedBytes).toBe((c.predicted - c.hits) * each);
      // the experts routed to in each layer pass, once each: hits and misses together
      const routedPerLayer = off.hits.map((layer) => layer.filter((h) => h > 0).length);
      expect(c.hits + c.misses).toBeGreaterThanOrEqual(DECODE * L * K); // the decode passes' K each ...
      expect(c.hits + c.misses).toBeLessThanOrEqual(DECODE * L * K + routedPerLayer.reduce((a, b) => a + b, 0)); // ... and the prompt's
    }
    // given the router's own input, the predictor routes exactly as the layer
    expect(exact.counters.hits).toBe(exact.counters.predicted);
    expect(exact.counters.misses).toBe(0);
    expect(exact.counters.wastedBytes).toBe(0);
    const decodePredicted = DECODE * L * K;
    for (const [mode, r] of [["ahead", ahead], ["early", early]] as const) {
      const a = r.counters;
      console.log(`${name}: ${mode} hit rate ${(a.hits / a.predicted).toFixed(3)} (${a.hits}/${a.predicted} predicted experts routed, ` +
        `${a.misses} routed unpredicted; ${decodePredicted} of the predictions in decode; chance ${(K / s.nExpert!).toFixed(3)}), ` +
        `advised ${a.advisedBytes} B: used ${a.usedBytes}, wasted ${a.wastedBytes}`);
      expect(a.predicted).toBeGreaterThanOrEqual(decodePredicted);
    }
  });
});

it("a window without experts takes only off; a mode must be named", async () => {
  const m = LocalModel.open("models/stories260K.gguf", { threads: 1 });
  const w = m.window(0, m.nLayers, { ctx: 8 });
  expect(() => w.expertPrefetch("ahead")).toThrow(/no mixture-of-experts layer/);
  w.expertPrefetch("off");
  expect(w.info().expertPrefetch).toBeUndefined();
  expect(() => w.expertPrefetch("soon" as ExpertPrefetchMode)).toThrow(/"off", "ahead", "early" or "exact"/);
  w.close();
  m.close();
});

it("a ring device predicts experts only while its windows do not fit in memory", async () => {
  const path = models.get("tiny-qwen3moe F32")!;
  const m = LocalModel.open(path, { threads: 1 });
  let room = Infinity;
  const node = new RingNode({
    model: m, windows: [{ firstLayer: 0, endLayer: m.nLayers, cycle: 0 }], cycles: 1, ctx: 16, maxBatch: 4,
    prefetch: true, expertPrefetch: true, weightRoomBytes: () => room, releaseAfterUse: false, isHead: true,
    send: async () => {}, onError: () => {},
  });
  const w = node.windows[0];
  const pass = async (pos: number) => {
    node.updateExpertPrefetch();
    await w.forward(m.embed(Int32Array.of(1)), pos, 1);
    return w.info().expertPrefetch!.layers;
  };
  expect(await pass(0)).toBe(0); // fits: nothing to read ahead
  room = node.weightBytes - 1;
  expect(await pass(1)).toBe(m.nLayers);
  room = node.weightBytes;
  expect(await pass(2)).toBe(m.nLayers); // fits again: off
  // a device's Status carries the window's counters to the coordinator (protos/prima.proto)
  const c = w.info().expertPrefetch!;
  const xp = expertPrefetchStatus(w);
  expect(xp).toEqual({ expertsPredicted: c.predicted, expertsRouted: c.hits, expertBytesUsed: c.usedBytes, expertBytesWasted: c.wastedBytes });
  expect(xp.expertsPredicted).toBe(m.nLayers * modelShapeByName("tiny-qwen3moe")!.nExpertUsed!);
  const session = coordinatorService().Session;
  const window = { firstLayer: 0, endLayer: m.nLayers, cycle: 0, residentBytes: 0, totalBytes: 0, frames: 0, tokens: 0, computeMs: 0, majorFaults: 0, ...xp };
  const back = session.requestDeserialize(session.requestSerialize({ status: { windows: [window], waitMs: 0, sendMs: 0, anonRssBytes: 0, memTotalBytes: 0 } })) as { status: { windows: typeof window[] } };
  expect(back.status.windows[0]).toMatchObject(xp);
  node.close();
  m.close();
});
