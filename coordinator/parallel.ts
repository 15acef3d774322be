// serve --parallel N on one device (issue #32): continuous batching over N sequence slots. Requests
// join and leave between steps; a newcomer's prompt is prefilled on its slot alone (the others wait
// that one pass), then every step takes the next token of each active sequence through one pass over
// the weights (SeqSlots.step). Each slot keeps the tokens its KV cache holds: a request takes the free
// slot whose cache shares the longest prefix with its prompt (llama-server's slots do the same).
// On a ring the sequences are split into groups (lanes), one per device, each stepping on its own: their
// passes are in flight at once, so while one device works on one group the others work on the rest.
import { NonFiniteError, discardFor, type GenerationResult, type SeqRow, type StopReason } from "../engine/index.js";
import type { GenerationOutcome, GenerationRequest } from "./request-run.js";
import { CancelledError, QueueFullError } from "./queue.js";
import type { RequestState, SlotState } from "./state.js";

export type { SlotState };

/** What the scheduler decodes on: N sequence slots, each a KV cache of nCtx positions (engine's
 * SeqSlots on this device; the shape a ring's slots would take too). */
export interface SequenceSlots {
  readonly size: number;
  readonly nCtx: number;
  /** The largest position <= pos a slot's cache can continue from. */
  resumable(slot: number, pos: number): number;
  /** Tokens at pos.. through one slot alone (positions >= pos forgotten first): the last row's logits. */
  prefill(slot: number, tokens: Int32Array, pos: number, onRows?: (rows: Float32Array) => void): Promise<Float32Array>;
  /** One pass for every row's next token: one logits row each, or the NonFiniteError of a row that overflowed. */
  step(rows: readonly SeqRow[]): Promise<(Float32Array | NonFiniteError)[]>;
  /** Context shift in one slot's cache (Pipeline.shift's p0, nDiscard, nPast). */
  shift(slot: number, p0: number, nDiscard: number, nPast: number): void | Promise<void>;
  /** Passes (on rows of distinct slots) that may be in flight at once: a ring's devices; 1 by default. */
  readonly inFlight?: number;
}

export interface SchedulerHooks {
  /** A token was handed to a client. */
  token(): void;
  /** A step ran `rows` sequences in one pass, begun while `inFlight` passes (itself too) ran. */
  step(rows: number, inFlight: number): void;
  /** A request ended (its outcome), or failed (undefined). */
  finished(outcome: GenerationOutcome | undefined, promptTokens: number): void;
  /** Something /api/state shows changed. */
  changed(): void;
}

interface Pending {
  readonly req: GenerationRequest;
  readonly queuedAt: number;
  readonly resolve: (o: GenerationOutcome) => void;
  readonly reject: (e: unknown) => void;
}

interface Seq extends Pending {
  readonly slot: number;
  /** The group it steps with (one pass of that group at a time). */
  readonly lane: number;
  readonly cached: number;
  readonly queueMs: number;
  readonly startedAt: number;
  readonly startedUnixMs: number;
  readonly history: number[];
  readonly ids: number[];
  pos: number;
  /** The token to feed at pos next step; undefined while it is being sampled. */
  next: number | undefined;
  firstAt: number | null;
  promptMs: number;
  decodeSteps: number;
  /** Context shifts made in the slot's cache, and the tokens they dropped. */
  shifts: number;
  discarded: number;
}

export class SequenceScheduler {
  private readonly pending: Pending[] = [];
  private readonly seqs: (Seq | undefined)[];
  /** Per slot: the tokens its cache holds at 0..n-1, whose scope may reuse them, when last used. */
  private readonly cache: { ids: number[]; scope: string | undefined; usedAt: number }[];
  /** Each group's stepping loop: whether it runs, and what settles when it stops (close() waits). */
  private readonly lanes: { running: boolean; stopped: Promise<void> }[];
  private closed = false;
  private uses = 0;
  /** Decode passes under way (one per group at most). */
  private passes = 0;

  constructor(private readonly slots: SequenceSlots, private readonly o: { maxQueue: number; layers: number; hooks: SchedulerHooks }) {
    this.seqs = new Array<Seq | undefined>(slots.size).fill(undefined);
    this.cache = Array.from({ length: slots.size }, () => ({ ids: [], scope: undefined, usedAt: 0 }));
    this.lanes = [];
  }

  /** Groups to step side by side now (their loops made as needed): the slots may move from this device
   * to a ring and back (a placement), so this is asked each time; a group above it keeps stepping what
   * it holds. */
  private lanesNow(): number {
    const n = Math.max(1, Math.min(this.slots.size, this.slots.inFlight ?? 1));
    while (this.lanes.length < n) this.lanes.push({ running: false, stopped: Promise.resolve() });
    return n;
  }

  get size(): number {
    return this.slots.size;
  }

  /** Requests waiting for a slot (or about to take a free one). */
  get waiting(): number {
    return this.pending.length;
  }

  /** Sequences in a slot. */
  get activeCount(): number {
    return this.seqs.filter((s) => s).length;
  }

  submit(req: GenerationRequest): Promise<GenerationOutcome> {
    if (this.closed) return Promise.reject(new Error("the server is shutting down"));
    // requests about to take a free slot (their prefill comes between steps) are not queued
    const queued = this.pending.length - (this.size - this.activeCount);
    if (queued >= this.o.maxQueue) {
      return Promise.reject(new QueueFullError(`${queued} requests are waiting (the limit is ${this.o.maxQueue}) and all ${this.size} slots are busy: try again shortly`));
    }
    return new Promise<GenerationOutcome>((resolve, reject) => {
      const p: Pending = { req, queuedAt: performance.now(), resolve, reject };
      this.pending.push(p);
      // a client that leaves while queued frees its place in the queue at once
      req.signal?.addEventListener("abort", () => {
        const i = this.pending.indexOf(p);
        if (i < 0) return;
        this.pending.splice(i, 1);
        this.o.hooks.changed();
        reject(new CancelledError("the client went away while the request was queued"));
      }, { once: true });
      this.o.hooks.changed();
      for (let l = 0; l < this.lanesNow(); l++) this.start(l);
    });
  }

  slotStates(): SlotState[] {
    return this.seqs.map((s, id) => ({
      id, state: s ? "processing" : "idle", nCtx: this.slots.nCtx, cachedTokens: s ? s.pos : this.cache[id].ids.length,
      request: s ? this.requestState(s) : null,
    }));
  }

  /** The oldest running request (the state's one "active" request). */
  activeState(): RequestState | null {
    const s = this.seqs.filter((x): x is Seq => x !== undefined).sort((a, b) => a.startedAt - b.startedAt)[0];
    return s ? this.requestState(s) : null;
  }

  private requestState(s: Seq): RequestState {
    const now = performance.now();
    const decodeS = s.firstAt === null ? 0 : (now - s.firstAt) / 1000;
    return {
      id: String(s.slot), kind: s.req.kind, promptTokens: s.req.prompt.length, cachedTokens: s.cached, generatedTokens: s.ids.length,
      tokensPerS: decodeS > 0 && s.ids.length > 1 ? (s.ids.length - 1) / decodeS : null,
      timeToFirstTokenMs: s.firstAt === null ? null : s.firstAt - s.startedAt, startedUnixMs: s.startedUnixMs,
    };
  }

  /** Fails whatever waits or runs, after the pass in flight (its windows are busy until it ends):
   * the slots are the caller's to close once this resolves. */
  async close(): Promise<void> {
    this.closed = true;
    for (const p of this.pending.splice(0)) p.reject(new Error("the server is shutting down"));
    await Promise.all(this.lanes.map((l) => l.stopped));
    for (const s of this.seqs) if (s) this.fail(s, new Error("the server is shutting down"));
  }

  private get hasFreeSlot(): boolean {
    return this.seqs.some((s) => !s);
  }

  /** A group's loop: admits waiting requests (into any free slot, to the least busy group), then steps
   * its own sequences, until it has none and no request can start. */
  private async loop(lane: number): Promise<void> {
    try {
      for (;;) {
        await this.admit();
        // sequences of this group ready to step (not those another loop is prefilling)
        const mine = this.seqs.filter((s): s is Seq => s !== undefined && s.lane === lane && s.next !== undefined);
        // a client gone while others ran: it leaves before the step, its slot free for the next
        for (const s of mine) if (s.req.signal?.aborted) this.finish(s, "caller");
        const rows = mine.filter((s) => this.seqs[s.slot] === s);
        if (this.closed) break;
        if (rows.length === 0) {
          if (this.pending.length === 0 || !this.hasFreeSlot) break;
          continue;
        }
        await this.step(rows);
        // the event loop runs between steps: streams flush, newcomers and departures are heard
        await new Promise((r) => setImmediate(r));
      }
    } finally {
      this.lanes[lane].running = false;
    }
    // Something arrived after the last check (a submit that saw this loop running): run again.
    if (this.pending.length > 0 && this.hasFreeSlot && !this.closed) this.start(lane);
  }

  private start(lane: number): void {
    const l = this.lanes[lane];
    if (l.running || this.closed) return;
    l.running = true;
    // a fault of the loop itself fails what it holds instead of leaving its clients waiting forever
    l.stopped = this.loop(lane).catch((e: unknown) => {
      for (const s of this.seqs) if (s) this.fail(s, e);
      for (const p of this.pending.splice(0)) p.reject(e);
    });
  }

  /** The group a new sequence joins: the one with the fewest. */
  private quietestLane(): number {
    const counts = new Array<number>(this.lanesNow()).fill(0);
    for (const s of this.seqs) if (s && s.lane < counts.length) counts[s.lane]++;
    return counts.indexOf(Math.min(...counts));
  }

  /** Starts waiting requests in free slots, each prefilled alone, until no slot or no request is left. */
  private async admit(): Promise<void> {
    while (!this.closed && this.pending.length > 0) {
      const free = this.seqs.flatMap((s, i) => (s ? [] : [i]));
      if (free.length === 0) return;
      const p = this.pending.shift()!;
      this.o.hooks.changed();
      if (p.req.signal?.aborted) {
        p.reject(new CancelledError("the client went away while the request was queued"));
        continue;
      }
      const prompt = p.req.prompt;
      if (prompt.length === 0 || prompt.length > this.slots.nCtx) {
        p.reject(new Error(prompt.length === 0 ? "the prompt has no tokens" : `prompt of ${prompt.length} tokens does not fit the context of ${this.slots.nCtx} tokens`));
        continue;
      }
      // the free slot whose cache (of the same scope) shares the longest prefix; else the least recently used
      let slot = free[0], best = -1;
      for (const i of free) {
        const c = this.cache[i];
        let n = 0;
        if (c.scope === p.req.cacheScope) while (n < c.ids.length && n < prompt.length && c.ids[n] === prompt[n]) n++;
        if (n > best || (n === best && c.usedAt < this.cache[slot].usedAt)) [slot, best] = [i, n];
      }
      // at least one token goes through the layers to give logits; sliding-window layers may hold too
      // little of an older prefix to continue from it
      const cached = this.slots.resumable(slot, Math.min(best, prompt.length - 1));
      this.cache[slot] = { ids: [], scope: undefined, usedAt: ++this.uses };
      const startedAt = performance.now();
      const s: Seq = {
        ...p, slot, lane: this.quietestLane(), cached, queueMs: startedAt - p.queuedAt, startedAt, startedUnixMs: Date.now(), history: Array.from(prompt), ids: [],
        pos: cached, next: undefined, firstAt: null, promptMs: 0, decodeSteps: 0, shifts: 0, discarded: 0,
      };
      this.seqs[slot] = s;
      this.o.hooks.changed();
      try {
        p.req.onStart?.();
        if (p.req.maxTokens <= 0) {
          this.finish(s, "length");
          continue;
        }
        const logits = await this.slots.prefill(slot, prompt.subarray(cached), cached, p.req.onPrompt && ((rows) => p.req.onPrompt!(rows, cached)));
        s.pos = prompt.length;
        s.promptMs = performance.now() - startedAt;
        await this.take(s, logits);
        // its group steps it from now on (that group's loop may have stopped meanwhile)
        if (this.seqs[slot] === s) this.start(s.lane);
      } catch (e) {
        this.fail(s, e);
      }
    }
  }

  /** One pass over the weights for every row's next token, then each samples its next. */
  private async step(rows: Seq[]): Promise<void> {
    let out: (Float32Array | NonFiniteError)[];
    const inFlight = ++this.passes;
    try {
      out = await this.slots.step(rows.map((s) => ({ slot: s.slot, token: s.next!, pos: s.pos })));
    } catch (e) {
      for (const s of rows) this.fail(s, e);
      return;
    } finally {
      this.passes--;
    }
    this.o.hooks.step(rows.length, inFlight);
    for (let i = 0; i < rows.length; i++) {
      const s = rows[i], l = out[i];
      s.pos++;
      s.decodeSteps++;
      if (l instanceof NonFiniteError) {
        this.fail(s, l);
        continue;
      }
      try {
        await this.take(s, l);
      } catch (e) {
        this.fail(s, e);
      }
    }
  }

  /** Samples a sequence's next token from its logits and hands it on, as engine/generate does. */
  private async take(s: Seq, logits: Float32Array): Promise<void> {
    const { req } = s;
    s.next = undefined;
    const id = req.sampler.constraint ? await req.sampler.next(logits, s.history) : req.sampler.sample(logits, s.history);
    s.history.push(id);
    if (req.isEnd(id)) return this.finish(s, "end");
    s.ids.push(id);
    s.firstAt ??= performance.now();
    this.o.hooks.token();
    if (req.signal?.aborted || req.onToken(id) === false) return this.finish(s, "caller");
    if (s.ids.length >= req.maxTokens) return this.finish(s, "length");
    // past the context: the slot's cache shifts as engine/generate's does (n_past + 1 >= n_ctx)
    const shift = req.contextShift;
    const d = shift && s.pos + 1 >= this.slots.nCtx ? discardFor(s.pos, shift) : 0;
    if (d > 0) {
      await this.slots.shift(s.slot, shift!.keep, d, s.pos);
      s.pos -= d;
      s.shifts++;
      s.discarded += d;
    }
    if (s.pos >= this.slots.nCtx) return this.finish(s, "context");
    s.next = id;
  }

  private finish(s: Seq, stopReason: StopReason): void {
    if (this.seqs[s.slot] !== s) return;
    this.seqs[s.slot] = undefined;
    // what went through the layers stays in the slot's cache: a later request may continue from it
    // (after a shift, only the positions no shift moved: those before keep)
    const kept = s.shifts > 0 ? Math.min(s.pos, s.req.contextShift!.keep) : s.pos;
    this.cache[s.slot] = { ids: [...s.req.prompt, ...s.ids].slice(0, kept), scope: s.req.cacheScope, usedAt: ++this.uses };
    const now = performance.now();
    const decodeMs = s.firstAt === null ? 0 : now - s.firstAt;
    const result: GenerationResult = {
      ids: s.ids, stopReason, promptTokens: s.req.prompt.length - s.cached, promptMs: s.promptMs, decodeSteps: s.decodeSteps, decodeMs, endPos: s.pos,
      shifts: s.shifts, discarded: s.discarded,
    };
    const outcome: GenerationOutcome = {
      result, cachedTokens: s.cached, queueMs: s.queueMs, firstTokenMs: s.firstAt === null ? null : s.firstAt - s.startedAt, devices: 1, cycles: 1,
      layersPerCycle: [this.o.layers], perDevice: [], meanDecodeMs: s.decodeSteps > 0 ? decodeMs / s.decodeSteps : 0,
    };
    this.o.hooks.finished(outcome, s.req.prompt.length);
    this.o.hooks.changed();
    s.resolve(outcome);
  }

  private fail(s: Seq, e: unknown): void {
    if (this.seqs[s.slot] !== s) return;
    this.seqs[s.slot] = undefined;
    this.cache[s.slot] = { ids: [], scope: undefined, usedAt: ++this.uses };
    this.o.hooks.finished(undefined, s.req.prompt.length);
    this.o.hooks.changed();
    s.reject(e);
  }
}
