// Parallel sequences on one device (issue #32): N sequence slots, each a window of every layer with its
// own KV cache of nCtx tokens, decoded together. A step takes the next token of every active sequence
// through ONE pass over the weights (the matmuls take N rows; attention runs per sequence over its own
// cache: NativeWindow.forwardSeqs); a new sequence's prompt is prefilled on its own slot alone.
import type { KvCacheTypes } from "../model/index.js";
import type { NativeWindow } from "../native/index.js";
import type { LocalModel } from "./local-model.js";
import { NonFiniteError, QuickForward, checkFinite } from "./quick-forward.js";

export interface SeqRow {
  readonly slot: number;
  readonly token: number;
  /** Its position in the slot's cache (the slot's filled length: the cache holds 0..pos-1). */
  readonly pos: number;
}

export class SeqSlots {
  readonly windows: NativeWindow[] = [];
  private readonly runners: QuickForward[] = [];
  private readonly owned: boolean[] = [];
  private readonly prefillLogits: Float32Array;
  private stepLogits: Float32Array;
  private stepActs: Float32Array;

  /** first: a window over every layer of nCtx tokens to use as slot 0 (the caller keeps closing it). */
  constructor(readonly model: LocalModel, readonly size: number, readonly nCtx: number, maxBatch = 128, first?: NativeWindow,
    kvCacheTypes?: KvCacheTypes) {
    if (!Number.isInteger(size) || size < 1 || size > maxBatch) throw new RangeError(`sequence slots: from 1 to ${maxBatch} (the batch), not ${size}`);
    try {
      for (let i = 0; i < size; i++) {
        const w = i === 0 && first ? first : model.window(0, model.nLayers, { ctx: nCtx, maxBatch, kvCacheTypes });
        this.windows.push(w);
        this.owned.push(!(i === 0 && first));
        this.runners.push(new QuickForward(w));
      }
    } catch (e) {
      this.close();
      throw e;
    }
    this.prefillLogits = new Float32Array(model.nVocab);
    this.stepLogits = new Float32Array(size * model.nVocab);
    this.stepActs = new Float32Array(size * model.nEmbd);
  }

  /** Positions of a slot's cache that hold data. */
  filled(slot: number): number {
    return this.windows[slot].info().filled;
  }

  /** The largest position <= pos a slot's cache can continue from (Pipeline.resumable). */
  resumable(slot: number, pos: number): number {
    return this.windows[slot].kvResumable(pos);
  }

  /** Forgets a slot's positions >= pos. */
  truncate(slot: number, pos: number): void {
    const w = this.windows[slot];
    w.kvTruncate(Math.min(pos, w.info().filled));
  }

  /** Context shift in one slot's cache: drops [p0, p0 + nDiscard) and moves [p0 + nDiscard, nPast)
   * down (NativeWindow.kvShift). */
  shift(slot: number, p0: number, nDiscard: number, nPast: number): void {
    this.windows[slot].kvShift(p0, nDiscard, nPast);
  }

  /** A sequence's prompt (or the part of it not cached) through its slot alone, at pos..; the last
   * row's logits (reused by the next prefill). onRows: the rows after every layer (what an embedding pools). */
  async prefill(slot: number, tokens: Int32Array, pos: number, onRows?: (rows: Float32Array) => void): Promise<Float32Array> {
    this.truncate(slot, pos);
    const rows = this.model.embed(tokens);
    await this.runners[slot].forward(rows, pos, tokens.length, this.prefillLogits);
    onRows?.(rows);
    return this.prefillLogits;
  }

  /** One decode step: each row's token at its position in its slot, all in one pass. Returns one
   * logits row per input row, in order (views of a buffer the next step reuses), or the NonFiniteError
   * of a row whose pass overflowed (its slot forgets the position; the other rows are fine). */
  async step(rows: readonly SeqRow[]): Promise<(Float32Array | NonFiniteError)[]> {
    const n = rows.length, E = this.model.nEmbd, V = this.model.nVocab;
    const acts = this.stepActs.subarray(0, n * E), logits = this.stepLogits.subarray(0, n * V);
    this.model.embed(Int32Array.from(rows, (r) => r.token), acts);
    const wins = rows.map((r) => this.windows[r.slot]);
    // the lead lends its scratch: the first row's own window
    await wins[0].forwardSeqs(wins, acts, Int32Array.from(rows, (r) => r.pos), logits);
    return rows.map((r, i) => {
      const l = logits.subarray(i * V, (i + 1) * V);
      try {
        checkFinite(wins[i], acts.subarray(i * E, (i + 1) * E), r.pos, 1, l);
        return l;
      } catch (e) {
        if (e instanceof NonFiniteError) return e;
        throw e;
      }
    });
  }

  close(): void {
    for (let i = 0; i < this.windows.length; i++) if (this.owned[i]) this.windows[i].close();
  }
}
