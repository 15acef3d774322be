// serve --parallel N > 1 as the cluster holds it: the N sequence slots beside the head's pipeline,
// opened when the layers are placed on this device alone and closed when they are taken down, their
// scheduler (parallel.ts), and the service counters each finished request feeds. The slots run on one
// device only: a ring's data plane carries one sequence (ParallelSequences.ringRefusal says so).
import { SeqSlots, type LocalModel } from "../engine/index.js";
import type { KvCacheTypes } from "../model/index.js";
import { settleMemory } from "../profiler/index.js";
import { SequenceScheduler, type SlotState } from "./parallel.js";
import type { Current, GenerationOutcome, GenerationRequest, ServiceCounters } from "./request-run.js";
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
}

export class ParallelSequences {
  private open: { slots: SeqSlots; scheduler: SequenceScheduler } | undefined;

  constructor(private readonly o: ParallelOptions) {}

  /** Why joining workers are left out while the slots are open: the data plane's frames carry the
   * rows of one sequence, and re-placing the layers would close slots that are decoding. */
  get ringRefusal(): string {
    return `--parallel ${this.o.parallel} runs on this device alone (a ring carries one sequence at a time)`;
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

  /** The slots beside the pipeline placed on this device alone (none beside a ring): slot 0 is its
   * window, the others each a KV cache of their own (N x ctx tokens in all); says what they hold.
   * When they cannot be made, the pipeline is closed too (the placement fails as a whole). */
  openBeside(current: Current): void {
    if (current.kind !== "local") return;
    const { model, parallel, ctx, batch, kvCacheTypes } = this.o;
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
    const scheduler = new SequenceScheduler(slots, {
      maxQueue: this.o.maxQueue, layers: model.nLayers,
      hooks: {
        token: () => this.o.token(),
        step: (rows) => this.o.counters.batchStep(rows),
        finished: (out, promptTokens) => this.record(out, promptTokens),
        changed: () => this.o.changed(),
      },
    });
    this.open = { slots, scheduler };
  }

  /** Fails what waits or runs (after the pass in flight), then frees the slots. */
  async close(): Promise<void> {
    const open = this.open;
    this.open = undefined;
    if (!open) return;
    await open.scheduler.close();
    open.slots.close();
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
      setImmediate(() => idle() && settleMemory());
    }
  }
}
