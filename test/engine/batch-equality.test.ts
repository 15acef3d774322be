// A token's hidden state must not depend on how it went through the layers: alone (decode, the rows
// kernels) or inside a prompt batch (the nc-row dots). The prompt cache reuses the KV cache of tokens
// generated one at a time where a cold run computes the same positions in a batch, and failover replays
// generated tokens as a batch: greedy output must be the same. Generated models whose rows span several
// super-blocks (1024 and 2048 wide), every weight type, every matrix that type (--pure).
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { LocalModel } from "../../engine/index.js";
import { modelShapeByName, type ModelShape } from "../../model/index.js";
import { generatedModel } from "../helpers/models.js";
import { killAll, root, startProcess } from "../helpers/process.js";

afterEach(killAll);

const SHAPE: ModelShape = {
  name: "wide-llama", arch: "llama", nEmbd: 1024, nLayers: 2, nHead: 8, nHeadKv: 2, nFf: 2048, nVocab: 512,
  tiedEmbeddings: false, qkvBias: false, contextLength: 512, ropeFreqBase: 10000, normEps: 1e-5, defaultVocab: "stories260K",
};
const PROMPT = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 300, 311, 270];
const GENERATE = 10;

// Experts: a token's pass must not depend on which other tokens its experts ran with either (an
// expert's matmul takes a batch of the tokens routed to it, one alone in decode).
const MOE_SHAPE: ModelShape = {
  ...SHAPE, name: "wide-qwen3moe", arch: "qwen3moe", headDim: 128, nFf: 1024, nExpert: 8, nExpertUsed: 2, nFfExp: 512,
};

// gpt-oss: sinks, biases, YaRN, a window on two of three layers, MXFP4 experts (MXFP4_MOE, not pure).
const GPT_OSS_SHAPE: ModelShape = { ...modelShapeByName("tiny-gpt-oss")!, name: "wide-gpt-oss", nEmbd: 1024, nFfExp: 512, nFf: 512 };

function model(type: string, shape: ModelShape = SHAPE): Promise<string> {
  return generatedModel({ shape, type, pure: type !== "MXFP4_MOE", seed: 5 });
}

interface Run {
  ids: number[];
  /** the hidden state of every position after the last layer, prompt and generated */
  hidden: Float32Array[];
  logits: Float32Array[];
}

/** The prompt in batches of `batch` tokens (1: every token alone), then greedy decode token by token. */
async function run(m: LocalModel, batch: number): Promise<Run> {
  const w = m.window(0, m.nLayers, { ctx: 64, maxBatch: batch });
  const E = m.nEmbd;
  const hidden: Float32Array[] = [], logits: Float32Array[] = [], ids: number[] = [];
  try {
    const acts = m.embed(Int32Array.from(PROMPT));
    await w.forward(acts, 0, PROMPT.length); // splits into max_batch pieces itself
    for (let i = 0; i < PROMPT.length; i++) hidden.push(acts.slice(i * E, (i + 1) * E));
    let last = hidden[hidden.length - 1];
    for (let s = 0; s < GENERATE; s++) {
      const l = await m.logits(last);
      logits.push(l);
      let best = 0;
      for (let i = 1; i < l.length; i++) if (l[i] > l[best]) best = i;
      ids.push(best);
      const row = m.embed(Int32Array.of(best));
      await w.forward(row, PROMPT.length + s, 1);
      hidden.push(row);
      last = row;
    }
  } finally {
    w.close();
  }
  return { ids, hidden, logits };
}

function bits(a: Float32Array): Uint32Array { return new Uint32Array(a.buffer, a.byteOffset, a.length); }
function firstDiff(a: Float32Array, b: Float32Array): number {
  const x = bits(a), y = bits(b);
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return i;
  return -1;
}

describe("decode equals batch, bit for bit", () => {
  const TYPES = ["Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "IQ4_XS", "F16", "BF16", "F32"];
  it.each(TYPES)("%s: every position's hidden state and logits alone = in batches of 128 and of 7", async (type) => {
    const m = LocalModel.open(await model(type), { threads: 2 });
    try {
      const alone = await run(m, 1);
      for (const batch of [128, 7]) {
        const got = await run(m, batch);
        expect(got.ids, `${type} batch ${batch}: generated ids`).toEqual(alone.ids);
        got.hidden.forEach((h, p) => expect(firstDiff(h, alone.hidden[p]), `${type} batch ${batch}: position ${p}, first differing element`).toBe(-1));
        got.logits.forEach((l, s) => expect(firstDiff(l, alone.logits[s]), `${type} batch ${batch}: logits of step ${s}`).toBe(-1));
      }
    } finally {
      m.close();
    }
  }, 60_000);

  it.each([["Q4_K_M", MOE_SHAPE], ["Q8_0", MOE_SHAPE], ["F16", MOE_SHAPE], ["MXFP4_MOE", GPT_OSS_SHAPE]] as const)("mixture of experts, %s: alone = in batches of 128 and of 7", async (type, shape) => {
    const m = LocalModel.open(await model(type, shape), { threads: 2 });
    try {
      const alone = await run(m, 1);
      for (const batch of [128, 7]) {
        const got = await run(m, batch);
        expect(got.ids, `${type} batch ${batch}: generated ids`).toEqual(alone.ids);
        got.hidden.forEach((h, p) => expect(firstDiff(h, alone.hidden[p]), `${type} batch ${batch}: position ${p}, first differing element`).toBe(-1));
      }
    } finally {
      m.close();
    }
  }, 60_000);

  // The user-facing form, at each SIMD level this CPU runs (the level is chosen once per process).
  it("run -b 1 and run -b 128 generate the same ids at every SIMD level (Q4_K_M, Q5_K_M)", async () => {
    const { simdLevels } = await import("../../native/kernels.js");
    for (const type of ["Q4_K_M", "Q5_K_M"]) {
      const path = await model(type);
      for (const level of simdLevels()) {
        const ids: number[][] = [];
        for (const b of ["1", "128"]) {
          const p = startProcess(process.execPath, [join(root, "dist", "coordinator", "cli.js"), "run", path, "-p",
            "Once upon a time there was a fox and a rabbit who lived", "-n", "12", "--temp", "0", "--json", "-b", b, "--ctx", "128",
            "--threads", "2"], { PRIMA_SIMD: level });
          expect(await p.exited, p.stderr).toBe(0);
          ids.push(JSON.parse(p.stdout).generated_ids);
        }
        expect(ids[1], `${type} at ${level}: -b 128 against -b 1`).toEqual(ids[0]);
      }
    }
  }, 120_000);
});
