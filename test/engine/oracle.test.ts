// llama.cpp (through node-llama-cpp) as the live oracle: it loads models our generator writes, in
// every weight type and in llama and qwen2 shapes, and its logits at every prompt position must
// agree with ours. This checks our GGUF writer, our quantizers and our kernels against llama.cpp's.
import { join } from "node:path";
import type { Llama } from "node-llama-cpp";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { LocalModel, LocalPipeline, Sampler, generate } from "../../engine/index.js";
import { Tokenizer } from "../../model/index.js";
import { simdLevels } from "../../native/index.js";
import { generatedModel } from "../helpers/models.js";
import { killAll, root, startNode } from "../helpers/process.js";
import { TOL_FIRST_POSITION, TOL_FLOOR, ORACLE_THREADS, agreement, firstPositionTolerance, compare, loadOracle, oracleLogits, ourLogits } from "./oracle-harness.js";

let llama: Llama;

beforeAll(async () => {
  llama = await loadOracle();
}, 60_000);
afterEach(() => killAll());

/** A fixed prompt of vocabulary ids (BOS first), long enough to exercise attention over positions. */
const PROMPT = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426];

const llamaTypes = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"];

describe("llama.cpp agrees with us on generated models", () => {
  const cases: [shape: string, type: string, pure: boolean][] = [
    ...llamaTypes.map((t) => ["tiny-llama", t, true] as [string, string, boolean]),
    ["small-llama", "Q4_K_M", false],
    ["small-llama", "Q5_K_S", false],
    ["small-llama", "IQ4_XS", false],
    ["tiny-qwen2", "F32", true],
    ["tiny-qwen2", "Q8_0", true],
    ["tiny-qwen2", "Q4_K_M", false],
  ];
  it.each(cases)("%s %s", async (shape, type, pure) => {
    const out = await generatedModel({ shape, type, pure, seed: 7, weightStd: 0.05 });
    const { first, noise, tol, all } = await agreement(llama, out, PROMPT);
    expect(first.maxRelErr, "first position: kernels and formats alone").toBeLessThan(firstPositionTolerance(type, tol));
    expect(all.top1Mismatches, `top-1 differs at positions ${all.top1Mismatches.join(",")} (tolerance ${tol})`).toEqual([]);
    expect(all.maxRelErr, `llama.cpp's own flash-attention noise is ${noise}`).toBeLessThan(tol);
  }, 60_000);
});

/** llama.cpp's greedy continuation of the prompt (temperature 0: the argmax at every step). */
async function oracleGreedy(path: string, prompt: readonly number[], n: number): Promise<number[]> {
  const model = await llama.loadModel({ modelPath: path, gpuLayers: 0 });
  const context = await model.createContext({ contextSize: 64, batchSize: 64, threads: ORACLE_THREADS });
  try {
    const out: number[] = [];
    for await (const t of context.getSequence().evaluate(prompt as never, { temperature: 0 })) {
      out.push(t);
      if (out.length >= n) break;
    }
    return out;
  } finally {
    await context.dispose();
    await model.dispose();
  }
}

describe("the IQ4 types end to end: a text prompt, its logits and its greedy continuation", () => {
  const TEXT = "Once upon a time there was a little girl who";
  const GREEDY = 24;
  it.each([["tiny-llama", "IQ4_NL", true], ["tiny-llama", "IQ4_XS", true], ["tiny-llama", "IQ4_XS", false]] as const)(
    "%s %s (pure %s)", async (shape, type, pure) => {
      const out = await generatedModel({ shape, type, pure, seed: 3, weightStd: 0.05 });
      // prompt ids: our tokenizer against llama.cpp's
      const theirsModel = await llama.loadModel({ modelPath: out, gpuLayers: 0 });
      const theirText = Array.from(theirsModel.tokenize(TEXT), Number);
      const bos = theirsModel.tokens.bos;
      await theirsModel.dispose();
      const tokenizer = Tokenizer.fromGguf(out);
      expect(Array.from(tokenizer.encode(TEXT))).toEqual(theirText);
      expect(bos).toBe(tokenizer.bos);
      const ids = Array.from(tokenizer.encode(TEXT, { addSpecial: true }));
      expect(ids).toEqual([bos, ...theirText]);

      // the five best logits of llama.cpp at every prompt position, within the tolerance of the test above
      const ref = await oracleLogits(llama, out, ids, false);
      const noise = compare(await oracleLogits(llama, out, ids, true), ref, 0).maxRelErr;
      const tol = Math.max(2 * noise, TOL_FLOOR);
      const ours = await ourLogits(out, ids);
      ref.forEach((r, p) => {
        const spread = Math.max(...r) - Math.min(...r);
        const top5 = [...r.keys()].sort((a, b) => r[b] - r[a]).slice(0, 5);
        for (const id of top5) {
          expect(Math.abs(ours[p][id] - r[id]) / spread, `position ${p} token ${id}: ours ${ours[p][id]} llama.cpp ${r[id]}`)
            .toBeLessThan(tol);
        }
      });

      // greedy tokens, token for token
      const want = await oracleGreedy(out, ids, GREEDY);
      const m = LocalModel.open(out, { threads: 2 });
      const pipe = new LocalPipeline(m, 64);
      const got = await generate(m, pipe, Int32Array.from(ids), { maxTokens: GREEDY, sampler: new Sampler({ temperature: 0 }), isEnd: () => false });
      pipe.close();
      m.close();
      expect(want.length).toBe(GREEDY);
      const ours2 = Array.from(got.ids);
      expect(ours2.length).toBe(GREEDY);
      const k = ours2.findIndex((t, i) => t !== want[i]);
      if (k >= 0) {
        // a divergence is allowed only where llama.cpp's own two candidates are a near tie (within the
        // noise tolerance above); after it the continuations are different texts and are not compared
        const r = (await oracleLogits(llama, out, [...ids, ...want.slice(0, k)], false)).at(-1)!;
        const spread = Math.max(...r) - Math.min(...r), margin = (r[want[k]] - r[ours2[k]]) / spread;
        console.log(`${shape} ${type}: greedy diverges at token ${k} (llama.cpp ${want[k]}, ours ${ours2[k]}), ` +
          `llama.cpp's margin ${margin.toExponential(2)} of the logit spread (tolerance ${tol.toExponential(2)})`);
        expect(Math.abs(margin), `greedy token ${k}: ours ${ours2[k]}, llama.cpp ${want[k]}`).toBeLessThan(tol);
      }
    }, 120_000);
});

/** Ours at one SIMD level: the level is chosen once per process, so a child (the compiled engine in dist/)
 * computes ourLogits' rows and prints them. */
async function ourLogitsAt(path: string, level: string): Promise<Float32Array[]> {
  const script = `
    const { LocalModel } = await import(${JSON.stringify(join(root, "dist", "engine", "index.js"))});
    const prompt = ${JSON.stringify(PROMPT)};
    const m = LocalModel.open(${JSON.stringify(path)}, { threads: 2 });
    const w = m.window(0, m.nLayers, { ctx: 64 });
    const acts = m.embed(Int32Array.from(prompt));
    await w.forward(acts, 0, prompt.length);
    const rows = [];
    for (let i = 0; i < prompt.length; i++) rows.push(Array.from(await m.logits(acts.subarray(i * m.nEmbd, (i + 1) * m.nEmbd))));
    w.close(); m.close();
    process.stdout.write(JSON.stringify(rows));`;
  const p = startNode(["--input-type=module", "-e", script], { PRIMA_SIMD: level });
  expect(await p.exited, p.stderr).toBe(0);
  return (JSON.parse(p.stdout) as number[][]).map((r) => Float32Array.from(r));
}

// The cases above run at the best level only. The float order of a dot decides which way a Q8
// activation near a rounding tie goes, and one such step shows far above the bounds: the scalar Q4_1
// dot, adding its min term per block, was 20x the first-position bound on this model (ggml's dots sum
// it apart), so every level this CPU runs is held to llama.cpp here (AVX-512 on a host that has it).
describe("llama.cpp agrees with us at every SIMD level", () => {
  it.each([["tiny-llama", "Q4_1", true], ["small-llama", "Q4_K_M", false]] as const)("%s %s", async (shape, type, pure) => {
    const out = await generatedModel({ shape, type, pure, seed: 7, weightStd: 0.05 });
    const ref = await oracleLogits(llama, out, PROMPT, false);
    const noise = compare(await oracleLogits(llama, out, PROMPT, true), ref, 0).maxRelErr;
    const tol = Math.max(2 * noise, TOL_FLOOR);
    for (const level of simdLevels()) {
      const ours = await ourLogitsAt(out, level);
      const first = compare(ours.slice(0, 1), ref.slice(0, 1), TOL_FIRST_POSITION);
      expect(first.maxRelErr, `${level}: first position`).toBeLessThan(firstPositionTolerance(type, tol));
      const all = compare(ours, ref, tol);
      expect(all.top1Mismatches, `${level}: top-1 differs at positions ${all.top1Mismatches.join(",")}`).toEqual([]);
      expect(all.maxRelErr, `${level}: llama.cpp's own flash-attention noise is ${noise}`).toBeLessThan(tol);
    }
  }, 120_000);
});
