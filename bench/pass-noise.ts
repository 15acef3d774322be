// How far one timing of the engine's pass can fall from the device's usual speed on this machine, and
// what slicing the timing buys. For a minute, through the model's first 7 layers after the ring's
// idle gap, the profile's two ways in turn: 21 passes in one go (as before 88f95e6) and 21 passes in
// three slices SLICE_GAP_MS apart (profiler/forward.ts, as the profile times now). Each timing's median
// against the median of every pass of the minute, and the one-go timings in order (the machine's
// speed over the minute).
//   node dist/bench/pass-noise.js [model.gguf] [seconds]
import { LocalModel } from "../engine/index.js";
import { SLICE_GAP_MS, timePasses } from "../profiler/index.js";
import { RING_COMPUTE_OPTIONS } from "../ring/index.js";
import { median, root, runWhenMain } from "./procs.js";

// As profile.ts times the pass: 3 untimed passes, 21 timed, each after a 10 ms gap; 3 slices.
const GAP_MS = 10, PASSES = 21, SKIP = 3, SLICES = 3, LAYERS = 7;

export async function main(modelArg?: string, seconds = 60): Promise<void> {
  const model = LocalModel.open(modelArg ?? `${root}.cache/bench-llama-Q4_K_M.gguf`, { threads: 2, ...RING_COMPUTE_OPTIONS });
  const oneGo: number[][] = [], sliced: number[][] = [];
  try {
    const w = model.window(0, LAYERS, { ctx: SKIP + PASSES + SLICES, maxBatch: 1 });
    try {
      for (const t0 = performance.now(); performance.now() - t0 < seconds * 1000;) {
        oneGo.push(await timePasses(w, model.nEmbd, { count: SKIP + PASSES, skip: SKIP, gapMs: GAP_MS }));
        sliced.push(await timePasses(w, model.nEmbd, { count: SKIP + PASSES, skip: SKIP, gapMs: GAP_MS, slices: SLICES, sliceGapMs: SLICE_GAP_MS }));
      }
    } finally {
      w.close();
    }
  } finally {
    model.close();
  }
  const overall = median([...oneGo.flat(), ...sliced.flat()]);
  const ratios = (timings: number[][]) => timings.map((ms) => median(ms) / overall);
  const describe = (rs: number[]) => {
    const off = (lim: number) => `${((100 * rs.filter((r) => Math.abs(r - 1) > lim).length) / rs.length).toFixed(0)}%`;
    return `${rs.length} timings; off by over 5%: ${off(0.05)}, over 8%: ${off(0.08)}; range ${Math.min(...rs).toFixed(3)}-${Math.max(...rs).toFixed(3)}`;
  };
  console.log(`\n## one timing of the pass against a minute of them: layers 0-${LAYERS - 1} of the benchmark model, ${GAP_MS} ms idle gap, ${seconds} s\n`);
  console.log(`the minute's median ${overall.toFixed(2)} ms a pass`);
  console.log(`${PASSES} passes in one go (the profile before 88f95e6): ${describe(ratios(oneGo))}`);
  console.log(`${PASSES} passes in ${SLICES} slices ${SLICE_GAP_MS} ms apart (the profile now): ${describe(ratios(sliced))}`);
  const span = (seconds / oneGo.length).toFixed(1);
  console.log(`the one-go timings in order, one every ${span} s: ${ratios(oneGo).map((r) => r.toFixed(2)).join(" ")}`);
}

runWhenMain(import.meta.url, (model) => main(model, process.argv[3] ? Number(process.argv[3]) : undefined));
