// Every family prima runs (model/arch/), against llama.cpp on generated models of its tiny shape:
// prompt ids equal, the logits at every prompt position within the oracle's tolerances (and so the
// top-5), and the greedy continuation equal token for token (a difference only at a near tie, with
// its margin printed). tiny-gemma3 slides a 4-token window on 2 of its 3 layers: the prompt and the
// continuation run far past it. The mixture-of-experts shapes (qwen3moe, Mixtral, gpt-oss) also show
// their routers sending the prompt's tokens to different experts. tiny-gpt-oss adds attention sinks,
// biases, YaRN, a 4-token window on 2 of 3 layers, the clamped SwiGLU, top-k-then-softmax routing and
// MXFP4 experts (its release file type, MXFP4_MOE).
import type { Llama } from "node-llama-cpp";
import { beforeAll, describe, expect, it } from "vitest";
import { LocalModel, LocalPipeline, Sampler, generate } from "../../engine/index.js";
import { Tokenizer, modelShapeByName, supportedArchitectures } from "../../model/index.js";
import { generatedModel } from "../helpers/models.js";
import { TOL_FIRST_POSITION, agreement, compare, loadOracle, oracleLogits, ourLogits } from "./oracle-harness.js";

let llama: Llama;

beforeAll(async () => {
  llama = await loadOracle();
}, 60_000);

const TEXT = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends.";
const GREEDY_TOKENS = 16;

/** Our greedy continuation of the prompt. */
async function ourGreedy(path: string, prompt: Int32Array): Promise<number[]> {
  const m = LocalModel.open(path, { threads: 2 });
  const pipe = new LocalPipeline(m, 128);
  const res = await generate(m, pipe, prompt, { maxTokens: GREEDY_TOKENS, sampler: new Sampler({ temperature: 0 }), isEnd: () => false });
  pipe.close();
  m.close();
  return res.ids;
}

const cases: [shape: string, type: string, pure: boolean][] = [
  ["tiny-qwen3", "F32", true],
  ["tiny-qwen3", "Q8_0", true],
  ["tiny-qwen3", "Q4_K_M", false],
  ["tiny-gemma2", "F32", true],
  ["tiny-gemma2", "Q4_K_M", false],
  ["tiny-gemma3", "F32", true],
  ["tiny-gemma3", "Q8_0", true],
  ["tiny-gemma3", "Q4_K_M", false],
  ["tiny-mistral3", "Q8_0", true],
  ["tiny-phi3", "F32", true],
  ["tiny-phi3", "Q8_0", true],
  ["tiny-phi3", "Q4_K_M", false],
  ["tiny-qwen3moe", "F32", true],
  ["tiny-qwen3moe", "Q8_0", true],
  ["tiny-qwen3moe", "Q4_K_M", false],
  ["tiny-mixtral", "F32", true],
  ["tiny-mixtral", "Q8_0", true],
  ["tiny-mixtral", "Q4_K_M", false],
  ["tiny-gpt-oss", "F32", true],
  ["tiny-gpt-oss", "Q8_0", true],
  ["tiny-gpt-oss", "MXFP4_MOE", false],
];

describe("mixture-of-experts routing is not degenerate", () => {
  it.each(["tiny-qwen3moe", "tiny-mixtral", "tiny-gpt-oss"])("%s: the prompt's tokens go to different experts, k each", async (shape) => {
    const out = await generatedModel({ shape, type: "F32", pure: true, seed: 7, weightStd: 0.05 });
    const prompt = Int32Array.from([1, ...Tokenizer.fromGguf(out).encode(TEXT)]);
    const m = LocalModel.open(out, { threads: 2 });
    const w = m.window(0, m.nLayers, { ctx: 64 });
    await w.forward(m.embed(prompt), 0, prompt.length);
    const hits = w.info().expertHits!;
    const s = modelShapeByName(shape)!;
    expect(hits.length).toBe(s.nLayers);
    for (const layer of hits) {
      expect(layer.length).toBe(s.nExpert);
      expect(layer.reduce((a, b) => a + b, 0)).toBe(prompt.length * s.nExpertUsed!);
      // more experts than one token uses: different tokens chose different experts
      expect(layer.filter((h) => h > 0).length).toBeGreaterThan(s.nExpertUsed!);
    }
    w.close();
    m.close();
  });
});

describe("every family agrees with llama.cpp", () => {
  it("each supported family has a case here", () => {
    // llama and qwen2 are test/engine/oracle.test.ts's
    const tested = new Set(["llama", "qwen2", ...cases.map(([shape]) => modelShapeByName(shape)!.arch)]);
    for (const a of supportedArchitectures) expect(tested.has(a), `${a} has no case`).toBe(true);
  });

  it.each(cases)("%s %s", async (shape, type, pure) => {
    const out = await generatedModel({ shape, type, pure, seed: 7, weightStd: 0.05 });

    const theirModel = await llama.loadModel({ modelPath: out, gpuLayers: 0 });
    const theirIds = Array.from(theirModel.tokenize(TEXT));
    await theirModel.dispose();
    const ourIds = Array.from(Tokenizer.fromGguf(out).encode(TEXT));
    expect(ourIds, "prompt ids").toEqual(theirIds);
    const prompt = [1, ...ourIds];

    const { first, firstFlash, noise, tol, all } = await agreement(llama, out, prompt);
    const sinks = modelShapeByName(shape)!.arch === "gpt-oss";
    expect((sinks ? firstFlash : first).maxRelErr, "first position: kernels and formats alone").toBeLessThan(TOL_FIRST_POSITION);
    expect(all.top1Mismatches, `top-1 differs at positions ${all.top1Mismatches.join(",")} (tolerance ${tol})`).toEqual([]);
    expect(all.maxRelErr, `llama.cpp's own flash-attention noise is ${noise}`).toBeLessThan(tol);

    // greedy: llama.cpp, fed the prompt and our continuation in one batch, picks our token at each step
    const ours = await ourGreedy(out, Int32Array.from(prompt));
    expect(ours.length).toBe(GREEDY_TOKENS);
    const seq = [...prompt, ...ours];
    const ref = await oracleLogits(llama, out, seq, false);
    for (let k = 0; k < GREEDY_TOKENS; k++) {
      const r = ref[prompt.length - 1 + k];
      let best = 0, min = Infinity;
      for (let i = 0; i < r.length; i++) {
        if (r[i] > r[best]) best = i;
        min = Math.min(min, r[i]);
      }
      if (best === ours[k]) continue;
      const margin = (r[best] - r[ours[k]]) / (r[best] - min);
      console.log(`${shape} ${type}: greedy step ${k} differs at a margin of ${margin} of the logit spread (tolerance ${tol})`);
      expect(margin, `greedy step ${k}: llama.cpp picks ${best}, we ${ours[k]}`).toBeLessThan(tol);
    }
    const withContinuation = compare(await ourLogits(out, seq), ref, tol);
    expect(withContinuation.maxRelErr, "logits over the prompt and the continuation").toBeLessThan(tol);
  }, 120_000);
});
