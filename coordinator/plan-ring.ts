// Gathering what Halda plans from: each worker's profile with its memory read afresh (and its pass
// timed again), the hop to it probed, the head's own profile last, and reread speeds seen in earlier
// rings; then the plan (placement.ts). Throws naming the device or the reason when there is none.
import { TIMED_STATUS_TIMEOUT_MS, type Status } from "../control/index.js";
import type { LocalModel } from "../engine/index.js";
import { effectiveDiskBytesPerS, type DeviceProfile, type HaldaOptions, type ModelProfile } from "../halda/index.js";
import { modelProfile, type KvCacheTypes } from "../model/index.js";
import {
  cachedExpertRouting, hardwareId, measureLink, reclaimIdlePages, settleMemory, sharedRoomBytes, parseDeviceReport, refreshMemory, windowOverheadMs, rereadKey, rereadFigure,
  RECENT_REREAD_MS, RECENT_RING_PASS_MS, ringPassFigure, ringPassKey, withPassRatio, type DeviceReport, type LinkMeasurement, type RereadStore, type RingPassStore,
} from "../profiler/index.js";
import { pooledTwins, twinKey } from "./compute-sharing.js";
import { placeRing, windowsByIndex, type Placement } from "./placement.js";
import { recallPlan, rememberPlan } from "./plan-memory.js";
import { checkedProfile, type WorkerHandle } from "./registry.js";
import { Phases } from "./phases.js";
import { HEAD_ID } from "./ring-setup.js";

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
   * profiles and the last probed hops are used, and only memory is read afresh. */
  readonly retime?: boolean;
  readonly ctx: number;
  readonly maxBatch: number;
  /** The KV cache's types (f16 when absent): a window's memory counts its cache in them. */
  readonly kvCacheTypes?: KvCacheTypes;
  /** Sequence slots (serve --parallel): every device holds a KV cache of ctx positions per slot. */
  readonly seqSlots?: number;
  /** The cache a decode step attends to (sets the attention FLOPs): a run's mean, or the context. */
  readonly tokens: number;
  readonly options: HaldaOptions;
  /** Which devices read ahead (the head, then the workers; coordinator/prefetch-choice.ts): Halda's
   * DeviceProfile.prefetches. Absent: none. */
  readonly prefetches?: readonly boolean[];
  /** MoE: price with each layer's routing measured on the head (cachedExpertRouting) instead of uniform. */
  readonly measureRouting?: boolean;
  readonly log: (line: string) => void;
  /** Devices' reread speeds seen in earlier rings: where a device has some, they price its rereads. */
  readonly rereads?: RereadStore;
  /** Devices' in-memory work in earlier rings of this model against its price: where a device has some,
   * they scale its compute (profiler/ring-passes.ts). */
  readonly passes?: RingPassStore;
  /** Where planning's time goes (statuses, link probes, the head, Halda). */
  readonly phases?: Phases;
  /** The workers' statuses (in `workers`' order) a recovery just read while it asked who answers,
   * the head's memory settled (settleHeadMemory) and read into `head` meanwhile: they are not asked,
   * nor is it settled or read, again. */
  readonly statuses?: readonly Status[];
}

/** The head's garbage collected and its group's idle pages reclaimed, before its room is read: what it
 * holds is then what it will hold besides the plan's windows. */
export async function settleHeadMemory(): Promise<void> {
  settleMemory();
  await reclaimIdlePages();
}

export interface RingPlan extends Placement {
  /** Display labels by Halda index (0 = head). */
  readonly labels: readonly string[];
  readonly model: ModelProfile;
  readonly links: readonly (LinkMeasurement | null)[];
  /** By Halda index: the key of the device's disk among reread observations (rereadKey). */
  readonly rereadKeys: readonly string[];
  /** By Halda index: the key of the device's passes of this model (ringPassKey), and the ratio its
   * compute was priced at (1 where none was seen): a new observation is kept against the profile's own. */
  readonly passKeys: readonly string[];
  readonly passRatios: readonly number[];
}

/** The report with its disk priced at the median of the device's recent rereads in a ring, where it
 * has some (said, beside its profile's figure); both disk fields, as Halda reads one or the other by OS. */
function withObservedRereads(r: DeviceReport, label: string, store: Pick<RereadStore, "recent"> | undefined, log: (line: string) => void): DeviceReport {
  const seen = store?.recent(rereadKey(r)) ?? [];
  const rate = rereadFigure(seen);
  if (rate === undefined) return r;
  const profiled = effectiveDiskBytesPerS(r.profile) ?? 0;
  log(`device ${label}: rereads priced at ${(rate / 1e6).toFixed(0)} MB/s, the median of its last ${seen.length} in a ring within ${RECENT_REREAD_MS / 60_000} minutes (its profile: ${(profiled / 1e6).toFixed(0)} MB/s)`);
  return { ...r, profile: { ...r.profile, diskSeqReadBytesPerS: rate, diskRandReadBytesPerS: rate } };
}

/** Each model's window scratch by its settings: measured once (a window made and closed, garbage
 * that would stand in the head's room reading), the same on every plan after. */
const scratchMeasured = new WeakMap<LocalModel, Map<string, number>>();

/** Scratch of one window (activations, RoPE tables): the engine's compute buffer, measured. */
function windowScratchBytes(model: LocalModel, ctx: number, maxBatch: number, kvCacheTypes?: KvCacheTypes): number {
  const known = scratchMeasured.get(model) ?? new Map<string, number>();
  scratchMeasured.set(model, known);
  const key = JSON.stringify([ctx, maxBatch, kvCacheTypes ?? null]);
  const seen = known.get(key);
  if (seen !== undefined) return seen;
  const bytes = measureScratch(model, ctx, maxBatch, kvCacheTypes);
  known.set(key, bytes);
  return bytes;
}

function measureScratch(model: LocalModel, ctx: number, maxBatch: number, kvCacheTypes?: KvCacheTypes): number {
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
/** The hop to each device as last probed (planRing without `retime` reuses it), by its hardware and
 * address: a worker restarted on the same device and network (rejoining during a request) has the same
 * hop. At most MAX_HOPS_KEPT, the oldest forgotten first. */
const lastLink = new Map<string, LinkMeasurement>();
const MAX_HOPS_KEPT = 256;
const hopKey = (w: WorkerHandle) => JSON.stringify([w.join.hardwareId, w.dataHost]);

function keepHop(w: WorkerHandle, link: LinkMeasurement): void {
  lastLink.delete(hopKey(w));
  lastLink.set(hopKey(w), link);
  if (lastLink.size > MAX_HOPS_KEPT) lastLink.delete(lastLink.keys().next().value!);
}

/** How the head probes a hop (its identity, the bulk it sends); the device's key comes from its report. */
type ProbeOptions = Omit<Parameters<typeof measureLink>[1], "linkKey">;

/** The hop to a worker: probed now (each plan that times its devices), or as last probed (a recovery:
 * a probe costs the paused request a round of frames per device, slower the more loaded the host; a
 * device never probed is probed now). Null where it cannot be probed (said). */
async function hopTo(w: WorkerHandle, r: DeviceReport, retime: boolean, phases: Phases, log: (line: string) => void, linkOptions: ProbeOptions): Promise<LinkMeasurement | null> {
  const known = retime ? undefined : lastLink.get(hopKey(w));
  if (known || !r.linkProbePort) return known ?? null;
  try {
    const host = w.dataHost.includes(":") ? `[${w.dataHost}]` : w.dataHost;
    const link = await phases.time("link probes", () => measureLink(`ws://${host}:${r.linkProbePort}`, { ...linkOptions, ...(r.linkProbeKey ? { linkKey: Buffer.from(r.linkProbeKey, "hex") } : {}) }));
    keepHop(w, link);
    return link;
  } catch (e) {
    log(`device ${w.label}: link probe failed (${(e as Error).message}); planning without its hop cost`);
    return null;
  }
}

/** A device's figures as the plan takes them, for the log. */
function profileLine(label: string, p: DeviceProfile, link: LinkMeasurement | null, handOffMs: number): string {
  return `profile ${label}: ${Object.entries(p.cpuFlopsPerS).map(([t, f]) => `${t} ${(f / 1e9).toFixed(1)}`).join(", ")} GFLOP/s; ` +
    `${(p.ramAvailableBytes / 2 ** 20).toFixed(0)} MiB for layers; disk ${((p.diskSeqReadBytesPerS ?? 0) / 1e6).toFixed(0)} MB/s` +
    (link ? `; hop ${link.rttMs.toFixed(3)} ms round trip, ${(link.bytesPerS / 1e6).toFixed(0)} MB/s` : "") +
    (handOffMs ? `; hand-off ${handOffMs.toFixed(2)} ms` : "");
}

/**
 * Gathers the workers' profiles (memory read afresh through a status request), measures the hop to
 * each worker, and runs Halda. Throws an Error naming the device or the reason when no plan exists.
 */
export async function planRing(i: RingPlanInput): Promise<RingPlan> {
  const oneSlot = modelProfile(i.model.desc, {
    nCtx: i.ctx, maxBatch: i.maxBatch, nPredict: Math.max(1, Math.min(i.ctx, i.tokens)), name: i.modelPath, kvCacheTypes: i.kvCacheTypes,
  });
  const phases = i.phases ?? new Phases();
  // A mixture of experts is priced with uniform routing unless asked (--measure-routing: each layer's
  // routing measured on the head once per model, then kept; first, so the head's memory is read after
  // it): priced so, the benchmark's plans ran far slower than predicted (docs/HALDA.md MoE-3).
  const routed = i.measureRouting ? await phases.time("routing", () => cachedExpertRouting(i.model, oneSlot, i.fingerprint, i.log)) : oneSlot;
  // N sequence slots hold N caches (each ctx positions, or a sliding-window layer's ring) on every device
  const profileModel = { ...routed, kvTokensPerLayer: (routed.kvTokensPerLayer ?? routed.nCtx) * (i.seqSlots ?? 1) };
  const scratch = await phases.time("scratch window", () => windowScratchBytes(i.model, i.ctx, i.maxBatch, i.kvCacheTypes));
  const probe: ProbeOptions = { identity: { deviceId: "head", modelFingerprint: i.fingerprint, hiddenSize: i.model.nEmbd }, bulkTokens: Math.min(512, i.maxBatch) };
  const reports: DeviceReport[] = [];
  const links: (LinkMeasurement | null)[] = [null];
  // earlier rings' observations, each file read once for every device
  const rereads = i.rereads?.snapshot(), passes = i.passes?.snapshot();
  const retime = i.retime ?? true;
  // Without timing (a recovery) every worker is asked at once: the answers come from memory.
  const statuses = i.statuses ? Promise.resolve(i.statuses) : retime ? undefined : phases.time("statuses", () => Promise.all(i.workers.map((w) => w.status())));
  statuses?.catch(() => undefined); // awaited below; a throw before that must not leave it unhandled
  for (const [j, w] of i.workers.entries()) {
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
    const s = statuses ? (await statuses)[j] : await phases.time("timed passes", () => w.status(TIMED_STATUS_TIMEOUT_MS, true));
    const timed = retime ? timedProfile(s.profileJson, w.label, i.log) : lastTimed.get(w);
    if (timed) lastTimed.set(w, timed);
    r = withObservedRereads(timed ?? r, w.label, rereads, i.log);
    const room = Number(s.layerRoomBytes ?? 0) > 0 ? Number(s.layerRoomBytes) : sharedRoomBytes(Number(s.memAvailableBytes));
    reports.push({ ...r, profile: { ...r.profile, ramTotalBytes: s.memTotalBytes, ramAvailableBytes: room } });
    links.push(await hopTo(w, r, retime, phases, i.log, probe));
  }
  // The head's memory last, with the garbage of planning (a window made to measure its scratch, the
  // link probes' frames) collected (settleMemory) and its group's idle pages reclaimed (reclaimIdlePages):
  // what it holds is what it will hold besides the plan's windows.
  // Its pass timed last, after the workers' (timing a window's pass leaves garbage too).
  const headReport = withObservedRereads(i.retimeHead ? await phases.time("head's pass", i.retimeHead) : i.head, "head (this coordinator)", rereads, i.log);
  if (!i.statuses) await phases.time("collecting garbage", settleHeadMemory);
  const head = i.statuses ? headReport : await phases.time("head's memory", () => refreshMemory(headReport, i.modelPath));
  // The head's hop goes to the first worker of the ring.
  links[0] = links[1] ?? null;
  // ξ, what a window costs besides its layers: the hop to the successor and, where the forward pass did
  // not price it, waking the compute threads.
  const withLink = (r: DeviceReport, name: string, link: LinkMeasurement | null, handOffMs = 0, prefetches = false): DeviceProfile => ({
    ...r.profile, name, cpuComputeBufferBytes: scratch, linkLatencyMs: (link?.linkLatencyMs ?? 0) + windowOverheadMs(r.details) + handOffMs,
    ...(prefetches ? { prefetches } : {}),
  });
  // The head hands its tokens on in JS, timed by its profile; workers hand off in C on their lane.
  const handOffMs = [Math.max(0, head.details.handOffMs ?? 0), ...reports.map(() => 0)];
  const labels = ["head (this coordinator)", ...i.workers.map((w) => w.label)];
  // Each device's compute as its recent rings of this model ran it, where they did
  const passKeys = [head, ...reports].map((r) => ringPassKey(r, i.fingerprint));
  const passRatios = passKeys.map((key, j) => {
    const seen = passes?.recent(key) ?? [];
    const ratio = ringPassFigure(seen);
    if (ratio !== undefined) i.log(`device ${labels[j]}: compute priced at ${ratio.toFixed(2)}x its profile's, the median of its last ${seen.length} ring${seen.length === 1 ? "" : "s"} of this model within ${RECENT_RING_PASS_MS / 60_000} minutes`);
    return ratio ?? 1;
  });
  const passed = (r: DeviceReport, j: number): DeviceReport => (passRatios[j] === 1 ? r : { ...r, profile: withPassRatio(r.profile, passRatios[j]) });
  // Devices on one machine with the same CPU setup compute alike: priced at their twins' median
  const twins = pooledTwins([
    withLink(passed(head, 0), "head", links[0], handOffMs[0], i.prefetches?.[0]),
    ...reports.map((r, j) => withLink(passed(r, j + 1), i.workers[j].id, links[j + 1], 0, i.prefetches?.[j + 1])),
  ], [head, ...reports].map((r) => twinKey(r.details)));
  for (const g of twins.groups) i.log(`${g.map((j) => labels[j]).join(", ")}: one machine's twins, their compute priced at the median of their timings`);
  const [headProfile, ...workerProfiles] = twins.profiles;
  [headProfile, ...workerProfiles].forEach((p, j) => i.log(profileLine(labels[j], p, links[j], handOffMs[j])));
  // The windows last placed on these devices (by name and hardware, in Halda's order) for this model
  // and these settings: kept where Halda prices them near its new best (placement.ts keptOrNew).
  const planKey = JSON.stringify([i.fingerprint, i.ctx, i.maxBatch, i.kvCacheTypes ?? null, i.seqSlots ?? 1, i.measureRouting ?? false, i.options, i.prefetches ?? [],
    [HEAD_ID, hardwareId()], ...i.workers.map((w) => [w.id, w.join.hardwareId])]);
  let placement: Placement;
  try {
    placement = await phases.time("halda", () => placeRing(headProfile, workerProfiles, profileModel, i.options, recallPlan(planKey)));
  } catch (e) {
    throw new Error(`no plan: ${(e as Error).message}`);
  }
  rememberPlan(planKey, { k: placement.cycles, windowLayers: windowsByIndex(placement.plan, labels.length) }, undefined, i.log);
  return { ...placement, handOffMs, labels, model: profileModel, links, rereadKeys: [head, ...reports].map(rereadKey), passKeys, passRatios };
}
