// What each device was predicted to cost per token beside what it measured: the counters of a decode
// per step, Halda's figures against them (run's report), the reread speeds streaming devices showed
// (which the next plans price), and the pipeline wrapper that times the decode steps.
import type { Status } from "../control/index.js";
import type { Pipeline } from "../engine/index.js";
import { effectiveDiskBytesPerS, type DeviceLatencyMs } from "../halda/index.js";
import { observedPassRatio, observedRereadBytesPerS, type RereadStore, type RingPassStore } from "../profiler/index.js";
import { haldaIndexAt, ms, type Placement } from "./placement.js";
import type { RingPlan } from "./plan-ring.js";

/** One device's decode cost per token, measured. */
export interface MeasuredDevice {
  /** Running its windows. */
  readonly computeMs: number;
  /** Handing activations to its successor. */
  readonly sendMs: number;
  /** Of computeMs and sendMs: the device's thread preempted (by another device's, on a shared host). */
  readonly descheduledMs: number;
  /** The paper's memory pressure on this device during the run (fraction of its memory). */
  readonly memPressure: number;
}

/** What a device did between two status snapshots (before: undefined for "since it started"), per
 * step; major faults in total. */
export interface StepCost {
  readonly computeMs: number;
  readonly waitMs: number;
  readonly sendMs: number;
  /** Of computeMs and sendMs: preempted (Status.descheduledMs). */
  readonly descheduledMs: number;
  readonly majorFaults: number;
  /** Bytes the device read from storage (its windows' weights read again), per step. */
  readonly readBytes: number;
}

export function costPerStep(before: Status | undefined, after: Status, steps: number): StepCost {
  const sum = (s: Status | undefined, f: (w: Status["windows"][number]) => number) => s?.windows.reduce((a, w) => a + f(w), 0) ?? 0;
  const t = Math.max(1, steps);
  return {
    computeMs: (sum(after, (w) => w.computeMs) - sum(before, (w) => w.computeMs)) / t,
    waitMs: (after.waitMs - (before?.waitMs ?? 0)) / t,
    sendMs: (after.sendMs - (before?.sendMs ?? 0)) / t,
    descheduledMs: ((after.descheduledMs ?? 0) - (before?.descheduledMs ?? 0)) / t,
    majorFaults: sum(after, (w) => w.majorFaults) - sum(before, (w) => w.majorFaults),
    readBytes: Math.max(0, Number(after.readBytes ?? 0) - Number(before?.readBytes ?? 0)) / t,
  };
}

export interface PredictionRow {
  readonly label: string;
  readonly haldaIndex: number;
  readonly set: string;
  readonly windowLayers: number;
  readonly predicted: DeviceLatencyMs;
  /** Halda's figure for the device's own work: compute, memory and disk, and its hand-off (handOffMs).
   * The rest of its hop (commMs) is the link's latency, which the device's counters do not hold (the
   * bytes are in flight, then the next device wakes): the report sets the hops beside what no device's
   * counters hold. */
  readonly predictedMs: number;
  /** Of predictedMs: handing its tokens on (Placement.handOffMs, k a token). */
  readonly handOffMs: number;
  readonly measured: MeasuredDevice;
  /** The device's own work: its compute and send less the time it was preempted (on separate machines
   * no device takes another's CPU). */
  readonly measuredMs: number;
}

export interface PredictionReport {
  readonly rows: readonly PredictionRow[];
  readonly predictedTokenMs: number;
  readonly measuredTokenMs: number;
  /** Halda's hops (its comm terms), and what the token holds beyond every device's own work: the hops
   * themselves, the head's sampling, and on a shared host the devices' waits for a CPU. */
  readonly predictedHopsMs: number;
  readonly measuredRestMs: number;
  /** (measured - predicted) / predicted. */
  readonly error: number;
  readonly decodeTokens: number;
}

export function predictionReport(p: Placement, labels: readonly string[], measured: ReadonlyMap<number, MeasuredDevice>, measuredTokenMs: number, decodeTokens: number): PredictionReport {
  const rows: PredictionRow[] = [];
  const n = p.devices.length - 1;
  // k hand-offs a token: one a cycle, as its hop (halda/latency.ts: commMs = k ξ).
  const handOff = (hi: number) => (p.handOffMs ? p.cycles * p.handOffMs[hi] : 0);
  const byIndex = new Map(p.plan.devices.map((d) => [d.index, d]));
  for (let pos = 0; pos <= n; pos++) {
    const hi = haldaIndexAt(pos, n);
    const d = byIndex.get(hi), m = measured.get(hi);
    if (d && m) {
      const l = d.latency;
      rows.push({
        label: labels[hi], haldaIndex: hi, set: d.set, windowLayers: d.windowLayers, predicted: l,
        predictedMs: l.computeMs + l.memoryMs + l.diskMs + handOff(hi), handOffMs: handOff(hi),
        measured: m, measuredMs: m.computeMs + m.sendMs - m.descheduledMs,
      });
    }
  }
  const predictedTokenMs = p.plan.latencyMs;
  return {
    rows, predictedTokenMs, measuredTokenMs, error: (measuredTokenMs - predictedTokenMs) / predictedTokenMs, decodeTokens,
    predictedHopsMs: rows.reduce((s, r) => s + r.predicted.commMs - r.handOffMs, 0), measuredRestMs: measuredTokenMs - rows.reduce((s, r) => s + r.measuredMs, 0),
  };
}

/** Halda's prediction beside what a decode measured: in a ring each device's own counters over the
 * decode (rows with `before`), the head alone by the pipeline's mean step. */
export function decodePrediction(
  p: RingPlan, rows: readonly { haldaIndex: number; before?: unknown; cost: StepCost; status: Status }[], inRing: boolean,
  meter: { readonly meanDecodeMs: number; readonly decodeSteps: number },
): PredictionReport {
  const measured = new Map<number, MeasuredDevice>();
  for (const r of rows) {
    if (r.before || !inRing) measured.set(r.haldaIndex, { computeMs: inRing ? r.cost.computeMs : meter.meanDecodeMs, sendMs: r.cost.sendMs, descheduledMs: r.cost.descheduledMs, memPressure: r.status.memPressure });
  }
  return predictionReport(p, p.labels, measured, meter.meanDecodeMs, meter.decodeSteps);
}

export function formatPrediction(r: PredictionReport): string {
  const pct = (x: number) => `${x >= 0 ? "+" : ""}${(100 * x).toFixed(0)}%`;
  const lines = [
    `predicted vs measured, ms per token (decode, ${r.decodeTokens} tokens):`,
    `${"device".padEnd(32)} window  predicted (compute+memory+disk+hand-off) measured (compute+send-preempted)   mem pressure`,
  ];
  for (const row of r.rows) {
    const p = row.predicted, m = row.measured;
    lines.push(
      `${row.label.padEnd(32)} ${String(row.windowLayers).padStart(6)}  ${ms(row.predictedMs).padStart(8)} (${ms(p.computeMs)}+${ms(p.memoryMs)}+${ms(p.diskMs)}+${ms(row.handOffMs)})`.padEnd(82) +
      `${ms(row.measuredMs).padStart(8)} (${ms(m.computeMs)}+${ms(m.sendMs)}-${ms(m.descheduledMs)})`.padEnd(36) + `${(100 * m.memPressure).toFixed(2)}%`.padStart(8),
    );
  }
  // In a ring, what no device's counters hold, beside Halda's hops (the head's output layer is in its
  // compute: its window computes the logits in the same native call).
  if (r.rows.length > 1) lines.push(`${"hops, sampling, CPU waits".padEnd(32)}        ${ms(r.predictedHopsMs).padStart(8)} (the hops)`.padEnd(82) + `${ms(Math.max(0, r.measuredRestMs)).padStart(8)}`);
  lines.push(`token latency: predicted ${ms(r.predictedTokenMs)} ms, measured ${ms(r.measuredTokenMs)} ms (${pct(r.error)})`);
  return lines.join("\n");
}

/**
 * A pipeline that times decode steps (one token each) and calls `onDecodeStart` once, before the
 * first of them, so the caller can snapshot every device's counters between prompt and decode.
 */
export class DecodeMeter implements Pipeline {
  readonly nCtx: number;
  readonly computesElsewhere?: boolean;
  private started = false;
  private decodeMs = 0;
  private steps = 0;

  constructor(private readonly inner: Pipeline, private readonly onDecodeStart: () => Promise<void>) {
    this.nCtx = inner.nCtx;
    this.computesElsewhere = inner.computesElsewhere;
  }

  async forward(acts: Float32Array, pos: number, nTokens: number): Promise<Float32Array> {
    const decode = nTokens === 1 && pos > 0;
    if (decode && !this.started) {
      this.started = true;
      await this.onDecodeStart();
    }
    const t0 = performance.now();
    const out = await this.inner.forward(acts, pos, nTokens);
    if (decode) {
      this.decodeMs += performance.now() - t0;
      this.steps++;
    }
    return out;
  }

  truncate(pos: number): void {
    this.inner.truncate(pos);
  }

  shift(p0: number, nDiscard: number, nPast: number): Promise<void> {
    if (!this.inner.shift) return Promise.reject(new Error("this pipeline cannot shift its context"));
    return this.inner.shift(p0, nDiscard, nPast);
  }

  async h2oScores(): Promise<Float32Array | null> {
    return (await this.inner.h2oScores?.()) ?? null;
  }

  /** Decode steps timed, and their mean wall time through the whole ring (ms). */
  get decodeSteps(): number {
    return this.steps;
  }

  get meanDecodeMs(): number {
    return this.steps ? this.decodeMs / this.steps : 0;
  }
}


type DecodeRow = { haldaIndex: number; cost: StepCost; before?: unknown };

/** Each placed device of a decode with its own counters (rows read before and after decoding): its
 * Halda index, its cost per step, its priced latency, its own work as measured (compute and send, less
 * preemption) and as priced without the disk (compute, memory, hand-off). What `seen` returns is said. */
function eachDecodeDevice(p: RingPlan, rows: readonly DecodeRow[], seen: (hi: number, c: StepCost, l: DeviceLatencyMs, measuredMs: number, inMemoryMs: number) => string | undefined): string[] {
  const said: string[] = [];
  for (const r of rows) {
    const d = p.plan.devices.find((x) => x.index === r.haldaIndex);
    if (!d || !r.before) continue; // only a decode's own counters
    const c = r.cost, l = d.latency;
    const line = seen(r.haldaIndex, c, l, c.computeMs + c.sendMs - c.descheduledMs, l.computeMs + l.memoryMs + p.cycles * (p.handOffMs?.[r.haldaIndex] ?? 0));
    if (line !== undefined) said.push(line);
  }
  return said;
}

/** Each placed device's reread speed in this decode, where it streamed (observedRereadBytesPerS), added
 * to the store: what the next plans price its rereads at. Returns what was seen, to be said. */
export function recordRereads(p: RingPlan, rows: readonly DecodeRow[], store: RereadStore): string[] {
  return eachDecodeDevice(p, rows, (hi, c, _l, measuredMs, inMemoryMs) => {
    const profiled = effectiveDiskBytesPerS(p.devices[hi]) ?? 0;
    const rate = observedRereadBytesPerS(c.readBytes, measuredMs, inMemoryMs, profiled);
    if (rate === undefined) return undefined;
    store.add(p.rereadKeys[hi], rate);
    return `device ${p.labels[hi]} reread ${(c.readBytes / 2 ** 20).toFixed(0)} MiB a token at ${(rate / 1e6).toFixed(0)} MB/s (priced at ${(profiled / 1e6).toFixed(0)})`;
  });
}

/** Each device that ran from memory in this decode: its own work against its price, as a ratio to its
 * profile's own figure (the plan's ratio times what it ran at; for twins on one machine, priced at
 * their median, to that median's), to the store: what the next plans of this model scale its compute
 * by. Returns what was seen, to be said. */
export function recordPasses(p: RingPlan, rows: readonly DecodeRow[], store: RingPassStore): string[] {
  return eachDecodeDevice(p, rows, (hi, c, l, measuredMs, inMemoryMs) => {
    const seen = observedPassRatio(measuredMs, inMemoryMs, l.diskMs, c.readBytes);
    if (seen === undefined) return undefined;
    const ratio = seen * (p.passRatios[hi] ?? 1);
    store.add(p.passKeys[hi], ratio);
    return `device ${p.labels[hi]} ran its window in ${seen.toFixed(2)}x the time priced (${ratio.toFixed(2)}x its profile's)`;
  });
}
