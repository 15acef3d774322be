// engine/logprobs.ts and the sampler's logit_bias and log probabilities, on rows made up here: the top
// n by partial selection equal a full sort's, the values are log-softmax, and the sampler records the
// raw row's while the bias (then the constraint's mask) decides the token, greedy or sampled.
import { describe, expect, it } from "vitest";
import { Rng, Sampler, logSumExp, stepLogprobs, topLogprobs, type TokenConstraint } from "../../engine/index.js";

function row(n: number, seed: number): Float32Array {
  const rng = new Rng(seed);
  return Float32Array.from({ length: n }, () => (rng.next() - 0.5) * 20);
}

describe("logprobs of a row", () => {
  it("top n equals a full sort, values are log-softmax, ties keep the lower id first", () => {
    for (const seed of [1, 2, 3]) {
      const r = row(5000, seed);
      const lse = Math.log(r.reduce((a, v) => a + Math.exp(v), 0));
      expect(logSumExp(r)).toBeCloseTo(lse, 9);
      const sorted = Array.from(r.keys()).sort((a, b) => r[b] - r[a] || a - b);
      for (const n of [0, 1, 5, 20]) {
        expect(topLogprobs(r, n).map((t) => t.id)).toEqual(sorted.slice(0, n));
        for (const t of topLogprobs(r, n)) expect(t.logprob).toBeCloseTo(r[t.id] - lse, 9);
      }
    }
    expect(topLogprobs(Float32Array.of(1, 3, 3, 2), 3).map((t) => t.id)).toEqual([1, 2, 3]);
    expect(topLogprobs(Float32Array.of(1, 2), 5).map((t) => t.id)).toEqual([1, 0]);
    const s = stepLogprobs(Float32Array.of(0, Math.log(3)), 0, 1);
    expect(s.logprob).toBeCloseTo(Math.log(0.25), 6);
    expect(s.top[0].logprob).toBeCloseTo(Math.log(0.75), 6);
  });
});

describe("the sampler's logit_bias and log probabilities", () => {
  const base = Float32Array.of(1, 5, 4, 0);
  it("greedy: -100 on the argmax gives the runner-up, +100 forces; logprobs stay the raw row's", () => {
    const raw = stepLogprobs(base, 1, 2);
    const banned = new Sampler({ temperature: 0, logprobs: 2, logitBias: new Map([[1, -100]]) });
    expect(banned.sample(base.slice())).toBe(2);
    expect(banned.last).toEqual({ ...raw, id: 2, logprob: stepLogprobs(base, 2, 0).logprob });
    const forced = new Sampler({ temperature: 0, logitBias: new Map([[3, 100]]) });
    expect(forced.sample(base.slice())).toBe(3);
    expect(forced.last).toBeUndefined();
  });

  it("sampled: +100 forces whatever the seed", () => {
    for (let seed = 0; seed < 20; seed++) {
      expect(new Sampler({ temperature: 1.5, topK: 0, topP: 1, minP: 0, seed, logitBias: new Map([[0, 100]]) }).sample(base.slice())).toBe(0);
    }
  });

  it("the constraint's mask comes after the bias: a forbidden token stays forbidden", async () => {
    const only2: TokenConstraint = {
      async mask(l) {
        for (let i = 0; i < l.length; i++) if (i !== 2) l[i] = -Infinity;
        return 1;
      },
      accept: (id) => id === 2,
    };
    const s = new Sampler({ temperature: 0, constraint: only2, logprobs: 1, logitBias: new Map([[3, 100]]) });
    expect(await s.next(base.slice())).toBe(2);
    expect(s.last?.top[0].id).toBe(1);
  });

  it("-Infinity bans a token outright (llama-server's false), greedy or sampled", () => {
    const ban = new Map([[1, -Infinity]]);
    expect(new Sampler({ temperature: 0, logitBias: ban }).sample(base.slice())).toBe(2);
    for (let seed = 0; seed < 20; seed++) {
      expect(new Sampler({ temperature: 1.5, topK: 0, topP: 1, minP: 0, seed, repeatPenalty: 1.3, logitBias: ban }).sample(base.slice(), [1])).not.toBe(1);
    }
  });

  it("refuses bias ids and values that are not numbers", () => {
    expect(() => new Sampler({ logitBias: new Map([[-1, 1]]) })).toThrow(/token id/);
    expect(() => new Sampler({ logitBias: new Map([[1, NaN]]) })).toThrow(/must be a number/);
    expect(() => new Sampler({ logitBias: new Map([[1, Infinity]]) })).toThrow(/must be a number/);
    expect(() => new Sampler({ logprobs: 1.5 })).toThrow(/logprobs/);
  });
});
