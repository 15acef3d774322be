// The scheduler of serve --parallel (coordinator/parallel.ts) on a real model, in process: requests
// submitted together share every decode step, each answer equals the same request alone, the queue
// counts only requests beyond the free slots, a client leaving the queue frees its place, a request
// continues from the slot holding its prefix, unless its sliding-window layers' rings no longer hold it.
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LocalModel, Sampler, SeqSlots } from "../../engine/index.js";
import { Tokenizer } from "../../model/index.js";
import type { GenerationRequest } from "../../coordinator/request-run.js";
import { CancelledError, QueueFullError } from "../../coordinator/queue.js";
import { SequenceScheduler } from "../../coordinator/parallel.js";
import { generateModel } from "../../modelgen/index.js";
import { root } from "../helpers/process.js";
import { tempDir } from "../helpers/temp.js";

let model: LocalModel;
let tok: Tokenizer;
beforeAll(() => {
  model = LocalModel.open(join(root, "models", "stories260K.gguf"), { threads: 1 });
  tok = Tokenizer.fromGguf(model.gguf);
});
afterAll(() => model.close());

const PROMPTS = ["Once upon a time", "The little dog", "Tim and Sue went to", "One day, a bird"];

function scheduler(size: number, maxQueue: number) {
  const slots = new SeqSlots(model, size, 256, 8);
  const steps: number[] = [];
  const s = new SequenceScheduler(slots, {
    maxQueue, layers: model.nLayers,
    hooks: { token: () => {}, step: (rows) => steps.push(rows), finished: () => {}, changed: () => {} },
  });
  return { s, slots, steps, close: async () => { await s.close(); slots.close(); } };
}

function request(prompt: string, extra: Partial<GenerationRequest> = {}): GenerationRequest & { tokens: number[] } {
  const tokens: number[] = [];
  return {
    kind: "completion", prompt: Int32Array.from(tok.encode(prompt, { addSpecial: true })), maxTokens: 30, sampler: new Sampler({ temperature: 0 }),
    isEnd: (id) => tok.isEog(id), onToken: (id) => void tokens.push(id), tokens, ...extra,
  };
}

describe("the sequence scheduler", () => {
  it("requests submitted together share every step and each equals itself alone", async () => {
    const alone: number[][] = [];
    {
      const one = scheduler(1, 8);
      for (const p of PROMPTS) alone.push((await one.s.submit(request(p))).result.ids);
      await one.close();
      expect(one.steps.every((n) => n === 1)).toBe(true);
    }
    const four = scheduler(4, 0);
    const outs = await Promise.all(PROMPTS.map((p) => four.s.submit(request(p))));
    outs.forEach((o, i) => expect(o.result.ids, PROMPTS[i]).toEqual(alone[i]));
    // all four were prefilled before the first step: it took them all
    expect(four.steps[0]).toBe(4);
    // a prompt that extends a slot's tokens continues from that slot's cache
    const first = request(PROMPTS[2]).prompt, ids = outs[2].result.ids;
    const again = await four.s.submit({ ...request(""), prompt: Int32Array.from([...first, ...ids.slice(0, 5)]) });
    expect(again.cachedTokens).toBe(first.length + 4);
    expect(again.result.ids.slice(0, ids.length - 5)).toEqual(ids.slice(5));
    await four.close();
  });

  it("queues beyond the free slots only, and a client leaving the queue frees its place", async () => {
    const two = scheduler(2, 1);
    const a = two.s.submit(request(PROMPTS[0])), b = two.s.submit(request(PROMPTS[1]));
    const leaving = new AbortController();
    const c = two.s.submit(request(PROMPTS[2], { signal: leaving.signal }));
    await expect(two.s.submit(request(PROMPTS[3]))).rejects.toBeInstanceOf(QueueFullError);
    leaving.abort();
    await expect(c).rejects.toBeInstanceOf(CancelledError);
    const d = two.s.submit(request(PROMPTS[3])); // its place again
    const [ra, rb, rd] = await Promise.all([a, b, d]);
    expect([ra, rb, rd].every((r) => r.result.ids.length > 0)).toBe(true);
    await two.close();
  });

  it("a request that cannot run fails alone; the others go on", async () => {
    const two = scheduler(2, 4);
    const ok = two.s.submit(request(PROMPTS[0]));
    const empty = two.s.submit({ ...request(PROMPTS[1]), prompt: new Int32Array(0) });
    const long = two.s.submit({ ...request(PROMPTS[1]), prompt: new Int32Array(300).fill(1) });
    await expect(empty).rejects.toThrow(/no tokens/);
    await expect(long).rejects.toThrow(/does not fit the context/);
    expect((await ok).result.ids.length).toBeGreaterThan(0);
    await two.close();
  });
});

describe("a slot whose sliding-window layers no longer hold the prefix", () => {
  // tiny-gemma3: 4-token windows, slots of batch 4, so each ring keeps 8 rows
  const dir = tempDir("prima-parallel-swa-");
  let gemma: LocalModel;
  beforeAll(async () => {
    const path = join(dir, "tiny-gemma3.gguf");
    await generateModel({ shape: "tiny-gemma3", type: "F32", out: path, pure: true, seed: 7, weightStd: 0.05 });
    gemma = LocalModel.open(path, { threads: 1 });
  }, 60_000);
  afterAll(() => gemma?.close());

  it("runs the prompt again from its start, and answers as a fresh slot does", async () => {
    const run = async (prompts: Int32Array[]) => {
      const slots = new SeqSlots(gemma, 1, 128, 4);
      const s = new SequenceScheduler(slots, { maxQueue: 4, layers: gemma.nLayers, hooks: { token: () => {}, step: () => {}, finished: () => {}, changed: () => {} } });
      const outs = [];
      for (const prompt of prompts) outs.push(await s.submit({ ...request(""), prompt, maxTokens: 30, isEnd: () => false }));
      await s.close();
      slots.close();
      return outs;
    };
    const first = Int32Array.from([1, 30, 40, 50, 60, 70]);
    const second = Int32Array.from([1, 30, 40, 50, 60, 71, 72]); // shares 5 tokens, 30 positions before the cache's end
    const [, after] = await run([first, second]);
    expect(after.cachedTokens).toBe(0);
    const [alone] = await run([second]);
    expect(after.result.ids).toEqual(alone.result.ids);
  }, 60_000);
});
