// A decode step of a small window takes a few milliseconds; sending it to a libuv thread and back
// costs two thread hand-offs, tens to hundreds of microseconds on a busy or virtual CPU, on every
// token and (in a ring) on every device. So one-token calls whose previous one was quick run on the
// calling thread. Anything that may take long (prompt batches, a window being paged in from disk)
// stays asynchronous, so the event loop keeps answering peers and liveness checks; a ring device
// also says when its pages may not be there (allowInline).
import type { NativeWindow } from "../native/index.js";

/** A one-token call runs on the calling thread when the previous one took less than this. */
export const INLINE_MAX_MS = 50;

export class QuickForward {
  private lastOneTokenMs = Infinity;

  /** allowInline: asked before each inline call; false whenever the call might page weights in. */
  constructor(readonly window: NativeWindow, private readonly allowInline: () => boolean = () => true) {}

  async forward(acts: Float32Array, pos: number, nTokens: number, logits?: Float32Array): Promise<void> {
    if (this.forwardInline(acts, pos, nTokens, logits)) return;
    if (nTokens !== 1) return this.window.forward(acts, pos, nTokens, logits);
    const t0 = performance.now();
    await this.window.forward(acts, pos, 1, logits);
    this.lastOneTokenMs = performance.now() - t0;
  }

  /** Runs the call on the calling thread if it qualifies, and says whether it did. Unlike awaiting
   * forward(), a caller can act on the result in the same event-loop turn (a ring device sends its
   * rows on before the promise machinery of the turn runs: ~0.1 ms per hop). */
  forwardInline(acts: Float32Array, pos: number, nTokens: number, logits?: Float32Array): boolean {
    if (nTokens !== 1 || !(this.lastOneTokenMs < INLINE_MAX_MS) || !this.allowInline()) return false;
    const t0 = performance.now();
    this.window.forwardNow(acts, pos, 1, logits);
    this.lastOneTokenMs = performance.now() - t0;
    return true;
  }
}
