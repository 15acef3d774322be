// Greedy tokens of several models in one process (a process under qemu takes seconds to start), at the
// SIMD level PRIMA_SIMD chose. Uses the engine of the tree this file is in, so the aarch64 tree runs its
// own build. Prints one JSON line per model: its generated ids, each step's top-1 logit and its lead over
// the runner-up (a mismatch where the lead is within the tolerance is a near tie, not a kernel difference).
//   node greedy.mjs N_TOKENS MODEL.gguf...
import { LocalModel } from "../../dist/engine/index.js";
import { simdLevel } from "../../dist/native/kernels.js";

const PROMPT = [1, 403, 407, 261, 378]; // "Once upon a time" in stories260K's vocabulary; ids < 512 fit every generated vocabulary
const [n, ...models] = process.argv.slice(2);

for (const path of models) {
  const m = LocalModel.open(path, { threads: 2 });
  const w = m.window(0, m.nLayers, { ctx: PROMPT.length + Number(n) });
  const ids = [], leads = [], tops = [];
  let tokens = PROMPT, pos = 0;
  for (let step = 0; step < Number(n); step++) {
    const acts = m.embed(Int32Array.from(tokens));
    await w.forward(acts, pos, tokens.length);
    pos += tokens.length;
    const logits = await m.logits(acts.subarray((tokens.length - 1) * m.nEmbd, tokens.length * m.nEmbd));
    let best = 0, second = -1;
    for (let i = 1; i < logits.length; i++) {
      if (logits[i] > logits[best]) { second = best; best = i; } else if (second < 0 || logits[i] > logits[second]) second = i;
    }
    ids.push(best);
    tops.push(Number(logits[best].toPrecision(4)));
    leads.push(Number((logits[best] - logits[second]).toPrecision(3)));
    tokens = [best];
  }
  w.close();
  m.close();
  console.log(JSON.stringify({ model: path.split("/").pop(), level: simdLevel(), ids, leads, tops }));
}
