// The profile's stand-in against the model's own layers (profiler/forward.ts), after the ring's idle
// gap: ms per layer over windows of 1, 3, 5 and 8 layers, real and stand-in, interleaved rounds; what
// the profile times here (five times the last-level cache); the stand-in timed ten times back to back;
// and the head's output layer, on the model's last six layers with and without it, against the
// profile's one-layer stand-in; and the rate streamed layers are reread at (each dropped once computed),
// the stand-in's over 3 layers (what a 200 MiB device holds) and over the layers the profile streams,
// against the model's own layers. Figures in BENCHMARKS.md, "standin", come from here.
//   node dist/bench/stand-in.js [model.gguf]
import { LocalModel } from "../engine/index.js";
import { lastLevelCacheBytes, rereadBytesPerS, standInLayers, standInMinBytes, timeForward, timePasses } from "../profiler/index.js";
import { RING_COMPUTE_OPTIONS } from "../ring/index.js";
import { median, root, runWhenMain } from "./procs.js";

const GAP_MS = 10, PASSES = 21, ROUNDS = 3;

/** MB/s the model's own layers [first, first + n) are reread at when each is dropped once computed:
 * their bytes over what streaming adds to the pass in memory (as profiler/forward.ts times its stand-in). */
async function realStreamedRate(model: LocalModel, first: number, n: number): Promise<number> {
  const w = model.window(first, first + n, { ctx: PASSES + 12, maxBatch: 1 });
  try {
    const inMemory = median(await timePasses(w, model.nEmbd, { count: PASSES + 3, skip: 3, gapMs: GAP_MS }));
    w.streamBeyond(0, true); // as the profiler times it
    const streamed = median(await timePasses(w, model.nEmbd, { count: 1 + Math.ceil(PASSES / 3), skip: 1, gapMs: GAP_MS }));
    return rereadBytesPerS(w.residency().totalBytes, streamed, inMemory)! / 1e6;
  } finally {
    w.close();
  }
}

/** Median ms of one-token passes through layers [first, first + n) after the idle gap, as the profile
 * times its stand-in (timePasses), with the output layer when `logits` is given. */
async function realMs(model: LocalModel, first: number, n: number, logits?: Float32Array): Promise<number> {
  const w = model.window(first, first + n, { ctx: PASSES + 4, maxBatch: 1 });
  try {
    return median(await timePasses(w, model.nEmbd, { count: PASSES + 3, skip: 3, gapMs: GAP_MS, logits }));
  } finally {
    w.close();
  }
}

export async function main(modelArg?: string): Promise<void> {
  const path = modelArg ?? `${root}.cache/bench-llama-Q4_K_M.gguf`;
  const model = LocalModel.open(path, { threads: 2, ...RING_COMPUTE_OPTIONS });
  const dir = `${root}.cache`;
  const standIn = async (n: number) => (await timeForward(model.gguf, model.desc, n, { dir, threads: 2, passes: PASSES, gapMs: GAP_MS })).windowMs;
  try {
    const llc = lastLevelCacheBytes();
    const profiled = standInLayers(model.desc, standInMinBytes(llc), Infinity);
    console.log(`\n## the profile's stand-in against the model's own layers, after a ${GAP_MS} ms idle gap (ms per layer, ${ROUNDS} interleaved rounds)\n`);
    console.log(`last-level cache ${llc === undefined ? "unknown (32 MiB assumed)" : `${llc >> 20} MiB`}: the profile times ${profiled} layers where memory allows\n`);
    console.log("| layers | real (per round) | stand-in (per round) |");
    console.log("|---|---|---|");
    const lengths = [1, 3, 5, 8];
    const real = lengths.map(() => [] as number[]), stand = lengths.map(() => [] as number[]);
    for (let r = 0; r < ROUNDS; r++) {
      for (const [i, n] of lengths.entries()) {
        real[i].push((await realMs(model, 0, n)) / n);
        stand[i].push((await standIn(n)) / n);
      }
    }
    const fmt = (xs: number[]) => xs.map((x) => x.toFixed(3)).join(", ");
    for (const [i, n] of lengths.entries()) console.log(`| ${n} | ${fmt(real[i])} | ${fmt(stand[i])} |`);

    const again: number[] = [];
    for (let i = 0; i < 10; i++) again.push(await standIn(3));
    console.log(`\nthe 3-layer stand-in timed ten times back to back: ${Math.min(...again).toFixed(2)}-${Math.max(...again).toFixed(2)} ms`);

    // The head's output layer: its last six layers (as the capped ring's head holds them), with and
    // without the output, against the profile's figure (profiler/profile.ts: one layer's stand-in).
    const last = model.nLayers - 6, logits = new Float32Array(model.desc.hparams.nVocab);
    const outReal: number[] = [], outProfile: number[] = [], lastPerLayer: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      const without = await realMs(model, last, 6);
      outReal.push((await realMs(model, last, 6, logits)) - without);
      lastPerLayer.push(without / 6);
      outProfile.push((await timeForward(model.gguf, model.desc, 1, { dir, threads: 2, passes: PASSES, gapMs: GAP_MS, output: true })).outputMs!);
    }
    console.log(`\nthe output layer: ${fmt(outReal)} ms over the model's last 6 layers (${fmt(lastPerLayer)} ms a layer without it); ` +
      `the profile's one-layer stand-in: ${fmt(outProfile)} ms`);

    // Rereads: a short stream pays a few ms before the disk reads at full speed, so the profile streams
    // `profiled` layers whatever the device's memory (profiler/profile.ts).
    const standInRate = async (n: number) => {
      const t = await timeForward(model.gguf, model.desc, n, { dir, threads: 2, passes: PASSES, gapMs: GAP_MS, streamedLayers: n });
      return rereadBytesPerS(t.streamedBytes, t.streamedMs!, t.inMemoryMs!)! / 1e6;
    };
    const short: number[] = [], long: number[] = [], own: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      short.push(await standInRate(3));
      long.push(await standInRate(profiled));
      own.push(await realStreamedRate(model, 6, profiled));
    }
    const rates = (xs: number[]) => xs.map((x) => x.toFixed(0)).join(", ");
    console.log(`\nrereads (MB/s, each layer dropped once computed): the stand-in over 3 layers ${rates(short)}; over ${profiled} ${rates(long)}; ` +
      `the model's layers 6-${5 + profiled} ${rates(own)}`);
  } finally {
    model.close();
  }
}

runWhenMain(import.meta.url, main);
