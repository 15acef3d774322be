// What the head's hand-off of a token costs right after its pass, against the same send back to back
// as the link probe makes it (profiler/link.ts timeHandOff, both ways): the gap that made the head's
// row of the capped bench run 6-11% over its prediction before the profile timed it. The pass is the
// head's window in the capped bench's plan [8,8,6] (layers 16-21) and the output layer.
//   node dist/bench/hand-off.js [model.gguf]
import { LocalModel } from "../engine/index.js";
import { timeHandOff } from "../profiler/index.js";
import { RING_COMPUTE_OPTIONS } from "../ring/index.js";
import { median, root, runWhenMain } from "./procs.js";

const FIRST = 16, END = 22, ROUNDS = 15, GAP_MS = 10, REPS = 5;

export async function main(modelArg?: string): Promise<void> {
  const model = LocalModel.open(modelArg ?? `${root}.cache/bench-llama-Q4_K_M.gguf`, { threads: 2, ...RING_COMPUTE_OPTIONS });
  const afterPass: number[] = [], backToBack: number[] = [];
  try {
    const w = model.window(FIRST, END, { ctx: ROUNDS + 4, maxBatch: 1 });
    try {
      const logits = new Float32Array(model.nVocab), acts = new Float32Array(model.nEmbd);
      const pass = (pos: number) => {
        acts.fill(0.1);
        w.forwardNow(acts, pos, 1, logits);
      };
      const relax = () => model.relax();
      // In turn, so that a slow spell of the machine falls on both.
      for (let r = 0; r < REPS; r++) {
        afterPass.push(median(await timeHandOff({ hiddenSize: model.nEmbd, rounds: ROUNDS, gapMs: GAP_MS, relax, pass })));
        backToBack.push(median(await timeHandOff({ hiddenSize: model.nEmbd, rounds: ROUNDS, gapMs: 0, relax, pass: () => {} })));
      }
    } finally {
      w.close();
    }
  } finally {
    model.close();
  }
  const list = (xs: number[]) => xs.map((x) => x.toFixed(3)).join(", ");
  console.log(`\n## the head's hand-off of one token: after its pass (layers ${FIRST}-${END - 1} and the output layer, ${GAP_MS} ms idle before it) and back to back; ms, median of ${ROUNDS} sends, ${REPS} runs each\n`);
  console.log(`| send | median of the runs | runs |\n|---|---|---|`);
  console.log(`| after the pass (the head profile times it so, after a stand-in layer and the output layer) | ${median(afterPass).toFixed(3)} | ${list(afterPass)} |`);
  console.log(`| back to back (as the link probe sends) | ${median(backToBack).toFixed(3)} | ${list(backToBack)} |`);
  console.log(`after the pass / back to back: ${(median(afterPass) / median(backToBack)).toFixed(1)}x`);
}

runWhenMain(import.meta.url, main);
