// Perplexity and KL divergence over a text, computed as llama.cpp's llama-perplexity computes them, so
// the two agree on the same file: the text's tokens (BOS first) cut into chunks of ctx tokens, each
// chunk's first token replaced by BOS, the KV cache cleared per chunk, and only the second half of each
// chunk scored (every scored token then has at least ctx/2 tokens of context). The KL divergence's base
// file is llama-perplexity's own `--kl-divergence-base` format, so either program can write it and
// either can compare against it.
import type { Embedder, Pipeline } from "./generate.js";

/** The largest logit, its token, and log(sum(exp(logit - max))): a double sum of float exponentials,
 * as llama.cpp's log_softmax computes it. */
function softmaxNorm(logits: Float32Array, nVocab: number): { max: number; top: number; logSumExp: number } {
  let max = logits[0];
  let top = 0;
  for (let i = 1; i < nVocab; i++) if (logits[i] > max) { max = logits[i]; top = i; }
  let sum = 0;
  for (let i = 0; i < nVocab; i++) sum += Math.exp(Math.fround(logits[i] - max));
  return { max, top, logSumExp: Math.log(sum) };
}

/** -log p(tok) under softmax(logits). */
export function negLogProb(logits: Float32Array, nVocab: number, tok: number): number {
  const { max, logSumExp } = softmaxNorm(logits, nVocab);
  return max + logSumExp - logits[tok];
}

/** uint16 slots a row of the base file takes: the scale and minimum as two floats, then one value per
 * token, padded to an even count (llama-perplexity's `nv`). */
export function baseRowSlots(nVocab: number): number {
  return 2 * Math.floor((nVocab + 1) / 2) + 4;
}

const BASE_MAGIC = "_logits_";
/** The base file keeps log-probabilities within this many nats of the best; lower ones read as that. */
const BASE_RANGE = 16;

/** Writes one row of log-probabilities as llama-perplexity stores them: 16-bit steps between the
 * row's minimum (at most BASE_RANGE below its maximum) and its maximum. */
export function encodeBaseRow(logits: Float32Array, nVocab: number, out: Uint16Array): void {
  const norm = softmaxNorm(logits, nVocab);
  const max = norm.max;
  const logSumExp = Math.fround(norm.logSumExp);
  let min = logits[0];
  for (let i = 1; i < nVocab; i++) if (logits[i] < min) min = logits[i];
  min = Math.max(min, max - BASE_RANGE);
  const head = new Float32Array(out.buffer, out.byteOffset, 2);
  const scale = Math.fround((max - min) / 65535);
  head[0] = scale;
  head[1] = Math.fround(min - max - logSumExp);
  const values = out.subarray(4, 4 + nVocab);
  if (scale === 0) {
    values.fill(0);
    return;
  }
  const inv = Math.fround(1 / scale);
  for (let i = 0; i < nVocab; i++) values[i] = logits[i] > min ? Math.round(Math.fround(inv * (logits[i] - min))) : 0;
}

/** The log-probability of token i in a base row. */
function baseLogProb(row: Uint16Array, i: number): number {
  const head = new Float32Array(row.buffer, row.byteOffset, 2);
  return Math.fround(head[0] * row[4 + i] + head[1]);
}

/** Running sums of the comparison with a base model, as llama-perplexity keeps them. */
export class KlStats {
  count = 0;
  sumNll = 0;
  sumNll2 = 0;
  sumNllBase = 0;
  sumNllBase2 = 0;
  sumNllNllBase = 0;
  sumKld = 0;
  sumKld2 = 0;
  sumPDiff = 0;
  sumPDiff2 = 0;
  maxPDiff = 0;
  sameTop = 0;
  readonly klds: number[] = [];

  /** Adds one scored position: our logits against the base row, the true next token tok. */
  add(logits: Float32Array, nVocab: number, base: Uint16Array, tok: number): void {
    const { max, top, logSumExp } = softmaxNorm(logits, nVocab);
    const nll = max + logSumExp - logits[tok];
    const nllBase = -baseLogProb(base, tok);
    this.sumNll += nll;
    this.sumNll2 += nll * nll;
    this.sumNllBase += nllBase;
    this.sumNllBase2 += nllBase * nllBase;
    this.sumNllNllBase += nll * nllBase;
    let kld = 0;
    let topBase = 0;
    let bestBase = -Infinity;
    for (let i = 0; i < nVocab; i++) {
      const lpBase = baseLogProb(base, i);
      if (lpBase > bestBase) { bestBase = lpBase; topBase = i; }
      if (lpBase > -BASE_RANGE) kld += Math.exp(lpBase) * (lpBase - (logits[i] - max - logSumExp));
    }
    this.sumKld += kld;
    this.sumKld2 += kld * kld;
    this.klds.push(kld);
    if (top === topBase) this.sameTop++;
    const pDiff = Math.exp(-nll) - Math.exp(-nllBase);
    this.sumPDiff += pDiff;
    this.sumPDiff2 += pDiff * pDiff;
    this.maxPDiff = Math.max(this.maxPDiff, Math.abs(pDiff));
    this.count++;
  }
}

/** A mean and its standard error (0 for fewer than 11 values, as llama-perplexity reports it). */
function meanAndError(sum: number, sum2: number, n: number): { mean: number; error: number } {
  if (n < 1) return { mean: 0, error: 0 };
  const mean = sum / n;
  const v = sum2 / n - mean * mean;
  return { mean, error: v > 0 && n > 10 ? Math.sqrt(v / (n - 1)) : 0 };
}

export interface KlSummary {
  /** Perplexity of this model and of the base. */
  readonly ppl: number;
  readonly pplBase: number;
  /** Mean of ln(PPL / PPL(base)) and its standard error. */
  readonly lnPplRatio: number;
  readonly lnPplRatioError: number;
  readonly meanKld: number;
  readonly meanKldError: number;
  readonly medianKld: number;
  readonly p99Kld: number;
  readonly maxKld: number;
  /** Share of positions whose most likely token is the base's. */
  readonly sameTop: number;
  /** Root mean square of p(true token) - p_base(true token). */
  readonly rmsPDiff: number;
  readonly maxPDiff: number;
  readonly count: number;
}

export function summarizeKl(s: KlStats): KlSummary {
  const n = s.count;
  const nll = meanAndError(s.sumNll, s.sumNll2, n);
  const base = meanAndError(s.sumNllBase, s.sumNllBase2, n);
  const kld = meanAndError(s.sumKld, s.sumKld2, n);
  // ln(PPL/PPL_base) is the difference of the two mean NLLs; its error uses their covariance.
  const cov = n >= 10 ? (s.sumNllNllBase / n - (s.sumNll / n) * (s.sumNllBase / n)) / (n - 1) : 0;
  const ratioVar = nll.error ** 2 + base.error ** 2 - 2 * cov;
  const sorted = [...s.klds].sort((a, b) => a - b);
  const at = (q: number) => (sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(q * (sorted.length - 1) + 0.5))] : 0);
  return {
    ppl: Math.exp(nll.mean), pplBase: Math.exp(base.mean),
    lnPplRatio: nll.mean - base.mean, lnPplRatioError: ratioVar > 0 ? Math.sqrt(ratioVar) : 0,
    meanKld: kld.mean, meanKldError: kld.error, medianKld: at(0.5), p99Kld: at(0.99), maxKld: sorted.length ? sorted[sorted.length - 1] : 0,
    sameTop: n ? s.sameTop / n : 0, rmsPDiff: n ? Math.sqrt(s.sumPDiff2 / n) : 0, maxPDiff: s.maxPDiff, count: n,
  };
}

/** The header of a base file: what it was computed over. */
export interface BaseHeader {
  readonly nCtx: number;
  readonly nVocab: number;
  readonly nChunks: number;
  /** The evaluated tokens, nChunks * nCtx of them. */
  readonly tokens: Int32Array;
}

export function encodeBaseHeader(h: BaseHeader): Buffer {
  const head = Buffer.alloc(8 + 12);
  head.write(BASE_MAGIC, 0, "latin1");
  head.writeUInt32LE(h.nCtx, 8);
  head.writeInt32LE(h.nVocab, 12);
  head.writeInt32LE(h.nChunks, 16);
  return Buffer.concat([head, Buffer.from(h.tokens.buffer, h.tokens.byteOffset, h.nChunks * h.nCtx * 4)]);
}

/** Reads a base file's header, checked against its size; throws naming what is wrong. */
export function decodeBaseHeader(file: Buffer, name: string): BaseHeader & { readonly rowsOffset: number } {
  if (file.length < 20 || file.toString("latin1", 0, 8) !== BASE_MAGIC) throw new Error(`${name} does not look like a file of log-probabilities (llama-perplexity --kl-divergence-base)`);
  const nCtx = file.readUInt32LE(8);
  const nVocab = file.readInt32LE(12);
  const nChunks = file.readInt32LE(16);
  if (nCtx < 4 || nCtx > 1 << 22 || nVocab < 1 || nVocab > 1 << 24 || nChunks < 1 || nChunks > 1 << 20) {
    throw new Error(`${name}: its header is not plausible (ctx ${nCtx}, vocabulary ${nVocab}, chunks ${nChunks})`);
  }
  const rowsOffset = 20 + nCtx * nChunks * 4;
  const need = rowsOffset + nChunks * scoredPerChunk(nCtx) * baseRowSlots(nVocab) * 2;
  if (file.length < need) throw new Error(`${name} is truncated: ${file.length} bytes where its header needs ${need}`);
  const tokens = new Int32Array(nCtx * nChunks);
  for (let i = 0; i < tokens.length; i++) tokens[i] = file.readInt32LE(20 + 4 * i);
  return { nCtx, nVocab, nChunks, tokens, rowsOffset };
}

/** Positions of a chunk that are scored: the second half, less the last (it has no next token). */
export function scoredPerChunk(nCtx: number): number {
  return nCtx - 1 - Math.floor(nCtx / 2);
}

export interface PerplexityOptions {
  readonly nCtx: number;
  /** Rows per forward call. */
  readonly batch: number;
  /** The BOS id each chunk starts with (null: the model adds none, and chunks start as they are). */
  readonly bos: number | null;
  readonly nVocab: number;
  /** Output norm + head over one row of final activations. */
  readonly rowLogits: (row: Float32Array) => Promise<Float32Array>;
  /** Called with each scored position's logits (chunk, index within the chunk's scored part). */
  readonly onScored?: (chunk: number, i: number, logits: Float32Array, nextToken: number) => void;
  /** Called after each chunk with the running perplexity. */
  readonly onChunk?: (chunk: number, nChunks: number, ppl: number) => void;
  /** At most this many chunks (default all). */
  readonly maxChunks?: number;
}

export interface PerplexityResult {
  readonly ppl: number;
  /** Its standard error, as llama-perplexity's "+/-". */
  readonly pplError: number;
  readonly nChunks: number;
  readonly scored: number;
  readonly tokens: number;
  /** The chunks' tokens as evaluated (before each chunk's BOS replacement), nChunks * nCtx. */
  readonly evaluated: Int32Array;
}

/**
 * Perplexity of `tokens` (already tokenized with BOS first where the model adds one) through a pipeline
 * of every layer, whose forward leaves the final activations of every row in place.
 */
export async function perplexity(embedder: Embedder, pipeline: Pipeline, tokens: Int32Array, o: PerplexityOptions): Promise<PerplexityResult> {
  const n = o.nCtx;
  if (n > pipeline.nCtx) throw new Error(`a chunk of ${n} tokens does not fit the context of ${pipeline.nCtx}`);
  if (tokens.length < n) throw new Error(`${tokens.length} tokens make no chunk of ${n}`);
  const nChunks = Math.min(Math.floor(tokens.length / n), o.maxChunks ?? Infinity);
  const first = Math.floor(n / 2);
  const E = embedder.nEmbd;
  let nll = 0;
  let nll2 = 0;
  let count = 0;
  for (let c = 0; c < nChunks; c++) {
    const chunk = tokens.slice(c * n, (c + 1) * n);
    if (o.bos !== null) chunk[0] = o.bos;
    pipeline.truncate(0);
    for (let b = 0; b < n; b += o.batch) {
      const size = Math.min(o.batch, n - b);
      const acts = embedder.embed(chunk.subarray(b, b + size));
      await pipeline.forward(acts, b, size);
      for (let r = Math.max(0, first - b); r < size; r++) {
        const pos = b + r;
        if (pos >= n - 1) break;
        const next = tokens[c * n + pos + 1];
        const logits = await o.rowLogits(acts.subarray(r * E, (r + 1) * E));
        const v = negLogProb(logits, o.nVocab, next);
        nll += v;
        nll2 += v * v;
        count++;
        o.onScored?.(c, pos - first, logits, next);
      }
    }
    o.onChunk?.(c, nChunks, Math.exp(nll / count));
  }
  const mean = nll / count;
  const variance = nll2 / count - mean * mean;
  const ppl = Math.exp(mean);
  return {
    ppl, pplError: variance > 0 ? Math.sqrt(variance / (count - 1)) * ppl : 0,
    nChunks, scored: count, tokens: tokens.length, evaluated: tokens.slice(0, nChunks * n),
  };
}
