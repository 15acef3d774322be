// llama.cpp (through node-llama-cpp) as the live oracle: it loads models our generator writes, in
// every weight type and in llama and qwen2 shapes, and its logits at every prompt position must
// agree with ours. This checks our GGUF writer, our quantizers and our kernels against llama.cpp's.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Llama } from "node-llama-cpp";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LocalModel, LocalPipeline, Sampler, generate } from "../../engine/index.js";
import { Tokenizer } from "../../model/index.js";
import { generateModel } from "../../modelgen/index.js";
import { TOL_FIRST_POSITION, TOL_FLOOR, agreement, compare, loadOracle, oracleLogits, ourLogits } from "./oracle-harness.js";

const dir = mkdtempSync(join(tmpdir(), "prima-oracle-"));
let llama: Llama;

beforeAll(async () => {
  llama = await loadOracle();
}, 60_000);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

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
    const out = join(dir, `${shape}-${type}.gguf`);
    await generateModel({ shape, type, out, pure, seed: 7, weightStd: 0.05 });
    const { first, noise, tol, all } = await agreement(llama, out, PROMPT);
    expect(first.maxRelErr, "first position: kernels and formats alone").toBeLessThan(TOL_FIRST_POSITION);
    expect(all.top1Mismatches, `top-1 differs at positions ${all.top1Mismatches.join(",")} (tolerance ${tol})`).toEqual([]);
    expect(all.maxRelErr, `llama.cpp's own flash-attention noise is ${noise}`).toBeLessThan(tol);
    rmSync(out);
  }, 60_000);
});

/** llama.cpp's greedy continuation of the prompt (temperature 0: the argmax at every step). */
async function oracleGreedy(path: string, prompt: readonly number[], n: number): Promise<number[]> {
  const model = await llama.loadModel({ modelPath: path, gpuLayers: 0 });
  const context = await model.createContext({ contextSize: 64, batchSize: 64, threads: 2 });
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
      const out = join(dir, `text-${shape}-${type}-${pure}.gguf`);
      await generateModel({ shape, type, out, pure, seed: 3, weightStd: 0.05 });
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
      rmSync(out);
    }, 120_000);
});
