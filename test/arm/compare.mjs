// Compares greedy.mjs outputs: every file's ids per model against the first file's (the reference).
// A difference counts only away from a near tie. Levels sum in different orders, and a Q8 activation near a
// rounding tie then goes either way (on random-weight models that moves a logit by up to ~1%): at the
// first differing step the reference's top-1 must have led its runner-up by more than both logits may
// each be off under the golden tests' looser tolerance, 1e-2 x max(1, |logit|). Exit 1 on a real mismatch.
//   node compare.mjs REFERENCE.jsonl OTHER.jsonl...
import { readFileSync } from "node:fs";
import { basename } from "node:path";

const GOLDEN_TOL = 1e-2;
const read = (f) => new Map(readFileSync(f, "utf8").trim().split("\n").map((l) => JSON.parse(l)).map((r) => [r.model, r]));
const [refFile, ...others] = process.argv.slice(2);
const ref = read(refFile);
let bad = 0;
for (const f of others) {
  const got = read(f);
  for (const [model, r] of ref) {
    const o = got.get(model);
    if (!o) { console.log(`${basename(f)}: ${model} missing`); bad++; continue; }
    const at = r.ids.findIndex((id, i) => o.ids[i] !== id);
    if (at < 0) continue;
    const tie = r.leads[at] <= 2 * GOLDEN_TOL * Math.max(1, Math.abs(r.tops[at]));
    console.log(`${basename(f)} ${o.level}: ${model} differs from ${r.level} at step ${at} (${o.ids.slice(0, at + 1)} vs ${r.ids.slice(0, at + 1)});` +
      ` ${r.level}'s lead there ${r.leads[at]}: ${tie ? "a near tie" : "a real mismatch"}`);
    if (!tie) bad++;
  }
  if (!bad) console.log(`${basename(f)}: ${got.size} models, ids equal to ${basename(refFile)}'s (or near ties)`);
}
process.exit(bad ? 1 : 0);
