// Where the time of a re-placement goes: a stopwatch that sums the time spent in named phases (the
// hop probes of every worker add up under one name), so that a recovery's pause can be told apart
// into detection, planning, wiring and replay (the event log and bench/chaos.ts read it).

export class Phases {
  private readonly totals = new Map<string, number>();
  private readonly startedAt = performance.now();

  /** Runs `fn`, adding its time to phase `name`. */
  async time<T>(name: string, fn: () => Promise<T> | T): Promise<T> {
    const t0 = performance.now();
    try {
      return await fn();
    } finally {
      this.add(name, performance.now() - t0);
    }
  }

  add(name: string, ms: number): void {
    this.totals.set(name, (this.totals.get(name) ?? 0) + ms);
  }

  /** Work done while a phase waited for others (the head's garbage collected while the workers
   * answer): said apart, as it adds nothing to the time. */
  meanwhile(name: string, ms: number): void {
    this.overlapped.set(name, (this.overlapped.get(name) ?? 0) + ms);
  }

  private readonly overlapped = new Map<string, number>();

  /** Milliseconds since the stopwatch started. */
  get elapsedMs(): number {
    return performance.now() - this.startedAt;
  }

  /** `name 0.12 s, other 0.03 s`, in the order the phases first ran, with the time no phase took. */
  toString(): string {
    const parts = [...this.totals].map(([n, ms]) => `${n} ${(ms / 1000).toFixed(2)} s`);
    const other = this.elapsedMs - [...this.totals.values()].reduce((a, b) => a + b, 0);
    if (other >= 5) parts.push(`other ${(other / 1000).toFixed(2)} s`);
    const meanwhile = [...this.overlapped].map(([n, ms]) => `${n} ${(ms / 1000).toFixed(2)} s`);
    return parts.join(", ") + (meanwhile.length ? `; meanwhile ${meanwhile.join(", ")}` : "");
  }
}
