// A link's sending side (RingLink.send): frames go out whole and in call order, each cut into
// fragments of `fragmentBytes`, with at most FRAGMENTS_IN_FLIGHT of them handed to ws and not yet
// flushed (the backpressure); each frame's timing is measured for the per-hop figures.
import type WebSocket from "ws";
import type { RingLinkError } from "./errors.js";

/** Timing and size of one sent frame (for per-hop timings). */
export interface FrameSendStats {
  /** Frame bytes (header + payload; WebSocket framing excluded). */
  bytes: number;
  /** Checks and encoding (the copy, or the f16 conversion). */
  encodeMs: number;
  /** Waiting for earlier frames on this link to be handed to the socket. */
  queuedMs: number;
  /** From the first fragment's write until the last one left this process (to the kernel), backpressure included. */
  writeMs: number;
  /** From send() until the last fragment left this process. */
  totalMs: number;
}

export interface FrameWriterOptions {
  readonly ws: WebSocket;
  readonly fragmentBytes: number;
  /** Throws the link's RingLinkError when it can no longer send. */
  readonly checkOpen: () => void;
  /** A fragment was flushed (the liveness watch counts it as progress). */
  readonly onFlushed: () => void;
  /** The error a fragment's failed write becomes. */
  readonly writeFailed: (err: Error) => RingLinkError;
  /** A whole frame has left this process. */
  readonly onSent: (bytes: number) => void;
}

const FRAGMENTS_IN_FLIGHT = 2;

/** Returns p, marked as handled: its caller still sees the rejection, but one that nobody awaits
 * (an ignored send, a fragment after an earlier failure) is not an unhandled rejection. */
export function handled<T>(p: Promise<T>): Promise<T> {
  p.catch(() => {});
  return p;
}

export class FrameWriter {
  /** Resolves when the previous frame's fragments are all handed to ws (frames never interleave). */
  private sendTurn: Promise<void> = Promise.resolve();
  /** Frames waiting for their turn or still handing fragments to ws (a new frame may skip the queue only when 0). */
  private framesQueued = 0;
  private fragmentsInFlight = 0;
  private slotWaiters: Array<() => void> = [];

  constructor(private readonly o: FrameWriterOptions) {}

  /** Writes an encoded frame after the frames before it; resolves once all of it left this process. */
  write(buf: Buffer, calledAt: number, encodedAt: number): Promise<FrameSendStats> {
    // Nothing queued and the frame fits one fragment with a slot free: hand it to the socket now
    // rather than a few microtasks later, after whatever else this event-loop turn still runs (a
    // one-token frame of the ring's decode waited ~70 us that way on every hop).
    if (this.framesQueued === 0 && this.fragmentsInFlight < FRAGMENTS_IN_FLIGHT && buf.length <= this.o.fragmentBytes) {
      return handled(this.finishFrame(buf, [handled(this.writeFragment(buf, true))], calledAt, encodedAt, encodedAt));
    }
    const turn = this.sendTurn;
    let releaseTurn!: () => void;
    this.framesQueued++;
    this.sendTurn = new Promise<void>((r) => (releaseTurn = r));
    return handled(turn.then(() => this.writeFrame(buf, calledAt, encodedAt, releaseTurn)));
  }

  /** Wakes frames waiting for a fragment slot (they then see the link closed or failed). */
  wake(): void {
    const waiters = this.slotWaiters;
    this.slotWaiters = [];
    for (const w of waiters) w();
  }

  private async writeFrame(buf: Buffer, calledAt: number, encodedAt: number, releaseTurn: () => void): Promise<FrameSendStats> {
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      this.framesQueued--;
      releaseTurn();
    };
    try {
      const turnAt = performance.now();
      const flushed: Promise<void>[] = [];
      for (let offset = 0; offset < buf.length; offset += this.o.fragmentBytes) {
        await this.fragmentSlot();
        const end = Math.min(buf.length, offset + this.o.fragmentBytes);
        flushed.push(handled(this.writeFragment(buf.subarray(offset, end), end === buf.length)));
      }
      release();
      return await this.finishFrame(buf, flushed, calledAt, encodedAt, turnAt);
    } finally {
      release(); // lets the next frame go even when this one failed
    }
  }

  /** Waits until the frame's fragments have left this process; counts it and times it. */
  private async finishFrame(buf: Buffer, flushed: Promise<void>[], calledAt: number, encodedAt: number, turnAt: number): Promise<FrameSendStats> {
    await Promise.all(flushed);
    const doneAt = performance.now();
    this.o.onSent(buf.length);
    return {
      bytes: buf.length, encodeMs: encodedAt - calledAt, queuedMs: turnAt - encodedAt, writeMs: doneAt - turnAt,
      totalMs: doneAt - calledAt,
    };
  }

  /** Waits until fewer than FRAGMENTS_IN_FLIGHT fragments are unflushed: this is the backpressure. */
  private async fragmentSlot(): Promise<void> {
    while (this.fragmentsInFlight >= FRAGMENTS_IN_FLIGHT) {
      this.o.checkOpen();
      await new Promise<void>((r) => this.slotWaiters.push(r));
    }
    this.o.checkOpen();
  }

  private writeFragment(bytes: Buffer, last: boolean): Promise<void> {
    this.fragmentsInFlight++;
    return new Promise<void>((resolve, reject) => {
      this.o.ws.send(bytes, { binary: true, fin: last, compress: false }, (err) => {
        this.fragmentsInFlight--;
        this.o.onFlushed();
        this.wake();
        if (err) reject(this.o.writeFailed(err));
        else resolve();
      });
    });
  }
}
