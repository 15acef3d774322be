// The addon in more than one environment of a process (a worker thread beside the main thread, as an
// app embedding the engine or a thread-pooled test runner loads it): each environment gets its own
// class constructors. With them in C++ statics, the second environment's load replaced the first's,
// and a window made on the main thread used a reference from the other: V8 aborted the process.
import { rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Worker } from "node:worker_threads";
import { afterAll, describe, expect, it } from "vitest";
import { LocalModel, LocalPipeline, Sampler, generate } from "../../engine/index.js";
import { root } from "../helpers/process.js";
import { ownedDir } from "../helpers/temp.js";

const dir = ownedDir(join(tmpdir(), `prima-worker-thread-${process.pid}`));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const MODEL = join(root, "models", "stories260K.gguf");
const PROMPT = [1, 403, 407, 261, 378]; // BOS and a few of stories260K's tokens
const N = 16;

/** Greedy ids from `ids`, on a model opened here. */
async function greedy(ids: number[]): Promise<number[]> {
  const model = LocalModel.open(MODEL, { threads: 1 });
  const pipe = new LocalPipeline(model, 64);
  const r = await generate(model, pipe, Int32Array.from(ids), { maxTokens: N, sampler: new Sampler({ temperature: 0 }), isEnd: () => false });
  pipe.close();
  model.close();
  return r.ids;
}

describe("the addon in a worker thread", () => {
  it("a worker thread and the main thread each run a model: the same tokens, the process stays up", async () => {
    const script = join(dir, "greedy.mjs");
    writeFileSync(script, `
      import { parentPort, workerData } from "node:worker_threads";
      const { LocalModel, LocalPipeline, Sampler, generate } = await import(workerData.engine);
      const model = LocalModel.open(workerData.model, { threads: 1 });
      parentPort.postMessage("loaded");
      const pipe = new LocalPipeline(model, 64);
      const r = await generate(model, pipe, Int32Array.from(workerData.prompt), { maxTokens: workerData.n, sampler: new Sampler({ temperature: 0 }), isEnd: () => false });
      pipe.close();
      model.close();
      parentPort.postMessage(r.ids);
    `);
    const worker = new Worker(script, { workerData: { engine: join(root, "dist", "engine", "index.js"), model: MODEL, prompt: PROMPT, n: N } });
    const message = (what: string) => new Promise<unknown>((resolve, reject) => {
      const limit = setTimeout(() => reject(new Error(`the worker thread sent no ${what} within 30 s`)), 30_000);
      worker.once("message", (m) => { clearTimeout(limit); resolve(m); });
      worker.once("error", (e) => { clearTimeout(limit); reject(e); });
    });
    // The main thread runs its own model after the worker's load (and again after its end).
    expect(await message("word of its load")).toBe("loaded");
    const fromWorker = message("tokens") as Promise<number[]>;
    const here = await greedy(PROMPT);
    const there = await fromWorker;
    await worker.terminate();
    expect(here).toHaveLength(N);
    expect(there).toEqual(here);
    expect(await greedy(PROMPT)).toEqual(here);
  });
});
