// The long-lived cluster that `serve`, `chat` and `run` share: the worker registry, the head's model,
// placement (Halda or hand-made windows), the current ring (or the head alone), the request queue and
// the prompt cache. Devices may join and leave at any time; the cluster re-places layers when the set
// of devices changed, between requests, never in the middle of one.
import { EventEmitter } from "node:events";
import { basename, dirname, extname, join, resolve } from "node:path";
import type { Status } from "../control/index.js";
import { KvJournal, LocalPipeline, SeqSlots, generate, replayJournal, type ContextShift, type GenerationResult, type LocalModel, type Sampler } from "../engine/index.js";
import { ggmlTypeName, metaString, modelFingerprint, rowBytes, type KvCacheTypes } from "../model/index.js";
import { defaultCacheDir, memoryPressureTracker, settleMemory, profileDevice, systemInfo, RereadStore, type DeviceReport, type SystemInfo } from "../profiler/index.js";
import { PlanError, evenLayerWindows, ringWindows } from "../ring/index.js";
import {
  DecodeMeter, costPerStep, formatPlan, planRing, predictionReport, recordRereads, type MeasuredDevice, type PredictionReport, type RingPlan, type StepCost,
} from "./placement.js";
import { ModelSource, defaultModelCacheDir } from "../transfer/index.js";
import { serveChunks, windowChunkHashes } from "./model-store.js";
import { WorkerRegistry, type WorkerHandle } from "./registry.js";
import { TrustStore } from "../trust/index.js";
import { HEAD_ID, Ring, headStatus } from "./ring-setup.js";
import { kvCacheState } from "./kv-cache-options.js";
import { SequenceScheduler, type SlotState } from "./parallel.js";
import {
  STATE_VERSION, type ClusterState, type DeviceState, type DeviceStateName, type EventState, type MeasuredMs, type PlanState,
  type RequestState,
} from "./state.js";

/** --layer-windows: in ring order, or by device name (`laptop=8,phone=4,head=10`). */
export type LayerWindowsArg = { readonly list: readonly number[] } | { readonly byName: ReadonlyMap<string, number> };

export interface ClusterOptions {
  readonly modelPath: string;
  readonly model: LocalModel;
  /** The cluster's name (mDNS, the dashboard). */
  readonly name: string;
  readonly ctx: number;
  readonly batch: number;
  /** The KV cache's types on every device (--cache-type-k/-v); default f16. */
  readonly kvCacheTypes?: KvCacheTypes;
  readonly prefetch: boolean;
  readonly reprofile: boolean;
  readonly layerWindows?: LayerWindowsArg;
  readonly cycles?: number;
  /** Place layers on every device, even where Halda would leave one out. */
  readonly keepAll?: boolean;
  /** Tokens a request is expected to hold (prompt + generated), for Halda's attention term. */
  readonly plannedTokens?: number;
  /** Re-place layers soon after devices join or leave while idle (serve), instead of only before the
   *  next request (run and chat, which place once all the workers they wait for have joined). */
  readonly autoPlace?: boolean;
  /** Workers to wait for before placing layers on its own (with autoPlace). */
  readonly minWorkers?: number;
  /** Requests waiting beyond the running one; more are refused (QueueFullError). Default 16. */
  readonly maxQueue?: number;
  /** Sequences decoded together on this device, each with a KV cache of ctx tokens (serve --parallel).
   * Above 1 every layer runs here: workers that join are not placed. Default 1. */
  readonly parallel?: number;
  /** A new join token (and certificate) before listening: workers need the new one. */
  readonly rotateToken?: boolean;
  /** Workers may name a data host other than the address they connect from (registry.ts). */
  readonly allowAdvertise?: boolean;
  readonly log: (line: string) => void;
}

export class QueueFullError extends Error {
  override name = "QueueFullError";
}
export class CancelledError extends Error {
  override name = "CancelledError";
}

export interface GenerationRequest {
  readonly kind: "chat" | "completion";
  readonly prompt: Int32Array;
  readonly maxTokens: number;
  readonly sampler: Sampler;
  /** Stop before sampling a token this says is the end (EOS/EOT). */
  readonly isEnd: (id: number) => boolean;
  /** Each generated token; return false to stop. */
  readonly onToken: (id: number) => boolean | void;
  /** Aborted: leaves the queue, or stops at the next token. */
  readonly signal?: AbortSignal;
  /** Called once the request leaves the queue and starts. */
  readonly onStart?: () => void;
  /** Wait for every device's counters (as decoding starts and at the end) and return them with the
   * prediction: run's report. Without it they are read beside the generation for the state, and the
   * caller never waits for them (default false). */
  readonly report?: boolean;
  /** Whose KV cache of earlier prompts this request may reuse: only a request of the same scope
   * (serve: the same API key or client) continues from the cache (undefined: one scope for all). */
  readonly cacheScope?: string;
  /** The prompt's rows after every layer, from position `fromPos` (the cache held those before), once
   * its pass is done (again after a failover's replay): what an embedding pools (embeddings.ts). */
  readonly onPrompt?: (rows: Float32Array, fromPos: number) => void;
  /** Past the context: shift it and go on (undefined: stop when it is full). */
  readonly contextShift?: ContextShift;
}

/** A device's counters per decode step, as run's report shows them. */
export interface DeviceDecodeRow {
  readonly id: string;
  readonly label: string;
  readonly status: Status;
  readonly haldaIndex: number;
  /** Counters when decoding started (undefined: no decode step was timed). */
  readonly before?: Status;
  readonly cost: StepCost;
}

export interface GenerationOutcome {
  readonly result: GenerationResult;
  /** Prompt tokens whose KV cache was reused from the previous request. */
  readonly cachedTokens: number;
  readonly queueMs: number;
  readonly firstTokenMs: number | null;
  readonly devices: number;
  readonly cycles: number;
  /** Layers per cycle in ring order of every worker (0: left out), then the head. */
  readonly layersPerCycle: readonly number[];
  readonly placement?: RingPlan;
  readonly perDevice: readonly DeviceDecodeRow[];
  readonly prediction?: PredictionReport;
  readonly meanDecodeMs: number;
}

interface DeviceInfo {
  /** The worker's profile as it joined with it (parsed once, for the state). */
  readonly report: Partial<DeviceReport>;
  state: DeviceStateName;
  detail: string | null;
  progress: number | null;
  readonly joinedUnixMs: number;
  measured: MeasuredMs | null;
  lastStatus: Status | null;
}

type Current =
  | { readonly kind: "local"; readonly pipeline: LocalPipeline; readonly devices: 1 }
  | { readonly kind: "ring"; readonly ring: Ring; readonly devices: number };

const MAX_EVENTS = 50;
const MAX_LOST_SHOWN = 8;
const HISTORY_POINTS = 120;
const HISTORY_INTERVAL_MS = 5000;
/** Re-placements one request may go through before it gives up. */
const MAX_RECOVERIES = 3;
/** After a failure, a worker that does not answer a status request this fast is left out. */
const RESPONSIVE_WITHIN_MS = 1000;
/** How often a generation lets the event loop run (streams flushed, clients and workers heard). */
const YIELD_EVERY_MS = 4;
/** After a join or a loss, wait this long for more before re-placing an idle cluster. */
const REPLAN_SETTLE_MS = 1000;

/** Events: "change" (the state changed). */
export class Cluster extends EventEmitter {
  readonly registry: WorkerRegistry;
  readonly fingerprint: string;
  readonly startedUnixMs = Date.now();
  private readonly modelSource: ModelSource;
  /** The cluster's key, certificate and join token (trust/), opened by start(). */
  private trustStore: TrustStore | undefined;
  private headReport: DeviceReport | undefined;
  private current: Current | undefined;
  private placement: RingPlan | undefined;
  private planState: PlanState | null = null;
  private perCycle: readonly number[] = [];
  /** The workers the current placement was made for, in ring order (Halda's devices 1..n). */
  private placedWorkers: readonly WorkerHandle[] = [];
  private generation = 0;
  private dirty = true;
  /** Devices that joined since the cluster started: a request that sees this grow places the layers
   * again at its next token (autoPlace), rather than leaving the newcomer idle until the next request. */
  private arrivals = 0;
  private clusterPort = 0;
  private readonly devices = new Map<string, DeviceInfo>();
  private readonly lost: { handle: WorkerHandle; info: DeviceInfo }[] = [];
  private readonly events: EventState[] = [];
  /** What the current pipeline's KV cache holds (engine/context-shift.ts). */
  private journal = new KvJournal();
  /** The scope of the request that left the journal (GenerationRequest.cacheScope). */
  private cachedScope: string | undefined;
  private tail: Promise<unknown> = Promise.resolve();
  private waiting = 0;
  private active: { state: RequestState; controller: { tokens: number; firstAt: number | null; startedAt: number } } | null = null;
  private stats = {
    completed: 0, failed: 0, generatedTokens: 0, promptTokens: 0, cachedTokens: 0, ttftMsSum: 0, ttftCount: 0, decodeMsSum: 0, decodeSteps: 0,
    lost: 0, replans: 0, recoveries: 0, recoveryMsSum: 0, recoveryMsLast: 0,
    /** Decode passes of parallel sequences, the rows they took, and the most in one. */
    batchSteps: 0, batchRows: 0, batchWidest: 0,
  };
  /** serve --parallel N > 1: the sequence slots and their scheduler (made with the local pipeline). */
  private sequences: { slots: SeqSlots; scheduler: SequenceScheduler } | undefined;
  private readonly history: { unixMs: number; tokensPerS: number }[] = [];
  private historyTokens = 0;
  private readonly historyTimer: NodeJS.Timeout;
  private settleTimer: NodeJS.Timeout | undefined;
  private closed = false;
  private headState: { state: DeviceStateName; detail: string | null } = { state: "profiling", detail: null };

  constructor(readonly o: ClusterOptions) {
    super();
    this.fingerprint = modelFingerprint(o.model.gguf);
    // Workers without their own copy fetch their windows' chunks from this file (transfer/).
    this.modelSource = new ModelSource({
      path: o.modelPath, fileBytes: o.model.gguf.fileBytes, dataOffset: o.model.gguf.dataOffset, fingerprint: this.fingerprint,
      name: basename(o.modelPath), hashDir: join(dirname(defaultModelCacheDir()), "chunk-hashes"),
    });
    const trust = () => {
      if (!this.trustStore) throw new Error("the cluster's identity is opened by start()");
      return this.trustStore;
    };
    this.registry = new WorkerRegistry({
      modelFingerprint: this.fingerprint, log: o.log, chunks: serveChunks(this.modelSource, o.log), allowAdvertise: o.allowAdvertise,
      trust: { get identity() { return trust().identity; }, refresh: () => trust().refresh() },
    });
    this.registry.on("joined", (w: WorkerHandle) => this.onJoined(w));
    this.registry.on("lost", (w: WorkerHandle, reason: string) => this.onLost(w, reason));
    this.historyTimer = setInterval(() => this.sampleHistory(), HISTORY_INTERVAL_MS);
    this.historyTimer.unref();
  }

  /** Measures this device (or reads its cached profile) unless the layers are placed by hand, then
   * listens for workers. Resolves with the cluster port. Profiling comes first so that on one machine
   * it never competes with a worker's. */
  async start(port: number, host = "0.0.0.0"): Promise<number> {
    if (this.o.layerWindows === undefined) {
      this.headState = { state: "profiling", detail: "measuring this device" };
      this.headReport = await this.profileHead(false);
    }
    this.headState = { state: "ready", detail: null };
    this.trustStore = await TrustStore.open(this.o.name, { rotate: this.o.rotateToken });
    this.clusterPort = await this.registry.listen(port, host);
    this.sayJoinCommand();
    this.changed();
    return this.clusterPort;
  }

  get port(): number {
    return this.clusterPort;
  }

  /** This device's profile: measured (or read from the cache) at start; `again` before each plan, from
   * the cache but for the pass and the output layer, timed anew, and the hand-off to a successor (only
   * a ring has one), saying only those. */
  private profileHead(again: boolean): Promise<DeviceReport> {
    return profileDevice({
      name: HEAD_ID, model: this.o.model, outputLayer: true, handOff: again, threads: this.o.model.threads,
      diskDirs: [dirname(resolve(this.o.modelPath))], nCtx: this.o.ctx, reprofile: this.o.reprofile && !again,
      progress: (l) => (!again || /^forward pass|^output layer|^hand-off/.test(l) ? this.o.log(`profile: ${l}`) : undefined),
    });
  }

  /** How workers join: the token file always; the token itself only when it is new or a person
   * watches (logs are kept and shared, and the token lets a device into the ring). */
  private sayJoinCommand(): void {
    const t = this.trustStore!;
    const model = `--model <their copy of ${basename(this.o.modelPath)}> (or none: they fetch their layers)`;
    if (t.created) this.o.log(`made a new join token for cluster "${this.o.name}" (${t.tokenFile}); workers with an older one are refused`);
    this.o.log(`workers join with: prima-worker --join HOST:${this.clusterPort} --token-file ${t.tokenFile} ${model}; HOST is this machine's address`);
    if (t.created || process.stderr.isTTY) this.o.log(`or: prima-worker --join HOST:${this.clusterPort} --token ${t.identity.tokenText}`);
  }

  get model(): LocalModel {
    return this.o.model;
  }

  /** Requests waiting for the ring (not counting the running one). */
  get queueLength(): number {
    return this.waiting;
  }

  get maxQueue(): number {
    return this.o.maxQueue ?? 16;
  }

  /** Live workers in ring order: by device name, then by id, never by who joined first. */
  workersInOrder(): WorkerHandle[] {
    return this.registry.live().sort((a, b) => a.join.deviceName.localeCompare(b.join.deviceName) || a.id.localeCompare(b.id, undefined, { numeric: true }));
  }

  // ---- devices coming and going ----------------------------------------------------------------

  private onJoined(w: WorkerHandle): void {
    let report: Partial<DeviceReport> = {};
    try {
      report = JSON.parse(w.join.profileJson) as Partial<DeviceReport>;
    } catch {
      // the registry checked it already; a state without the profile's details is still a state
    }
    this.devices.set(w.id, { report, state: "joining", detail: "waiting to be placed", progress: null, joinedUnixMs: Date.now(), measured: null, lastStatus: null });
    this.event("joined", `device ${w.label} joined`);
    this.arrivals++;
    // The handshakes' garbage is freed now, while no window runs (memory readings show the live set).
    if (!this.active) setImmediate(settleMemory);
    this.markDirty();
  }

  private onLost(w: WorkerHandle, reason: string): void {
    const info = this.devices.get(w.id);
    if (info) {
      info.state = "lost";
      info.detail = reason;
      this.devices.delete(w.id);
      this.lost.push({ handle: w, info });
      if (this.lost.length > MAX_LOST_SHOWN) this.lost.shift();
    }
    this.stats.lost++;
    this.event("lost", `device ${w.label} lost: ${reason}`);
    if (this.current?.kind === "ring" && this.current.ring.spec.members.some((m) => m.worker === w)) this.journal = new KvJournal();
    this.markDirty();
  }

  /** The set of devices changed: re-place before the next request, or soon if idle. */
  private markDirty(): void {
    this.dirty = true;
    this.changed();
    clearTimeout(this.settleTimer);
    if (!this.o.autoPlace) return;
    this.settleTimer = setTimeout(() => {
      const enough = this.readiness().ok;
      if (this.dirty && enough && !this.active && this.waiting === 0 && !this.closed) {
        this.exclusive(() => this.prepare()).catch((e: unknown) => this.o.log(`placing layers failed: ${(e as Error).message}`));
      }
    }, REPLAN_SETTLE_MS);
    this.settleTimer.unref();
  }

  private event(kind: EventState["kind"], message: string): void {
    this.events.push({ unixMs: Date.now(), kind, message });
    if (this.events.length > MAX_EVENTS) this.events.shift();
    this.changed();
  }

  private changed(): void {
    this.emit("change");
  }

  // ---- the queue -------------------------------------------------------------------------------

  /** Runs fn after everything queued before it; one task at a time owns the ring. */
  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.tail.then(fn, fn);
    this.tail = run.catch(() => {});
    return run;
  }

  // ---- placing layers --------------------------------------------------------------------------

  /** Makes sure the pipeline matches the devices there are now (inside exclusive()). */
  async prepare(): Promise<void> {
    // parallel sequences run here alone, for good: re-placing would close slots that are decoding
    if (this.parallel > 1 && this.current) {
      this.dirty = false;
      for (const d of this.devices.values()) {
        if (d.state !== "joining") continue;
        d.state = "left-out";
        d.detail = `--parallel ${this.parallel} runs on this device alone`;
      }
      return;
    }
    const broken = this.current?.kind === "ring" && this.current.ring.failure !== undefined;
    if (!this.dirty && this.current && !broken) return;
    await this.replace(false);
  }

  /** Takes the ring down and places the layers on the devices there are now. When recovering, layers
   * placed by hand that name a device no longer there are spread evenly over the devices left. */
  private async replace(recovering: boolean): Promise<void> {
    if (this.closed) throw new Error("the cluster is shutting down");
    this.dirty = false;
    await this.takeDown();
    try {
      await this.place(recovering);
      this.stats.replans++;
    } catch (e) {
      this.dirty = true;
      this.event("error", `placing layers failed: ${(e as Error).message}`);
      throw e;
    }
  }

  private async takeDown(): Promise<void> {
    const c = this.current;
    this.current = undefined;
    this.journal = new KvJournal();
    if (this.sequences) {
      await this.sequences.scheduler.close();
      this.sequences.slots.close();
      this.sequences = undefined;
    }
    if (c?.kind === "local") c.pipeline.close();
    if (c?.kind === "ring") await c.ring.close();
  }

  private windowsFor(workers: readonly WorkerHandle[], recovering: boolean): { perCycle: number[]; cycles?: number } {
    // A service (or a request recovering from a loss) goes on when devices it names are away.
    if (!recovering && !this.o.autoPlace) return this.handMadeWindows(workers);
    try {
      return this.handMadeWindows(workers);
    } catch (e) {
      this.o.log(`${(e as Error).message}: spreading the layers evenly over the ${workers.length + 1} devices there are until the devices named return`);
      return { perCycle: evenLayerWindows(this.o.model.nLayers, workers.length + 1, 1) };
    }
  }

  /** --layer-windows for these workers (ring order), or an even split without it. */
  private handMadeWindows(workers: readonly WorkerHandle[]): { perCycle: number[]; cycles?: number } {
    const lw = this.o.layerWindows;
    const L = this.o.model.nLayers;
    if (lw === undefined) return { perCycle: evenLayerWindows(L, workers.length + 1, this.o.cycles ?? 1), cycles: this.o.cycles };
    if ("list" in lw) {
      if (lw.list.length !== workers.length + 1) {
        throw new PlanError(`--layer-windows lists ${lw.list.length} windows for ${workers.length} workers and the head (${workers.length + 1} expected)`);
      }
      return { perCycle: [...lw.list], cycles: this.o.cycles };
    }
    const names = [...workers.map((w) => w.join.deviceName), HEAD_ID];
    for (const n of lw.byName.keys()) {
      if (!names.includes(n) && !workers.some((w) => w.id === n)) {
        throw new PlanError(`--layer-windows names device "${n}", which has not joined (devices: ${names.join(", ")})`);
      }
    }
    const perCycle = [...workers.map((w) => lw.byName.get(w.join.deviceName) ?? lw.byName.get(w.id) ?? 0), lw.byName.get(HEAD_ID) ?? 0];
    return { perCycle, cycles: this.o.cycles };
  }

  private async place(recovering = false): Promise<void> {
    const { model, log } = this.o;
    const workers = recovering ? await this.responsive(this.workersInOrder()) : this.workersInOrder();
    this.placedWorkers = workers;
    const generation = ++this.generation;
    this.placement = undefined;
    if (workers.length === 0) {
      this.useLocal([], "no workers: every layer runs on this device");
      return;
    }
    if (this.parallel > 1) {
      for (const w of workers) this.setDevice(w, "left-out", `--parallel ${this.parallel} runs on this device alone`);
      this.useLocal(workers.map((w) => ({ device: w.id, reason: `--parallel ${this.parallel} runs on one device` })), `--parallel ${this.parallel}: every layer runs on this device; workers are not used`);
      return;
    }
    let perCycle: number[];
    let cycles: number | undefined;
    let placement: RingPlan | undefined;
    if (this.headReport && this.o.layerWindows === undefined) {
      for (const w of workers) this.setDevice(w, "profiling", "reading memory and measuring the link");
      placement = await planRing({
        model, modelPath: this.o.modelPath, fingerprint: this.fingerprint, workers, head: this.headReport, ctx: this.o.ctx,
        // A recovery plans with the last timed passes: a request is paused until it is placed.
        retime: !recovering, retimeHead: recovering ? undefined : async () => (this.headReport = await this.profileHead(true)),
        maxBatch: this.o.batch, tokens: this.o.plannedTokens ?? this.o.ctx, log, kvCacheTypes: this.o.kvCacheTypes,
        options: { k: this.o.cycles, ...(this.o.keepAll ? { keepAll: true } : {}) }, rereads: this.rereads,
      });
      log(formatPlan(placement, placement.labels));
      perCycle = [...placement.perCycle];
      cycles = placement.cycles;
      this.placement = placement;
    } else ({ perCycle, cycles } = this.windowsFor(workers, recovering));
    const plan = ringWindows(model.nLayers, perCycle, cycles);
    this.perCycle = perCycle;
    const releaseAfterUse = (pos: number) => placement?.releaseAfterUse[pos] ?? false;
    const leftOut = workers.filter((_, i) => plan.perDevice[i].length === 0);
    const dropReason = (w: WorkerHandle) =>
      placement?.plan.dropped.find((d) => d.index === workers.indexOf(w) + 1)?.reason ?? (placement ? "Halda gives it no layers" : "--layer-windows gives it no layers");
    for (const w of leftOut) {
      log(`device ${w.label} takes no layers and stays out of the ring`);
      this.setDevice(w, "left-out", dropReason(w));
    }
    const members = workers.flatMap((w, i) => (plan.perDevice[i].length > 0 ? [{ worker: w, windows: plan.perDevice[i], releaseAfterUse: releaseAfterUse(i) }] : []));
    if (members.length === 0) {
      if (!placement) throw new PlanError("no worker takes a layer: give the workers some layers in --layer-windows");
      for (const w of workers) log(`device ${w.label} takes no layers: Halda keeps every layer on this device`);
      this.useLocal(leftOut.map((w) => ({ device: w.id, reason: dropReason(w) })), "Halda keeps every layer on this device", generation);
      return;
    }
    const headWindows = plan.perDevice[workers.length];
    log(`plan: ${plan.cycles} cycle${plan.cycles === 1 ? "" : "s"} of [${perCycle.join(", ")}] layers (ring order: ${[...members.map((m) => m.worker.id), HEAD_ID].join(" -> ")})`);
    for (const m of members) this.setDevice(m.worker, "loading", "receiving its windows", 0);
    const ring = await Ring.build({
      members, headWindows, headReleaseAfterUse: releaseAfterUse(workers.length), cycles: plan.cycles, ctx: this.o.ctx,
      maxBatch: this.o.batch, prefetch: this.o.prefetch, kvCacheTypes: this.o.kvCacheTypes,
    }, {
      model, fingerprint: this.fingerprint, registry: this.registry, log,
      weights: async (layers) => ({ chunkBytes: this.modelSource.info.chunkBytes, chunks: await windowChunkHashes(this.modelSource, model.gguf, layers) }),
      onProgress: (w, fraction, stage) => this.setDevice(w, "loading", stage, fraction),
      onBroken: (e) => {
        this.event("error", `the ring broke: ${e.message}`);
        this.markDirty();
      },
    });
    for (const m of members) this.setDevice(m.worker, "ready", null);
    // Setting the ring up (the workers' windows' chunk hashes above all) left garbage the plan did not
    // count; the head's room for its window is read from its group on the first tokens (WeightRoom), and
    // read with it a capped head streamed part of a window that fitted. No window runs yet: collect it.
    settleMemory();
    this.current = { kind: "ring", ring, devices: members.length + 1 };
    const windows = [...members.map((m) => ({ id: m.worker.id, ws: m.windows })), { id: HEAD_ID, ws: headWindows }]
      .flatMap(({ id, ws }) => ws.map((w) => ({ device: id, firstLayer: w.firstLayer, endLayer: w.endLayer, cycle: w.cycle })));
    this.planState = {
      generation, planner: placement ? `Halda (${placement.plan.planner})` : "--layer-windows", cycles: plan.cycles, ringOrder: ring.order,
      layersPerCycle: [...members.map((m) => m.windows[0].endLayer - m.windows[0].firstLayer), headWindows.length ? headWindows[0].endLayer - headWindows[0].firstLayer : 0],
      predictedMsPerToken: placement?.plan.latencyMs ?? null, windows,
      leftOut: leftOut.map((w) => ({ device: w.id, reason: dropReason(w) })), notes: placement ? [...placement.plan.notes] : [], madeUnixMs: Date.now(),
    };
    this.event("replan", `placed ${model.nLayers} layers on ${members.length + 1} devices, ${plan.cycles} cycle${plan.cycles === 1 ? "" : "s"} [${perCycle.join(", ")}]`);
  }

  private useLocal(leftOut: { device: string; reason: string }[], why: string, generation = this.generation): void {
    const pipeline = new LocalPipeline(this.o.model, this.o.ctx, this.o.batch, this.o.kvCacheTypes);
    if (this.parallel > 1) {
      // slot 0 is the pipeline's window; the others each a KV cache of their own: N x ctx in all
      let slots: SeqSlots;
      try {
        slots = new SeqSlots(this.o.model, this.parallel, this.o.ctx, this.o.batch, pipeline.window, this.o.kvCacheTypes);
      } catch (e) {
        pipeline.close();
        throw e;
      }
      // K and V in their types for every layer of every slot, as the windows hold them (sliding-window layers a ring)
      const kvBytes = slots.windows.reduce((a, w) => a + w.info().kvBytes, 0);
      const anonBytes = slots.windows.reduce((a, w) => a + w.info().anonBytes, 0);
      const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;
      this.o.log(`--parallel ${this.parallel}: ${this.parallel} sequence slots of ${this.o.ctx} tokens each (${this.parallel * this.o.ctx} tokens of KV cache: ${mib(kvBytes)}; ${mib(anonBytes)} with the slots' scratch)`);
      const scheduler = new SequenceScheduler(slots, {
        maxQueue: this.maxQueue, layers: this.o.model.nLayers,
        hooks: {
          token: () => this.historyTokens++,
          step: (rows) => {
            this.stats.batchSteps++;
            this.stats.batchRows += rows;
            this.stats.batchWidest = Math.max(this.stats.batchWidest, rows);
          },
          finished: (out, promptTokens) => this.recordParallel(out, promptTokens),
          changed: () => this.changed(),
        },
      });
      this.sequences = { slots, scheduler };
    }
    this.perCycle = this.placement ? this.placement.perCycle : [this.o.model.nLayers];
    this.current = { kind: "local", pipeline, devices: 1 };
    const L = this.o.model.nLayers;
    this.planState = {
      generation, planner: this.placement ? `Halda (${this.placement.plan.planner})` : "alone", cycles: 1, ringOrder: [HEAD_ID], layersPerCycle: [L],
      predictedMsPerToken: this.placement?.plan.latencyMs ?? null, windows: [{ device: HEAD_ID, firstLayer: 0, endLayer: L, cycle: 0 }], leftOut,
      notes: [why, ...(this.placement?.plan.notes ?? [])], madeUnixMs: Date.now(),
    };
    this.event("replan", why);
  }

  private setDevice(w: WorkerHandle, state: DeviceStateName, detail: string | null, progress: number | null = null): void {
    const info = this.devices.get(w.id);
    if (!info) return;
    info.state = state;
    info.detail = detail;
    info.progress = progress;
    this.changed();
  }

  /** Places layers now if the devices changed (serve calls this when it starts and after joins). */
  async ensurePlaced(): Promise<void> {
    await this.exclusive(() => this.prepare());
  }

  // ---- requests --------------------------------------------------------------------------------

  get parallel(): number {
    return this.o.parallel ?? 1;
  }

  /** The sequence slots (serve --parallel N > 1), else undefined. */
  slotStates(): SlotState[] | undefined {
    return this.sequences?.scheduler.slotStates();
  }

  /** serve --parallel: a request takes a sequence slot and decodes beside the others (parallel.ts). */
  private async generateParallel(req: GenerationRequest): Promise<GenerationOutcome> {
    if (!this.sequences) await this.exclusive(() => this.prepare());
    if (!this.sequences) throw new Error("the sequence slots are not there (the layers were not placed)");
    return this.sequences.scheduler.submit(req);
  }

  private recordParallel(out: GenerationOutcome | undefined, promptTokens: number): void {
    if (!out) {
      this.stats.failed++;
      return;
    }
    this.stats.completed++;
    this.stats.generatedTokens += out.result.ids.length;
    this.stats.promptTokens += promptTokens;
    this.stats.cachedTokens += out.cachedTokens;
    if (out.firstTokenMs !== null) {
      this.stats.ttftMsSum += out.firstTokenMs;
      this.stats.ttftCount++;
    }
    this.stats.decodeMsSum += out.result.decodeMs;
    this.stats.decodeSteps += out.result.decodeSteps;
    if (!this.sequences?.scheduler.activeCount) {
      const idle = () => !this.sequences?.scheduler.activeCount && !this.sequences?.scheduler.waiting && !this.closed;
      setImmediate(() => idle() && settleMemory());
    }
  }

  /** Queues a generation; it runs when the requests before it are done. */
  generate(req: GenerationRequest): Promise<GenerationOutcome> {
    if (this.closed) return Promise.reject(new Error("the server is shutting down"));
    if (this.parallel > 1) return this.generateParallel(req);
    if (this.waiting >= this.maxQueue && (this.active || this.waiting > 0)) {
      return Promise.reject(new QueueFullError(`${this.waiting} requests are waiting (the limit is ${this.maxQueue}): try again shortly`));
    }
    this.waiting++;
    this.changed();
    const queuedAt = performance.now();
    let left = false;
    const leave = () => {
      if (!left) {
        left = true;
        this.waiting--;
        this.changed();
      }
    };
    return this.exclusive(async () => {
      leave();
      if (req.signal?.aborted) throw new CancelledError("the client went away while the request was queued");
      return this.run(req, performance.now() - queuedAt);
    }).finally(() => {
      leave();
      // Nothing waiting: hand back what the request's traffic grew (V8's young generation can reach
      // tens of MiB), memory the plan gave the windows (profiler's settleMemory, ~15 ms).
      const idle = () => !this.active && this.waiting === 0 && !this.closed;
      if (idle()) setImmediate(() => idle() && settleMemory());
    });
  }

  private async run(req: GenerationRequest, queueMs: number): Promise<GenerationOutcome> {
    try {
      await this.prepare();
    } catch (e) {
      // A device lost while the ring was being wired (its loss not yet declared): once more, without it.
      if (this.closed) throw e;
      this.o.log(`placing the layers failed (${(e as Error).message}); trying again with the devices that answer`);
      await this.recoverRing();
    }
    let current = this.current!;
    req.onStart?.();
    const prompt = req.prompt;
    // What of the prompt the KV cache already holds (at least one token goes through the layers, for
    // logits); the request's journal records the rest, to be replayed after a failure.
    if (req.cacheScope !== this.cachedScope) this.journal = new KvJournal();
    const journal = this.journal;
    this.journal = new KvJournal(); // until the request ends well
    // sliding-window layers may hold too little of an older prefix to continue from it
    const pipeline = current.kind === "ring" ? current.ring.pipeline : current.pipeline;
    const continued = journal.continueWith(prompt, pipeline.resumable?.bind(pipeline));
    const cached = prompt.length - continued.rest.length;
    const started = performance.now();
    const ctrl = { tokens: 0, firstAt: null as number | null, startedAt: started };
    this.active = {
      controller: ctrl,
      state: { id: "", kind: req.kind, promptTokens: prompt.length, cachedTokens: cached, generatedTokens: 0, tokensPerS: null, timeToFirstTokenMs: null, startedUnixMs: Date.now() },
    };
    for (const d of this.devices.values()) if (d.state === "ready") d.state = "busy";
    this.headState = { state: "busy", detail: null };
    this.changed();
    const pressure = memoryPressureTracker();
    // Every token handed to the caller, across recoveries: a replay feeds them back as prompt.
    const emitted: number[] = [];
    let lostAt: number | null = null;
    /** When the last recovery's replay began (its ring placed): the pause's part that replays. */
    let replayFrom = 0;
    let lastTokenAt = performance.now();
    const parts: GenerationResult[] = [];
    let before: Promise<Awaited<ReturnType<Ring["statuses"]>> | undefined> | undefined;
    let meter!: DecodeMeter;
    let input = continued.rest;
    let startPos = continued.startPos;
    let replay = false;
    // A device that joins during the request is placed at the next token: the ring is re-placed and
    // the prompt and the tokens sent so far replayed, as after a loss (without counting as one).
    let arrivalsSeen = this.arrivals;
    let rejoining = false;
    try {
      for (let recoveries = 0; ; ) {
        const ring = current.kind === "ring" ? current.ring : undefined;
        meter = new DecodeMeter(ring ? ring.pipeline : (current as Extract<Current, { kind: "local" }>).pipeline, async () => {
          const read = ring ? ring.statuses(0).catch(() => undefined) : Promise.resolve(undefined);
          before = read;
          if (req.report) await read;
        });
        try {
          const left = req.maxTokens - emitted.length;
          if (left <= 0) break;
          if (replay) ({ startPos, input } = await replayJournal(journal, this.o.model, meter, [...prompt, ...emitted]));
          replay = false;
          parts.push(await generate(this.o.model, meter, input, {
            startPos, maxTokens: left, sampler: req.sampler, isEnd: req.isEnd, yieldEveryMs: YIELD_EVERY_MS, onPrompt: req.onPrompt && ((rows) => req.onPrompt!(rows, startPos)),
            journal, contextShift: req.contextShift,
            onShift: (keep, d, pos) => this.o.log(`context full: shifted the KV cache on every device (kept ${keep}, dropped ${d}, ${pos} left)`),
            onToken: (id) => {
              const now = performance.now();
              if (ctrl.firstAt === null) ctrl.firstAt = now;
              if (lostAt !== null) this.recovered(now - lostAt, now - replayFrom, input.length);
              lostAt = null;
              lastTokenAt = now;
              ctrl.tokens++;
              this.historyTokens++;
              emitted.push(id);
              if (req.signal?.aborted) return false;
              if (req.onToken(id) === false) return false;
              if (this.o.autoPlace && this.arrivals !== arrivalsSeen && emitted.length < req.maxTokens) {
                rejoining = true;
                return false;
              }
              return true;
            },
          }));
          if (!rejoining) break;
          rejoining = false;
          arrivalsSeen = this.arrivals;
          this.event("info", `placing the layers again for a device that joined during the request; replaying ${prompt.length + emitted.length} tokens`);
          await this.recoverRing();
          current = this.current!;
          replay = true;
        } catch (e) {
          const failure = await ring?.failureWithin();
          if (!failure || req.signal?.aborted || recoveries++ >= MAX_RECOVERIES) throw e;
          // A device or link of the ring failed mid-request: place the layers on the devices left,
          // rebuild their KV caches by replaying the prompt and every token sent so far, and go on.
          // The pause the client sees: from the last token before the loss to the next one.
          lostAt ??= lastTokenAt;
          this.event("info", `recovering the request: ${failure.message}; replaying ${prompt.length + emitted.length} tokens on the devices left`);
          arrivalsSeen = this.arrivals; // this placement takes every device there is
          await this.recoverRing();
          current = this.current!;
          replay = true;
          replayFrom = performance.now();
        }
      }
    } catch (e) {
      this.stats.failed++;
      this.finishActive();
      pressure.stop();
      this.markDirty();
      throw e;
    }
    pressure.stop();
    pressure.sample();
    const last = parts.at(-1);
    const result: GenerationResult = {
      ids: emitted, stopReason: last?.stopReason ?? "length", promptTokens: prompt.length - cached, promptMs: parts[0]?.promptMs ?? 0,
      decodeSteps: parts.reduce((a, r) => a + r.decodeSteps, 0), decodeMs: parts.reduce((a, r) => a + r.decodeMs, 0), endPos: last?.endPos ?? startPos,
      shifts: parts.reduce((a, r) => a + r.shifts, 0), discarded: parts.reduce((a, r) => a + r.discarded, 0),
    };
    // What went through the layers is in every device's KV cache: the next request may reuse it.
    this.journal = journal;
    this.cachedScope = req.cacheScope;
    const firstTokenMs = ctrl.firstAt === null ? null : ctrl.firstAt - started;
    this.stats.completed++;
    this.stats.generatedTokens += result.ids.length;
    this.stats.promptTokens += prompt.length;
    this.stats.cachedTokens += cached;
    if (firstTokenMs !== null) {
      this.stats.ttftMsSum += firstTokenMs;
      this.stats.ttftCount++;
    }
    this.stats.decodeMsSum += result.decodeMs;
    this.stats.decodeSteps += result.decodeSteps;
    const ring = current.kind === "ring" ? current.ring : undefined;
    const placement = this.placement;
    const measuring = (async () => {
      const rows = await this.measure(current, parts.length === 1 ? await before : undefined, pressure.pressure(), meter, result);
      // What streaming devices really reread at: the next plans price their rereads by it.
      if (placement && current.kind === "ring" && meter.decodeSteps > 0) {
        try {
          for (const line of recordRereads(placement, rows, this.rereads)) this.o.log(line);
        } catch (e) {
          this.o.log(`could not keep the devices' reread speeds: ${(e as Error).message}`);
        }
      }
      return rows;
    })();
    const perDevice = req.report ? await measuring : [];
    if (!req.report) measuring.catch((e: unknown) => this.o.log(`reading the devices' counters failed: ${(e as Error).message}`));
    this.finishActive();
    let prediction: PredictionReport | undefined;
    if (this.placement && meter.decodeSteps > 0) {
      const measured = new Map<number, MeasuredDevice>();
      for (const r of perDevice) {
        if (r.before || !ring) measured.set(r.haldaIndex, { computeMs: ring ? r.cost.computeMs : meter.meanDecodeMs, sendMs: r.cost.sendMs, descheduledMs: r.cost.descheduledMs, memPressure: r.status.memPressure });
      }
      prediction = predictionReport(this.placement, this.placement.labels, measured, meter.meanDecodeMs, meter.decodeSteps);
    }
    return {
      result, cachedTokens: cached, queueMs, firstTokenMs, devices: current.devices, cycles: this.planState?.cycles ?? 1,
      layersPerCycle: this.perCycle, placement: this.placement, perDevice, prediction,
      meanDecodeMs: meter.meanDecodeMs,
    };
  }

  /** Places the layers again after the ring failed mid-request. A device can fail to answer while
   * that happens (a dead one not yet declared lost): then once more, without it. */
  private async recoverRing(): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      try {
        await this.replace(true);
        return;
      } catch (e) {
        if (attempt >= MAX_RECOVERIES || this.closed) throw e;
        this.o.log(`re-placing the layers failed (${(e as Error).message}); trying again with the devices that answer`);
      }
    }
  }

  /** The workers that answer a status request within the limit: after a failure a silent one is not
   * waited for (the registry declares it lost, as its status limit does). */
  private async responsive(workers: readonly WorkerHandle[]): Promise<WorkerHandle[]> {
    // A device whose messages come late lately (starved by other work) gets as long as its lateness.
    const limitMs = (w: WorkerHandle) => Math.round(Math.max(RESPONSIVE_WITHIN_MS, 2 * w.recentGapMs));
    const answers = await Promise.all(workers.map((w) => w.status(limitMs(w)).then(() => true, () => false)));
    const silent = workers.filter((_, i) => !answers[i]);
    for (const w of silent) {
      this.o.log(`device ${w.label} did not answer within ${limitMs(w)} ms: leaving it out of this placement`);
    }
    return workers.filter((_, i) => answers[i]);
  }

  /** A request went on after a loss: how long the stream paused. */
  private recovered(pauseMs: number, replayMs: number, replayed: number): void {
    this.stats.recoveries++;
    this.stats.recoveryMsSum += pauseMs;
    this.stats.recoveryMsLast = pauseMs;
    this.event("recovered", `the request went on after a ${(pauseMs / 1000).toFixed(2)} s pause (${(replayMs / 1000).toFixed(2)} s of it replaying ${replayed} tokens)`);
  }


  /** Every device's counters after a request, per decode step when decoding was timed. */
  private async measure(current: Current, before: Awaited<ReturnType<Ring["statuses"]>> | undefined, headPressure: number, meter: DecodeMeter, result: GenerationResult): Promise<DeviceDecodeRow[]> {
    if (current.kind === "local") {
      const status = this.localStatus(current.pipeline, headPressure);
      const cost = { computeMs: meter.meanDecodeMs, waitMs: 0, sendMs: 0, descheduledMs: 0, majorFaults: 0, readBytes: 0 };
      this.headMeasured = { computeMs: cost.computeMs, waitMs: 0, sendMs: 0, majorFaultsPerToken: 0, tokens: meter.decodeSteps };
      this.headStatusSeen = status;
      return [{ id: HEAD_ID, label: `${HEAD_ID} (this coordinator)`, status, haldaIndex: 0, cost }];
    }
    const after = await current.ring.statuses(headPressure).catch(() => undefined);
    if (!after) return [];
    const workers = this.placedWorkers;
    const decodeOnly = meter.decodeSteps > 0 && before !== undefined;
    const steps = decodeOnly ? meter.decodeSteps : result.ids.length + result.promptTokens;
    return after.map((s) => {
      const b = decodeOnly ? before!.find((x) => x.id === s.id)?.status : undefined;
      const cost = costPerStep(b, s.status, steps);
      const info = this.devices.get(s.id);
      const measured: MeasuredMs = { computeMs: cost.computeMs, waitMs: cost.waitMs, sendMs: cost.sendMs, descheduledMs: cost.descheduledMs, majorFaultsPerToken: cost.majorFaults / Math.max(1, steps), tokens: steps };
      if (info) {
        info.measured = measured;
        info.lastStatus = s.status;
      } else if (s.id === HEAD_ID) {
        this.headMeasured = measured;
        this.headStatusSeen = s.status;
      }
      const haldaIndex = s.id === HEAD_ID ? 0 : workers.findIndex((w) => w.id === s.id) + 1; // placedWorkers: Halda's 1..n
      return { id: s.id, label: s.label, status: s.status, haldaIndex, before: b, cost };
    });
  }

  /** The head alone: one window of every layer. */
  private localStatus(pipeline: LocalPipeline, pressure: number): Status {
    const r = pipeline.window.residency();
    const base = headStatus(undefined, pressure);
    const L = this.o.model.nLayers;
    return { ...base, windows: [{ firstLayer: 0, endLayer: L, cycle: 0, residentBytes: r.residentBytes, totalBytes: r.totalBytes, frames: 0, tokens: 0, computeMs: 0, majorFaults: 0 }] };
  }

  private headMeasured: MeasuredMs | null = null;
  /** Devices' reread speeds seen in this cluster's rings, kept beside this device's profile. */
  private readonly rereads = new RereadStore(defaultCacheDir());
  private headSystem: SystemInfo | undefined;
  /** The state's model part: it never changes. */
  private modelState: ClusterState["model"] | undefined;
  private headStatusSeen: Status | null = null;

  private finishActive(): void {
    this.active = null;
    for (const d of this.devices.values()) if (d.state === "busy") d.state = "ready";
    this.headState = { state: "ready", detail: null };
    this.changed();
    // Devices came or went while the request ran (the settle timer found it busy): place them now.
    if (this.dirty) this.markDirty();
  }

  // ---- what the service shows ------------------------------------------------------------------

  /** Tokens/s, TTFT and the other counters /metrics exposes. */
  get counters(): Readonly<typeof this.stats> {
    return this.stats;
  }

  /** The ring can serve a request now (or will, once it re-places layers for the devices there are):
   * the model is loaded, this device measured, and --min-workers joined once (a device lost later does
   * not hold the service back: the ring goes on without it). */
  get ready(): boolean {
    return this.readiness().ok;
  }

  readiness(): { ok: boolean; status: string } {
    if (this.closed) return { ok: false, status: "stopping" };
    if (this.headState.state === "profiling" || this.clusterPort === 0) return { ok: false, status: this.headState.detail ?? "starting" };
    const live = this.registry.live().length, min = this.o.minWorkers ?? 0;
    if (live >= min) this.formed = true;
    if (!this.formed) return { ok: false, status: `waiting for workers (${live} of ${min} joined)` };
    return { ok: true, status: this.active || this.sequences?.scheduler.activeCount ? "generating" : this.dirty && (this.o.autoPlace ?? false) ? "re-placing layers" : "ready" };
  }

  private formed = false;

  private sampleHistory(): void {
    this.history.push({ unixMs: Date.now(), tokensPerS: this.historyTokens / (HISTORY_INTERVAL_MS / 1000) });
    this.historyTokens = 0;
    if (this.history.length > HISTORY_POINTS) this.history.shift();
    if (this.active || this.history.at(-2)?.tokensPerS) this.changed();
  }

  private activeState(): RequestState | null {
    if (this.sequences) return this.sequences.scheduler.activeState();
    if (!this.active) return null;
    const c = this.active.controller;
    const now = performance.now();
    const decodeS = c.firstAt === null ? 0 : (now - c.firstAt) / 1000;
    return {
      ...this.active.state, generatedTokens: c.tokens, timeToFirstTokenMs: c.firstAt === null ? null : c.firstAt - c.startedAt,
      tokensPerS: decodeS > 0 && c.tokens > 1 ? (c.tokens - 1) / decodeS : null,
    };
  }

  private windowStates(deviceId: string, status: Status | null): DeviceState["windows"] {
    const planned = this.planState?.windows.filter((w) => w.device === deviceId) ?? [];
    return planned.map((w) => {
      const s = status?.windows.find((x) => x.firstLayer === w.firstLayer && x.endLayer === w.endLayer);
      return { firstLayer: w.firstLayer, endLayer: w.endLayer, cycle: w.cycle, residentBytes: s ? Number(s.residentBytes) : null, totalBytes: s ? Number(s.totalBytes) : null };
    });
  }

  state(): ClusterState {
    const { model } = this.o;
    const workers = this.workersInOrder();
    const ringOrder = this.planState?.ringOrder ?? [];
    const predictedFor = (haldaIndex: number) => {
      const d = this.placement?.plan.devices.find((x) => x.index === haldaIndex);
      return d ? { ...d.latency } : null;
    };
    const setFor = (haldaIndex: number) => this.placement?.plan.devices.find((x) => x.index === haldaIndex)?.set ?? null;
    // Halda's device i is the placement's worker i - 1 (0 is the head).
    const haldaIndexOf = (w: WorkerHandle) => (this.placement && this.placedWorkers.includes(w) ? this.placedWorkers.indexOf(w) + 1 : -1);
    const deviceState = (id: string, name: string, address: string, isHead: boolean, info: DeviceInfo | null, report: Partial<DeviceReport> | undefined, haldaIndex: number, status: Status | null): DeviceState => {
      const d = report?.details, p = report?.profile;
      // Without a profile (layers placed by hand) the head still knows its own machine.
      const sys = d?.system ?? (isHead ? (this.headSystem ??= systemInfo()) : undefined);
      const pos = ringOrder.indexOf(id);
      return {
        id, name, address, isHead,
        state: isHead ? this.headState.state : info!.state,
        detail: isHead ? this.headState.detail : info!.detail,
        loadProgress: info?.progress ?? null,
        os: sys ? `${sys.os} ${sys.kernelRelease} (${sys.arch})` : p?.os ?? null,
        cpu: sys?.cpuModel ?? null,
        threads: d?.threads ?? (isHead ? this.o.model.threads : null),
        ramTotalBytes: status ? Number(status.memTotalBytes) : p?.ramTotalBytes ?? null,
        ramAvailableBytes: status ? Number(status.memAvailableBytes) : p?.ramAvailableBytes ?? null,
        anonRssBytes: status ? Number(status.anonRssBytes) : null,
        memPressure: status ? status.memPressure : null,
        diskReadBytesPerS: p?.diskSeqReadBytesPerS ?? null,
        gpu: { present: (d?.gpus?.length ?? 0) > 0, used: false, name: d?.gpus?.[0]?.name ?? null },
        ringPosition: pos >= 0 ? pos : null,
        set: haldaIndex >= 0 ? setFor(haldaIndex) : null,
        windows: this.windowStates(id, status),
        predicted: haldaIndex >= 0 ? predictedFor(haldaIndex) : null,
        measured: isHead ? this.headMeasured : info?.measured ?? null,
        joinedUnixMs: info?.joinedUnixMs ?? this.startedUnixMs,
      };
    };
    const readiness = this.readiness();
    const pressureSeen = this.headStatusSeen?.memPressure ?? 0;
    const headStatusNow = this.current?.kind === "local" ? this.localStatus(this.current.pipeline, pressureSeen) : headStatus(this.current?.ring.node, pressureSeen);
    const devices: DeviceState[] = [
      ...workers.flatMap((w) => {
        const info = this.devices.get(w.id);
        return info ? [deviceState(w.id, w.join.deviceName, w.dataHost, false, info, info.report, haldaIndexOf(w), info.lastStatus)] : [];
      }),
      deviceState(HEAD_ID, `${HEAD_ID} (this coordinator)`, "this machine", true, null, this.headReport, this.placement ? 0 : -1, headStatusNow),
      ...this.lost.map(({ handle: w, info }) => deviceState(w.id, w.join.deviceName, w.dataHost, false, info, info.report, -1, null)),
    ];
    const links = ringOrder.map((from, i) => {
      const to = ringOrder[(i + 1) % ringOrder.length];
      const w = workers.find((x) => x.id === to);
      const hi = w ? haldaIndexOf(w) : -1;
      const link = hi > 0 ? this.placement?.links[hi] : undefined;
      return { from, to, hopMs: link ? link.linkLatencyMs : null };
    }).filter((l) => ringOrder.length > 1 && l.from !== l.to);
    return {
      version: STATE_VERSION,
      cluster: this.o.name,
      model: (this.modelState ??= {
        // The name /v1/models lists (the file's), which the dashboard's chat sends back.
        name: basename(this.o.modelPath, extname(this.o.modelPath)), path: this.o.modelPath,
        architecture: metaString(model.gguf, "general.architecture") ?? "unknown", layers: model.nLayers, sizeBytes: model.desc.fileBytes,
        quantization: quantizationOf(model), fingerprint: this.fingerprint, contextTokens: this.o.ctx,
        kvCache: kvCacheState(model.desc.hparams, this.o.kvCacheTypes),
      }),
      server: {
        startedUnixMs: this.startedUnixMs, nowUnixMs: Date.now(), ready: readiness.ok,
        status: readiness.status,
        clusterPort: this.clusterPort,
      },
      plan: this.planState,
      devices,
      links,
      requests: {
        queueLength: this.waiting + (this.sequences?.scheduler.waiting ?? 0), active: this.activeState(),
        ...(this.sequences ? { slots: this.sequences.scheduler.slotStates() } : {}), completed: this.stats.completed, failed: this.stats.failed,
        generatedTokens: this.stats.generatedTokens, history: [...this.history],
      },
      events: [...this.events],
    };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.historyTimer);
    clearTimeout(this.settleTimer);
    for (const w of this.registry.live()) w.shutdown("the coordinator is stopping");
    await this.takeDown();
    await this.registry.close();
    await this.modelSource.close();
  }
}

/** The weight type holding most of the layers' bytes ("Q4_K"), or the two largest of a mix ("Q4_K + Q6_K"). */
function quantizationOf(model: LocalModel): string {
  const bytes = new Map<string, number>();
  for (const t of model.gguf.tensors) {
    if (!t.name.startsWith("blk.") || t.dims.length < 2) continue;
    const name = ggmlTypeName(t.type);
    bytes.set(name, (bytes.get(name) ?? 0) + rowBytes(t.type, t.dims[0]) * t.dims.slice(1).reduce((a, b) => a * b, 1));
  }
  const sorted = [...bytes.entries()].sort((a, b) => b[1] - a[1]).map(([n]) => n);
  return sorted.length === 0 ? "unknown" : sorted.slice(0, 2).join(" + ");
}
