// One device's part of the piped ring: its windows (one per cycle), and what it does with each
// activation frame from its predecessor: run the window of that frame's cycle, pass the rows on,
// then advise the OS about the next window (prefetch) and, if memory is short, drop the one it used.
// The head (last in ring order) also closes each cycle: it starts the next one or delivers the result.
import { QuickForward, type KvCacheTypes, type LocalModel } from "../engine/index.js";
import { descheduledMs, threadClock, type ExpertPrefetchMode, type NativeWindow } from "../native/index.js";
import type { ActivationsFrame, ErrorFrame, H2oScoresFrame, KvShiftFrame, SeqActivationsFrame } from "./frame.js";
import { closeWhenIdle, tryClose } from "./window-close.js";

/** Why a device cannot run a frame (it passes an ERROR frame on instead). */
export function noWindowMessage(cycle: number): string {
  return `no window for cycle ${cycle} on this device`;
}

export interface WindowSpec {
  readonly firstLayer: number;
  readonly endLayer: number;
  readonly cycle: number;
}

export interface WindowStats {
  readonly firstLayer: number;
  readonly endLayer: number;
  readonly cycle: number;
  frames: number;
  tokens: number;
  computeMs: number;
  majorFaults: number;
}

export interface NodeStats {
  windows: WindowStats[];
  /** Time between finishing one frame and the next one arriving. */
  waitMs: number;
  /** Time spent handing frames to the successor: encoding and the socket write; the wait for the
   * write to complete only while frames queued behind it (otherwise the successor computes, and this
   * device has nothing to do but wait for its next input). */
  sendMs: number;
  /** Of the windows' computeMs and of sendMs: the thread that ran them preempted, as by another
   * device's threads on a shared host (native threadClock): time this device did not cost. */
  descheduledMs: number;
  frames: number;
}

/** How a ring device runs its compute threads (LocalModel.open options), whose next pass is a ring
 * round away:
 * - idleSpinUs: how long they spin after a pass before sleeping. It covers a device's own passes in
 *   a row (the head's output layer, then the next token's window). Once a device has handed its rows
 *   on it relaxes its threads at once (LocalModel.relax). Measured on a loopback ring of virtual
 *   CPUs: 500 us beat 0 while decode steps went through a libuv thread (21.5 -> 25 tok/s,
 *   bench/history/2026-11-23-ring-overhead.md); with steps inline, 0 and 500 us are within noise and
 *   2000 us is slower (measured for de6e8f5; those figures were not recorded).
 * - spreadThreads: during a pass, the threads stay on distinct CPUs, and spin rather than sleep at
 *   its barriers. Woken together after the gap, they were often stacked on one CPU, trading places at
 *   every barrier (perf sched); the loopback ring's decode was faster with it in 7 of 8 paired runs
 *   (bench/history/2026-11-23-ring-overhead.md). */
export const RING_COMPUTE_OPTIONS = { idleSpinUs: 500, spreadThreads: true } as const;

export interface RingNodeOptions {
  readonly model: LocalModel;
  readonly windows: readonly WindowSpec[];
  readonly cycles: number;
  readonly ctx: number;
  readonly maxBatch: number;
  /** The KV cache's types (the coordinator's --cache-type-k/-v); default f16. */
  readonly kvCacheTypes?: KvCacheTypes;
  readonly prefetch: boolean;
  /** Predict each MoE layer's experts with its router and advise their bytes while the layer computes
   * (NativeWindow.expertPrefetch), while this device's windows do not fit in memory. Default off. */
  readonly expertPrefetch?: boolean;
  /** Bytes of weights memory can hold now (default: unlimited). It bounds how far the next window is
   * paged in ahead, and when it is less than this device's windows, decode steps stay off the event
   * loop: paging a window in can take seconds, and a blocked event loop would look dead to the ring. */
  readonly weightRoomBytes?: () => number;
  readonly releaseAfterUse: boolean;
  /** The head is last in ring order: it wraps cycles and delivers finished rows. */
  readonly isHead: boolean;
  /** Sends a frame to the successor (resolves when it is handed to the socket). */
  readonly send: (frame: RingFrame) => Promise<void>;
  /** Head only: rows that finished their last cycle; `logits` is set when logitsFor asked for them. */
  readonly deliver?: (frame: ActivationsFrame, logits?: Float32Array) => void;
  /** Head only: a context shift went round the ring (every device, the head too, shifted its caches). */
  readonly shifted?: (frame: KvShiftFrame) => void;
  /** Head only: H2O's statistics went round the ring (every device, the head too, added its windows'). */
  readonly h2oScored?: (frame: H2oScoresFrame) => void;
  /** Head only: a buffer when this frame's last row needs the output layer (fused into the window's call). */
  readonly logitsFor?: (frame: ActivationsFrame) => Float32Array | undefined;
  /** Sequence slots (serve --parallel on a ring): each window has a KV cache per slot, the window
   * itself for slot 0 and one more window of the same layers for each other slot. Default 1. */
  readonly seqSlots?: number;
  /** Head only: a SEQ_ACTIVATIONS frame's rows that finished their last cycle, with the logits when
   * seqLogitsFor gave a buffer (every row's for a step of several slots, the last row's for one slot's rows). */
  readonly seqDeliver?: (frame: SeqActivationsFrame, logits?: Float32Array) => void;
  readonly seqLogitsFor?: (frame: SeqActivationsFrame) => Float32Array | undefined;
  /** A frame could not be processed (the error was also passed on to the successor). */
  readonly onError: (message: string, frame: RingFrame) => void;
}

/** A window's expert prefetch counters as a device's Status carries them (zeros: none, or never on). */
export function expertPrefetchStatus(window: NativeWindow): { expertsPredicted: number; expertsRouted: number; expertBytesUsed: number; expertBytesWasted: number } {
  const c = window.info().expertPrefetch;
  return { expertsPredicted: c?.predicted ?? 0, expertsRouted: c?.hits ?? 0, expertBytesUsed: c?.usedBytes ?? 0, expertBytesWasted: c?.wastedBytes ?? 0 };
}

/** What travels the ring after the handshake. */
export type RingFrame = ActivationsFrame | ErrorFrame | KvShiftFrame | SeqActivationsFrame | H2oScoresFrame;

/** The ERROR frame that stands for a frame that failed (its request, and its rows when it has any). */
export function errorFrameFor(frame: RingFrame, message: string): ErrorFrame {
  const rows = frame.type === "kvShift" ? { firstTokenPosition: frame.p0, nTokens: 0, cycle: 0 }
    : frame.type === "h2oScores" ? { firstTokenPosition: 0, nTokens: 0, cycle: 0 }
    : frame.type === "seqActivations" ? { firstTokenPosition: 0, nTokens: frame.nTokens, cycle: frame.cycle }
    : { firstTokenPosition: frame.firstTokenPosition, nTokens: frame.nTokens, cycle: frame.cycle };
  return { type: "error", requestId: frame.requestId, ...rows, message };
}

/** Adds what a device's windows gathered for H2O (NativeWindow.h2oScores, one entry a window) to a
 * frame's scores, or throws naming why they cannot: a window made without the statistics, or holding
 * other positions than the head's cache. */
export function addH2oScores(windowScores: readonly (Float32Array | null)[], frame: H2oScoresFrame): void {
  const sum = frame.scores;
  for (const s of windowScores) {
    if (!s) throw new Error("this device's windows gather no H2O statistics (its assignment asked for no --kv-evict h2o)");
    if (s.length !== sum.length) throw new Error(`this device's cache holds ${s.length} positions where the head's holds ${sum.length}: H2O cannot score them`);
    for (let p = 0; p < sum.length; p++) sum[p] += s[p];
  }
}

/** A window's copy for one sequence slot (serve --parallel), or an error naming the slot. */
function seqWindowOf(s: Slot, seqSlot: number): NativeWindow {
  const w = s.seqWindows[seqSlot];
  if (!w) throw new Error(`sequence slot ${seqSlot} is not on this device (it holds ${s.seqWindows.length})`);
  return w;
}

interface Slot {
  readonly spec: WindowSpec;
  readonly window: NativeWindow;
  /** Per sequence slot, the window whose KV cache holds it (window itself first; RingNodeOptions.seqSlots). */
  readonly seqWindows: NativeWindow[];
  readonly runner: QuickForward;
  readonly stats: WindowStats;
  /** Major page faults during this window's last call. */
  lastFaults: number;
  /** The room the window was last given (streamBeyond); given again only when it changes. */
  streamRoom?: number;
  /** The window has MoE layers; its expert prefetch mode as last set (set again only when it changes). */
  readonly moe: boolean;
  expertPrefetch: ExpertPrefetchMode;
}

export class RingNode {
  private readonly slots = new Map<number, Slot>();
  private queue: RingFrame[] = [];
  private busy = false;
  private lastDoneMs = 0;
  private stats: Omit<NodeStats, "windows"> = { waitMs: 0, sendMs: 0, descheduledMs: 0, frames: 0 };
  private closed = false;
  /** Settles once close() has closed every window (see close). */
  private closing: Promise<void> = Promise.resolve();
  /** Drop a window's pages after running it (a device short of memory with several windows). */
  releaseAfterUse: boolean;

  /** Bytes of weights in this device's windows together. */
  readonly weightBytes: number;

  constructor(private readonly o: RingNodeOptions) {
    this.releaseAfterUse = o.releaseAfterUse;
    for (const spec of o.windows) {
      if (this.slots.has(spec.cycle)) throw new Error(`two windows for cycle ${spec.cycle}`);
      const window = o.model.window(spec.firstLayer, spec.endLayer, { ctx: o.ctx, maxBatch: o.maxBatch, kvCacheTypes: o.kvCacheTypes });
      const seqWindows = [window];
      try {
        while (seqWindows.length < (o.seqSlots ?? 1)) seqWindows.push(o.model.window(spec.firstLayer, spec.endLayer, { ctx: o.ctx, maxBatch: o.maxBatch, kvCacheTypes: o.kvCacheTypes }));
      } catch (e) {
        for (const w of seqWindows) w.close();
        for (const s of this.slots.values()) for (const w of s.seqWindows) w.close();
        throw e;
      }
      const slot: Slot = {
        spec, window, seqWindows, lastFaults: 0, moe: window.info().expertHits !== undefined, expertPrefetch: "off", stats: { ...spec, frames: 0, tokens: 0, computeMs: 0, majorFaults: 0 },
        // Inline only while the window's pages are all there: no faults last time, none released since.
        runner: new QuickForward(window, () => slot.lastFaults === 0 && !this.releaseAfterUse && this.windowsFitInMemory()),
      };
      this.slots.set(spec.cycle, slot);
    }
    this.weightBytes = [...this.slots.values()].reduce((a, s) => a + s.window.residency().totalBytes, 0);
  }

  private windowsFitInMemory(): boolean {
    return this.weightRoomBytes() >= this.weightBytes;
  }

  /** Bytes of weights memory can hold now (RingNodeOptions.weightRoomBytes; unlimited without it). */
  weightRoomBytes(): number {
    return this.o.weightRoomBytes?.() ?? Infinity;
  }

  get cycles(): number {
    return this.o.cycles;
  }

  get prefetch(): boolean {
    return this.o.prefetch;
  }

  /** Expert prefetch on each MoE window while the windows do not fit in memory (RingNodeOptions
   * .expertPrefetch): with every page resident there is nothing to read ahead. Cheap when nothing
   * changes: called before each pass, and by the native lane with each renewal of the room. */
  updateExpertPrefetch(): void {
    if (!this.o.expertPrefetch) return;
    const mode: ExpertPrefetchMode = this.windowsFitInMemory() ? "off" : "ahead";
    for (const s of this.slots.values()) {
      if (s.moe && s.expertPrefetch !== mode) s.window.expertPrefetch((s.expertPrefetch = mode));
    }
  }

  /** Bytes of this device's weights in memory now (mincore over its windows: not for every token). */
  residentWeightBytes(): number {
    return this.windows.reduce((a, w) => a + w.residency().residentBytes, 0);
  }

  /** Each window with its spec and its sequence slots' windows (the window first), in cycle order (for
   * the native lane, which runs them itself). */
  get slotWindows(): readonly { readonly spec: WindowSpec; readonly window: NativeWindow; readonly seqWindows: readonly NativeWindow[] }[] {
    return this.slotsInOrder.map((s) => ({ spec: s.spec, window: s.window, seqWindows: s.seqWindows }));
  }

  private get slotsInOrder(): Slot[] {
    return [...this.slots.values()].sort((a, b) => a.spec.cycle - b.spec.cycle);
  }

  /** Windows in cycle order. */
  get windows(): readonly NativeWindow[] {
    return this.slotWindows.map((s) => s.window);
  }

  anonBytes(): number {
    let total = 0;
    for (const s of this.slots.values()) for (const w of s.seqWindows) total += w.info().anonBytes;
    return total;
  }

  /** Takes a frame from the predecessor; frames are processed one at a time, in arrival order. */
  receive(frame: RingFrame): void {
    if (this.closed) return;
    // Idle until now, this device's compute threads sleep: wake them at once, so their wake-up (0.05-0.5
    // ms on a virtual CPU) overlaps the rest of this turn rather than the pass's first layer.
    if (!this.busy && (frame.type === "activations" || frame.type === "seqActivations") && this.slots.has(frame.cycle)) this.o.model.prewake();
    if (this.lastDoneMs > 0 && !this.busy && this.queue.length === 0) this.stats.waitMs += performance.now() - this.lastDoneMs;
    this.queue.push(frame);
    if (!this.busy) void this.drain();
  }

  statsSnapshot(): NodeStats {
    return { ...this.stats, windows: [...this.slots.values()].map((s) => ({ ...s.stats })) };
  }

  resetStats(): void {
    this.stats = { waitMs: 0, sendMs: 0, descheduledMs: 0, frames: 0 };
    this.lastDoneMs = 0;
    for (const s of this.slots.values()) Object.assign(s.stats, { frames: 0, tokens: 0, computeMs: 0, majorFaults: 0 });
  }

  /** Sends rows to the successor, timing it. With nothing else queued, this device has no work until
   * rows come round again: its threads stop spinning now, before the write completes (that can take
   * milliseconds), since the successor starts as soon as the bytes arrive and on a loopback ring
   * needs the same cores. */
  async send(frame: RingFrame): Promise<void> {
    const c0 = threadClock(), t0 = performance.now();
    if (this.queue.length === 0) this.o.model.relax();
    // A link with nothing queued encodes the frame and writes it to the socket before it returns.
    const sent = this.o.send(frame);
    const c1 = threadClock(), handedMs = performance.now() - t0;
    await sent;
    // The wait for the write's completion comes after the bytes went out, while the successor
    // computes: this device's work only if frames waited for it.
    const waited = this.queue.length > 0;
    const ms = waited ? performance.now() - t0 : handedMs;
    this.stats.sendMs += ms;
    this.stats.descheduledMs += descheduledMs(c0, waited ? threadClock() : c1, ms);
  }

  /** Closes every window. One still busy with a forward pass (the native lane's, or one awaited here)
   * closes as soon as that pass ends: the model refuses to close while any window is open, so a window
   * left to "the model's close" would leak and make that close fail. Settles once all are closed, or
   * after BUSY_CLOSE_LIMIT_MS with the windows still busy (a pass that never ends), never rejects. */
  close(): Promise<void> {
    if (this.closed) return this.closing;
    this.closed = true;
    this.queue = [];
    const busy = [...this.slots.values()].flatMap((s) => s.seqWindows).filter((w) => !tryClose(w));
    this.slots.clear();
    if (busy.length > 0) this.closing = closeWhenIdle(busy);
    return this.closing;
  }

  private async drain(): Promise<void> {
    this.busy = true;
    while (this.queue.length > 0 && !this.closed) {
      const frame = this.queue.shift()!;
      try {
        await this.process(frame);
      } catch (e) {
        const message = e instanceof Error ? e.message : String(e);
        this.o.onError(message, frame);
        if (!this.closed) {
          await this.o.send(errorFrameFor(frame, message)).catch(() => {});
        }
      }
    }
    this.busy = false;
    this.lastDoneMs = performance.now();
  }

  /** Every window's cache shifts (in cycle order; a device holds the same positions in each), or with
   * a sequence slot, that slot's window of each. */
  shiftWindows(frame: KvShiftFrame): void {
    const { slot } = frame;
    for (const s of this.slotsInOrder) {
      (slot === undefined ? s.window : seqWindowOf(s, slot)).kvShift(frame.p0, frame.nDiscard, frame.nPast);
    }
  }

  private async process(frame: RingFrame): Promise<void> {
    if (frame.type === "error") {
      // Pass the failure on so it reaches the head, which ends the request.
      if (this.o.isHead) this.o.onError(frame.message, frame);
      else await this.send(frame);
      return;
    }
    if (frame.type === "kvShift") {
      this.shiftWindows(frame);
      if (this.o.isHead) this.o.shifted?.(frame);
      else await this.send(frame);
      return;
    }
    if (frame.type === "h2oScores") {
      addH2oScores(this.windows.map((w) => w.h2oScores()), frame);
      if (this.o.isHead) this.o.h2oScored?.(frame);
      else await this.send(frame);
      return;
    }
    if (frame.type === "seqActivations") return this.processSeqs(frame);
    this.stats.frames++;
    const slot = this.slots.get(frame.cycle);
    const last = frame.cycle + 1 >= this.o.cycles;
    const logits = this.o.isHead && last && slot ? this.o.logitsFor?.(frame) : undefined;
    if (slot) {
      this.updateExpertPrefetch();
      const faults0 = process.resourceUsage().majorPageFault;
      const c0 = threadClock(), t0 = performance.now();
      // Inline, the rows go on to the successor in this same turn, without an await in between.
      const { activations, firstTokenPosition, nTokens } = frame;
      if (!slot.runner.forwardInline(activations, firstTokenPosition, nTokens, logits)) {
        await slot.runner.forward(activations, firstTokenPosition, nTokens, logits);
      }
      const ms = performance.now() - t0;
      slot.stats.computeMs += ms;
      this.stats.descheduledMs += descheduledMs(c0, threadClock(), ms);
      slot.lastFaults = process.resourceUsage().majorPageFault - faults0;
      slot.stats.majorFaults += slot.lastFaults;
      slot.stats.frames++;
      slot.stats.tokens += frame.nTokens;
    } else if (!this.o.isHead) {
      throw new Error(noWindowMessage(frame.cycle));
    }
    if (this.o.isHead && last) this.o.deliver?.(frame, logits);
    else await this.send(this.o.isHead ? { ...frame, cycle: frame.cycle + 1 } : frame);
    if (slot) this.advise(slot, frame);
  }

  /** Rows of several sequences: one slot's rows (a prompt) through its window; rows of distinct slots
   * (a decode step) through one pass over the weights, each attending to its own slot's cache. */
  private async processSeqs(frame: SeqActivationsFrame): Promise<void> {
    this.stats.frames++;
    const slot = this.slots.get(frame.cycle);
    const last = frame.cycle + 1 >= this.o.cycles;
    const logits = this.o.isHead && last && slot ? this.o.seqLogitsFor?.(frame) : undefined;
    if (slot) {
      const { slots, positions, nTokens: n } = frame;
      const wins = Array.from(slots, (s) => seqWindowOf(slot, s));
      const oneSlot = slots.every((s, i) => s === slots[0] && positions[i] === positions[0] + i);
      const t0 = performance.now();
      if (oneSlot) await wins[0].forward(frame.activations, positions[0], n, logits);
      else await wins[0].forwardSeqs(wins, frame.activations, positions, logits);
      slot.stats.computeMs += performance.now() - t0;
      slot.stats.frames++;
      slot.stats.tokens += n;
    } else if (!this.o.isHead) {
      throw new Error(noWindowMessage(frame.cycle));
    }
    if (this.o.isHead && last) this.o.seqDeliver?.(frame, logits);
    else await this.send(this.o.isHead ? { ...frame, cycle: frame.cycle + 1 } : frame);
  }

  private nextSlot(cycle: number): Slot | undefined {
    for (let c = 1; c <= this.o.cycles; c++) {
      const s = this.slots.get((cycle + c) % this.o.cycles);
      if (s) return s;
    }
    return undefined;
  }

  /** After passing rows on: page in the next window, and drop this one if memory is short. Not while
   * more rows for the same window are already waiting (a long prompt's batches). */
  private advise(slot: Slot, frame: ActivationsFrame): void {
    const next = this.queue[0];
    if (next && next.type !== "kvShift" && next.type !== "h2oScores" && next.cycle === frame.cycle) return;
    // With one window, the next window is this one again: releasing all of it would only thrash, and
    // advice could only page its first layers back in at the cost of its last (measured slower, and
    // the advice itself costs a walk over every page on each token).
    const following = this.nextSlot(frame.cycle);
    if (!following || following === slot) {
      // One window, larger than the memory it has: keep its first bytes and drop the rest of each
      // layer right after computing it, so that each pass rereads only that tail; left to the kernel, a
      // window read in the same order every pass lost kept pages too and reread about twice its excess.
      // (While the window fits, every room reads as "all of it": no native call on each token.)
      const room = Math.min(this.weightRoomBytes(), this.weightBytes);
      if (room !== slot.streamRoom) slot.window.streamBeyond((slot.streamRoom = room));
      return;
    }
    if (this.releaseAfterUse) slot.window.release();
    // in the background: giving the advice takes as long as allocating the window's pages, and the
    // next frame must not wait for it (native prima_window_prefetch_background)
    if (this.o.prefetch) following.window.prefetch(this.o.weightRoomBytes?.(), true);
  }
}
