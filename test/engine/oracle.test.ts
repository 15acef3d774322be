// llama.cpp (through node-llama-cpp) as the live oracle: it loads models our generator writes, in
// every weight type and in llama and qwen2 shapes, and its logits at every prompt position must
// agree with ours. This checks our GGUF writer, our quantizers and our kernels against llama.cpp's.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Llama } from "node-llama-cpp";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateModel } from "../../modelgen/index.js";
import { TOL_FIRST_POSITION, agreement, loadOracle } from "./oracle-harness.js";

const dir = mkdtempSync(join(tmpdir(), "prima-oracle-"));
let llama: Llama;

beforeAll(async () => {
  llama = await loadOracle();
}, 60_000);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A fixed prompt of vocabulary ids (BOS first), long enough to exercise attention over positions. */
const PROMPT = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426];

const llamaTypes = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"];

describe("llama.cpp agrees with us on generated models", () => {
  const cases: [shape: string, type: string, pure: boolean][] = [
    ...llamaTypes.map((t) => ["tiny-llama", t, true] as [string, string, boolean]),
    ["small-llama", "Q4_K_M", false],
    ["small-llama", "Q5_K_S", false],
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
