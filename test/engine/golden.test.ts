// llama.cpp's reference outputs for the models that ship (../shared/golden/generation): prompt ids,
// teacher-forced top-5 logits at every prompt position (one batch), and the greedy continuation.
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { LocalModel, LocalPipeline, Sampler, generate } from "../../engine/index.js";

interface GoldenCase {
  prompt: string;
  prompt_ids: number[];
  top5: [number, number][][];
  greedy_ids: number[];
}

const shared = new URL("../../../shared/", import.meta.url).pathname;
const files = [
  { model: "models/stories260K.gguf", golden: "stories260K.json", tol: 1e-3 },
  { model: `${shared}models/stories260K-F16.gguf`, golden: "stories260K-F16.json", tol: 1e-2 },
];

/** |a - b| relative to the reference logit (absolute near zero). */
const relErr = (a: number, b: number) => Math.abs(a - b) / Math.max(1, Math.abs(b));

describe.each(files)("golden generation: $golden", ({ model: path, golden, tol }) => {
  const cases: GoldenCase[] = JSON.parse(readFileSync(`${shared}golden/generation/${golden}`, "utf8")).cases;
  const model = LocalModel.open(path, { threads: 2 });

  it.each(cases.map((c) => [c.prompt, c] as const))("top-5 logits of every prompt position, one batch: %s", async (_p, c) => {
    const pipe = new LocalPipeline(model, 256);
    const ids = Int32Array.from(c.prompt_ids);
    const acts = model.embed(ids);
    await pipe.window.forward(acts, 0, ids.length);
    const E = model.nEmbd;
    for (let i = 0; i < ids.length; i++) {
      const logits = await model.logits(acts.subarray(i * E, (i + 1) * E));
      const top1 = logits.indexOf(Math.max(...logits));
      expect(top1, `position ${i}`).toBe(c.top5[i][0][0]);
      for (const [id, ref] of c.top5[i]) {
        expect(relErr(logits[id], ref), `position ${i} token ${id}: ${logits[id]} vs ${ref}`).toBeLessThanOrEqual(tol);
      }
    }
    pipe.close();
  });

  it.each(cases.map((c) => [c.prompt, c] as const))("greedy continuation token for token: %s", async (_p, c) => {
    const pipe = new LocalPipeline(model, 256);
    const res = await generate(model, pipe, Int32Array.from(c.prompt_ids), {
      maxTokens: c.greedy_ids.length,
      sampler: new Sampler({ temperature: 0 }),
      isEnd: (id) => id === 2,
    });
    expect(res.ids).toEqual(c.greedy_ids);
    pipe.close();
  });
});
