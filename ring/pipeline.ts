// The head's view of the ring as an engine Pipeline: a forward call sends the rows (in batches, all
// at once, so a long prompt's batches are on different devices at the same time) into cycle 0 and
// resolves when the last batch has gone through every cycle; the head applies the output layer.
import type { LocalModel, Pipeline } from "../engine/index.js";
import { kvAfterShift, kvCacheRows, kvResumablePosition } from "../model/index.js";
import type { ActivationsFrame, H2oScoresFrame, KvShiftFrame, SeqActivationsFrame } from "./frame.js";
import type { RingNode } from "./node.js";
import type { PayloadDtype } from "./validation.js";

/** Rows of sequence slots round the ring (forwardSeqs), sent in `frames` frames in order. */
interface PendingSeqs {
  readonly requestId: number;
  readonly frames: number;
  delivered: number;
  /** One slot's consecutive rows (a prompt: the last row's logits), else a step (every row's). */
  readonly oneSlot: boolean;
  /** The caller's rows: each frame's come back into them as it finishes (what an embedding pools). */
  readonly acts: Float32Array;
  readonly logits: Float32Array;
  readonly resolve: (logits: Float32Array) => void;
  readonly reject: (e: Error) => void;
}

interface Pending {
  readonly requestId: number;
  readonly endPos: number;
  /** The caller's rows, from position `pos`: each batch's rows come back into them as it finishes (the
   * Pipeline's rows are updated in place, as a local window's are: an embedding pools them). */
  readonly acts: Float32Array;
  readonly pos: number;
  readonly resolve: (logits: Float32Array) => void;
  readonly reject: (e: Error) => void;
}

export interface RingPipelineOptions {
  readonly model: LocalModel;
  /** The head's own node (last in ring order; it may hold no windows). */
  readonly node: RingNode;
  readonly nCtx: number;
  readonly maxBatch: number;
  readonly wireDtype: PayloadDtype;
  /** Every device's windows gather H2O's statistics (--kv-evict h2o): h2oScores gathers them. */
  readonly h2o?: boolean;
}

export class RingPipeline implements Pipeline {
  readonly nCtx: number;
  /** A forward returns once its frames are sent: the devices compute while the head streams a token. */
  readonly computesElsewhere = true;
  private requestId = 0;
  private pending: Pending | undefined;
  /** Shifts round the ring: the request's (one at a time), or sequence slots' (beside their rows). */
  private readonly pendingShifts = new Map<number, { readonly resolve: () => void; readonly reject: (e: Error) => void }>();
  /** H2O's statistics round the ring (one at a time, between a request's forwards). */
  private pendingScores: { readonly requestId: number; readonly resolve: (s: Float32Array) => void; readonly reject: (e: Error) => void } | undefined;
  /** forwardSeqs calls in flight (several groups of sequences round the ring at once), by request. */
  private readonly pendingSeqs = new Map<number, PendingSeqs>();
  private failure: Error | undefined;
  private readonly logits: Float32Array;
  /** The devices' caches as the frames sent fill them: positions held, and the end of the furthest
   * write since position 0 (for the sliding-window layers' rings, model/'s kvResumablePosition). */
  private filled = 0;
  private kvEnd = 0;
  private kvFloor = 0;
  private readonly kvRows: number[];

  constructor(private readonly o: RingPipelineOptions) {
    this.nCtx = o.nCtx;
    this.logits = new Float32Array(o.model.nVocab);
    this.kvRows = kvCacheRows(o.model.desc.hparams.layerWindow, o.nCtx, o.maxBatch);
  }

  /** Sends a request's frames, then waits for its answer (`done`): a send that fails fails the ring, which
   * rejects `done` with it; `settled` runs however it ends. */
  private async roundTrip<T>(done: Promise<T>, send: () => Promise<void>, settled: () => void): Promise<T> {
    try {
      await send();
    } catch (e) {
      this.fail(e instanceof Error ? e : new Error(String(e)));
    }
    try {
      return await done;
    } finally {
      settled();
    }
  }

  /** Something of a request is round the ring: rows, a shift or H2O's statistics. */
  private get inFlight(): boolean {
    return !!this.pending || this.pendingShifts.size > 0 || this.pendingSeqs.size > 0 || !!this.pendingScores;
  }

  async forward(acts: Float32Array, pos: number, nTokens: number): Promise<Float32Array> {
    if (this.failure) throw this.failure;
    if (this.inFlight) throw new Error("the ring runs one request at a time");
    const E = this.o.model.nEmbd;
    const requestId = (this.requestId = (this.requestId + 1) >>> 0);
    const done = new Promise<Float32Array>((resolve, reject) => {
      this.pending = { requestId, endPos: pos + nTokens, acts, pos, resolve, reject };
    });
    this.filled = pos + nTokens;
    this.kvEnd = pos === 0 ? nTokens : Math.max(this.kvEnd, pos + nTokens);
    if (pos === 0) this.kvFloor = 0;
    return this.roundTrip(done, async () => {
      for (let off = 0; off < nTokens; off += this.o.maxBatch) {
        const n = Math.min(this.o.maxBatch, nTokens - off);
        await this.o.node.send({
          type: "activations", requestId, firstTokenPosition: pos + off, nTokens: n, cycle: 0, rowWidth: E,
          dtype: this.o.wireDtype, activations: acts.subarray(off * E, (off + n) * E),
        });
      }
    }, () => {
      this.pending = undefined;
    });
  }

  /** Positions are carried by every frame: a forward at position p overwrites from p on every device. */
  truncate(pos: number): void {
    this.filled = Math.min(this.filled, pos);
  }

  resumable(pos: number): number {
    return kvResumablePosition(Math.min(pos, this.filled), this.kvEnd, this.o.model.desc.hparams.layerWindow, this.kvRows, this.nCtx, this.kvFloor);
  }

  /** A KV_SHIFT frame round the ring, in order with the rows: each device shifts every window it
   * holds and passes it on; resolves when it is back at the head (which shifted its own). */
  async shift(p0: number, nDiscard: number, nPast: number): Promise<void> {
    if (this.inFlight) throw new Error("the ring runs one request at a time");
    await this.sendShift(p0, nDiscard, nPast);
    // the devices shifted (a refusal fails the ring above): their rings as kv_shift.c leaves them
    ({ kvEnd: this.kvEnd, kvFloor: this.kvFloor } = kvAfterShift({ kvEnd: this.kvEnd, kvFloor: this.kvFloor }, p0, nDiscard, nPast, this.o.model.desc.hparams.layerWindow, this.kvRows, this.nCtx));
    this.filled = nPast - nDiscard;
  }

  /** A context shift in one sequence slot's caches (serve --parallel): beside other slots' rows in
   * flight, in order with that slot's (its next step waits for this). */
  async shiftSeq(slot: number, p0: number, nDiscard: number, nPast: number): Promise<void> {
    if (this.pending) throw new Error("the ring runs one request at a time");
    await this.sendShift(p0, nDiscard, nPast, slot);
  }

  private async sendShift(p0: number, nDiscard: number, nPast: number, slot?: number): Promise<void> {
    if (this.failure) throw this.failure;
    const requestId = (this.requestId = (this.requestId + 1) >>> 0);
    const done = new Promise<void>((resolve, reject) => {
      this.pendingShifts.set(requestId, { resolve, reject });
    });
    await this.roundTrip(done, async () => {
      await this.o.node.send({ type: "kvShift", requestId, p0, nDiscard, nPast, ...(slot === undefined ? {} : { slot }) });
    }, () => {
      this.pendingShifts.delete(requestId);
    });
  }

  /** H2O's statistics of the positions the caches hold, summed over every device's layers: an
   * H2O_SCORES frame round the ring, in order with the rows (null: the windows gather none). */
  async h2oScores(): Promise<Float32Array | null> {
    if (!this.o.h2o) return null;
    if (this.failure) throw this.failure;
    if (this.inFlight) throw new Error("the ring runs one request at a time");
    if (this.filled === 0) return new Float32Array(0);
    const requestId = (this.requestId = (this.requestId + 1) >>> 0);
    const done = new Promise<Float32Array>((resolve, reject) => {
      this.pendingScores = { requestId, resolve, reject };
    });
    return this.roundTrip(done, async () => {
      await this.o.node.send({ type: "h2oScores", requestId, scores: new Float32Array(this.filled) });
    }, () => {
      this.pendingScores = undefined;
    });
  }

  /** H2O's statistics back from every device (from the head's node). */
  h2oScored(frame: H2oScoresFrame): void {
    if (this.pendingScores?.requestId === frame.requestId) this.pendingScores.resolve(frame.scores);
  }

  /** A shift that went round the whole ring (from the head's node). */
  shifted(frame: KvShiftFrame): void {
    this.pendingShifts.get(frame.requestId)?.resolve();
  }

  /** The buffer for the output layer when the frame is the request's last batch (the head's window
   * computes the logits in the same native call). */
  logitsFor(frame: ActivationsFrame): Float32Array | undefined {
    return this.isFinal(frame) ? this.logits : undefined;
  }

  private isFinal(frame: ActivationsFrame): boolean {
    const p = this.pending;
    return !!p && frame.requestId === p.requestId && frame.firstTokenPosition + frame.nTokens === p.endPos;
  }

  /** Rows that finished their last cycle (from the head's node), with their logits when fused. */
  async deliver(frame: ActivationsFrame, logits?: Float32Array): Promise<void> {
    const p = this.pending;
    if (p && frame.requestId === p.requestId) {
      const E = this.o.model.nEmbd, at = (frame.firstTokenPosition - p.pos) * E, n = frame.nTokens * E;
      if (at >= 0 && at + n <= p.acts.length) p.acts.set(frame.activations.subarray(0, n), at);
    }
    // a stale batch of an abandoned request, or an earlier batch whose KV is written: nothing more to do
    if (!p || !this.isFinal(frame)) return;
    try {
      if (!logits) {
        const E = this.o.model.nEmbd;
        await this.o.model.logits(frame.activations.subarray((frame.nTokens - 1) * E, frame.nTokens * E), this.logits);
      }
      p.resolve(this.logits);
    } catch (e) {
      p.reject(e instanceof Error ? e : new Error(String(e)));
    }
  }

  /** Rows of sequence slots (serve --parallel) round the ring: row i at positions[i] of slot slots[i]
   * on every device (RingNodeOptions.seqSlots). One slot's consecutive rows (a prompt, in frames of
   * maxBatch rows) give the last row's logits; rows of distinct slots (a decode step, at most maxBatch)
   * give one logits row each, in a buffer of their own. Several calls may be in flight at once (on rows
   * of distinct slots): each device takes their frames in turn, so while one works on a group of
   * sequences the others work on the rest (the pipeline is kept full). */
  async forwardSeqs(slots: Int32Array, positions: Int32Array, acts: Float32Array): Promise<Float32Array> {
    if (this.failure) throw this.failure;
    if (this.pending) throw new Error("the ring runs one request at a time");
    const n = slots.length, E = this.o.model.nEmbd, V = this.o.model.nVocab, B = this.o.maxBatch;
    const oneSlot = slots.every((s, i) => s === slots[0] && positions[i] === positions[0] + i);
    if (!oneSlot && n > B) throw new RangeError(`a step of ${n} sequences is more than the batch of ${B}`);
    const requestId = (this.requestId = (this.requestId + 1) >>> 0);
    const frames = Math.ceil(n / B);
    const logits = new Float32Array(oneSlot ? V : n * V);
    const done = new Promise<Float32Array>((resolve, reject) => {
      this.pendingSeqs.set(requestId, { requestId, frames, delivered: 0, oneSlot, acts, logits, resolve, reject });
    });
    return this.roundTrip(done, async () => {
      for (let off = 0; off < n; off += B) {
        const m = Math.min(B, n - off);
        await this.o.node.send({
          type: "seqActivations", requestId, nTokens: m, cycle: 0, rowWidth: E, dtype: this.o.wireDtype,
          slots: slots.subarray(off, off + m), positions: positions.subarray(off, off + m), activations: acts.subarray(off * E, (off + m) * E),
        });
      }
    }, () => {
      this.pendingSeqs.delete(requestId);
    });
  }

  /** The buffer for the output layer when the frame is the last of forwardSeqs' rows. */
  seqLogitsFor(frame: SeqActivationsFrame): Float32Array | undefined {
    const p = this.pendingSeqs.get(frame.requestId);
    return p && p.delivered === p.frames - 1 ? p.logits : undefined;
  }

  /** forwardSeqs' rows back from their last cycle (from the head's node), with their logits when fused. */
  async seqDeliver(frame: SeqActivationsFrame, logits?: Float32Array): Promise<void> {
    const p = this.pendingSeqs.get(frame.requestId);
    if (!p) return;
    const E = this.o.model.nEmbd, at = p.delivered * this.o.maxBatch * E, floats = frame.nTokens * E;
    if (at + floats <= p.acts.length) p.acts.set(frame.activations.subarray(0, floats), at);
    if (++p.delivered < p.frames) return;
    try {
      if (!logits) {
        // the head holds no layer of the last cycle: the output layer here, on each row that needs it
        const V = this.o.model.nVocab, n = frame.nTokens;
        for (let i = p.oneSlot ? n - 1 : 0; i < n; i++) {
          const out = p.oneSlot ? p.logits : p.logits.subarray(i * V, (i + 1) * V);
          await this.o.model.logits(frame.activations.subarray(i * E, (i + 1) * E), out);
        }
      }
      p.resolve(p.logits);
    } catch (e) {
      p.reject(e instanceof Error ? e : new Error(String(e)));
    }
  }

  /** Ends the current request (and every later one) with this error: a device failed. */
  fail(e: Error): void {
    this.failure ??= e;
    for (const p of this.pendingSeqs.values()) p.reject(this.failure);
    this.pending?.reject(this.failure);
    for (const p of this.pendingShifts.values()) p.reject(this.failure);
    this.pendingScores?.reject(this.failure);
  }
}
