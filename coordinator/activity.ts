// What the dashboard shows of the cluster over time: the last events (joins, losses, placements,
// recoveries, errors) and the tokens per second of the last ten minutes, sampled every five seconds.
import type { EventState } from "./state.js";

const MAX_EVENTS = 50;
const HISTORY_POINTS = 120;
export const HISTORY_INTERVAL_MS = 5000;

export class Activity {
  readonly events: EventState[] = [];
  readonly history: { unixMs: number; tokensPerS: number }[] = [];
  private tokensNow = 0;

  event(kind: EventState["kind"], message: string): void {
    this.events.push({ unixMs: Date.now(), kind, message });
    if (this.events.length > MAX_EVENTS) this.events.shift();
  }

  /** A token went to a client. */
  token(): void {
    this.tokensNow++;
  }

  /** Closes an interval of the history (every HISTORY_INTERVAL_MS); true when it had tokens. */
  sample(): boolean {
    this.history.push({ unixMs: Date.now(), tokensPerS: this.tokensNow / (HISTORY_INTERVAL_MS / 1000) });
    this.tokensNow = 0;
    if (this.history.length > HISTORY_POINTS) this.history.shift();
    return (this.history.at(-2)?.tokensPerS ?? 0) > 0;
  }
}
