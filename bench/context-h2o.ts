// The context bench's H2O part (--kv-evict h2o): a text read past a small cache. The first 512 tokens
// of test/fixtures/story.txt go through one at a time (teacher-forced) with a cache of 128 tokens that
// is made room in when full, by H2O at 20% of it (engine/h2o.ts) or by llama.cpp's context shift (the
// oldest half after the BOS dropped), against the same tokens with the whole 512 in the cache (exact
// F16 attention): perplexity of the tokens after the first 128, its delta, the mean KL divergence of
// each next-token distribution from the exact one, and how often the top token is the exact one's.
import { readFileSync } from "node:fs";
import { LocalModel, LocalPipeline, discardFor, h2oEvict, logSumExp } from "../engine/index.js";
import { Tokenizer, kvBytesPerTokenLayer } from "../model/index.js";

const TOKENS = 512, CACHE = 128, BUDGET = 0.2;

type Policy = "exact" | "shift" | "shift20" | "h2o";
const POLICIES: Policy[] = ["exact", "shift", "shift20", "h2o"];

/** log-softmax of every step's logits (the distribution of the token after it). */
async function readThrough(m: LocalModel, ids: Int32Array, policy: Policy): Promise<Float32Array[]> {
  const ctx = policy === "exact" ? ids.length : CACHE;
  const pipe = new LocalPipeline(m, ctx, 1, { k: "f16", v: "f16", ...(policy === "h2o" ? { evict: "h2o" as const } : {}) });
  const out: Float32Array[] = [];
  try {
    let pos = 0;
    for (let i = 0; i < ids.length - 1; i++) {
      if (pos + 1 >= ctx) {
        if (policy === "h2o") pos -= await h2oEvict(pipe, pos, 1, BUDGET);
        else {
          // llama.cpp's rule (half of what follows the BOS), or the oldest dropped down to H2O's budget
          const d = policy === "shift" ? discardFor(pos, { keep: 1 }) : pos - Math.floor(BUDGET * ctx);
          await pipe.shift(1, d, pos);
          pos -= d;
        }
      }
      const logits = await pipe.forward(m.embed(ids.subarray(i, i + 1)), pos, 1);
      pos++;
      const lse = logSumExp(logits);
      out.push(Float32Array.from(logits, (x) => x - lse));
    }
  } finally {
    pipe.close();
  }
  return out;
}

export async function h2oQuality(models: { name: string; path: string }[], text: string, threads: number, log: (s: string) => void): Promise<void> {
  console.log(`\n## H2O eviction at ${BUDGET * 100}%: a text read past a cache of ${CACHE} tokens (${TOKENS} tokens, one at a time, scored after the first ${CACHE})\n`);
  console.log("| model | cache | KV bytes per token | PPL | PPL delta | mean KL divergence | same top token |");
  console.log("|---|---|---|---|---|---|---|");
  for (const mm of models) {
    const m = LocalModel.open(mm.path, { threads });
    try {
      const tok = Tokenizer.fromGguf(m.gguf);
      const ids = tok.encode(readFileSync(text, "utf8"), { addSpecial: true, parseSpecial: false }).subarray(0, TOKENS);
      if (ids.length < TOKENS || m.desc.hparams.nCtxTrain < TOKENS) {
        console.log(`| ${mm.name} | (the text or the model's context is under ${TOKENS} tokens) | | | | | |`);
        continue;
      }
      const hp = m.desc.hparams, bytes = kvBytesPerTokenLayer(hp) * hp.nLayers;
      const runs: Record<Policy, Float32Array[]> = { exact: [], shift: [], shift20: [], h2o: [] };
      for (const p of POLICIES) {
        log(`context: ${mm.name}, ${p}`);
        runs[p] = await readThrough(m, ids, p);
      }
      let basePpl = 0;
      for (const p of POLICIES) {
        let nll = 0, kl = 0, same = 0, n = 0;
        for (let i = CACHE; i < ids.length - 1; i++) {
          const lp = runs[p][i], base = runs.exact[i];
          nll -= lp[ids[i + 1]];
          let k = 0, top = 0, baseTop = 0;
          for (let v = 0; v < lp.length; v++) {
            k += Math.exp(base[v]) * (base[v] - lp[v]);
            if (lp[v] > lp[top]) top = v;
            if (base[v] > base[baseTop]) baseTop = v;
          }
          kl += k;
          same += top === baseTop ? 1 : 0;
          n++;
        }
        const ppl = Math.exp(nll / n);
        if (p === "exact") basePpl = ppl;
        const delta = 100 * (ppl / basePpl - 1);
        const label = p === "exact" ? `all ${TOKENS} (exact)` : p === "shift" ? `${CACHE}, context shift (to 50%)`
          : p === "shift20" ? `${CACHE}, context shift to ${BUDGET * 100}%` : `${CACHE}, H2O ${BUDGET * 100}%`;
        const kvTokens = p === "exact" ? TOKENS : CACHE;
        console.log(`| ${mm.name} | ${label} | ${bytes} (x ${kvTokens} tokens) | ${ppl.toFixed(4)} | ${p === "exact" ? "(base)" : `${delta >= 0 ? "+" : ""}${delta.toFixed(2)}%`} | ${p === "exact" ? "" : (kl / n).toExponential(2)} | ${p === "exact" ? "" : `${(100 * same / n).toFixed(1)}%`} |`);
      }
    } finally {
      m.native.close();
    }
  }
  console.log(`\nH2O evicts to ${BUDGET * 100}% of the cache (${Math.floor(BUDGET * CACHE)} tokens: the BOS, the recent half, the heaviest hitters) each time it fills; the context shift keeps the BOS and the newer half (llama.cpp's rule) or the newest 20% (H2O's budget without its heavy hitters). Both read the same 128-token cache: the bytes per token are the F16 cache's.`);
}
