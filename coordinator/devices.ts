// The cluster's records of its devices: each live worker's profile as it joined, its state (joining,
// loading, ready, busy, left out) and what it last measured; the last few lost ones, shown with why;
// and the head's own. The registry (registry.ts) holds the connections; these are what the state shows.
import type { Status } from "../control/index.js";
import type { DeviceReport } from "../profiler/index.js";
import type { WorkerHandle } from "./registry.js";
import type { DeviceStateName, MeasuredMs } from "./state.js";

const MAX_LOST_SHOWN = 8;

export interface DeviceRecord {
  /** The worker's profile as it joined with it (parsed once, for the state). */
  readonly report: Partial<DeviceReport>;
  state: DeviceStateName;
  detail: string | null;
  progress: number | null;
  readonly joinedUnixMs: number;
  measured: MeasuredMs | null;
  lastStatus: Status | null;
}

export class DeviceRecords {
  private readonly live = new Map<string, DeviceRecord>();
  /** The last few workers lost, oldest first. */
  readonly lost: { readonly handle: WorkerHandle; readonly record: DeviceRecord }[] = [];
  head: { state: DeviceStateName; detail: string | null } = { state: "profiling", detail: null };
  headMeasured: MeasuredMs | null = null;
  /** The head's counters as last read (its memory pressure is shown between requests). */
  headStatusSeen: Status | null = null;

  constructor(private readonly changed: () => void) {}

  get(id: string): DeviceRecord | undefined {
    return this.live.get(id);
  }

  joined(w: WorkerHandle): void {
    let report: Partial<DeviceReport> = {};
    try {
      report = JSON.parse(w.join.profileJson) as Partial<DeviceReport>;
    } catch {
      // the registry checked it already; a state without the profile's details is still a state
    }
    this.live.set(w.id, { report, state: "joining", detail: "waiting to be placed", progress: null, joinedUnixMs: Date.now(), measured: null, lastStatus: null });
  }

  /** The worker is gone: its record moves to the lost ones, with the reason. */
  gone(w: WorkerHandle, reason: string): void {
    const record = this.live.get(w.id);
    if (!record) return;
    record.state = "lost";
    record.detail = reason;
    this.live.delete(w.id);
    this.lost.push({ handle: w, record });
    if (this.lost.length > MAX_LOST_SHOWN) this.lost.shift();
  }

  set(w: WorkerHandle, state: DeviceStateName, detail: string | null, progress: number | null = null): void {
    const record = this.live.get(w.id);
    if (!record) return;
    record.state = state;
    record.detail = detail;
    record.progress = progress;
    this.changed();
  }

  /** Workers still waiting to be placed are left out, saying why. */
  leaveOutJoining(detail: string): void {
    for (const d of this.live.values()) {
      if (d.state !== "joining") continue;
      d.state = "left-out";
      d.detail = detail;
    }
  }

  /** A request runs: the ready devices and the head are busy (not announced: the caller says it). */
  busy(): void {
    for (const d of this.live.values()) if (d.state === "ready") d.state = "busy";
    this.head = { state: "busy", detail: null };
  }

  /** The request ended: the busy devices and the head are ready again. */
  idle(): void {
    for (const d of this.live.values()) if (d.state === "busy") d.state = "ready";
    this.head = { state: "ready", detail: null };
  }

  /** A device's cost per step and counters after a request (the head's too). */
  measured(id: string, measured: MeasuredMs, status: Status, isHead: boolean): void {
    const record = this.live.get(id);
    if (record) {
      record.measured = measured;
      record.lastStatus = status;
    } else if (isHead) {
      this.headMeasured = measured;
      this.headStatusSeen = status;
    }
  }
}
