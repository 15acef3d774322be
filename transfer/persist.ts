// Small files the transfer keeps beside its data (the verified chunks of a cached model, the hashes of
// a served one): written whole or not at all, and not on every change.
import { renameSync, writeFileSync } from "node:fs";

/** Writes text through a temporary file renamed over path: a reader (or a restart) never sees half. */
export function writeFileAtomic(path: string, text: string): void {
  writeFileSync(`${path}.tmp`, text);
  renameSync(`${path}.tmp`, path);
}

/** Runs fn once, ms after the first of any number of soon() calls; the timer never keeps Node alive. */
export class Debounced {
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly ms: number, private readonly fn: () => void) {}

  soon(): void {
    if (this.timer) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.fn();
    }, this.ms);
    this.timer.unref();
  }

  /** Forgets a pending run (the caller runs fn itself now). */
  cancel(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}
