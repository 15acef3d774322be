// The speed at which a device really rereads streamed weights, seen in its ring's decode: the bytes it
// read from storage per token over the time its own work took beyond what Halda priced as compute.
// A profile times rereads once, on a stand-in written for it, and keeps that figure, but a disk's speed
// moves: on this project's VM five profiles one after another read 4.9 to 6.9 GB/s, the rings' rereads
// ran at 5.8 to 7.8 within an hour, and the tenth session's host reread 20% slower than its cached
// figure for hours (bench/history/2026-11-27-capped-s11.md). Plans price a disk's
// rereads at the median of its recent observations where it has some, else at the profile's figure.
import { join } from "node:path";
import { recentTimed } from "./cache.js";
import type { DeviceReport } from "./report.js";
import { middleOf, TimedStore } from "./timed-store.js";

/** One observation: bytes per second, and when (Unix ms). */
export interface RereadObservation {
  readonly bytesPerS: number;
  readonly atMs: number;
}

/** A device rereading less than this a token is not streaming: its own work's noise would be the rate. */
export const MIN_OBSERVED_REREAD_BYTES = 16 * 2 ** 20;
/** An observation this far from the profile's figure (either way) is a broken measurement. */
const MAX_REREAD_RATIO = 8;
/** How long an observation counts, and how many count: a disk's speed moves with its other work. */
export const RECENT_REREAD_MS = 60 * 60_000, RECENT_REREADS = 3;

/**
 * The reread speed a decode shows (undefined where it shows none): `readBytesPerToken` read from
 * storage, in the time the device's own work (`measuredMs`: compute and send, less preemption) took
 * beyond Halda's figure for it without the disk (`inMemoryMs`: compute, memory, hand-off). `profiled`:
 * the figure the plan used, to refuse an implausible one.
 */
export function observedRereadBytesPerS(readBytesPerToken: number, measuredMs: number, inMemoryMs: number, profiled: number): number | undefined {
  const diskMs = measuredMs - inMemoryMs;
  if (!(readBytesPerToken >= MIN_OBSERVED_REREAD_BYTES) || !(diskMs > 0)) return undefined;
  const rate = (1000 * readBytesPerToken) / diskMs;
  return rate * MAX_REREAD_RATIO >= profiled && rate <= profiled * MAX_REREAD_RATIO ? rate : undefined;
}

/** What identifies a device's disk as its rereads see it: its hardware, block device and read throttle
 * (devices of one machine on one disk share their observations). */
export function rereadKey(r: DeviceReport): string {
  // A worker's report comes from the worker: only its fields' text is used, bounded.
  const d = (r.details as Partial<DeviceReport["details"]> | undefined)?.disk;
  return `${String(r.profile.id ?? "-")}|${String(d?.device || d?.dir || "-")}|bps=${String(d?.throttle?.readBytesPerS ?? "-")}|iops=${String(d?.throttle?.readIops ?? "-")}`.slice(0, 300);
}

/** The observations that still count at `nowMs` (well-formed ones only: they come from a file), oldest first. */
export function recentRereads(list: unknown, nowMs: number): RereadObservation[] {
  return recentTimed(list, "bytesPerS", nowMs, RECENT_REREAD_MS, RECENT_REREADS);
}

/** The middle of the recent observations (the upper middle of two: a slow moment is the likelier
 * outlier on a shared disk), or undefined. */
export function rereadFigure(list: readonly RereadObservation[]): number | undefined {
  return middleOf(list.map((o) => o.bytesPerS));
}

/** Observations kept in a file beside the profiles (the coordinator's), by rereadKey. */
export class RereadStore extends TimedStore<"bytesPerS"> {
  constructor(dir: string) {
    super(join(dir, "rereads.json"), "bytesPerS", RECENT_REREAD_MS, RECENT_REREADS);
  }
}
