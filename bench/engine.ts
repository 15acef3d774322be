// Our engine measured the way llama-bench measures llama.cpp: prompt = one batch of P random tokens
// from position 0 (logits of the last row), decode = D single-token steps from position 0, each with
// its embedding, forward, logits and a greedy pick: our whole per-token loop counts.
import { LocalModel, LocalPipeline, Rng, Sampler } from "../engine/index.js";

export interface EngineResult {
  readonly promptTokS: number;
  readonly decodeTokS: number;
}

export async function benchEngine(path: string, o: { threads: number; prompt: number; decode: number; reps: number }): Promise<EngineResult> {
  const model = LocalModel.open(path, { threads: o.threads });
  const pipe = new LocalPipeline(model, Math.max(o.prompt, o.decode) + 1, 512);
  const rng = new Rng(42);
  const randomTokens = (n: number) => Int32Array.from({ length: n }, () => Math.floor(rng.next() * model.nVocab));
  const sampler = new Sampler({ temperature: 0 });
  const run = async () => {
    pipe.truncate(0);
    const t0 = performance.now();
    await pipe.forward(model.embed(randomTokens(o.prompt)), 0, o.prompt);
    const pp = (o.prompt / (performance.now() - t0)) * 1000;
    pipe.truncate(0);
    const row = new Float32Array(model.nEmbd);
    const tok = randomTokens(1);
    const t1 = performance.now();
    for (let i = 0; i < o.decode; i++) {
      const logits = await pipe.forward(model.embed(tok, row), i, 1);
      tok[0] = sampler.sample(logits);
    }
    const tg = (o.decode / (performance.now() - t1)) * 1000;
    return { pp, tg };
  };
  await run(); // warm-up: page in the weights, as llama-bench's own warm-up run does
  let pp = 0, tg = 0;
  for (let r = 0; r < o.reps; r++) {
    const x = await run();
    pp += x.pp;
    tg += x.tg;
  }
  pipe.close();
  model.close();
  return { promptTokS: pp / o.reps, decodeTokS: tg / o.reps };
}
