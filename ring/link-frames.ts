// A link's frames as an async iterator (RingLink.frames): frames already waiting first, then each as
// it arrives; it ends when the link closes cleanly and throws the link's error once when it failed.
import type { RingLinkError } from "./errors.js";
import type { Frame } from "./frame.js";

/** What the iterator needs of a link. */
export interface FrameSource {
  /** Frames that arrived before anyone listened, handed over to the iterator. */
  readonly waiting: Frame[];
  /** Calls onFrame for each frame and onClose once the link closes; returns the unsubscribe. */
  subscribe(onFrame: (f: Frame) => void, onClose: () => void): () => void;
  /** Whether the link has closed, and with which error (null: closed cleanly). */
  closedWith(): { error: RingLinkError | null } | null;
}

export function frameIterator(source: FrameSource): AsyncIterableIterator<Frame> {
  const queue: Frame[] = source.waiting;
  let waiter: { resolve: (r: IteratorResult<Frame>) => void; reject: (e: unknown) => void } | null = null;
  let finished = false;
  let errorThrown = false;
  const unsubscribe = source.subscribe(
    (f) => {
      if (waiter) {
        const w = waiter;
        waiter = null;
        w.resolve({ value: f, done: false });
      } else queue.push(f);
    },
    () => {
      if (!waiter) return;
      const w = waiter;
      waiter = null;
      settleEnd(w.resolve, w.reject);
    },
  );
  const cleanup = () => {
    finished = true;
    unsubscribe();
  };
  const settleEnd = (resolve: (r: IteratorResult<Frame>) => void, reject: (e: unknown) => void) => {
    const error = source.closedWith()?.error ?? null;
    cleanup();
    if (error && !errorThrown) {
      errorThrown = true;
      reject(error);
    } else resolve({ value: undefined, done: true });
  };
  const iterator: AsyncIterableIterator<Frame> = {
    next: () =>
      new Promise<IteratorResult<Frame>>((resolve, reject) => {
        if (queue.length > 0) return resolve({ value: queue.shift()!, done: false });
        if (finished) return resolve({ value: undefined, done: true });
        if (source.closedWith()) return settleEnd(resolve, reject);
        waiter = { resolve, reject };
      }),
    return: () => {
      cleanup();
      if (waiter) waiter.resolve({ value: undefined, done: true });
      waiter = null;
      return Promise.resolve({ value: undefined, done: true });
    },
    [Symbol.asyncIterator]() {
      return iterator;
    },
  };
  return iterator;
}
