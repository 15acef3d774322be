// The main thread's side of the grammar engine's thread (engine-worker.ts): requests as messages, each
// answered within a limit. A thread that dies or does not answer in time is ended, every request
// waiting on it fails with an error saying so, and the GrammarSet starts a fresh one for the next.
import { Worker } from "node:worker_threads";
import type { EngineMessage, EngineReply, EngineRequest } from "./engine-worker.js";

/** The engine refused the grammar (GrammarSet makes it a GrammarError). */
export class EngineRefusal extends Error {}

export type StepAnswer = { readonly masked: boolean; readonly terminated: boolean };

interface Waiting {
  resolve(a: StepAnswer): void;
  reject(e: Error): void;
  readonly timer: NodeJS.Timeout;
}

export class EngineThread {
  private readonly worker: Worker;
  private readonly waiting = new Map<number, Waiting>();
  private nextId = 1;
  /** Why the thread is gone; set once. */
  failure: Error | undefined;

  constructor() {
    // The process's flags, but --input-type (a script given with -e), which a worker refuses.
    const execArgv = process.execArgv.filter((a) => !a.startsWith("--input-type"));
    this.worker = new Worker(new URL("./engine-worker.js", import.meta.url), { execArgv });
    this.worker.on("message", (r: EngineReply) => {
      const w = this.waiting.get(r.id);
      if (!w) return;
      this.waiting.delete(r.id);
      clearTimeout(w.timer);
      if (r.ok) w.resolve({ masked: r.masked, terminated: r.terminated });
      else w.reject(r.grammar ? new EngineRefusal(r.error) : new Error(r.error));
    });
    this.worker.on("error", (e) => this.fail(`the grammar engine's thread failed: ${e.message}`));
    this.worker.on("exit", (code) => this.fail(`the grammar engine's thread exited (code ${code})`));
    // The thread alone does not keep the process up (a CLI run ends when its work does); a request
    // waiting on it does, through its timer. After the listeners, which would ref it again.
    this.worker.unref();
  }

  /** Asks the thread; fails if it has not answered within waitMs (`what` says what was asked). */
  call(req: EngineRequest, what: string, waitMs: number): Promise<StepAnswer> {
    if (this.failure) return Promise.reject(this.failure);
    const id = this.nextId++;
    return new Promise<StepAnswer>((resolve, reject) => {
      const timer = setTimeout(() => this.fail(`the grammar engine did not answer within ${(waitMs / 1000).toFixed(1)} s (${what}); it was stopped, and the next request starts a fresh one`), waitMs);
      this.waiting.set(id, { resolve, reject, timer });
      this.worker.postMessage({ id, req } satisfies EngineMessage);
    });
  }

  /** Tells the thread something that needs no answer. */
  post(req: EngineRequest): void {
    if (!this.failure) this.worker.postMessage({ id: 0, req } satisfies EngineMessage);
  }

  /** Ends the thread; every request waiting on it fails with `why`. */
  fail(why: string): void {
    if (this.failure) return;
    this.failure = new Error(why);
    for (const w of this.waiting.values()) {
      clearTimeout(w.timer);
      w.reject(this.failure);
    }
    this.waiting.clear();
    void this.worker.terminate();
  }
}
