// Placing the layers on the devices there are: Halda's plan from their profiles (planRing), or the
// windows given by hand (--layer-windows), or every layer on the head; then the ring wired to the
// members (ring-setup.ts) or the head's own pipeline. The cluster decides when; this is how.
import type { Status } from "../control/index.js";
import { LocalPipeline } from "../engine/index.js";
import { parseDeviceReport, refreshMemory, settleMemory, systemInfo, type DeviceReport, type RereadStore, type RingPassStore } from "../profiler/index.js";
import { PlanError, evenLayerWindows, ringWindows } from "../ring/index.js";
import type { ModelSource } from "../transfer/index.js";
import type { ClusterOptions } from "./cluster-options.js";
import type { DeviceRecords } from "./devices.js";
import { windowChunkHashes } from "./model-store.js";
import { formatPlan, type Seat } from "./placement.js";
import { planRing, settleHeadMemory, type RingPlan } from "./plan-ring.js";
import { computeSharing, describeSharing, machineOf, type ComputeDevice } from "./compute-sharing.js";
import { choosePrefetch, type PrefetchDevice } from "./prefetch-choice.js";
import type { WorkerHandle, WorkerRegistry } from "./registry.js";
import type { Current } from "./request-run.js";
import { HEAD_ID, Ring } from "./ring-setup.js";
import type { PlanState } from "./state.js";
import type { Phases } from "./phases.js";

export interface PlaceInput {
  readonly o: ClusterOptions;
  readonly fingerprint: string;
  readonly registry: WorkerRegistry;
  readonly modelSource: ModelSource;
  /** Devices' reread speeds seen in earlier rings, and their passes against their price. */
  readonly rereads: RereadStore;
  readonly passes: RingPassStore;
  readonly devices: DeviceRecords;
  /** The workers to place on, in ring order, with their seats (the head last). */
  readonly workers: readonly WorkerHandle[];
  readonly seats: readonly Seat[];
  /** A request waits for this placement (after a loss): plan with the last timed passes. */
  readonly recovering: boolean;
  readonly generation: number;
  /** The head's profile (undefined: layers placed by hand). */
  readonly headReport: DeviceReport | undefined;
  /** The head's profile with its pass timed again. */
  readonly retimeHead: () => Promise<DeviceReport>;
  /** The ring broke after it was placed. */
  readonly onBroken: (e: Error) => void;
  /** Where the time goes (planning, wiring), for a recovery's event. */
  readonly phases?: Phases;
  /** The workers' statuses just read (a recovery's `answering`), the head's garbage collected meanwhile. */
  readonly statuses?: readonly Status[];
}

export interface Placed {
  readonly current: Current;
  /** Halda's plan (undefined: by hand, or no workers). */
  readonly placement: RingPlan | undefined;
  readonly planState: PlanState;
  /** Layers per cycle in ring order, the head last. */
  readonly perCycle: readonly number[];
  /** What the event log says of it. */
  readonly said: string;
}

type LeftOut = PlanState["leftOut"];

/** After a failure, a worker that does not answer a status request this fast is left out. */
const RESPONSIVE_WITHIN_MS = 1000;

/** place() once more when it fails (a device that does not answer, not yet declared lost, is left
 * out the next time), up to `attempts` in all; `stop` ends the retries at once. */
export async function placeRetrying(place: () => Promise<void>, attempts: number, stop: () => boolean, log: (line: string) => void): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await place();
    } catch (e) {
      if (attempt >= attempts || stop()) throw e;
      log(`re-placing the layers failed (${(e as Error).message}); trying again with the devices that answer`);
    }
  }
}

/** The head's memory read for a recovery's plan, while the workers answer: settled first (a collection
 * on its event loop, 0.1-0.5 s on a loaded host) only where that could change the plan; the garbage it
 * frees (tens of MiB) cannot where the head has room for the whole model twice over. */
export async function headMemoryNow(head: DeviceReport, modelPath: string, modelBytes: number, phases: Phases): Promise<DeviceReport> {
  const t0 = performance.now();
  let now = refreshMemory(head, modelPath);
  const plenty = now.profile.ramAvailableBytes >= 2 * modelBytes;
  if (!plenty) {
    await settleHeadMemory();
    now = refreshMemory(head, modelPath);
  }
  phases.meanwhile(plenty ? "the head's memory read" : "the head's memory settled and read", performance.now() - t0);
  return now;
}

/** The workers that answer a status request within the limit, with their answers (the plan reads
 * their memory from them): after a failure a silent one is not waited for (the registry declares it
 * lost, as its status limit does). `meanwhile` runs once the requests are out: the head's own work
 * (collecting its garbage) then overlaps the workers' answers instead of adding to the pause. */
export async function answering(workers: readonly WorkerHandle[], log: (line: string) => void, meanwhile?: () => Promise<void>): Promise<{ workers: WorkerHandle[]; statuses: Status[] }> {
  // A device whose messages come late lately (starved by other work) gets as long as its lateness.
  const limitMs = (w: WorkerHandle) => Math.round(Math.max(RESPONSIVE_WITHIN_MS, 2 * w.recentGapMs));
  const asked = Promise.all(workers.map((w) => w.status(limitMs(w)).catch(() => undefined)));
  if (meanwhile) {
    await new Promise((r) => setImmediate(r)); // the requests leave before the head's own work holds it
    await meanwhile();
  }
  const answers = await asked;
  const silent = workers.filter((_, i) => !answers[i]);
  for (const w of silent) {
    log(`device ${w.label} did not answer within ${limitMs(w)} ms: leaving it out of this placement`);
  }
  return { workers: workers.filter((_, i) => answers[i]), statuses: answers.filter((s): s is Status => s !== undefined) };
}
/** The head, then each worker, as the rules about devices sharing a machine see them (the prefetch
 * choice, how many compute at once), from the profile each joined with: parsed once a placement. A
 * worker without a usable profile is a machine of its own. */
interface SharingDevice extends ComputeDevice, PrefetchDevice {}

function sharingDevices(o: ClusterOptions, headReport: DeviceReport | undefined, workers: readonly WorkerHandle[]): SharingDevice[] {
  const head = headReport?.details.system ?? systemInfo();
  const detailsOf = (w: WorkerHandle): DeviceReport["details"] | undefined => {
    try {
      return parseDeviceReport(w.join.profileJson).details;
    } catch {
      return undefined; // none sent, or one that does not parse
    }
  };
  return [
    { label: HEAD_ID, machine: machineOf(head), threads: o.model.threads, logicalCpus: head.logicalCpus, readCpuShare: headReport?.details.disk.seqReadCpuShare },
    ...workers.map((w) => {
      const d = detailsOf(w);
      return { label: w.label, machine: machineOf(d?.system), threads: d?.threads ?? 1, logicalCpus: d?.system.logicalCpus ?? 1, readCpuShare: d?.disk.seqReadCpuShare };
    }),
  ];
}

export async function placeLayers(i: PlaceInput): Promise<Placed> {
  const { o, workers, seats, devices } = i;
  const { model, log } = o;
  const parallel = o.parallel ?? 1;
  if (workers.length === 0) return local(i, undefined, [], "no workers: every layer runs on this device");
  const sharing = sharingDevices(o, i.headReport, workers); // the head, then the workers
  // Whether each reads ahead (coordinator/prefetch-choice.ts), one choice a placement: Halda prices the
  // plan with it and the ring runs with it. A worker the plan leaves out still counts as sharing its
  // machine (it is idle).
  const prefetch = choosePrefetch(o.prefetch, sharing).map((c, j) => ({ ...c, label: sharing[j].label }));
  let perCycle: number[];
  let cycles: number | undefined;
  let placement: RingPlan | undefined;
  if (i.headReport && o.layerWindows === undefined) {
    for (const w of workers) devices.set(w, "profiling", "reading memory and measuring the link");
    placement = await planRing({
      model, modelPath: o.modelPath, fingerprint: i.fingerprint, workers, head: i.headReport, ctx: o.ctx,
      // A recovery plans with the last timed passes: a request is paused until it is placed.
      retime: !i.recovering, retimeHead: i.recovering ? undefined : i.retimeHead,
      maxBatch: o.batch, tokens: o.meanCacheTokens ?? o.ctx, log, kvCacheTypes: o.kvCacheTypes, seqSlots: parallel,
      // Halda prices plans of k > 1 with these devices' reads hidden (HALDA.md §4.9)
      prefetches: prefetch.map((c) => c.on),
      measureRouting: o.measureRouting, options: { k: o.cycles, ...(o.keepAll ? { keepAll: true } : {}) }, rereads: i.rereads, passes: i.passes, phases: i.phases, statuses: i.statuses,
    });
    log(formatPlan(placement, placement.labels));
    perCycle = [...placement.perCycle];
    cycles = placement.cycles;
  } else {
    ({ perCycle, cycles } = windowsFor(o, workers, i.recovering));
    // As planRing leaves it before a plan (not in a recovery, which pauses a request): the head's
    // group's idle pages reclaimed, so its window's room, read on the first tokens, is the room a
    // plan counted. Without it a capped head of hand-made windows streamed part of a window that
    // fitted: 4 x 200 MiB, [6,6,6,4] by hand 22 tok/s against Halda's same plan at 40.
    if (!i.recovering) await settleHeadMemory();
  }
  const plan = ringWindows(model.nLayers, perCycle, cycles);
  const releaseAfterUse = (pos: number) => placement?.releaseAfterUse[pos] ?? false;
  const leftOut = workers.filter((_, j) => plan.perDevice[j].length === 0);
  const dropReason = (w: WorkerHandle) =>
    placement?.plan.dropped.find((d) => d.index === seats.find((s) => s.worker === w)?.haldaIndex)?.reason ?? (placement ? "Halda gives it no layers" : "--layer-windows gives it no layers");
  for (const w of leftOut) {
    log(`device ${w.label} takes no layers and stays out of the ring`);
    devices.set(w, "left-out", dropReason(w));
  }
  const leftOutState: LeftOut = leftOut.map((w) => ({ device: w.id, reason: dropReason(w) }));
  const inRing = workers.flatMap((_, j) => (plan.perDevice[j].length > 0 ? [j] : []));
  const members = inRing.map((j) => ({ worker: workers[j], windows: plan.perDevice[j], releaseAfterUse: releaseAfterUse(j), prefetch: prefetch[j + 1].on }));
  // said where it matters: with several windows a device (one window is streamed, never prefetched)
  const prefetchNotes = plan.cycles > 1 ? [prefetch[0], ...inRing.map((j) => prefetch[j + 1])].map((c) => `prefetch ${c.on ? "on" : "off"} on ${c.label}: ${c.why}`) : [];
  for (const n of prefetchNotes) log(n);
  if (members.length === 0) {
    if (!placement) throw new PlanError("no worker takes a layer: give the workers some layers in --layer-windows");
    for (const w of workers) log(`device ${w.label} takes no layers: Halda keeps every layer on this device`);
    return local(i, placement, leftOutState, "Halda keeps every layer on this device");
  }
  const headWindows = plan.perDevice[workers.length];
  log(`plan: ${plan.cycles} cycle${plan.cycles === 1 ? "" : "s"} of [${perCycle.join(", ")}] layers (ring order: ${[...members.map((m) => m.worker.id), HEAD_ID].join(" -> ")})`);
  for (const m of members) devices.set(m.worker, "loading", "receiving its windows", 0);
  const ring = await Ring.build({
    members, headWindows, headReleaseAfterUse: releaseAfterUse(workers.length), cycles: plan.cycles, ctx: o.ctx,
    maxBatch: o.batch, headPrefetch: prefetch[0].on, expertPrefetch: o.expertPrefetch, kvCacheTypes: o.kvCacheTypes, seqSlots: parallel,
  }, {
    model, fingerprint: i.fingerprint, registry: i.registry, log,
    weights: async (layers) => ({ chunkBytes: i.modelSource.info.chunkBytes, chunks: await windowChunkHashes(i.modelSource, model.gguf, layers) }),
    onProgress: (w, fraction, stage) => devices.set(w, "loading", stage, fraction),
    onBroken: i.onBroken, phases: i.phases,
    // Setting the ring up (the workers' windows' chunk hashes above all) left garbage the plan did not
    // count; the head's room for its window is read from its group on the first tokens (WeightRoom), and
    // read with it a capped head streamed part of a window that fitted. No window runs yet: it is
    // collected while the workers set their windows up (their own work, which the head only waits for).
    // Not in a recovery: its collection while the workers answered is a moment old, and since then
    // only the plan and at most a 4 MiB hashing buffer per member were made (a second one cost the
    // paused request 0.1-0.5 s of a loaded host's CPU).
    whileAssigning: i.statuses ? undefined : settleMemory,
  });
  for (const m of members) devices.set(m.worker, "ready", null);
  const windows = [...members.map((m) => ({ id: m.worker.id, ws: m.windows })), { id: HEAD_ID, ws: headWindows }]
    .flatMap(({ id, ws }) => ws.map((w) => ({ device: id, firstLayer: w.firstLayer, endLayer: w.endLayer, cycle: w.cycle })));
  const planState: PlanState = {
    generation: i.generation, planner: placement ? `Halda (${placement.plan.planner})` : "--layer-windows", cycles: plan.cycles, ringOrder: ring.order,
    layersPerCycle: [...members.map((m) => m.windows[0].endLayer - m.windows[0].firstLayer), headWindows.length ? headWindows[0].endLayer - headWindows[0].firstLayer : 0],
    predictedMsPerToken: placement?.plan.latencyMs ?? null, windows, leftOut: leftOutState, notes: [...(placement?.plan.notes ?? []), ...prefetchNotes], madeUnixMs: Date.now(),
  };
  // How many of the ring's devices (its members, and the head where it holds layers) compute at once
  const computing = computeSharing([...inRing.map((j) => sharing[j + 1]), ...(headWindows.length > 0 ? [sharing[0]] : [])]);
  if (computing.crowded.length > 0) log(`${computing.count} of the ring's devices compute at once: ${describeSharing(computing)}`);
  return {
    current: { kind: "ring", ring, devices: members.length + 1, computeAtOnce: computing.count }, placement, planState, perCycle,
    said: `placed ${model.nLayers} layers on ${members.length + 1} devices, ${plan.cycles} cycle${plan.cycles === 1 ? "" : "s"} [${perCycle.join(", ")}]`,
  };
}

/** Every layer on the head. */
function local(i: PlaceInput, placement: RingPlan | undefined, leftOut: LeftOut, why: string): Placed {
  const L = i.o.model.nLayers;
  return {
    current: { kind: "local", pipeline: new LocalPipeline(i.o.model, i.o.ctx, i.o.batch, i.o.kvCacheTypes), devices: 1 }, placement, perCycle: placement ? placement.perCycle : [L],
    planState: {
      generation: i.generation, planner: placement ? `Halda (${placement.plan.planner})` : "alone", cycles: 1, ringOrder: [HEAD_ID], layersPerCycle: [L],
      predictedMsPerToken: placement?.plan.latencyMs ?? null, windows: [{ device: HEAD_ID, firstLayer: 0, endLayer: L, cycle: 0 }], leftOut,
      notes: [why, ...(placement?.plan.notes ?? [])], madeUnixMs: Date.now(),
    },
    said: why,
  };
}

function windowsFor(o: ClusterOptions, workers: readonly WorkerHandle[], recovering: boolean): { perCycle: number[]; cycles?: number } {
  // A service (or a request recovering from a loss) goes on when devices it names are away.
  if (!recovering && !o.autoPlace) return handMadeWindows(o, workers);
  try {
    return handMadeWindows(o, workers);
  } catch (e) {
    o.log(`${(e as Error).message}: spreading the layers evenly over the ${workers.length + 1} devices there are until the devices named return`);
    return { perCycle: evenLayerWindows(o.model.nLayers, workers.length + 1, 1) };
  }
}

/** --layer-windows for these workers (ring order), or an even split without it. */
function handMadeWindows(o: ClusterOptions, workers: readonly WorkerHandle[]): { perCycle: number[]; cycles?: number } {
  const lw = o.layerWindows;
  const L = o.model.nLayers;
  if (lw === undefined) return { perCycle: evenLayerWindows(L, workers.length + 1, o.cycles ?? 1), cycles: o.cycles };
  if ("list" in lw) {
    if (lw.list.length !== workers.length + 1) {
      throw new PlanError(`--layer-windows lists ${lw.list.length} windows for ${workers.length} workers and the head (${workers.length + 1} expected)`);
    }
    return { perCycle: [...lw.list], cycles: o.cycles };
  }
  const names = [...workers.map((w) => w.join.deviceName), HEAD_ID];
  for (const n of lw.byName.keys()) {
    if (!names.includes(n) && !workers.some((w) => w.id === n)) {
      throw new PlanError(`--layer-windows names device "${n}", which has not joined (devices: ${names.join(", ")})`);
    }
  }
  const perCycle = [...workers.map((w) => lw.byName.get(w.join.deviceName) ?? lw.byName.get(w.id) ?? 0), lw.byName.get(HEAD_ID) ?? 0];
  return { perCycle, cycles: o.cycles };
}
