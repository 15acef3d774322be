// Generated test models, made once per machine in the temp directory (a few seconds) and reused.
import { closeSync, copyFileSync, fsyncSync, openSync } from "node:fs";
import { basename, join } from "node:path";
import { LocalModel } from "../../engine/index.js";
import { generatedModel } from "../helpers/models.js";
import { describeModel, modelProfile, readGguf, type ModelShape } from "../../model/index.js";

/** 12 llama layers of 1024 wide, Q8_0 (145 MB): enough work per token that latency is not overhead. */
export const PLACEMENT_SHAPE: ModelShape = {
  name: "placement-test", arch: "llama", nEmbd: 1024, nLayers: 12, nHead: 16, nHeadKv: 4, nFf: 2816, nVocab: 512,
  tiedEmbeddings: false, qkvBias: false, contextLength: 1024, ropeFreqBase: 10000, normEps: 1e-5, defaultVocab: "stories260K",
};

/** The model file for a shape and type, generated on first use (cached by content: generatedModel). */
export function testModel(shape: ModelShape, type: string): Promise<string> {
  return generatedModel({ shape, type, seed: 7, pure: true });
}

/** A copy of a model file of the caller's own (in `dir`), for a test whose devices' memory cgroups
 * must pay for the pages they read: the shared file's page cache is charged to whichever process of
 * another test file read it first, and that test's reclaim or dropFileCache takes the pages from under
 * this one's windows (a capped head's window 18 of 48 MiB resident beside other test runs). */
export function privateModelCopy(path: string, dir: string): string {
  const copy = join(dir, basename(path));
  copyFileSync(path, copy);
  // Written back now, so that dropping its pages drops them all (dirty pages stay cached).
  const fd = openSync(copy, "r+");
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  return copy;
}

/** What a layer costs a device at this context (b': weights with their KV cache), the window scratch
 * as planRing measures it (a one-layer window at the CLI's prompt batch of 128), and the model profile. */
export function layerCosts(modelPath: string, ctx: number) {
  const mp = modelProfile(describeModel(readGguf(modelPath)), { nCtx: ctx });
  const bPrime = mp.layerBytes + mp.kvBytesPerTokenLayer * ctx;
  const lm = LocalModel.open(modelPath, { threads: 1 });
  const w = lm.window(0, 1, { ctx, maxBatch: 128 });
  const scratch = w.info().anonBytes - mp.kvBytesPerTokenLayer * ctx;
  w.close();
  lm.close();
  return { mp, bPrime, scratch };
}
