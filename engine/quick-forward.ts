// A decode step of a small window takes a few milliseconds; sending it to a libuv thread and back
// costs two thread hand-offs, tens to hundreds of microseconds on a busy or virtual CPU, on every
// token and (in a ring) on every device. So one-token calls whose previous one was quick run on the
// calling thread. Anything that may take long (prompt batches, a window being paged in from disk)
// stays asynchronous, so the event loop keeps answering peers and liveness checks; a ring device
// also says when its pages may not be there (allowInline).
import type { NativeWindow } from "../native/index.js";

/** A pass made NaN or infinite activations (a broken or hostile weight file, or an overflow): the
 * tokens that would follow are noise, so generation stops with this instead of printing nothing. */
export class NonFiniteError extends Error {
  override name = "NonFiniteError";
}

/** Index of the first NaN or infinity in a[0..n), or -1. A plain sum first: it is finite exactly when
 * every element is (f32 values cannot overflow a double sum), and it is the cheap common case. */
function firstNonFinite(a: Float32Array, n: number): number {
  let sum = 0;
  for (let i = 0; i < n; i++) sum += a[i];
  if (Number.isFinite(sum)) return -1;
  for (let i = 0; i < n; i++) if (!Number.isFinite(a[i])) return i;
  return -1;
}

/** Throws NonFiniteError naming the window's layers (and forgets the positions the pass wrote) when its
 * output rows or logits are not all finite. ~1 µs per 1000 floats: a decode step checks one row. */
export function checkFinite(window: NativeWindow, acts: Float32Array, pos: number, nTokens: number, logits?: Float32Array): void {
  const E = acts.length / Math.max(1, nTokens);
  const rows = Math.min(acts.length, nTokens * E);
  const at = firstNonFinite(acts, rows);
  const bad = at >= 0 ? `${acts[at]} in the output of token ${pos + Math.floor(at / E)}` : logits && firstNonFinite(logits, logits.length) >= 0 ? "in the logits" : null;
  if (bad === null) return;
  const info = window.info();
  window.kvTruncate(Math.min(pos, info.filled));
  const layers = info.endLayer - info.firstLayer === 1 ? `layer ${info.firstLayer}` : `layers ${info.firstLayer}-${info.endLayer - 1}`;
  throw new NonFiniteError(`${layers} made NaN or infinite activations (${bad}): the model's weights are broken, or its activations overflow`);
}

/** A one-token call runs on the calling thread when the previous one took less than this. */
export const INLINE_MAX_MS = 50;

export class QuickForward {
  private lastOneTokenMs = Infinity;

  /** allowInline: asked before each inline call; false whenever the call might page weights in. */
  constructor(readonly window: NativeWindow, private readonly allowInline: () => boolean = () => true) {}

  async forward(acts: Float32Array, pos: number, nTokens: number, logits?: Float32Array): Promise<void> {
    if (this.forwardInline(acts, pos, nTokens, logits)) return;
    const t0 = performance.now();
    await this.window.forward(acts, pos, nTokens, logits);
    if (nTokens === 1) this.lastOneTokenMs = performance.now() - t0;
    checkFinite(this.window, acts, pos, nTokens, logits);
  }

  /** Runs the call on the calling thread if it qualifies, and says whether it did. Unlike awaiting
   * forward(), a caller can act on the result in the same event-loop turn (a ring device sends its
   * rows on before the promise machinery of the turn runs: ~0.1 ms per hop). */
  forwardInline(acts: Float32Array, pos: number, nTokens: number, logits?: Float32Array): boolean {
    if (nTokens !== 1 || !(this.lastOneTokenMs < INLINE_MAX_MS) || !this.allowInline()) return false;
    const t0 = performance.now();
    this.window.forwardNow(acts, pos, 1, logits);
    this.lastOneTokenMs = performance.now() - t0;
    checkFinite(this.window, acts, pos, 1, logits);
    return true;
  }
}
