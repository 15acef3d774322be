// serve --parallel N > 1 as the cluster holds it: the N sequence slots beside the pipeline, opened when
// the layers are placed and closed when they are taken down, their scheduler (parallel.ts), and the
// service counters each finished request feeds. On this device alone the slots are engine SeqSlots;
// on a ring every device holds a KV cache per slot and the rows go round tagged (ring RingSeqSlots).
import { SeqSlots, type LocalModel, type NonFiniteError, type SeqRow } from "../engine/index.js";
import { RingSeqSlots } from "../ring/index.js";
import type { KvCacheTypes } from "../model/index.js";
import { settleMemory } from "../profiler/index.js";
import { SequenceScheduler, type SequenceSlots, type SlotState } from "./parallel.js";
import { MAX_RECOVERIES, type Current, type GenerationOutcome, type GenerationRequest, type ServiceCounters } from "./request-run.js";
import type { RequestState } from "./state.js";

export interface ParallelOptions {
  readonly model: LocalModel;
  /** Sequence slots (> 1). */
  readonly parallel: number;
  readonly ctx: number;
  readonly batch: number;
  readonly kvCacheTypes?: KvCacheTypes;
  readonly maxQueue: number;
  readonly log: (line: string) => void;
  readonly counters: ServiceCounters;
  /** A token was handed to a client (the activity's tokens/s). */
  readonly token: () => void;
  /** Something /api/state shows changed. */
  readonly changed: () => void;
  /** The cluster is shutting down (no memory settling then). */
  readonly closing: () => boolean;
  /** The last sequence left and none waits (devices that came meanwhile may be placed now). */
  readonly idle: () => void;
  /** A pass failed: when the ring broke, the layers are placed again (openBeside is called with the
   * new pipeline while the slots stay open) and this resolves true; false for any other failure. */
  readonly recover: () => Promise<boolean>;
}

/** The slots the scheduler decodes on, kept across a re-placement: they remember the tokens each slot's
 * cache holds, and when a pass fails because the ring broke, they have the layers placed again, every
 * slot's tokens replayed on the new pipeline (every sequence in flight, and the prefixes kept for
 * reuse), and the pass run again, so a client only sees a pause. */
class ReplayingSlots {
  private readonly written: number[][];

  /** recovered: a pass went through after a loss, `pauseMs` after it began (the streams' pause). */
  constructor(private inner: SequenceSlots, private readonly recover: () => Promise<boolean>, private readonly recovered: (pauseMs: number) => void) {
    this.written = Array.from({ length: inner.size }, () => []);
  }

  get size(): number {
    return this.inner.size;
  }

  get nCtx(): number {
    return this.inner.nCtx;
  }

  get inFlight(): number {
    return this.inner.inFlight ?? 1;
  }

  /** The new placement's slots (empty caches: the next pass replays into them first). */
  swap(inner: SequenceSlots): void {
    this.inner = inner;
  }

  resumable(slot: number, pos: number): number {
    return this.inner.resumable(slot, pos);
  }

  async prefill(slot: number, tokens: Int32Array, pos: number, onRows?: (rows: Float32Array) => void): Promise<Float32Array> {
    const logits = await this.retrying(() => this.inner.prefill(slot, tokens, pos, onRows));
    this.written[slot] = [...this.written[slot].slice(0, pos), ...tokens];
    return logits;
  }

  async step(rows: readonly SeqRow[]): Promise<(Float32Array | NonFiniteError)[]> {
    const out = await this.retrying(() => this.inner.step(rows));
    for (const r of rows) {
      this.written[r.slot].length = r.pos;
      this.written[r.slot].push(r.token);
    }
    return out;
  }

  async shift(slot: number, p0: number, nDiscard: number, nPast: number): Promise<void> {
    // a ring broken meanwhile: the slot's tokens before the shift are replayed, then it shifts
    await this.retrying(async () => this.inner.shift(slot, p0, nDiscard, nPast));
    const w = this.written[slot];
    w.splice(p0, nDiscard);
    w.length = Math.min(w.length, nPast - nDiscard);
  }

  /** Passes of distinct slots may be in flight at once (a ring's groups): when the ring breaks they all
   * fail, and one recovery (placing the layers again, then replaying every slot) serves them all; a
   * pass waits while one is under way, so that none reaches a slot its replay has not refilled. */
  private async retrying<T>(pass: () => Promise<T>): Promise<T> {
    const began = performance.now();
    for (let attempt = 0; ; attempt++) {
      while (this.recovering) await this.recovering;
      const placement = this.placements;
      try {
        const out = await pass();
        if (attempt > 0) this.recovered(performance.now() - began);
        return out;
      } catch (e) {
        if (attempt >= MAX_RECOVERIES) throw e;
        // placed again since this pass began (another pass's recovery): only run it again
        if (this.placements !== placement) continue;
        if (!this.recovering) {
          const r = (this.recovering = this.recoverAndReplay());
          void r.finally(() => {
            if (this.recovering === r) this.recovering = undefined;
          });
        }
        if (!(await this.recovering)) throw e;
      }
    }
  }

  private recovering: Promise<boolean> | undefined;
  /** Placements the slots have moved to (a pass that failed on an older one just runs again). */
  private placements = 0;

  private async recoverAndReplay(): Promise<boolean> {
    try {
      for (let attempt = 0; attempt < MAX_RECOVERIES; attempt++) {
        if (!(await this.recover())) return false;
        this.placements++;
        try {
          for (let s = 0; s < this.written.length; s++) if (this.written[s].length > 0) await this.inner.prefill(s, Int32Array.from(this.written[s]), 0);
          return true;
        } catch {
          // the replay failed too (another device lost): place again
        }
      }
      return false;
    } catch {
      return false;
    }
  }
}

export class ParallelSequences {
  private open: { slots: ReplayingSlots; close: () => void; scheduler: SequenceScheduler } | undefined;
  /** The ring broke under the slots and the layers are being placed again: they stay open, to move. */
  private moving = false;

  constructor(private readonly o: ParallelOptions) {}

  /** Why joining workers are left out while the slots are open: re-placing the layers would close
   * slots that are decoding. */
  get joinRefusal(): string {
    return `--parallel ${this.o.parallel}: waits until no sequence slot is decoding to place the layers again`;
  }

  /** A sequence decodes or waits for a slot. */
  get busy(): boolean {
    return this.activeCount > 0 || this.waiting > 0;
  }

  get opened(): boolean {
    return this.open !== undefined;
  }

  /** Sequences in a slot. */
  get activeCount(): number {
    return this.open?.scheduler.activeCount ?? 0;
  }

  /** Requests waiting for a slot. */
  get waiting(): number {
    return this.open?.scheduler.waiting ?? 0;
  }

  /** The slots beside the pipeline: on this device alone, slot 0 is its window and the others each a
   * KV cache of their own (N x ctx tokens in all; when they cannot be made, the pipeline is closed
   * too: the placement fails as a whole); on a ring, each device made its slots with its windows.
   * Open already (a re-placement after the ring broke): the slots move to the new pipeline. */
  openBeside(current: Current): void {
    const { model, parallel, ctx, batch, kvCacheTypes } = this.o;
    if (current.kind === "ring") {
      const slots = new RingSeqSlots(model, current.ring.pipeline, parallel, ctx, current.computeAtOnce);
      this.start(slots, () => {});
      this.o.log(`--parallel ${parallel}: ${parallel} sequence slots of ${ctx} tokens each on every device of the ring, in ${slots.inFlight} group${slots.inFlight === 1 ? "" : "s"} whose steps go round at once`);
      return;
    }
    let slots: SeqSlots;
    try {
      slots = new SeqSlots(model, parallel, ctx, batch, current.pipeline.window, kvCacheTypes);
    } catch (e) {
      current.pipeline.close();
      throw e;
    }
    // K and V in their types for every layer of every slot, as the windows hold them
    const kvBytes = slots.windows.reduce((a, w) => a + w.info().kvBytes, 0);
    const anonBytes = slots.windows.reduce((a, w) => a + w.info().anonBytes, 0);
    const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;
    this.o.log(`--parallel ${parallel}: ${parallel} sequence slots of ${ctx} tokens each (${parallel * ctx} tokens of KV cache: ${mib(kvBytes)}; ${mib(anonBytes)} with the slots' scratch)`);
    this.start(slots, () => slots.close());
  }

  private start(backend: SequenceSlots, close: () => void): void {
    if (this.open) {
      this.open.close();
      this.open.slots.swap(backend);
      this.open.close = close;
      return;
    }
    const slots = new ReplayingSlots(backend, async () => {
      this.moving = true;
      try {
        return await this.o.recover();
      } finally {
        this.moving = false;
      }
    }, (ms) => this.o.counters.recovered(ms));
    const scheduler = new SequenceScheduler(slots, {
      maxQueue: this.o.maxQueue, layers: this.o.model.nLayers,
      hooks: {
        token: () => this.o.token(),
        step: (rows, inFlight) => this.o.counters.batchStep(rows, inFlight),
        finished: (out, promptTokens) => this.record(out, promptTokens),
        changed: () => this.o.changed(),
      },
    });
    this.open = { slots, close, scheduler };
  }

  /** Fails what waits or runs (after the pass in flight), then frees the slots; not while they move
   * to a new placement after a loss (the cluster takes the old one down first). */
  async close(): Promise<void> {
    if (this.moving && !this.o.closing()) return;
    const open = this.open;
    this.open = undefined;
    if (!open) return;
    await open.scheduler.close();
    open.close();
  }

  /** A request takes a sequence slot and decodes beside the others. */
  submit(req: GenerationRequest): Promise<GenerationOutcome> {
    if (!this.open) return Promise.reject(new Error("the sequence slots are not there (the layers were not placed)"));
    return this.open.scheduler.submit(req);
  }

  slotStates(): SlotState[] | undefined {
    return this.open?.scheduler.slotStates();
  }

  /** The oldest running request, or null. */
  activeState(): RequestState | null {
    return this.open?.scheduler.activeState() ?? null;
  }

  private record(out: GenerationOutcome | undefined, promptTokens: number): void {
    if (!out) {
      this.o.counters.failed++;
      return;
    }
    this.o.counters.finished(out.result, promptTokens, out.cachedTokens, out.firstTokenMs);
    // the last sequence left: hand back what the requests' traffic grew, as a lone request does
    if (this.activeCount === 0) {
      const idle = () => this.activeCount === 0 && this.waiting === 0 && !this.o.closing();
      setImmediate(() => {
        if (!idle()) return;
        settleMemory();
        this.o.idle();
      });
    }
  }
}
