// The log lines of refused connections, at most one per address per interval: a port scanner or a
// stranger reconnecting in a loop must not flood the log. The first refusal from an address is logged
// at once; the ones that follow within the interval are counted, and one line at its end says how many
// (the interval starts again while they keep coming).

/** How long one address stays quiet after a logged line. */
export const DROP_LOG_INTERVAL_MS = 10_000;
/** Addresses tracked at once; beyond them, refusals are counted together under OTHERS. */
const MAX_ADDRESSES = 256;
const OTHERS = "other addresses";

interface Quiet {
  count: number;
  reason: string;
  timer: NodeJS.Timeout;
}

export class DropLog {
  private readonly quiet = new Map<string, Quiet>();

  /** `prefix` starts each line (e.g. "prima ring: port 7401"). */
  constructor(private readonly log: (line: string) => void, private readonly prefix: string, private readonly intervalMs = DROP_LOG_INTERVAL_MS) {}

  /** A refused connection from `remote` (host:port). */
  note(remote: string, reason: string): void {
    let address = remote.slice(0, Math.max(0, remote.lastIndexOf(":"))) || remote;
    if (!this.quiet.has(address) && this.quiet.size >= MAX_ADDRESSES) address = OTHERS;
    const q = this.quiet.get(address);
    if (q) {
      q.count++;
      q.reason = reason;
      return;
    }
    if (address !== OTHERS) this.log(`${this.prefix} dropped ${remote}: ${reason}`);
    this.quiet.set(address, { count: address === OTHERS ? 1 : 0, reason, timer: this.timer(address) });
  }

  private timer(address: string): NodeJS.Timeout {
    const t = setTimeout(() => this.summarize(address, true), this.intervalMs);
    t.unref();
    return t;
  }

  /** The interval of `address` ended: one line for what it kept quiet; quiet on while they come. */
  private summarize(address: string, again: boolean): void {
    const q = this.quiet.get(address);
    if (!q) return;
    clearTimeout(q.timer);
    if (q.count === 0) {
      this.quiet.delete(address);
      return;
    }
    const span = this.intervalMs >= 1000 ? `${Math.round(this.intervalMs / 1000)} s` : `${this.intervalMs} ms`;
    this.log(`${this.prefix} dropped ${q.count} more connection${q.count === 1 ? "" : "s"} from ${address} in the last ${span} (the last: ${q.reason})`);
    q.count = 0;
    if (again) q.timer = this.timer(address);
    else this.quiet.delete(address);
  }

  /** Logs what is still counted and stops the timers. */
  close(): void {
    for (const address of [...this.quiet.keys()]) this.summarize(address, false);
    for (const q of this.quiet.values()) clearTimeout(q.timer);
    this.quiet.clear();
  }
}
