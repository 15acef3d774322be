// Parallel sequences (issue #32): a decode step of N sequences in one pass over the weights gives each
// sequence exactly what it gets decoded alone, token for token and logits bit for bit, with sequences
// joining and leaving between steps. Attention stays per sequence (its own KV cache); the matmuls take
// the N rows together, and are batch-invariant (batch-equality.test.ts).
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { LocalModel, SeqSlots, argmax } from "../../engine/index.js";
import { modelShapeByName, type KvCacheTypes, type ModelShape } from "../../model/index.js";
import { generatedModel } from "../helpers/models.js";
import { root } from "../helpers/process.js";


const SHAPE: ModelShape = {
  name: "wide-llama", arch: "llama", nEmbd: 1024, nLayers: 2, nHead: 8, nHeadKv: 2, nFf: 2048, nVocab: 512,
  tiedEmbeddings: false, qkvBias: false, contextLength: 512, ropeFreqBase: 10000, normEps: 1e-5, defaultVocab: "stories260K",
};
const MOE_SHAPE: ModelShape = { ...SHAPE, name: "wide-qwen3moe", arch: "qwen3moe", headDim: 128, nFf: 1024, nExpert: 8, nExpertUsed: 2, nFfExp: 512 };

const PROMPTS = [
  [1, 403, 407, 261, 378, 432, 383, 286, 261],
  [1, 376, 298, 315],
  [1, 421, 395, 317, 426, 300, 311, 270, 403, 407, 261, 378],
  [1, 286],
];
/** Steps each sequence decodes; the shorter ones leave while the others go on. */
const STEPS = [12, 7, 10, 12];
/** The step at which each sequence joins (0: from the start). */
const JOIN = [0, 0, 3, 5];

interface Seq { ids: number[]; logits: Float32Array[] }

/** Each prompt alone in its own window, decoded greedily one token at a time. */
async function alone(m: LocalModel, prompt: number[], steps: number, kvCacheTypes?: KvCacheTypes): Promise<Seq> {
  const w = m.window(0, m.nLayers, { ctx: 64, kvCacheTypes });
  const out: Seq = { ids: [], logits: [] };
  try {
    const logits = new Float32Array(m.nVocab);
    await w.forward(m.embed(Int32Array.from(prompt)), 0, prompt.length, logits);
    let pos = prompt.length;
    for (let s = 0; s < steps; s++) {
      out.logits.push(logits.slice());
      const id = argmax(logits);
      out.ids.push(id);
      await w.forward(m.embed(Int32Array.of(id)), pos++, 1, logits);
    }
  } finally {
    w.close();
  }
  return out;
}

/** All of them through four slots: each joins at its step (its prompt prefilled alone), then every
 * active sequence's next token goes through one shared pass per step until it has its steps. */
async function together(m: LocalModel, kvCacheTypes?: KvCacheTypes): Promise<{ seqs: Seq[]; widest: number }> {
  const slots = new SeqSlots(m, 4, 64, 128, undefined, kvCacheTypes);
  const seqs: Seq[] = PROMPTS.map(() => ({ ids: [], logits: [] }));
  const state: { pos: number; next: number }[] = [];
  let widest = 0;
  try {
    for (let step = 0; seqs.some((s, i) => s.ids.length < STEPS[i]); step++) {
      for (let i = 0; i < PROMPTS.length; i++) {
        if (JOIN[i] !== step) continue;
        const l = await slots.prefill(i, Int32Array.from(PROMPTS[i]), 0);
        seqs[i].logits.push(l.slice());
        seqs[i].ids.push(argmax(l));
        state[i] = { pos: PROMPTS[i].length, next: seqs[i].ids[0] };
      }
      const active = PROMPTS.map((_, i) => i).filter((i) => state[i] && seqs[i].ids.length < STEPS[i]);
      if (active.length === 0) continue;
      widest = Math.max(widest, active.length);
      const out = await slots.step(active.map((i) => ({ slot: i, token: state[i].next, pos: state[i].pos })));
      active.forEach((i, k) => {
        const l = out[k];
        if (!(l instanceof Float32Array)) throw l;
        state[i].pos++;
        if (seqs[i].ids.length < STEPS[i]) {
          seqs[i].logits.push(l.slice());
          state[i].next = argmax(l);
          seqs[i].ids.push(state[i].next);
        }
      });
    }
  } finally {
    slots.close();
  }
  return { seqs, widest };
}

function bits(a: Float32Array): Uint32Array { return new Uint32Array(a.buffer, a.byteOffset, a.length); }
function firstDiff(a: Float32Array, b: Float32Array): number {
  const x = bits(a), y = bits(b);
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return i;
  return -1;
}

async function check(path: string, kvCacheTypes?: KvCacheTypes): Promise<void> {
  const m = LocalModel.open(path, { threads: 2 });
  try {
    const { seqs, widest } = await together(m, kvCacheTypes);
    expect(widest).toBe(4);
    for (let i = 0; i < PROMPTS.length; i++) {
      const a = await alone(m, PROMPTS[i], STEPS[i], kvCacheTypes);
      expect(seqs[i].ids, `sequence ${i}: greedy ids`).toEqual(a.ids);
      seqs[i].logits.forEach((l, s) => expect(firstDiff(l, a.logits[s]), `sequence ${i}, token ${s}: first differing logit`).toBe(-1));
    }
  } finally {
    m.close();
  }
}

describe("parallel sequences: a shared decode step equals each sequence alone, bit for bit", () => {
  it.each(["Q4_K_M", "Q8_0", "F16"])("llama %s", async (type) => {
    const out = await generatedModel({ shape: SHAPE, type, pure: true, seed: 5 });
    await check(out);
  }, 60_000);

  // quantized KV caches (--cache-type-k/-v), plain and rotated: each sequence's rows go to its own cache
  it.each([[{ k: "q8_0", v: "q4_0" }], [{ k: "q4_0-rot", v: "q8_0-rot" }]] as [KvCacheTypes][])("llama Q8_0, KV cache %o", async (types) => {
    const out = await generatedModel({ shape: SHAPE, type: "Q8_0", pure: true, seed: 5 });
    await check(out, types);
  }, 60_000);

  it("mixture of experts, Q4_K_M", async () => {
    const out = await generatedModel({ shape: MOE_SHAPE, type: "Q4_K_M", pure: true, seed: 5 });
    await check(out);
  }, 60_000);

  // soft caps (gemma2), sliding windows with their own RoPE (gemma3), QKV biases (qwen2), experts
  it.each(["tiny-gemma2", "tiny-gemma3", "tiny-qwen2", "tiny-mixtral"])("%s Q8_0", async (name) => {
    const out = await generatedModel({ shape: modelShapeByName(name), type: "Q8_0", pure: true, seed: 5 });
    await check(out);
  }, 60_000);

  // sinks, biases, YaRN, windows and MXFP4 experts (gpt-oss's release mix)
  it("tiny-gpt-oss MXFP4_MOE", async () => {
    const out = await generatedModel({ shape: "tiny-gpt-oss", type: "MXFP4_MOE", seed: 5 });
    await check(out);
  }, 60_000);

  it("stories260K", async () => {
    await check(join(root, "models", "stories260K.gguf"));
  }, 60_000);

  it("bad input is an error, never a crash", async () => {
    const m = LocalModel.open(join(root, "models", "stories260K.gguf"), { threads: 2 });
    const a = m.window(0, m.nLayers, { ctx: 16, maxBatch: 4 }), b = m.window(0, m.nLayers, { ctx: 16, maxBatch: 4 });
    const short = m.window(0, m.nLayers, { ctx: 8, maxBatch: 4 });
    try {
      const acts = new Float32Array(2 * m.nEmbd);
      await expect(a.forwardSeqs([a, a], acts, Int32Array.of(0, 0))).rejects.toThrow(/share a window/);
      await expect(a.forwardSeqs([a, b], acts, Int32Array.of(0, 3))).rejects.toThrow(/gap/);
      await expect(a.forwardSeqs([a, short], acts, Int32Array.of(0, 0))).rejects.toThrow(/same model, layers and context/);
      expect(() => a.forwardSeqs([a, b], acts, Int32Array.of(0))).toThrow(/one position per window/);
      expect(() => a.forwardSeqs([a, {} as never], acts, Int32Array.of(0, 0))).toThrow(/not a NativeWindow/);
      expect(() => a.forwardSeqs([], acts, Int32Array.of())).toThrow(/from 1 to 4/);
      expect(() => a.forwardSeqs([a, b], new Float32Array(3), Int32Array.of(0, 0))).toThrow(/one row per window/);
      expect(() => a.forwardSeqs([a, b], acts, Int32Array.of(0, 0), new Float32Array(5))).toThrow(/logits/);
      expect(() => new SeqSlots(m, 0, 16)).toThrow(RangeError);
      // after the refusals both still step
      await a.forwardSeqs([a, b], acts, Int32Array.of(0, 0));
      expect([a.info().filled, b.info().filled]).toEqual([1, 1]);
    } finally {
      a.close();
      b.close();
      short.close();
      m.close();
    }
  });
});
