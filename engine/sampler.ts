// Token sampling: repetition penalties, top-k, top-p, min-p, temperature, then a seeded draw, in
// llama.cpp's default order. Greedy (argmax) when the temperature is 0. Reproducible for a seed.
// With a constraint (grammar/: JSON Schema, tools), tokens it forbids are masked out before the draw.
// Order at each step: the log probabilities are read (the model's raw distribution), then logit_bias
// is added, then the constraint masks (a bias never lets a forbidden token through), then penalties
// and the draw (or the argmax).
import { keepTopK, stepLogprobs, type StepLogprobs } from "./logprobs.js";

/** Which tokens may come next (structured output); the sampler masks the rest out. */
export interface TokenConstraint {
  /** Sets the logits of the tokens it forbids next to -Infinity; returns how many are allowed. */
  mask(logits: Float32Array): Promise<number>;
  /** The token chosen; false when the constraint refuses it. */
  accept(id: number): boolean;
  /** The token (finite logit) that most quickly ends the output, for a reply near its budget. */
  pickClosing?(logits: Float32Array): number;
}

export interface SamplerOptions {
  /** 0 = greedy. Default 0.8. */
  readonly temperature?: number;
  /** Keep the k most likely tokens; 0 disables. Default 40. */
  readonly topK?: number;
  /** Keep the smallest set whose probability reaches p; 1 disables. Default 0.95. */
  readonly topP?: number;
  /** Drop tokens below minP x the top probability; 0 disables. Default 0.05. */
  readonly minP?: number;
  /** Divides positive logits (multiplies negative ones) of recently seen tokens; 1 disables. Default 1. */
  readonly repeatPenalty?: number;
  /** How many recent tokens the penalties look at. Default 64. */
  readonly repeatLastN?: number;
  readonly frequencyPenalty?: number;
  readonly presencePenalty?: number;
  /** Seed of the draw; default random. */
  readonly seed?: number;
  /** Only tokens this allows are drawn (structured output). */
  readonly constraint?: TokenConstraint;
  /** After this many constrained tokens, let the constraint steer to the quickest end (pickClosing), so
   * that the value ends within its budget. */
  readonly closeAfter?: number;
  /** Added to these tokens' logits before anything else changes them (OpenAI's logit_bias; -100
   * effectively bans a token, +100 all but forces it; -Infinity bans it outright). */
  readonly logitBias?: ReadonlyMap<number, number>;
  /** Record each step's log probabilities (`last`): the chosen token's and this many alternatives.
   * They are the model's distribution, log-softmax of the raw logits: before logit_bias, penalties,
   * the constraint's mask and temperature, as OpenAI reports them. Undefined: none recorded. */
  readonly logprobs?: number;
}

export class SamplerError extends Error {
  override name = "SamplerError";
  /** The option out of its range, so an API can name its own field. */
  constructor(readonly option: keyof SamplerOptions, message: string) {
    super(message);
  }
}

/** sfc32: small, fast, and good enough for sampling; seeded through splitmix32. */
export class Rng {
  private a: number;
  private b: number;
  private c: number;
  private d: number;
  constructor(seed: number) {
    let s = seed >>> 0;
    const next = () => {
      s = (s + 0x9e3779b9) >>> 0;
      let z = s;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
      return (z ^ (z >>> 16)) >>> 0;
    };
    this.a = next();
    this.b = next();
    this.c = next();
    this.d = next();
  }
  /** Uniform in [0, 1). */
  next(): number {
    const t = (((this.a + this.b) >>> 0) + this.d) >>> 0;
    this.d = (this.d + 1) >>> 0;
    this.a = this.b ^ (this.b >>> 9);
    this.b = (this.c + (this.c << 3)) >>> 0;
    this.c = ((this.c << 21) | (this.c >>> 11)) >>> 0;
    this.c = (this.c + t) >>> 0;
    return t / 4294967296;
  }
}

export function argmax(logits: ArrayLike<number>): number {
  let best = 0;
  let bestV = logits[0];
  for (let i = 1; i < logits.length; i++) {
    if (logits[i] > bestV) {
      bestV = logits[i];
      best = i;
    }
  }
  return best;
}

export class Sampler {
  readonly temperature: number;
  readonly topK: number;
  readonly topP: number;
  readonly minP: number;
  readonly repeatPenalty: number;
  readonly repeatLastN: number;
  readonly frequencyPenalty: number;
  readonly presencePenalty: number;
  readonly seed: number;
  readonly constraint: TokenConstraint | undefined;
  readonly closeAfter: number;
  readonly logitBias: ReadonlyMap<number, number> | undefined;
  readonly logprobs: number | undefined;
  /** The last step's log probabilities (with the logprobs option). */
  last: StepLogprobs | undefined;
  private raw = new Float32Array(0);
  private steps = 0;
  private readonly rng: Rng;
  private ids = new Int32Array(0);
  private vals = new Float32Array(0);

  constructor(o: SamplerOptions = {}) {
    this.temperature = o.temperature ?? 0.8;
    this.topK = o.topK ?? 40;
    this.topP = o.topP ?? 0.95;
    this.minP = o.minP ?? 0.05;
    this.repeatPenalty = o.repeatPenalty ?? 1;
    this.repeatLastN = o.repeatLastN ?? 64;
    this.frequencyPenalty = o.frequencyPenalty ?? 0;
    this.presencePenalty = o.presencePenalty ?? 0;
    this.seed = o.seed ?? Math.floor(Math.random() * 2 ** 32);
    this.constraint = o.constraint;
    this.closeAfter = o.closeAfter ?? Infinity;
    this.logitBias = o.logitBias && o.logitBias.size > 0 ? o.logitBias : undefined;
    this.logprobs = o.logprobs;
    const check = (ok: boolean, option: keyof SamplerOptions, what: string) => {
      if (!ok) throw new SamplerError(option, what);
    };
    check(Number.isFinite(this.temperature) && this.temperature >= 0, "temperature", `temperature must be >= 0 (got ${this.temperature})`);
    check(Number.isInteger(this.topK) && this.topK >= 0, "topK", `top-k must be a whole number >= 0 (got ${this.topK})`);
    // top-p 0 keeps the most probable token alone, as llama.cpp's (which keeps at least one) and OpenAI's.
    check(this.topP >= 0 && this.topP <= 1, "topP", `top-p must be in [0, 1] (got ${this.topP})`);
    check(this.minP >= 0 && this.minP < 1, "minP", `min-p must be in [0, 1) (got ${this.minP})`);
    check(this.repeatPenalty > 0 && Number.isFinite(this.repeatPenalty), "repeatPenalty", `repeat penalty must be > 0 (got ${this.repeatPenalty})`);
    check(Number.isInteger(this.repeatLastN) && this.repeatLastN >= 0, "repeatLastN", `repeat-last-n must be a whole number >= 0`);
    check(Number.isFinite(this.frequencyPenalty), "frequencyPenalty", `frequency penalty must be a number (got ${this.frequencyPenalty})`);
    check(Number.isFinite(this.presencePenalty), "presencePenalty", `presence penalty must be a number (got ${this.presencePenalty})`);
    check(Number.isInteger(this.seed) && this.seed >= 0 && this.seed < 2 ** 32, "seed", `seed must be an integer in [0, 2^32)`);
    check(this.logprobs === undefined || (Number.isInteger(this.logprobs) && this.logprobs >= 0), "logprobs", `logprobs must be a whole number >= 0 (got ${this.logprobs})`);
    for (const [id, bias] of this.logitBias ?? []) {
      check(Number.isInteger(id) && id >= 0, "logitBias", `logit bias: token id ${id} is not a token id`);
      // -Infinity bans the token (llama-server's `false`); +Infinity would not pick one token among several.
      check(Number.isFinite(bias) || bias === -Infinity, "logitBias", `logit bias of token ${id} must be a number (got ${bias})`);
    }
    this.rng = new Rng(this.seed);
  }

  get greedy(): boolean {
    return this.temperature === 0;
  }

  /** Picks the next token among those the constraint allows (generate's entry point). logits may be
   * modified (bias, mask and penalties are applied in place). */
  async next(logits: Float32Array, history: ArrayLike<number> = []): Promise<number> {
    const c = this.constraint;
    if (!c) return this.sample(logits, history);
    this.before(logits);
    if ((await c.mask(logits)) === 0) throw new SamplerError("constraint", "the constraint allows no token here");
    const id = ++this.steps > this.closeAfter && c.pickClosing ? c.pickClosing(logits) : this.choose(logits, history);
    if (!c.accept(id)) throw new SamplerError("constraint", `the constraint refused token ${id}, which its own mask allowed`);
    return this.after(id);
  }

  /** Picks the next token, unconstrained. logits may be modified (bias and penalties are applied in place). */
  sample(logits: Float32Array, history: ArrayLike<number> = []): number {
    this.before(logits);
    return this.after(this.choose(logits, history));
  }

  /** Keeps the raw row for the log probabilities, then adds the bias. */
  private before(logits: Float32Array): void {
    if (this.logprobs !== undefined) {
      if (this.raw.length !== logits.length) this.raw = new Float32Array(logits.length);
      this.raw.set(logits);
    }
    if (this.logitBias) for (const [id, bias] of this.logitBias) if (id < logits.length) logits[id] += bias;
  }

  private after(id: number): number {
    if (this.logprobs !== undefined) this.last = stepLogprobs(this.raw, id, this.logprobs);
    return id;
  }

  /** Penalties, then the argmax or the draw. */
  private choose(logits: Float32Array, history: ArrayLike<number>): number {
    this.applyPenalties(logits, history);
    if (this.greedy) return argmax(logits);
    let n = this.selectTopK(logits);
    // Masked-out tokens (-Infinity) are never drawn, however few are left.
    while (n > 1 && this.vals[n - 1] === -Infinity) n--;
    const ids = this.ids, vals = this.vals;
    // Softmax over the (descending) candidates for top-p and min-p, before temperature, as llama.cpp.
    const max = vals[0];
    let sum = 0;
    for (let i = 0; i < n; i++) sum += Math.exp(vals[i] - max);
    if (this.topP < 1) {
      let cum = 0;
      for (let i = 0; i < n; i++) {
        cum += Math.exp(vals[i] - max) / sum;
        if (cum >= this.topP) {
          n = i + 1;
          break;
        }
      }
    }
    if (this.minP > 0) {
      const floor = max + Math.log(this.minP);
      let keep = 1;
      while (keep < n && vals[keep] >= floor) keep++;
      n = keep;
    }
    let total = 0;
    const probs = new Float64Array(n);
    for (let i = 0; i < n; i++) {
      probs[i] = Math.exp((vals[i] - max) / this.temperature);
      total += probs[i];
    }
    let r = this.rng.next() * total;
    for (let i = 0; i < n; i++) {
      r -= probs[i];
      if (r < 0) return ids[i];
    }
    return ids[n - 1];
  }

  private applyPenalties(logits: Float32Array, history: ArrayLike<number>): void {
    if (this.repeatLastN === 0 || history.length === 0) return;
    if (this.repeatPenalty === 1 && this.frequencyPenalty === 0 && this.presencePenalty === 0) return;
    const counts = new Map<number, number>();
    for (let i = Math.max(0, history.length - this.repeatLastN); i < history.length; i++) {
      const id = history[i];
      if (id >= 0 && id < logits.length) counts.set(id, (counts.get(id) ?? 0) + 1);
    }
    for (const [id, count] of counts) {
      let l = logits[id];
      l = l > 0 ? l / this.repeatPenalty : l * this.repeatPenalty;
      l -= count * this.frequencyPenalty + this.presencePenalty;
      logits[id] = l;
    }
  }

  /** Fills ids/vals with the candidates in descending logit order; returns how many. */
  private selectTopK(logits: Float32Array): number {
    const V = logits.length;
    const k = this.topK > 0 && this.topK < V ? this.topK : V;
    if (this.ids.length < k) {
      this.ids = new Int32Array(k);
      this.vals = new Float32Array(k);
    }
    const ids = this.ids, vals = this.vals;
    if (k === V) {
      const order = Array.from({ length: V }, (_, i) => i).sort((a, b) => logits[b] - logits[a]);
      for (let i = 0; i < V; i++) {
        ids[i] = order[i];
        vals[i] = logits[order[i]];
      }
      return V;
    }
    return keepTopK(logits, k, ids, vals);
  }
}
