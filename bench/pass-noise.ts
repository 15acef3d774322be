// How far one timing of the engine's pass can fall from the device's usual speed on this machine, and
// what slicing the timing buys (profiler/forward.ts times its in-memory passes in three slices 0.3 s
// apart). A minute of one-token passes through the model's first 7 layers, after the ring's idle gap,
// in runs of 7; against the minute's median: the median of 3 runs back to back (the profile's 21 passes
// in one go) and of 3 runs spread as the slices are (every 4th run, about 0.4 s apart).
//   node dist/bench/pass-noise.js [model.gguf] [seconds]
import { LocalModel } from "../engine/index.js";
import { timePasses } from "../profiler/index.js";
import { RING_COMPUTE_OPTIONS } from "../ring/index.js";
import { median, root, runWhenMain } from "./procs.js";

const GAP_MS = 10, RUN = 7, LAYERS = 7, SPREAD = 4;

export async function main(modelArg?: string, seconds = 60): Promise<void> {
  const model = LocalModel.open(modelArg ?? `${root}.cache/bench-llama-Q4_K_M.gguf`, { threads: 2, ...RING_COMPUTE_OPTIONS });
  const runs: number[][] = [];
  try {
    const w = model.window(0, LAYERS, { ctx: RUN + 2, maxBatch: 1 });
    try {
      await timePasses(w, model.nEmbd, { count: 3, skip: 3, gapMs: GAP_MS });
      for (const t0 = performance.now(); performance.now() - t0 < seconds * 1000;) {
        runs.push(await timePasses(w, model.nEmbd, { count: RUN, skip: 0, gapMs: GAP_MS }));
      }
    } finally {
      w.close();
    }
  } finally {
    model.close();
  }
  const overall = median(runs.flat());
  const ratios = (span: number) => runs.slice(0, runs.length - 2 * span).map((_, i) => median([...runs[i], ...runs[i + span], ...runs[i + 2 * span]]) / overall);
  const describe = (rs: number[]) => {
    const off = (lim: number) => `${((100 * rs.filter((r) => Math.abs(r - 1) > lim).length) / rs.length).toFixed(0)}%`;
    return `${rs.length} timings; off by over 5%: ${off(0.05)}, over 8%: ${off(0.08)}; range ${Math.min(...rs).toFixed(3)}-${Math.max(...rs).toFixed(3)}`;
  };
  console.log(`\n## one timing of the pass against a minute of them: layers 0-${LAYERS - 1} of the benchmark model, ${GAP_MS} ms idle gap, ${seconds} s\n`);
  console.log(`the minute's median ${overall.toFixed(2)} ms a pass (${runs.length} runs of ${RUN})`);
  console.log(`21 passes back to back (the profile before slicing): ${describe(ratios(1))}`);
  console.log(`21 passes in 3 slices about 0.4 s apart (the profile now): ${describe(ratios(SPREAD))}`);
}

runWhenMain(import.meta.url, (model) => main(model, process.argv[3] ? Number(process.argv[3]) : undefined));
