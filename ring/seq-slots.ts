// The head's view of a ring's sequence slots (serve --parallel on a ring): the shape the sequence
// scheduler decodes on (coordinator/parallel.ts SequenceSlots, as engine/SeqSlots on one device). A
// prompt's rows go round the ring tagged with their slot and positions (SEQ_ACTIVATIONS frames); a
// decode step's rows, one per sequence of a group, go round together, so every device runs one pass
// over its windows' weights for all of them (RingNode, each row attending to its slot's own cache).
// Up to one group per device that can compute at once is in flight (`inFlight`; devices sharing a
// machine's CPUs count as many as fit in them, coordinator/compute-sharing.ts): they work side by side.
import type { LocalModel, SeqRow } from "../engine/index.js";
import type { RingPipeline } from "./pipeline.js";

export class RingSeqSlots {
  /** Per slot: positions its caches hold on every device (the frames sent wrote them). */
  private readonly filled: number[];

  /** groups: how many of the ring's devices can compute at once, each on one group of sequences while
   * the others work on the rest. */
  readonly inFlight: number;

  constructor(private readonly model: LocalModel, private readonly pipeline: RingPipeline, readonly size: number, readonly nCtx: number, groups: number) {
    this.inFlight = Math.max(1, Math.min(size, groups));
    this.filled = new Array<number>(size).fill(0);
  }

  /** Sliding-window layers keep only their last positions (their rings are not tracked per slot
   * here): such a model starts every prompt afresh; others continue from any position held. */
  resumable(slot: number, pos: number): number {
    return this.model.desc.hparams.layerWindow.some((w) => w > 0) ? 0 : Math.min(pos, this.filled[slot]);
  }

  async prefill(slot: number, tokens: Int32Array, pos: number, onRows?: (rows: Float32Array) => void): Promise<Float32Array> {
    const n = tokens.length;
    const rows = this.model.embed(tokens);
    this.filled[slot] = Math.min(this.filled[slot], pos);
    const logits = await this.pipeline.forwardSeqs(new Int32Array(n).fill(slot), Int32Array.from({ length: n }, (_, i) => pos + i), rows);
    this.filled[slot] = pos + n;
    onRows?.(rows);
    return logits;
  }

  async step(rows: readonly SeqRow[]): Promise<Float32Array[]> {
    const V = this.model.nVocab;
    const acts = this.model.embed(Int32Array.from(rows, (r) => r.token));
    const logits = await this.pipeline.forwardSeqs(Int32Array.from(rows, (r) => r.slot), Int32Array.from(rows, (r) => r.pos), acts);
    for (const r of rows) this.filled[r.slot] = r.pos + 1;
    return rows.map((_, i) => logits.subarray(i * V, (i + 1) * V));
  }

  /** Context shift in one slot's caches on every device (a KV_SHIFT frame with the slot). */
  async shift(slot: number, p0: number, nDiscard: number, nPast: number): Promise<void> {
    await this.pipeline.shiftSeq(slot, p0, nDiscard, nPast);
    this.filled[slot] = Math.min(this.filled[slot], nPast - nDiscard);
  }
}
