// The request queue: one task at a time owns the pipeline (a request's run, or placing the layers);
// requests wait their turn in order, at most --queue of them, and one whose client left while it
// waited is dropped when its turn comes.

export class QueueFullError extends Error {
  override name = "QueueFullError";
}
export class CancelledError extends Error {
  override name = "CancelledError";
}

export class RequestQueue {
  private tail: Promise<unknown> = Promise.resolve();
  private waitingNow = 0;

  constructor(private readonly changed: () => void) {}

  /** Requests waiting (not counting the running one). */
  get waiting(): number {
    return this.waitingNow;
  }

  /** Runs fn after everything queued before it. */
  exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.tail.then(fn, fn);
    this.tail = run.catch(() => {});
    return run;
  }

  /** Queues a request, refused past maxQueue waiting while one runs (busy) or others wait; fn gets the
   * time it waited. */
  enqueue<T>(maxQueue: number, busy: boolean, signal: AbortSignal | undefined, fn: (queueMs: number) => Promise<T>): Promise<T> {
    if (this.waitingNow >= maxQueue && (busy || this.waitingNow > 0)) {
      return Promise.reject(new QueueFullError(`${this.waitingNow} requests are waiting (the limit is ${maxQueue}): try again shortly`));
    }
    this.waitingNow++;
    this.changed();
    const queuedAt = performance.now();
    let left = false;
    const leave = () => {
      if (!left) {
        left = true;
        this.waitingNow--;
        this.changed();
      }
    };
    return this.exclusive(async () => {
      leave();
      if (signal?.aborted) throw new CancelledError("the client went away while the request was queued");
      return fn(performance.now() - queuedAt);
    }).finally(leave);
  }
}
