// What a ring device's idle gap costs its next window: the same 7-layer window in one process, back to
// back vs after the 25 ms a ring device sleeps while the others compute, with the compute threads left
// to the scheduler and spread over distinct CPUs during each pass (RING_COMPUTE_OPTIONS.spreadThreads).
//   node dist/bench/idle-gap.js [model.gguf]
import { LocalModel } from "../engine/index.js";
import { timePasses } from "../profiler/index.js";
import { RING_COMPUTE_OPTIONS } from "../ring/index.js";
import { median, root, runWhenMain } from "./procs.js";

/** Median ms of one-token passes through the first 7 layers (inline, as a ring device runs a
 * one-token window), each after `gapMs`: the profile's own loop (timePasses). */
export async function medianForwardMs(model: LocalModel, gapMs: number, n = 100): Promise<number> {
  const w = model.window(0, 7, { ctx: n + 1 });
  try {
    return median(await timePasses(w, model.nEmbd, { count: n, skip: 0, gapMs }));
  } finally {
    w.close();
  }
}

export async function main(modelArg?: string): Promise<void> {
  const path = modelArg ?? `${root}.cache/bench-llama-Q4_K_M.gguf`;
  console.log("\n## one process, a 7-layer window, with and without a ring device's idle gap\n");
  console.log("| threads during a pass | back to back, median ms | after a 25 ms idle gap, median ms |");
  console.log("|---|---|---|");
  for (const spreadThreads of [false, true]) {
    const model = LocalModel.open(path, { threads: 2, ...RING_COMPUTE_OPTIONS, spreadThreads });
    try {
      const b2b = await medianForwardMs(model, 0);
      const gap = await medianForwardMs(model, 25);
      console.log(`| ${spreadThreads ? "spread over distinct CPUs" : "placed by the scheduler"} | ${b2b.toFixed(2)} | ${gap.toFixed(2)} |`);
    } finally {
      model.close();
    }
  }
}

runWhenMain(import.meta.url, main);
