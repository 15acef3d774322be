// Generating past the context: llama.cpp's context shift. When the cache is full, the first `keep`
// tokens stay (attention sinks: BOS, a system prompt), half of the rest (the oldest) is dropped, and
// the later entries move down with their keys re-rotated (native kv_shift.c), on every device.
// The KV journal records what went into a cache (tokens forwarded, shifts made), so that a cache can
// be matched against the next prompt and rebuilt exactly on other devices (failover).
import type { Embedder, Pipeline } from "./generate.js";

export interface ContextShift {
  /** Positions [0, keep) never move (llama.cpp's n_keep, BOS counted: resolveKeep). */
  readonly keep: number;
  /** Tokens dropped per shift; 0 or undefined: half of those after `keep` (llama-server's n_discard). */
  readonly discard?: number;
  /** H2O eviction instead (engine/h2o.ts): keep this fraction of the context (--kv-budget), the first
   * `keep` positions, the most recent and the most attended; `discard` does not apply. */
  readonly h2o?: number;
}

/** llama-server's n_keep: -1 keeps the whole prompt, else N tokens after the BOS (which is always
 * kept), and at most the context less 4. */
export function resolveKeep(nKeep: number, promptTokens: number, addBos: boolean, nCtx: number): number {
  const keep = nKeep < 0 ? promptTokens : nKeep + (addBos ? 1 : 0);
  return Math.max(0, Math.min(nCtx - 4, keep));
}

/** Tokens one shift drops with nPast positions in the cache (llama-server's rule: half of those after
 * keep, or the asked number, and at least one of them left); 0: nothing can be dropped. */
export function discardFor(nPast: number, s: ContextShift): number {
  const left = nPast - s.keep;
  const want = s.discard ? s.discard : Math.floor(left / 2);
  return Math.max(0, Math.min(want, left - 1));
}

interface ShiftEvent {
  /** Tokens of the history forwarded before the shift. */
  readonly at: number;
  readonly keep: number;
  readonly discard: number;
}

export class KvJournal {
  /** Every token that went through the layers, in order (the history: shifts do not remove any). */
  private history: number[] = [];
  private shifts: ShiftEvent[] = [];
  /** The cache's tokens, position by position. */
  private kv: number[] = [];

  /** Positions the cache holds. */
  get pos(): number {
    return this.kv.length;
  }

  /** The cache's tokens, position by position. */
  get tokens(): readonly number[] {
    return this.kv;
  }

  get shifted(): boolean {
    return this.shifts.length > 0;
  }

  /** Tokens forwarded since the journal started (after a truncation: from its kept prefix). */
  get forwardedCount(): number {
    return this.history.length;
  }

  forwarded(ids: ArrayLike<number>): void {
    for (let i = 0; i < ids.length; i++) {
      this.history.push(ids[i]);
      this.kv.push(ids[i]);
    }
  }

  shift(keep: number, discard: number): void {
    this.shifts.push({ at: this.history.length, keep, discard });
    this.kv.splice(keep, discard);
  }

  clear(): void {
    this.history = [];
    this.shifts = [];
    this.kv = [];
  }

  /** Positions that hold what was forwarded there, untouched by any shift (their keys computed once,
   * at that position, over the tokens before them). */
  private get stablePrefix(): number {
    return this.shifts.reduce((m, s) => Math.min(m, s.keep), this.kv.length);
  }

  /**
   * How a prompt continues this cache: the positions kept, and the prompt's tokens left to forward.
   * A prompt that extends the whole history (a conversation's next turn, the cache shifted or not)
   * continues from the cache as it is; any other keeps the longest prefix it shares with the cache
   * that no shift touched, and at least one token is left to forward (its logits). The journal is
   * cut to what is kept. `resumable` (Pipeline.resumable) is the cache's own say: sliding-window rings
   * may no longer hold what an older prefix needs, and then it starts at 0.
   */
  continueWith(prompt: Int32Array, resumable?: (pos: number) => number): { startPos: number; rest: Int32Array } {
    const h = this.history;
    const end = this.kv.length;
    if (this.shifted && prompt.length > h.length && h.every((t, i) => prompt[i] === t) && (!resumable || resumable(end) === end)) {
      return { startPos: end, rest: prompt.subarray(h.length) };
    }
    const limit = Math.min(this.stablePrefix, prompt.length - 1);
    let n = 0;
    while (n < limit && this.kv[n] === prompt[n]) n++;
    if (resumable) n = resumable(n);
    this.truncate(n);
    return { startPos: n, rest: prompt.subarray(n) };
  }

  /** Keeps positions [0, n); n must be within the prefix no shift touched. */
  truncate(n: number): void {
    if (n > this.stablePrefix) throw new Error(`cannot cut a shifted cache to ${n} positions (its first ${this.stablePrefix} are as forwarded)`);
    this.kv.length = n;
    this.history = this.kv.slice();
    this.shifts = [];
  }

  /**
   * Rebuilds the cache on a fresh pipeline: the first `tokens` of the history forwarded and each shift
   * made at the same point, so that every device's cache is the one lost (the kernels give a token's
   * row the same bits whatever batch it is in). Returns the position after it.
   */
  async replay(embedder: Embedder, pipeline: Pipeline, tokens = this.history.length): Promise<number> {
    pipeline.truncate(0);
    let pos = 0, done = 0;
    const forward = async (end: number) => {
      if (end <= done) return;
      const ids = Int32Array.from(this.history.slice(done, end));
      await pipeline.forward(embedder.embed(ids), pos, ids.length);
      pos += ids.length;
      done = end;
    };
    for (const s of this.shifts) {
      if (s.at > tokens) break;
      await forward(s.at);
      if (!pipeline.shift) throw new Error("this pipeline cannot shift its context");
      await pipeline.shift(s.keep, s.discard, pos);
      pos -= s.discard;
    }
    await forward(tokens);
    return pos;
  }
}

/** After a failure, on a fresh pipeline: the journal's cache rebuilt, and what of `stream` (the
 * request's prompt and tokens generated so far, whose start the journal holds) is left to forward. */
export async function replayJournal(journal: KvJournal, embedder: Embedder, pipeline: Pipeline, stream: readonly number[]): Promise<{ startPos: number; input: Int32Array }> {
  const done = journal.forwardedCount;
  if (done >= stream.length) throw new Error(`nothing left to replay: the cache holds all ${stream.length} tokens of the request`);
  const startPos = await journal.replay(embedder, pipeline);
  return { startPos, input: Int32Array.from(stream.slice(done)) };
}
