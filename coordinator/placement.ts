// From device profiles to a ring: Halda's plan (devices, sets, windows, predicted latency), mapped to
// layer windows in ring order with device selection applied; and afterwards, what each device was
// predicted to cost per token next to what it measured.
//
// Order: Halda's device 0 is the head; our ring runs workers in join order and then the head (which
// holds the last window of each cycle). Halda's latency is a sum over devices, so the rotation does
// not change the plan: worker j (join order) is Halda device j + 1.
import { TIMED_STATUS_TIMEOUT_MS, type Status } from "../control/index.js";
import type { LocalModel, Pipeline } from "../engine/index.js";
import { effectiveDiskBytesPerS, selectDevices, type DeviceLatencyMs, type DeviceProfile, type HaldaOptions, type ModelProfile, type Plan } from "../halda/index.js";
import { kvBytesPerLayer, modelProfile, type KvCacheTypes } from "../model/index.js";
import {
  measureLink, reclaimIdlePages, settleMemory, sharedRoomBytes, parseDeviceReport, refreshMemory, windowOverheadMs, observedRereadBytesPerS, rereadKey, rereadFigure,
  RECENT_REREAD_MS, type DeviceReport, type LinkMeasurement, type RereadStore,
} from "../profiler/index.js";
import { checkedProfile, type WorkerHandle } from "./registry.js";

export interface Placement {
  readonly plan: Plan;
  /** Halda's input, the head first. */
  readonly devices: readonly DeviceProfile[];
  /** Layers per cycle in ring order (workers in join order, then the head); 0: takes no part. */
  readonly perCycle: readonly number[];
  readonly cycles: number;
  /** Per ring position: drop a window's pages after running it, so the prefetch of the next one has
   *  room (an overloaded device that runs several windows per token). */
  readonly releaseAfterUse: readonly boolean[];
  /** b': bytes of one layer with its KV cache, the unit of the devices' capacities. */
  readonly layerBytesWithKv: number;
  /** Per Halda device: of its hop (linkLatencyMs), ms of its own work handing a token on, timed (the
   * head's: DeviceDetails.handOffMs); its counters hold it as send time, so the report counts it in
   * the device's row rather than in the hops. */
  readonly handOffMs?: readonly number[];
}

/** Ring position (workers 0..n-1, head n) of Halda device i. */
export function ringPosition(haldaIndex: number, nWorkers: number): number {
  return haldaIndex === 0 ? nWorkers : haldaIndex - 1;
}

/** Halda device index of ring position pos. */
function haldaIndexAt(pos: number, nWorkers: number): number {
  return pos === nWorkers ? 0 : pos + 1;
}

/**
 * Halda's plan for the head and the workers (join order), with the best subset of devices (HALDA.md
 * §4.4), or every device with `options.keepAll` (what `--keep-all` passes); throws HaldaError when there
 * is none.
 */
export function placeRing(head: DeviceProfile, workers: readonly DeviceProfile[], model: ModelProfile, options: HaldaOptions = {}): Placement {
  const devices = [head, ...workers];
  // Priced as the engine pages: a device whose one window does not fit streams the layers past its
  // room (native streamBeyond), rereading its excess, one layer and a margin more each token ("stream").
  const plan = selectDevices(devices, model, { overloadReload: "stream", ...options });
  const n = workers.length;
  const perCycle = new Array<number>(n + 1).fill(0);
  const releaseAfterUse = new Array<boolean>(n + 1).fill(false);
  for (const d of plan.devices) {
    const pos = ringPosition(d.index, n);
    perCycle[pos] = d.windowLayers;
    releaseAfterUse[pos] = plan.k > 1 && d.set !== "M4";
  }
  return { plan, devices, perCycle, cycles: plan.k, releaseAfterUse, layerBytesWithKv: model.layerBytes + kvBytesPerLayer(model) };
}

const ms = (v: number) => v.toFixed(2);

/** The plan as a table: device, set, window, layers, predicted ms per token and its breakdown. */
export function formatPlan(p: Placement, labels: readonly string[]): string {
  const n = p.devices.length - 1;
  const lines = [
    `plan: Halda (${p.plan.planner}), k = ${p.cycles} cycle${p.cycles === 1 ? "" : "s"}, predicted ${ms(p.plan.latencyMs)} ms per token` +
      (p.plan.runnerUp ? ` (best other k = ${p.plan.runnerUp.k}: ${ms(p.plan.runnerUp.latencyMs)} ms)` : ""),
    `${"device".padEnd(32)} set  window  RAM-side cap    compute   memory     disk     comm   total ms`,
  ];
  const byIndex = new Map(p.plan.devices.map((d) => [d.index, d]));
  const droppedByIndex = new Map(p.plan.dropped.map((d) => [d.index, d]));
  for (let pos = 0; pos <= n; pos++) {
    const hi = haldaIndexAt(pos, n);
    const d = byIndex.get(hi);
    const label = labels[hi];
    if (!d) {
      const x = droppedByIndex.get(hi);
      const withIt = x ? (x.latencyWithMs === null ? "no feasible plan with it" : `${ms(x.latencyWithMs)} ms with it`) : "";
      lines.push(`${label.padEnd(32)} -    dropped${x ? ` (${withIt}, ${ms(x.latencyWithoutMs)} ms without)` : ""}`);
      continue;
    }
    const l = d.latency;
    const capLayers = d.ramLayerCapacityBytes / p.layerBytesWithKv;
    lines.push(
      `${label.padEnd(32)} ${d.set}   ${String(d.windowLayers).padStart(6)}  ${`${Math.max(0, capLayers).toFixed(1)} layers`.padStart(12)} ` +
      `${ms(l.computeMs).padStart(9)} ${ms(l.memoryMs).padStart(8)} ${ms(l.diskMs).padStart(8)} ${ms(l.commMs).padStart(8)} ${ms(l.totalMs).padStart(10)}`,
    );
  }
  for (const d of p.plan.dropped) lines.push(`dropped ${labels[d.index]}: ${d.reason}`);
  for (const note of p.plan.notes) lines.push(`note: ${note}`);
  return lines.join("\n");
}

// ---- predicted vs measured ---------------------------------------------------------------------

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
  private started = false;
  private decodeMs = 0;
  private steps = 0;

  constructor(private readonly inner: Pipeline, private readonly onDecodeStart: () => Promise<void>) {
    this.nCtx = inner.nCtx;
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

  h2oScores(): Float32Array | null {
    return this.inner.h2oScores?.() ?? null;
  }

  /** Decode steps timed, and their mean wall time through the whole ring (ms). */
  get decodeSteps(): number {
    return this.steps;
  }

  get meanDecodeMs(): number {
    return this.steps ? this.decodeMs / this.steps : 0;
  }
}

// ---- gathering the profiles --------------------------------------------------------------------

export interface RingPlanInput {
  readonly model: LocalModel;
  readonly modelPath: string;
  readonly fingerprint: string;
  readonly workers: readonly WorkerHandle[];
  /** The head's own profile (measured before it listened). */
  readonly head: DeviceReport;
  /** The head's profile taken again, with its pass timed now (after the workers'). */
  readonly retimeHead?: () => Promise<DeviceReport>;
  /** Time every worker's pass again (default). Off when a request waits for the plan (a recovery):
   * each timing costs the device a second or more and stalls its event loop, so the last timed
   * profiles are used, and only memory is read afresh. */
  readonly retime?: boolean;
  readonly ctx: number;
  readonly maxBatch: number;
  /** The KV cache's types (f16 when absent): a window's memory counts its cache in them. */
  readonly kvCacheTypes?: KvCacheTypes;
  /** Tokens the run will hold: prompt + generated (sets the attention FLOPs). */
  readonly tokens: number;
  readonly options: HaldaOptions;
  readonly log: (line: string) => void;
  /** Devices' reread speeds seen in earlier rings: where a device has some, they price its rereads. */
  readonly rereads?: RereadStore;
}

export interface RingPlan extends Placement {
  /** Display labels by Halda index (0 = head). */
  readonly labels: readonly string[];
  readonly model: ModelProfile;
  readonly links: readonly (LinkMeasurement | null)[];
  /** By Halda index: the key of the device's disk among reread observations (rereadKey). */
  readonly rereadKeys: readonly string[];
}

/** The report with its disk priced at the median of the device's recent rereads in a ring, where it
 * has some (said, beside its profile's figure); both disk fields, as Halda reads one or the other by OS. */
function withObservedRereads(r: DeviceReport, label: string, store: RereadStore | undefined, log: (line: string) => void): DeviceReport {
  const seen = store?.recent(rereadKey(r)) ?? [];
  const rate = rereadFigure(seen);
  if (rate === undefined) return r;
  const profiled = effectiveDiskBytesPerS(r.profile) ?? 0;
  log(`device ${label}: rereads priced at ${(rate / 1e6).toFixed(0)} MB/s, the median of its last ${seen.length} in a ring within ${RECENT_REREAD_MS / 60_000} minutes (its profile: ${(profiled / 1e6).toFixed(0)} MB/s)`);
  return { ...r, profile: { ...r.profile, diskSeqReadBytesPerS: rate, diskRandReadBytesPerS: rate } };
}

/** Each placed device's reread speed in this decode, where it streamed (observedRereadBytesPerS), added
 * to the store: what the next plans price its rereads at. Returns what was seen, to be said. */
export function recordRereads(p: RingPlan, rows: readonly { haldaIndex: number; cost: StepCost; before?: unknown }[], store: RereadStore): string[] {
  const said: string[] = [];
  const handOff = (hi: number) => (p.handOffMs ? p.cycles * p.handOffMs[hi] : 0);
  for (const r of rows) {
    const d = p.plan.devices.find((x) => x.index === r.haldaIndex);
    if (!d || !r.before) continue; // only a decode's own counters
    const c = r.cost, l = d.latency;
    const profiled = effectiveDiskBytesPerS(p.devices[r.haldaIndex]) ?? 0;
    const rate = observedRereadBytesPerS(c.readBytes, c.computeMs + c.sendMs - c.descheduledMs, l.computeMs + l.memoryMs + handOff(r.haldaIndex), profiled);
    if (rate === undefined) continue;
    store.add(p.rereadKeys[r.haldaIndex], rate);
    said.push(`device ${p.labels[r.haldaIndex]} reread ${(c.readBytes / 2 ** 20).toFixed(0)} MiB a token at ${(rate / 1e6).toFixed(0)} MB/s (priced at ${(profiled / 1e6).toFixed(0)})`);
  }
  return said;
}

/** Scratch of one window (activations, RoPE tables): the engine's compute buffer, measured. */
function windowScratchBytes(model: LocalModel, ctx: number, maxBatch: number, kvCacheTypes?: KvCacheTypes): number {
  const w = model.window(0, 1, { ctx, maxBatch, kvCacheTypes });
  try {
    const info = w.info();
    return Math.max(0, info.anonBytes - info.kvBytes);
  } finally {
    w.close();
  }
}

/** A worker's profile with the pass just timed (Status.profileJson), or undefined where it sent none
 * or one that does not parse (said; its join's profile stands). */
function timedProfile(json: string | undefined, label: string, log: (line: string) => void): DeviceReport | undefined {
  if (!json) return undefined;
  try {
    return checkedProfile(json);
  } catch (e) {
    log(`device ${label}: the profile it timed now is not usable (${(e as Error).message}); its profile from the join is used`);
    return undefined;
  }
}

/** Each worker's profile as its pass was last timed (planRing without `retime` plans with it). */
const lastTimed = new WeakMap<WorkerHandle, DeviceReport>();

/**
 * Gathers the workers' profiles (memory read afresh through a status request), measures the hop to
 * each worker, and runs Halda. Throws an Error naming the device or the reason when no plan exists.
 */
export async function planRing(i: RingPlanInput): Promise<RingPlan> {
  const profileModel = modelProfile(i.model.desc, {
    nCtx: i.ctx, maxBatch: i.maxBatch, nPredict: Math.max(1, Math.min(i.ctx, i.tokens)), name: i.modelPath, kvCacheTypes: i.kvCacheTypes,
  });
  const scratch = windowScratchBytes(i.model, i.ctx, i.maxBatch, i.kvCacheTypes);
  const linkOptions = {
    identity: { deviceId: "head", modelFingerprint: i.fingerprint, hiddenSize: i.model.nEmbd }, bulkTokens: Math.min(512, i.maxBatch),
  };
  const reports: DeviceReport[] = [];
  const links: (LinkMeasurement | null)[] = [null];
  for (const w of i.workers) {
    let r: DeviceReport;
    try {
      r = parseDeviceReport(w.join.profileJson);
    } catch (e) {
      throw new Error(`device ${w.label} has no usable profile: ${(e as Error).message}; give --layer-windows to place layers by hand`);
    }
    // Memory now, not when it joined: the status carries the device's own reading of its room for
    // layers (profiler's layerRoomBytes), taken while it holds no windows (the ring was taken down);
    // a device that still holds some reports none, and its MemAvailable with the fifth kept back counts.
    // And its pass timed now, each device in turn: a device's speed moves with its load and, on a
    // shared host, from second to second (a pass timed at a worker's join once read 12% slower than
    // its twin's, which then computed alike in the ring).
    const retime = i.retime ?? true;
    const s = retime ? await w.status(TIMED_STATUS_TIMEOUT_MS, true) : await w.status();
    const timed = retime ? timedProfile(s.profileJson, w.label, i.log) : lastTimed.get(w);
    if (timed) lastTimed.set(w, timed);
    r = withObservedRereads(timed ?? r, w.label, i.rereads, i.log);
    const room = Number(s.layerRoomBytes ?? 0) > 0 ? Number(s.layerRoomBytes) : sharedRoomBytes(Number(s.memAvailableBytes));
    reports.push({ ...r, profile: { ...r.profile, ramTotalBytes: s.memTotalBytes, ramAvailableBytes: room } });
    let link: LinkMeasurement | null = null;
    if (r.linkProbePort) {
      try {
        const host = w.dataHost.includes(":") ? `[${w.dataHost}]` : w.dataHost;
        link = await measureLink(`ws://${host}:${r.linkProbePort}`, { ...linkOptions, ...(r.linkProbeKey ? { linkKey: Buffer.from(r.linkProbeKey, "hex") } : {}) });
      } catch (e) {
        i.log(`device ${w.label}: link probe failed (${(e as Error).message}); planning without its hop cost`);
      }
    }
    links.push(link);
  }
  // The head's memory last, with the garbage of planning (a window made to measure its scratch, the
  // link probes' frames) collected (settleMemory) and its group's idle pages reclaimed (reclaimIdlePages):
  // what it holds is what it will hold besides the plan's windows.
  // Its pass timed last, after the workers' (timing a window's pass leaves garbage too).
  const headReport = withObservedRereads(i.retimeHead ? await i.retimeHead() : i.head, "head (this coordinator)", i.rereads, i.log);
  settleMemory();
  await reclaimIdlePages();
  const head = refreshMemory(headReport, i.modelPath);
  // The head's hop goes to the first worker of the ring.
  links[0] = links[1] ?? null;
  // ξ, what a window costs besides its layers: the hop to the successor and, where the forward pass did
  // not price it, waking the compute threads.
  const withLink = (r: DeviceReport, name: string, link: LinkMeasurement | null, handOffMs = 0): DeviceProfile => ({
    ...r.profile, name, cpuComputeBufferBytes: scratch, linkLatencyMs: (link?.linkLatencyMs ?? 0) + windowOverheadMs(r.details) + handOffMs,
  });
  // The head hands its tokens on in JS, timed by its profile; workers hand off in C on their lane.
  const handOffMs = [Math.max(0, head.details.handOffMs ?? 0), ...reports.map(() => 0)];
  const headProfile = withLink(head, "head", links[0], handOffMs[0]);
  const workerProfiles = reports.map((r, j) => withLink(r, i.workers[j].id, links[j + 1]));
  const labels = ["head (this coordinator)", ...i.workers.map((w) => w.label)];
  for (let j = 0; j < labels.length; j++) {
    const p = j === 0 ? headProfile : workerProfiles[j - 1];
    const l = links[j];
    i.log(`profile ${labels[j]}: ${Object.entries(p.cpuFlopsPerS).map(([t, f]) => `${t} ${(f / 1e9).toFixed(1)}`).join(", ")} GFLOP/s; ` +
      `${(p.ramAvailableBytes / 2 ** 20).toFixed(0)} MiB for layers; disk ${((p.diskSeqReadBytesPerS ?? 0) / 1e6).toFixed(0)} MB/s` +
      (l ? `; hop ${l.rttMs.toFixed(3)} ms round trip, ${(l.bytesPerS / 1e6).toFixed(0)} MB/s` : "") +
      (handOffMs[j] ? `; hand-off ${handOffMs[j].toFixed(2)} ms` : ""));
  }
  let placement: Placement;
  try {
    placement = placeRing(headProfile, workerProfiles, profileModel, i.options);
  } catch (e) {
    throw new Error(`no plan: ${(e as Error).message}`);
  }
  return { ...placement, handOffMs, labels, model: profileModel, links, rereadKeys: [head, ...reports].map(rereadKey) };
}
