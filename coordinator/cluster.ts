// The long-lived cluster that `serve`, `chat` and `run` share: the worker registry, the head's model,
// the pipeline now (a ring, or the head alone), and when to place the layers again: after devices
// joined or left, between requests, never in the middle of one (but for a request recovering from a
// loss). Its rooms: devices.ts (the device records), queue.ts (one task at a time), request-run.ts (a
// request's run, its replay after a loss, its counters), run-outcome.ts (what a run cost), placing.ts
// (how the layers are placed), head-device.ts (this device's profile, what workers join),
// parallel-service.ts (serve --parallel's slots), cluster-state.ts (the state, from a snapshot) and
// activity.ts (events and tokens/s over time).
import { EventEmitter } from "node:events";
import { basename, extname } from "node:path";
import type { LocalModel } from "../engine/index.js";
import { modelFingerprint } from "../model/index.js";
import { defaultCacheDir, memoryPressureTracker, settleMemory, systemInfo, RereadStore, RingPassStore, type DeviceReport, type SystemInfo } from "../profiler/index.js";
import { seatsOf, type Seat } from "./placement.js";
import type { RingPlan } from "./plan-ring.js";
import { measuredOutcome } from "./run-outcome.js";
import type { ModelSource } from "../transfer/index.js";
import type { WorkerHandle, WorkerRegistry } from "./registry.js";
import { profileHead, sayJoinCommand, workerSide } from "./head-device.js";
import { TrustStore } from "../trust/index.js";
import { aloneStatus, headStatus } from "./ring-setup.js";
import { answering, headMemoryNow, placeLayers, placeRetrying } from "./placing.js";
import { Activity, HISTORY_INTERVAL_MS } from "./activity.js";
import type { ClusterOptions } from "./cluster-options.js";
import { DeviceRecords } from "./devices.js";
import { RequestQueue } from "./queue.js";
import { Phases } from "./phases.js";
import {
  PromptCache, RequestRun, ServiceCounters, MAX_RECOVERIES, type Current, type GenerationOutcome, type GenerationRequest, type RunHost,
} from "./request-run.js";
import { clusterState, modelState } from "./cluster-state.js";
import type { SlotState } from "./parallel.js";
import { ParallelSequences } from "./parallel-service.js";
import type { ClusterState, EventState, PlanState, RequestState } from "./state.js";

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
  /** The devices the current placement was made for: the workers in ring order, then the head. */
  private seats: readonly Seat[] = [];
  private generation = 0;
  private dirty = true;
  /** Devices that joined since the cluster started: a request that sees this grow places the layers
   * again at its next token (autoPlace), rather than leaving the newcomer idle until the next request. */
  private arrivals = 0;
  private clusterPort = 0;
  private readonly devices = new DeviceRecords(() => this.changed());
  private readonly activity = new Activity();
  private readonly promptCache = new PromptCache();
  private readonly queue = new RequestQueue(() => this.changed());
  private active: RequestRun | null = null;
  private readonly stats = new ServiceCounters();
  /** serve --parallel N > 1: the sequence slots, opened with the local pipeline (parallel-service.ts). */
  private readonly sequences: ParallelSequences | undefined;
  private readonly historyTimer: NodeJS.Timeout;
  /** Devices' reread speeds seen in this cluster's rings, kept beside this device's profile. */
  private readonly rereads = new RereadStore(defaultCacheDir());
  private readonly passes = new RingPassStore(defaultCacheDir());
  private headSystem: SystemInfo | undefined;
  /** The state's model part: it never changes. */
  private modelState: ClusterState["model"] | undefined;
  /** --min-workers joined once: the service is ready from then on. */
  private formed = false;
  private settleTimer: NodeJS.Timeout | undefined;
  private closed = false;

  constructor(readonly o: ClusterOptions) {
    super();
    this.fingerprint = modelFingerprint(o.model.gguf);
    const trust = () => {
      if (!this.trustStore) throw new Error("the cluster's identity is opened by start()");
      return this.trustStore;
    };
    ({ modelSource: this.modelSource, registry: this.registry } = workerSide(o, this.fingerprint, trust));
    this.registry.on("joined", (w: WorkerHandle) => this.onJoined(w));
    this.registry.on("lost", (w: WorkerHandle, reason: string) => this.onLost(w, reason));
    this.sequences = (o.parallel ?? 1) > 1 ? new ParallelSequences({
      ...o, parallel: o.parallel!, maxQueue: this.maxQueue, counters: this.stats, token: () => this.activity.token(), changed: () => this.changed(),
      closing: () => this.closed, idle: () => this.dirty && this.markDirty(), recover: () => this.recoverSequences(),
    }) : undefined;
    this.historyTimer = setInterval(() => this.sampleHistory(), HISTORY_INTERVAL_MS);
    this.historyTimer.unref();
  }

  /** Measures this device (or reads its cached profile) unless the layers are placed by hand, then
   * listens for workers. Resolves with the cluster port. Profiling comes first so that on one machine
   * it never competes with a worker's. */
  async start(port: number, host = "0.0.0.0"): Promise<number> {
    if (this.o.layerWindows === undefined) {
      this.devices.head = { state: "profiling", detail: "measuring this device" };
      this.headReport = await profileHead(this.o, false);
    }
    this.devices.head = { state: "ready", detail: null };
    this.trustStore = await TrustStore.open(this.o.name, { rotate: this.o.rotateToken });
    this.clusterPort = await this.registry.listen(port, host);
    sayJoinCommand(this.o, this.trustStore, this.clusterPort);
    this.changed();
    return this.clusterPort;
  }

  get port(): number {
    return this.clusterPort;
  }

  get model(): LocalModel {
    return this.o.model;
  }

  /** Requests waiting for the ring (not counting the running one). */
  get queueLength(): number {
    return this.queue.waiting;
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
    this.devices.joined(w);
    this.event("joined", `device ${w.label} joined`);
    this.arrivals++;
    // The handshakes' garbage is freed now, while no window runs (memory readings show the live set).
    if (!this.active) setImmediate(settleMemory);
    this.markDirty();
  }

  private onLost(w: WorkerHandle, reason: string): void {
    this.devices.gone(w, reason);
    this.stats.lost++;
    this.event("lost", `device ${w.label} lost: ${reason}`);
    if (this.current?.kind === "ring" && this.current.ring.spec.members.some((m) => m.worker === w)) this.promptCache.clear();
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
      if (this.dirty && enough && !this.active && !this.sequences?.busy && this.queue.waiting === 0 && !this.closed) {
        this.queue.exclusive(() => this.prepare()).catch((e: unknown) => this.o.log(`placing layers failed: ${(e as Error).message}`));
      }
    }, REPLAN_SETTLE_MS);
    this.settleTimer.unref();
  }

  private event(kind: EventState["kind"], message: string): void {
    this.activity.event(kind, message);
    this.changed();
  }

  private changed(): void {
    this.emit("change");
  }

  // ---- placing layers --------------------------------------------------------------------------

  /** Makes sure the pipeline matches the devices there are now (inside exclusive()). */
  async prepare(): Promise<void> {
    const broken = this.current?.kind === "ring" && this.current.ring.failure !== undefined;
    // re-placing would close sequence slots that are decoding: devices that came wait until they are idle
    if (this.sequences?.busy && this.current && !broken) return this.devices.leaveOutJoining(this.sequences.joinRefusal);
    if (!this.dirty && this.current && !broken) return;
    await this.replace(false);
  }

  /** Takes the ring down and places the layers on the devices there are now. When recovering, layers
   * placed by hand that name a device no longer there are spread evenly over the devices left. */
  private async replace(recovering: boolean, phases = new Phases()): Promise<void> {
    if (this.closed) throw new Error("the cluster is shutting down");
    this.dirty = false;
    await phases.time("take-down", () => this.takeDown());
    try {
      await this.place(recovering, phases);
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
    this.promptCache.clear();
    await this.sequences?.close();
    if (c?.kind === "local") c.pipeline.close();
    if (c?.kind === "ring") await c.ring.close();
  }

  private async place(recovering = false, phases = new Phases()): Promise<void> {
    // A recovery asks who answers and plans from their answers; the head reads its memory meanwhile.
    let headNow: DeviceReport | undefined;
    const settle = async () => void (headNow = await headMemoryNow(this.headReport!, this.o.modelPath, this.o.model.gguf.fileBytes, phases));
    const halda = this.headReport !== undefined && this.o.layerWindows === undefined;
    const answered = recovering ? await phases.time("answering", () => answering(this.workersInOrder(), this.o.log, halda ? settle : undefined)) : undefined;
    const workers = answered?.workers ?? this.workersInOrder();
    const seats = (this.seats = seatsOf(workers));
    const generation = ++this.generation;
    this.placement = undefined;
    const placed = await placeLayers({
      o: this.o, fingerprint: this.fingerprint, registry: this.registry, modelSource: this.modelSource, rereads: this.rereads, passes: this.passes, devices: this.devices,
      workers, seats, recovering, generation, headReport: headNow ?? this.headReport, phases, statuses: headNow ? answered?.statuses : undefined,
      retimeHead: async () => (this.headReport = await profileHead(this.o, true)),
      onBroken: (e) => {
        this.event("error", `the ring broke: ${e.message}`);
        this.markDirty();
      },
    });
    this.sequences?.openBeside(placed.current);
    ({ current: this.current, placement: this.placement, planState: this.planState, perCycle: this.perCycle } = placed);
    this.event("replan", placed.said);
  }

  /** Places layers now if the devices changed (serve calls this when it starts and after joins). */
  async ensurePlaced(): Promise<void> {
    await this.queue.exclusive(() => this.prepare());
  }

  // ---- requests --------------------------------------------------------------------------------

  /** serve --parallel: a pass failed; when the ring broke, placed again (the slots replay on it). */
  private async recoverSequences(): Promise<boolean> {
    if (this.current?.kind !== "ring" || !(await this.current.ring.failureWithin()) || this.closed) return false;
    await this.recoverRing();
    return true;
  }

  get parallel(): number {
    return this.o.parallel ?? 1;
  }

  /** The sequence slots (serve --parallel N > 1), else undefined. */
  slotStates(): SlotState[] | undefined {
    return this.sequences?.slotStates();
  }

  /** Queues a generation; it runs when the requests before it are done. */
  generate(req: GenerationRequest): Promise<GenerationOutcome> {
    if (this.closed) return Promise.reject(new Error("the server is shutting down"));
    // serve --parallel: a request takes a sequence slot and decodes beside the others
    const seqs = this.sequences;
    // (devices came since the slots opened: placed first unless a sequence decodes, as a lone request is)
    if (seqs) return (seqs.opened && !this.dirty ? Promise.resolve() : this.queue.exclusive(() => this.prepare())).then(() => seqs.submit(req));
    return this.queue.enqueue(this.maxQueue, this.active !== null, req.signal, (queueMs) => this.run(req, queueMs)).finally(() => {
      // Nothing waiting: hand back what the request's traffic grew (V8's young generation can reach
      // tens of MiB), memory the plan gave the windows (profiler's settleMemory, ~15 ms).
      const idle = () => !this.active && this.queue.waiting === 0 && !this.closed;
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
    req.onStart?.();
    const placed = this.current!;
    const run = new RequestRun(this.runHost(), req, this.promptCache.take(req.prompt, req.cacheScope, placed.kind === "ring" ? placed.ring.pipeline : placed.pipeline));
    this.active = run;
    this.devices.busy();
    this.changed();
    const pressure = memoryPressureTracker();
    let decoded: Awaited<ReturnType<RequestRun["decode"]>>;
    try {
      decoded = await run.decode(this.current!);
    } catch (e) {
      this.stats.failed++;
      this.finishActive();
      pressure.stop();
      this.markDirty();
      throw e;
    }
    pressure.stop();
    pressure.sample();
    const { current, result } = decoded;
    // What went through the layers is in every device's KV cache: the next request may reuse it.
    this.promptCache.keep(run.journal, req.cacheScope);
    this.stats.finished(result, req.prompt.length, run.cached, run.firstTokenMs);
    const outcome = await measuredOutcome({
      current, run, headPressure: pressure.pressure(), result, report: req.report ?? false, seats: this.seats, devices: this.devices,
      placement: this.placement, rereads: this.rereads, passes: this.passes, nLayers: this.o.model.nLayers, log: this.o.log,
      queueMs, cycles: this.planState?.cycles ?? 1, perCycle: this.perCycle,
    });
    this.finishActive();
    return outcome;
  }

  /** What a request's run needs of the cluster. */
  private runHost(): RunHost {
    return {
      model: this.o.model, autoPlace: this.o.autoPlace ?? false, counters: this.stats, arrivals: () => this.arrivals,
      replace: async () => {
        const placing = await this.recoverRing();
        return { current: this.current!, placing };
      },
      event: (kind, message) => this.event(kind, message), log: (line) => this.o.log(line), token: () => this.activity.token(),
    };
  }

  /** Places the layers again after the ring failed mid-request (once more without a device that
   * fails to answer meanwhile, a dead one not yet declared lost). Resolves with where the time went
   * (Phases), for the request's recovered event. */
  private async recoverRing(): Promise<string> {
    const phases = new Phases();
    await placeRetrying(() => this.replace(true, phases), MAX_RECOVERIES, () => this.closed, this.o.log);
    const said = `re-placing ${(phases.elapsedMs / 1000).toFixed(2)} s: ${phases}`;
    this.o.log(`the layers were placed again for a waiting request: ${said}`);
    return said;
  }

  private finishActive(): void {
    this.active = null;
    this.devices.idle();
    this.changed();
    // Devices came or went while the request ran (the settle timer found it busy): place them now.
    if (this.dirty) this.markDirty();
  }

  // ---- what the service shows ------------------------------------------------------------------

  /** Tokens/s, TTFT and the other counters /metrics exposes. */
  get counters(): Readonly<ServiceCounters> {
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
    if (this.devices.head.state === "profiling" || this.clusterPort === 0) return { ok: false, status: this.devices.head.detail ?? "starting" };
    const live = this.registry.live().length, min = this.o.minWorkers ?? 0;
    if (live >= min) this.formed = true;
    if (!this.formed) return { ok: false, status: `waiting for workers (${live} of ${min} joined)` };
    return { ok: true, status: this.active || this.sequences?.activeCount ? "generating" : this.dirty && (this.o.autoPlace ?? false) ? "re-placing layers" : "ready" };
  }

  private sampleHistory(): void {
    if (this.activity.sample() || this.active) this.changed();
  }

  private activeState(): RequestState | null {
    if (this.sequences) return this.sequences.activeState();
    return this.active?.state() ?? null;
  }

  state(): ClusterState {
    const readiness = this.readiness();
    const pressureSeen = this.devices.headStatusSeen?.memPressure ?? 0;
    const headStatusNow = this.current?.kind === "local" ? aloneStatus(this.current.pipeline, this.o.model.nLayers, pressureSeen) : headStatus(this.current?.ring.node, pressureSeen);
    return clusterState({
      cluster: this.o.name,
      model: (this.modelState ??= modelState(this.o.model, this.o.modelPath, basename(this.o.modelPath, extname(this.o.modelPath)), this.fingerprint, this.o.ctx, this.o.kvCacheTypes, this.parallel)),
      server: { startedUnixMs: this.startedUnixMs, nowUnixMs: Date.now(), ready: readiness.ok, status: readiness.status, clusterPort: this.clusterPort },
      plan: this.planState, placement: this.placement, seats: this.seats, workers: this.workersInOrder(), devices: this.devices,
      head: { report: this.headReport, system: (this.headSystem ??= systemInfo()), threads: this.o.model.threads, status: headStatusNow, joinedUnixMs: this.startedUnixMs },
      requests: {
        queueLength: this.queue.waiting + (this.sequences?.waiting ?? 0), active: this.activeState(),
        ...(this.sequences?.opened ? { slots: this.sequences.slotStates() } : {}), completed: this.stats.completed, failed: this.stats.failed,
        generatedTokens: this.stats.generatedTokens, history: [...this.activity.history],
      },
      events: this.activity.events,
    });
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
