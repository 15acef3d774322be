// Log probabilities of a logits row: the model's own distribution (log-softmax of the raw logits, in
// float64), the chosen token's and the n most likely. For the APIs' logprobs (OpenAI's logprobs and
// top_logprobs, llama-server's n_probs). A partial selection keeps the n best in one pass over the
// vocabulary: no sort of a 150k row per token.

export interface TokenLogprob {
  readonly id: number;
  readonly logprob: number;
}

/** log(sum(exp(logits))), stable; -Infinity entries count as zero probability. */
export function logSumExp(logits: ArrayLike<number>): number {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i] > max) max = logits[i];
  if (max === -Infinity || !Number.isFinite(max)) return max;
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i] - max);
  return max + Math.log(sum);
}

/** Fills ids/vals with the k largest logits, largest first (ties: the lower id first, as argmax), in
 * one pass: a sorted list of the best so far, which most logits fail to enter at the first comparison
 * (NaN never enters a full list). Returns how many it holds (k, or fewer for a shorter row). */
export function keepTopK(logits: ArrayLike<number>, k: number, ids: Int32Array, vals: Float32Array | Float64Array): number {
  let have = 0;
  for (let i = 0; i < logits.length; i++) {
    const v = logits[i];
    if (have === k && !(v > vals[k - 1])) continue;
    let j = have < k ? have++ : k - 1;
    while (j > 0 && vals[j - 1] < v) {
      vals[j] = vals[j - 1];
      ids[j] = ids[j - 1];
      j--;
    }
    vals[j] = v;
    ids[j] = i;
  }
  return have;
}

/** The n most likely tokens, most likely first (ties: the lower id first, as argmax), with their log
 * probabilities given lse = logSumExp(logits). */
export function topLogprobs(logits: ArrayLike<number>, n: number, lse = logSumExp(logits)): TokenLogprob[] {
  const k = Math.min(Math.max(0, Math.floor(n)), logits.length);
  if (k === 0) return [];
  const ids = new Int32Array(k);
  const vals = new Float64Array(k);
  const have = keepTopK(logits, k, ids, vals);
  const out: TokenLogprob[] = [];
  for (let i = 0; i < have; i++) out.push({ id: ids[i], logprob: vals[i] - lse });
  return out;
}

/** A sampled token's log probability and the n most likely alternatives at its step. */
export interface StepLogprobs {
  readonly id: number;
  readonly logprob: number;
  readonly top: readonly TokenLogprob[];
}

/** Log probabilities of one step: token id's and the top n, from the same (raw) row. */
export function stepLogprobs(logits: ArrayLike<number>, id: number, n: number): StepLogprobs {
  const lse = logSumExp(logits);
  return { id, logprob: logits[id] - lse, top: topLogprobs(logits, n, lse) };
}
