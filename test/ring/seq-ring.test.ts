// Sequence slots on a ring (serve --parallel's data plane): three devices in process (two "workers"
// and the head, each a RingNode holding a window per slot), every frame through the wire codec. The
// sequence scheduler over the ring's slots gives, for requests submitted together, exactly the tokens
// each gives alone on one device (engine SeqSlots, one slot): in groups whose passes are round the ring
// at once (one per device), and, with one group, sharing every decode step. The frame's tags survive the
// codec, and a hostile tag is refused by name. Past the context, a slot's cache shifts round the ring
// (a KV_SHIFT frame with its slot) beside the other slots' rows, and the tokens are one device's.
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LocalModel, Sampler, SeqSlots } from "../../engine/index.js";
import { Tokenizer } from "../../model/index.js";
import type { GenerationRequest } from "../../coordinator/request-run.js";
import { SequenceScheduler, type SequenceSlots } from "../../coordinator/parallel.js";
import { FrameError, RingNode, RingPipeline, RingSeqSlots, decodeFrame, encodeFrame, type RingFrame } from "../../ring/index.js";
import { root } from "../helpers/process.js";

let model: LocalModel;
let tok: Tokenizer;
beforeAll(() => {
  model = LocalModel.open(join(root, "models", "stories260K.gguf"), { threads: 1 });
  tok = Tokenizer.fromGguf(model.gguf);
});
afterAll(() => model.close());

const PROMPTS = ["Once upon a time", "The little dog", "Tim and Sue went to"];
const CTX = 128, BATCH = 8;
const limits = () => ({ hiddenSize: model.nEmbd, maxTokensPerFrame: BATCH, maxPayloadBytes: 1 << 20 });

function request(prompt: string): GenerationRequest {
  return {
    kind: "completion", prompt: Int32Array.from(tok.encode(prompt, { addSpecial: true })), maxTokens: 24, sampler: new Sampler({ temperature: 0 }),
    isEnd: (id) => tok.isEog(id), onToken: () => {},
  };
}

function scheduler(slots: SequenceSlots, steps: number[], inFlight: number[] = []): SequenceScheduler {
  const step = (n: number, f: number) => {
    steps.push(n);
    inFlight.push(f);
  };
  return new SequenceScheduler(slots, { maxQueue: 8, layers: model.nLayers, hooks: { token: () => {}, step, finished: () => {}, changed: () => {} } });
}

/** Two workers and the head in ring order, their layers split in three, frames encoded and decoded
 * on every hop; the head's pipeline over it. */
function ring(seqSlots: number, groups = 3, ctx = CTX) {
  const L = model.nLayers, cut = [0, Math.floor(L / 3), Math.floor((2 * L) / 3), L];
  const nodes: RingNode[] = [];
  const hop = (i: number) => async (f: RingFrame) => {
    const back = decodeFrame(encodeFrame(f), limits()) as RingFrame;
    queueMicrotask(() => nodes[(i + 1) % 3].receive(back));
  };
  const errors: string[] = [];
  let pipeline: RingPipeline | undefined;
  for (let i = 0; i < 3; i++) {
    const isHead = i === 2;
    nodes.push(new RingNode({
      model, windows: [{ firstLayer: cut[i], endLayer: cut[i + 1], cycle: 0 }], cycles: 1, ctx, maxBatch: BATCH, seqSlots,
      prefetch: false, releaseAfterUse: false, isHead, send: hop(i),
      onError: (m) => {
        errors.push(m);
        // as the ring's head does (coordinator/ring-setup.ts): a failed frame fails what waits for it
        if (isHead) pipeline!.fail(new Error(m));
      },
      ...(isHead ? {
        seqLogitsFor: (f) => pipeline!.seqLogitsFor(f),
        seqDeliver: (f, l) => void pipeline!.seqDeliver(f, l),
        shifted: (f) => pipeline!.shifted(f),
      } : {}),
    }));
  }
  pipeline = new RingPipeline({ model, node: nodes[2], nCtx: ctx, maxBatch: BATCH, wireDtype: "f32" });
  return { pipeline, nodes, errors, slots: new RingSeqSlots(model, pipeline, seqSlots, ctx, groups), close: () => Promise.all(nodes.map((n) => n.close())) };
}

describe("sequence slots on a ring", () => {
  it("requests submitted together go round the ring at once and each equals itself alone on one device", async () => {
    const alone: number[][] = [];
    {
      const local = new SeqSlots(model, 1, CTX, BATCH);
      const one = scheduler(local, []);
      for (const p of PROMPTS) alone.push((await one.submit(request(p))).result.ids);
      await one.close();
      local.close();
    }
    // one group: every request was prefilled before the first step, which carried all three round the ring
    {
      const r = ring(PROMPTS.length, 1);
      const steps: number[] = [];
      const s = scheduler(r.slots, steps);
      try {
        const outs = await Promise.all(PROMPTS.map((p) => s.submit(request(p))));
        outs.forEach((o, i) => expect(o.result.ids, PROMPTS[i]).toEqual(alone[i]));
        expect(steps[0]).toBe(PROMPTS.length);
      } finally {
        await s.close();
        await r.close();
      }
    }
    // a group per device: each request steps in its own, their passes round the ring at once
    const r = ring(PROMPTS.length);
    const steps: number[] = [], inFlight: number[] = [];
    const s = scheduler(r.slots, steps, inFlight);
    try {
      const outs = await Promise.all(PROMPTS.map((p) => s.submit(request(p))));
      outs.forEach((o, i) => expect(o.result.ids, PROMPTS[i]).toEqual(alone[i]));
      expect(alone.every((ids) => ids.length > 5)).toBe(true);
      expect(Math.max(...steps)).toBe(1);
      expect(Math.max(...inFlight)).toBeGreaterThanOrEqual(2);
      // a prompt longer than a frame goes in frames of the batch, the last one giving the logits
      const long = request(PROMPTS.join(" "));
      expect(long.prompt.length).toBeGreaterThan(BATCH);
      const longAlone = await (async () => {
        const local = new SeqSlots(model, 1, CTX, BATCH);
        const one = scheduler(local, []);
        try {
          return (await one.submit(request(PROMPTS.join(" ")))).result.ids;
        } finally {
          await one.close();
          local.close();
        }
      })();
      expect((await s.submit(long)).result.ids).toEqual(longAlone);
      expect(r.errors).toEqual([]);
    } finally {
      await s.close();
      await r.close();
    }
  });

  it("past the context, each slot's cache shifts round the ring beside the other's rows: the tokens one device gives", async () => {
    const ctx = 24;
    const long = (p: string): GenerationRequest => ({ ...request(p), maxTokens: 48, contextShift: { keep: 1 } });
    const alone: { ids: number[]; shifts: number }[] = [];
    {
      const local = new SeqSlots(model, 1, ctx, BATCH);
      const one = scheduler(local, []);
      for (const p of PROMPTS.slice(0, 2)) alone.push((await one.submit(long(p))).result);
      await one.close();
      local.close();
    }
    expect(alone.every((r) => r.shifts > 0 && r.ids.length > ctx)).toBe(true);
    const r = ring(2, 2, ctx);
    const s = scheduler(r.slots, []);
    try {
      const outs = await Promise.all(PROMPTS.slice(0, 2).map((p) => s.submit(long(p))));
      outs.forEach((o, i) => {
        expect(o.result.ids, PROMPTS[i]).toEqual(alone[i].ids);
        expect(o.result.shifts).toBe(alone[i].shifts);
      });
      expect(r.errors).toEqual([]);
    } finally {
      await s.close();
      await r.close();
    }
  });

  it("a slot a device does not hold fails the rows by name; the tags survive the codec and a hostile one is refused", async () => {
    const r = ring(2);
    try {
      const rows = model.embed(Int32Array.from([1, 2]));
      await expect(r.pipeline.forwardSeqs(Int32Array.from([0, 5]), Int32Array.from([0, 0]), rows)).rejects.toThrow();
      expect(r.errors.join("\n")).toMatch(/sequence slot 5 is not on this device \(it holds 2\)/);
    } finally {
      await r.close();
    }
    const f = { type: "seqActivations" as const, requestId: 7, nTokens: 2, cycle: 1, rowWidth: model.nEmbd, dtype: "f32" as const,
      slots: Int32Array.from([3, 0]), positions: Int32Array.from([41, 9]), activations: model.embed(Int32Array.from([1, 2])) };
    const back = decodeFrame(encodeFrame(f), limits());
    expect(back).toMatchObject({ type: "seqActivations", requestId: 7, nTokens: 2, cycle: 1 });
    if (back.type !== "seqActivations") throw new Error("not a seqActivations frame");
    expect([...back.slots, ...back.positions]).toEqual([3, 0, 41, 9]);
    expect(back.activations).toEqual(f.activations);
    const bad = encodeFrame(f);
    bad.writeUInt32LE(0xffffffff, 32 + 4); // row 0's position
    expect(() => decodeFrame(bad, limits())).toThrow(FrameError);
    expect(() => decodeFrame(bad, limits())).toThrow(/row 0's slot 3 or position 4294967295 is out of range/);
    // rows without their tags (as an ACTIVATIONS frame's payload): the length names what is missing
    const untagged = Buffer.from(encodeFrame(f).subarray(0, encodeFrame(f).length - 16));
    untagged.writeUInt32LE(untagged.length - 32, 28);
    expect(() => decodeFrame(untagged, limits())).toThrow(/is not 2 rows x \(8 tag bytes/);
    // a slot's context shift: its slot survives; one of every window has none; a hostile slot is refused
    const shift = { type: "kvShift" as const, requestId: 9, p0: 1, nDiscard: 11, nPast: 23 };
    expect(decodeFrame(encodeFrame({ ...shift, slot: 5 }), limits())).toEqual({ ...shift, slot: 5 });
    expect(decodeFrame(encodeFrame(shift), limits())).toEqual(shift);
    const hostile = encodeFrame({ ...shift, slot: 5 });
    hostile.writeUInt32LE(0xffffffff, 32 + 8);
    expect(() => decodeFrame(hostile, limits())).toThrow(/a kv shift's sequence slot 4294967295 is out of range/);
  });
});
