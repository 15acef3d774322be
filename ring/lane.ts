// A ring worker's data path on the native lane (native/src/lane.h). Once a worker has both links, their
// connections go to a C thread that reads each frame, runs its window and writes the rows on, with
// no event loop, stream or JS object in between: on a loopback ring that path cost ~0.4 ms of CPU per
// device per token (bench/history/2026-11-23-ring-overhead.md). JS keeps what is rare: the frames the
// lane leaves to it (ERROR frames to pass on, frames it cannot run or that fail its checks, which the
// codec then names), link failures (reported through the RingLink objects, as before), KV commands and
// statistics.
import { INLINE_MAX_MS } from "../engine/index.js";
import { startNativeLane, type NativeLane, type NativeLaneEvent, type NativeModel } from "../native/index.js";
import { encodeFrame, type Frame } from "./frame.js";
import { FRAME_HEADER_BYTES, SEQ_TAG_BYTES } from "./wire.js";
import { CLOSE_GRACE_MS, type RingLink } from "./link.js";
import { livenessRules } from "./liveness.js";
import { addH2oScores, errorFrameFor, noWindowMessage, type NodeStats, type RingNode } from "./node.js";
import type { ResolvedLinkOptions } from "./options.js";

export interface RingLaneOptions {
  readonly model: NativeModel;
  /** The device's node: its windows, cycles, prefetch and memory settings (the lane runs its frames). */
  readonly node: RingNode;
  /** This device's link options (its HELLO limits, liveness timeout, fragment size). */
  readonly link: ResolvedLinkOptions;
  readonly predecessor: RingLink;
  readonly successor: RingLink;
  /** A frame could not be processed (an ERROR frame went on to the successor). */
  readonly onError: (message: string) => void;
}

const ROOM_RENEW_MS = 1000;

/** The most a predecessor can have sent and this device not yet run: each sequence slot's context
 * once (a request at a time per slot; one-token frames, f32 rows and their tags: the most bytes), and a
 * few whole messages besides (ERROR frames, the next request's first batch). Beyond it is a flood. */
export function maxQueuedBytes(link: ResolvedLinkOptions, ctx: number, seqSlots = 1): number {
  const perToken = link.limits.hiddenSize * 4 + SEQ_TAG_BYTES + FRAME_HEADER_BYTES + 64;
  return seqSlots * ctx * perToken + 4 * link.maxMessageBytes;
}

export class RingLane {
  private stopped = false;
  private readonly roomTimer: NodeJS.Timeout;

  private constructor(private readonly lane: NativeLane, private readonly o: RingLaneOptions, fds: { in: number; out: number }) {
    const side = (which: "in" | "out") => ({
      close: (code: number, reason: string) => {
        if (!this.stopped) lane.closeLink(which, code, reason);
      },
    });
    // Both descriptors are dup'ed (attach) before JS closes its own (handOverToLane), in one turn.
    // A keyed link's sequence numbers go on in C from where JS left them (nothing is in flight: socketForLane).
    lane.attach("in", fds.in, o.predecessor.laneCrypto() ?? undefined);
    lane.attach("out", fds.out, o.successor.laneCrypto() ?? undefined);
    o.predecessor.handOverToLane(side("in"));
    o.successor.handOverToLane(side("out"));
    // What memory can hold decides whether a pass may run on the lane thread (lane.c, quick()).
    const renew = () => {
      lane.setWeightRoom(o.node.weightRoomBytes());
      o.node.updateExpertPrefetch();
    };
    renew();
    this.roomTimer = setInterval(renew, ROOM_RENEW_MS);
    this.roomTimer.unref();
  }

  /** Starts the lane over both links, or returns null (the links stay with JS) when either cannot be
   * handed over now (see RingLink.socketForLane). */
  static start(o: RingLaneOptions): RingLane | null {
    const fds = { in: o.predecessor.socketForLane(), out: o.successor.socketForLane() };
    if (fds.in === null || fds.out === null) return null;
    const { node } = o;
    const slots = node.slotWindows;
    let self: RingLane | null = null;
    const lane = startNativeLane(o.model, slots.map((s) => s.window), slots.map((s) => s.spec.cycle), {
      cycles: node.cycles,
      maxTokensPerFrame: o.link.limits.maxTokensPerFrame,
      maxPayloadBytes: o.link.limits.maxPayloadBytes,
      maxMessageBytes: o.link.maxMessageBytes,
      maxQueuedBytes: maxQueuedBytes(o.link, slots.length ? slots[0].window.info().ctx : 0, slots.length ? slots[0].seqWindows.length : 1),
      ...livenessRules(o.link.livenessTimeoutMs),
      closeGraceMs: CLOSE_GRACE_MS,
      fragmentBytes: o.link.fragmentBytes,
      prefetch: node.prefetch,
      weightBytes: node.weightBytes,
      quickPassMs: INLINE_MAX_MS,
      seqWindows: slots.map((s) => s.seqWindows),
    }, (ev) => self?.onEvent(ev));
    lane.setReleaseAfterUse(node.releaseAfterUse);
    self = new RingLane(lane, o, { in: fds.in, out: fds.out });
    return self;
  }

  /** A frame the predecessor link delivered to JS (the lane left it, and waits). */
  takeFrame(frame: Frame): void {
    if (this.stopped) return;
    if (frame.type === "error") this.lane.send(encodeFrame(frame));
    else if (frame.type === "kvShift" || frame.type === "h2oScores") {
      // between frames (the lane waits for resume): every window shifts, or adds its H2O statistics,
      // then the frame goes on
      try {
        if (frame.type === "h2oScores") addH2oScores(this.lane.h2oScores(), frame);
        else this.lane.kvShift(frame.p0, frame.nDiscard, frame.nPast, frame.slot);
        this.lane.send(encodeFrame(frame));
      } catch (e) {
        const message = (e as Error).message;
        this.o.onError(message);
        this.lane.send(encodeFrame(errorFrameFor(frame, message)));
      }
    }
    else if (frame.type === "activations" || frame.type === "seqActivations") {
      // Valid (the codec passed it) yet not run: no window of this device is in that cycle.
      const message = noWindowMessage(frame.cycle);
      this.o.onError(message);
      this.lane.send(encodeFrame(errorFrameFor(frame, message)));
    }
    this.lane.resume();
  }

  /** A pass that may take long (a prompt batch, a window paged in from disk) runs on a libuv thread,
   * while the lane thread goes on answering pings: a device busy for seconds must not look dead. */
  private runOffLane(frame: Buffer): void {
    this.lane.runFrame(frame).then(
      () => this.stopped || this.lane.resume(),
      (e: Error) => {
        if (this.stopped) return;
        this.o.onError(e.message);
        this.lane.resume();
      },
    );
  }

  kvClear(): void {
    if (!this.stopped) this.lane.kvClear();
  }

  kvTruncate(position: number): void {
    if (!this.stopped) this.lane.kvTruncate(position);
  }

  setReleaseAfterUse(on: boolean): void {
    if (!this.stopped) this.lane.setReleaseAfterUse(on);
  }

  stats(): NodeStats {
    const s = this.lane.stats();
    const slots = this.o.node.slotWindows;
    return {
      waitMs: s.waitMs, sendMs: s.sendMs, descheduledMs: s.descheduledMs, frames: s.frames,
      windows: slots.map((slot, i) => ({ ...slot.spec, ...s.windows[i] })),
    };
  }

  resetStats(): void {
    if (!this.stopped) this.lane.resetStats();
  }

  /** Closes both links (close handshakes, at most the links' grace), then ends the thread. */
  async close(reason: string): Promise<void> {
    if (this.stopped) return;
    await Promise.allSettled([this.o.predecessor.close(reason), this.o.successor.close(reason)]);
    this.stop();
  }

  /** Ends the thread at once (its connections close without close frames). */
  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    clearInterval(this.roomTimer);
    this.lane.stop();
    this.o.predecessor.laneStopped();
    this.o.successor.laneStopped();
  }

  private onEvent(ev: NativeLaneEvent): void {
    if (this.stopped) return;
    const { kind } = ev;
    if (kind === "error") return this.o.onError(ev.text);
    if (kind === "frame" && ev.link === "in" && ev.code === 1) return this.runOffLane(ev.data!);
    (ev.link === "in" ? this.o.predecessor : this.o.successor).laneEvent({ ...ev, kind });
  }
}
