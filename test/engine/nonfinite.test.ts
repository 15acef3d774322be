// A model whose weights make NaN stops generation with an error naming its layers (issue #18),
// instead of sampling noise from NaN logits and printing empty text.
import { copyFileSync, openSync, closeSync, writeSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { LocalModel, LocalPipeline, NonFiniteError, Sampler, generate } from "../../engine/index.js";
import { readGguf } from "../../model/index.js";
import { tempDir } from "../helpers/temp.js";

describe("NaN or infinite activations", () => {
  it("stop generation with an error naming the window's layers", async () => {
    const path = join(tempDir("prima-nan-"), "nan.gguf");
    copyFileSync("models/stories260K.gguf", path);
    const t = readGguf(path).tensors.find((x) => x.name === "blk.2.ffn_norm.weight")!;
    const nan = Buffer.alloc(t.nBytes);
    for (let i = 0; i < t.nBytes; i += 4) nan.writeUInt32LE(0x7fc00000, i);
    const fd = openSync(path, "r+");
    writeSync(fd, nan, 0, nan.length, t.offset);
    closeSync(fd);
    const model = LocalModel.open(path, { threads: 1 });
    const pipeline = new LocalPipeline(model, 32);
    try {
      const run = generate(model, pipeline, Int32Array.of(1, 2, 3), { maxTokens: 4, sampler: new Sampler({ temperature: 0 }) });
      await expect(run).rejects.toBeInstanceOf(NonFiniteError);
      await expect(run).rejects.toThrow(/layers 0-4 made NaN or infinite activations \(NaN in the output of token 0\)/);
      expect(pipeline.window.info().filled).toBe(0); // the positions of the failed pass are forgotten
    } finally {
      pipeline.close();
      model.close();
    }
  });
});
