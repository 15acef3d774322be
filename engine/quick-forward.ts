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
    if (nTokens !== 1) return this.window.forward(acts, pos, nTokens, logits);
    const t0 = performance.now();
    if (this.lastOneTokenMs < INLINE_MAX_MS && this.allowInline()) this.window.forwardNow(acts, pos, 1, logits);
    else await this.window.forward(acts, pos, 1, logits);
    this.lastOneTokenMs = performance.now() - t0;
  }
}
