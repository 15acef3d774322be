// npm run bench -- --only structured: what constrained decoding costs. Decode tokens/s on the
// benchmark model with a JSON Schema against without (the same loop as `run`: generate() with its
// sampler, greedy), and the mask time per token over Qwen2's 151k-token vocabulary (p50, p99), the
// size where it costs most, walking the schema with random allowed tokens.
import { LocalModel, LocalPipeline, Rng, Sampler, generate } from "../engine/index.js";
import { GrammarSet, closingStart } from "../grammar/index.js";
import { Tokenizer, bundledVocab } from "../model/index.js";

const SCHEMA = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 40 },
    age: { type: "integer", minimum: 0, maximum: 120 },
    email: { type: "string", format: "email" },
    tags: { type: "array", items: { type: "string", maxLength: 20 }, maxItems: 4 },
    address: { type: "object", properties: { city: { type: "string" }, zip: { type: "string", pattern: "^[0-9]{5}$" } }, required: ["city", "zip"], additionalProperties: false },
  },
  required: ["name", "age", "email", "tags", "address"],
  additionalProperties: false,
};

const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * p))];

async function decodeRate(model: LocalModel, pipe: LocalPipeline, tok: Tokenizer, set: GrammarSet | undefined, steps: number): Promise<{ tokS: number; tokens: number; maskMs: number }> {
  const constraint = set ? await set.constraint({ kind: "json-schema", schema: SCHEMA }) : undefined;
  const sampler = new Sampler({ temperature: 0, constraint, closeAfter: constraint ? closingStart(steps) : undefined });
  const prompt = tok.encode("Once upon a time", { addSpecial: true });
  const r = await generate(model, pipe, prompt, { maxTokens: steps, sampler, isEnd: (id) => tok.isEog(id) });
  const out = { tokS: r.decodeSteps / (r.decodeMs / 1000), tokens: r.ids.length, maskMs: constraint && constraint.steps ? constraint.ms / constraint.steps : 0 };
  constraint?.dispose();
  return out;
}

export async function main(modelPath: string, threads: number, reps: number): Promise<void> {
  console.log("\n## structured output: the constraint's cost\n");
  const model = LocalModel.open(modelPath, { threads });
  const tok = Tokenizer.fromGguf(modelPath);
  const pipe = new LocalPipeline(model, 512, 128);
  const set = await GrammarSet.forTokenizer(tok, model.nVocab);
  await decodeRate(model, pipe, tok, set, 16); // warm-up: page in the weights, compile the schema
  const free: number[] = [], constrained: number[] = [], masks: number[] = [];
  let lengths = "";
  // Alternated, so that the machine's other load falls on both alike; each constrained run is as
  // long as the free one after it (a reply that ends early would time fewer, cheaper steps).
  for (let r = 0; r < reps; r++) {
    const c = await decodeRate(model, pipe, tok, set, 96);
    const f = await decodeRate(model, pipe, tok, undefined, Math.max(c.tokens, 8));
    constrained.push(c.tokS);
    masks.push(c.maskMs);
    free.push(f.tokS);
    lengths += `${c.tokens} `;
  }
  pipe.close();
  model.close();
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  console.log(`| model | decode tok/s free | decode tok/s with the schema | ratio (goal >= 0.95) | constraint ms/token |`);
  console.log(`|---|---|---|---|---|`);
  console.log(`| ${modelPath.split("/").pop()} (${tok.nVocab} tokens) | ${mean(free).toFixed(1)} | ${mean(constrained).toFixed(1)} | ${(mean(constrained) / mean(free)).toFixed(3)} | ${mean(masks).toFixed(3)} |`);
  console.log(`\n${reps} runs each, greedy, ${threads} threads; constrained replies of ${lengths.trim()} tokens, each free run as long.`);

  // The mask alone over a 151k vocabulary: a random walk through the schema (no model).
  const qwen = Tokenizer.fromMetadata(bundledVocab("qwen2").metadata);
  const t0 = performance.now();
  const big = await GrammarSet.forTokenizer(qwen);
  const setupMs = performance.now() - t0;
  const t1 = performance.now();
  await big.compile({ kind: "json-schema", schema: SCHEMA });
  const compileMs = performance.now() - t1;
  const per: number[] = [];
  const rng = new Rng(7);
  for (let walk = 0; walk < Math.max(3, reps); walk++) {
    const c = await big.constraint({ kind: "json-schema", schema: SCHEMA });
    const logits = new Float32Array(qwen.nVocab);
    for (let step = 0; step < 200; step++) {
      const before = c.ms;
      const mask = await c.nextMask();
      per.push(c.ms - before);
      const ok: number[] = [];
      for (let i = 0; i < qwen.nVocab; i++) if ((mask[i >> 5] >>> (i & 31)) & 1) ok.push(i);
      let id = ok[Math.floor(rng.next() * ok.length)];
      if (step >= closingStart(200)) {
        logits.fill(-Infinity);
        for (const t of ok) logits[t] = 0;
        id = c.pickClosing(logits);
      }
      c.accept(id);
      if (qwen.isEog(id)) break;
    }
    c.dispose();
  }
  console.log(`\n| vocabulary | tokens | mask ms p50 | mask ms p99 | masks | vocabulary setup ms | schema compile ms |`);
  console.log(`|---|---|---|---|---|---|---|`);
  console.log(`| qwen2 | ${qwen.nVocab} | ${pct(per, 0.5).toFixed(3)} | ${pct(per, 0.99).toFixed(3)} | ${per.length} | ${setupMs.toFixed(0)} | ${compileMs.toFixed(0)} |`);
  console.log(`\nThe mask time is what the main thread waits for it: the round trip to the engine's thread (grammar/engine-worker.ts), the UTF-8 and control-character masks prima adds to XGrammar's, and the copy nextMask() returns.`);
}
