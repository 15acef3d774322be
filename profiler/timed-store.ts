// Observations a device's rings showed (its rereads' speed, its passes against their price), kept by
// key in a file beside the profiles (the coordinator's) for the next plans: the last few within a time
// window. The file may have been written by anyone: only well-formed entries count.
import { readFileSync } from "node:fs";
import { dirname } from "node:path";
import { makeDirs, recentTimed, writeJsonAtomically } from "./cache.js";

export type TimedObservation<K extends string> = { readonly atMs: number } & Record<K, number>;

export class TimedStore<K extends string> {
  constructor(private readonly file: string, private readonly field: K, private readonly withinMs: number, private readonly count: number) {}

  /** The observations of `list` (from a file or not) that still count at `nowMs`, oldest first. */
  recentOf(list: unknown, nowMs: number): TimedObservation<K>[] {
    return recentTimed(list, this.field, nowMs, this.withinMs, this.count);
  }

  private load(nowMs: number): Map<string, TimedObservation<K>[]> {
    try {
      const j = JSON.parse(readFileSync(this.file, "utf8")) as unknown;
      const entries = typeof j === "object" && j !== null && !Array.isArray(j) ? Object.entries(j) : [];
      return new Map(entries.map(([k, v]) => [k, this.recentOf(v, nowMs)] as const).filter(([, v]) => v.length > 0));
    } catch {
      return new Map(); // none yet, or unreadable: no observations
    }
  }

  /** The recent observations under a key. */
  recent(key: string, nowMs = Date.now()): TimedObservation<K>[] {
    return this.snapshot(nowMs).recent(key);
  }

  /** The file read once, for looking up several keys (a plan's devices) as they are now. */
  snapshot(nowMs = Date.now()): { recent(key: string): TimedObservation<K>[] } {
    const all = this.load(nowMs);
    return { recent: (key) => all.get(key) ?? [] };
  }

  /** Adds an observation and writes the file atomically (errors are the caller's to say). */
  add(key: string, value: number, nowMs = Date.now()): void {
    const all = this.load(nowMs);
    all.set(key, this.recentOf([...(all.get(key) ?? []), { [this.field]: value, atMs: nowMs }], nowMs));
    makeDirs(dirname(this.file));
    writeJsonAtomically(this.file, Object.fromEntries(all));
  }
}

/** The middle of some observations (the upper middle of two), or undefined. */
export function middleOf(values: readonly number[]): number | undefined {
  if (values.length === 0) return undefined;
  const s = [...values].sort((a, b) => a - b);
  return s[s.length >> 1];
}
