// Why a loopback ring on virtual CPUs is slower than its parts: the same window of layers, run in
// one process, back to back vs after the idle gap a ring device sees while the others compute.
//   node dist/bench/idle-gap.js [model.gguf]
import { fileURLToPath } from "node:url";
import { Worker } from "node:worker_threads";
import { LocalModel } from "../engine/index.js";
import { RING_COMPUTE_OPTIONS } from "../ring/index.js";

const root = fileURLToPath(new URL("../..", import.meta.url));

type Gap = { name: string; wait: (ms: number) => Promise<void> };

const idle: Gap = { name: "idle (sleeping)", wait: (ms) => new Promise((r) => setTimeout(r, ms)) };
// Both cores kept busy through the gap: this thread spins, and so does a helper thread.
function busyGap(): Gap & { stop: () => Promise<number> } {
  const flag = new Int32Array(new SharedArrayBuffer(8));
  const helper = new Worker(
    `const { workerData: f } = require("node:worker_threads");
     for (;;) { Atomics.wait(f, 0, 0); const ms = Atomics.load(f, 1); if (ms < 0) break;
       const end = performance.now() + ms; while (performance.now() < end); Atomics.store(f, 0, 0); }`,
    { eval: true, workerData: flag });
  return {
    name: "busy (both cores spin)",
    wait: async (ms) => {
      Atomics.store(flag, 1, ms);
      Atomics.store(flag, 0, 1);
      Atomics.notify(flag, 0);
      const end = performance.now() + ms;
      while (performance.now() < end);
    },
    stop: () => {
      Atomics.store(flag, 1, -1);
      Atomics.store(flag, 0, 1);
      Atomics.notify(flag, 0);
      return helper.terminate();
    },
  };
}

async function medianForwardMs(model: LocalModel, gapMs: number, gap: Gap, n = 120): Promise<number> {
  const w = model.window(0, 7, { ctx: n + 1 });
  const emb = model.embed(new Int32Array([1]));
  const acts = new Float32Array(model.nEmbd);
  const ms: number[] = [];
  try {
    for (let i = 0; i < n; i++) {
      acts.set(emb);
      const t0 = performance.now();
      await w.forward(acts, i, 1);
      ms.push(performance.now() - t0);
      if (gapMs > 0) await gap.wait(gapMs);
    }
  } finally {
    w.close();
  }
  return ms.sort((a, b) => a - b)[n >> 1]!;
}

export async function main(modelArg?: string): Promise<void> {
  const path = modelArg ?? `${root}.cache/bench-llama-Q4_K_M.gguf`;
  const model = LocalModel.open(path, { threads: 2, ...RING_COMPUTE_OPTIONS });
  try {
    console.log("\n## one process, a 7-layer window, with and without a ring device's idle gap\n");
    console.log("| between forwards | median ms per forward |");
    console.log("|---|---|");
    console.log(`| nothing (back to back) | ${(await medianForwardMs(model, 0, idle)).toFixed(2)} |`);
    const busy = busyGap();
    try {
      for (const gap of [idle, busy]) console.log(`| 25 ms, ${gap.name} | ${(await medianForwardMs(model, 25, gap)).toFixed(2)} |`);
    } finally {
      await busy.stop();
    }
  } finally {
    model.close();
  }
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  main(process.argv[2]).catch((e: unknown) => {
    console.error(e instanceof Error ? e.message : String(e));
    process.exitCode = 1;
  });
}
