// A request's run on the cluster's pipeline: the prefix of its prompt whose KV cache is already in
// place (PromptCache), the generation itself, and when a device of the ring fails mid-request (or,
// serving, one joins) the layers placed again and the prompt and every token sent so far replayed on
// the new ring, so the client's stream only pauses. What the request did goes into the counters.
import type { Status } from "../control/index.js";
import { KvJournal, generate, replayJournal, type ContextShift, type GenerationResult, type LocalModel, type LocalPipeline, type Pipeline, type Sampler } from "../engine/index.js";
import type { ClusterCounters } from "./metrics.js";
import type { RingPlan } from "./plan-ring.js";
import { DecodeMeter, type PredictionReport, type StepCost } from "./prediction.js";
import type { Ring } from "./ring-setup.js";
import type { EventState, RequestState } from "./state.js";

/** Re-placements one request may go through before it gives up. */
export const MAX_RECOVERIES = 3;
/** How often a generation lets the event loop run (streams flushed, clients and workers heard). */
const YIELD_EVERY_MS = 4;

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

/** What runs a request: the head alone, or a ring. */
export type Current =
  | { readonly kind: "local"; readonly pipeline: LocalPipeline; readonly devices: 1 }
  /** computeAtOnce: the devices that can compute at the same moment (coordinator/compute-sharing.ts). */
  | { readonly kind: "ring"; readonly ring: Ring; readonly devices: number; readonly computeAtOnce: number };

export type RingStatuses = Awaited<ReturnType<Ring["statuses"]>>;

/** What the cluster counts for every front door (/metrics). */
export class ServiceCounters implements ClusterCounters {
  completed = 0;
  failed = 0;
  generatedTokens = 0;
  promptTokens = 0;
  cachedTokens = 0;
  ttftMsSum = 0;
  ttftCount = 0;
  decodeMsSum = 0;
  decodeSteps = 0;
  lost = 0;
  replans = 0;
  recoveries = 0;
  recoveryMsSum = 0;
  recoveryMsLast = 0;
  /** Decode passes of parallel sequences, the rows they took, and the most in one. */
  batchSteps = 0;
  batchRows = 0;
  batchWidest = 0;
  batchInFlightMax = 0;

  /** A request finished: its prompt's tokens, those of them reused from the cache, and what it made. */
  finished(result: GenerationResult, promptTokens: number, cachedTokens: number, firstTokenMs: number | null): void {
    this.completed++;
    this.generatedTokens += result.ids.length;
    this.promptTokens += promptTokens;
    this.cachedTokens += cachedTokens;
    if (firstTokenMs !== null) {
      this.ttftMsSum += firstTokenMs;
      this.ttftCount++;
    }
    this.decodeMsSum += result.decodeMs;
    this.decodeSteps += result.decodeSteps;
  }

  /** A request went on after a loss: how long its stream paused. */
  recovered(pauseMs: number): void {
    this.recoveries++;
    this.recoveryMsSum += pauseMs;
    this.recoveryMsLast = pauseMs;
  }

  /** One decode pass of `rows` parallel sequences, begun while `inFlight` passes (itself too) ran. */
  batchStep(rows: number, inFlight: number): void {
    this.batchSteps++;
    this.batchRows += rows;
    this.batchWidest = Math.max(this.batchWidest, rows);
    this.batchInFlightMax = Math.max(this.batchInFlightMax, inFlight);
  }
}

/** Where a request starts: its journal (what the KV cache holds, engine/context-shift.ts), the
 * position its first token goes to and the prompt's tokens the cache does not hold. */
export interface RunStart {
  readonly journal: KvJournal;
  readonly startPos: number;
  readonly rest: Int32Array;
}

/** What the pipeline's KV cache holds (a journal, shifts included), and the scope of the request that
 * left it (GenerationRequest.cacheScope). */
export class PromptCache {
  private journal = new KvJournal();
  private scope: string | undefined;

  /** The request's start: the longest prefix of its prompt whose KV cache is in place for this scope (at
   * least one token goes through the layers, for logits; sliding-window layers may hold too little of an
   * older prefix to continue from it: `pipeline.resumable`). The cache is forgotten until the run ends
   * well (keep): the run overwrites it. */
  take(prompt: Int32Array, scope: string | undefined, pipeline: Pipeline): RunStart {
    if (scope !== this.scope) this.journal = new KvJournal();
    const journal = this.journal;
    this.journal = new KvJournal();
    return { journal, ...journal.continueWith(prompt, pipeline.resumable?.bind(pipeline)) };
  }

  keep(journal: KvJournal, scope: string | undefined): void {
    this.journal = journal;
    this.scope = scope;
  }

  clear(): void {
    this.journal = new KvJournal();
  }
}

/** What a run needs of the cluster. */
export interface RunHost {
  readonly model: LocalModel;
  /** serve: a device that joins during a request is placed at its next token. */
  readonly autoPlace: boolean;
  readonly counters: ServiceCounters;
  /** Devices that joined since the cluster started. */
  arrivals(): number;
  /** Places the layers again on the devices that answer; resolves with what runs them and where the
   * time went (Phases). */
  replace(): Promise<{ current: Current; placing: string }>;
  event(kind: EventState["kind"], message: string): void;
  log(line: string): void;
  /** A token went to the client (the state's tokens/s). */
  token(): void;
}

export class RequestRun {
  /** Every token handed to the caller, across recoveries: a replay feeds them back as prompt. */
  readonly emitted: number[] = [];
  private readonly startedAt = performance.now();
  private readonly startedUnixMs = Date.now();
  private firstAt: number | null = null;
  private lostAt: number | null = null;
  /** When the last recovery's replay began (its ring placed): the pause's part that replays. */
  private replayFrom = 0;
  /** The pause's parts before the replay: the loss found (detection) and the layers placed again. */
  private pauseParts = "";
  /** Tokens the last recovery replays (the prompt and every token sent before the loss). */
  private replayTokens = 0;
  private lastTokenAt = performance.now();
  private readonly parts: GenerationResult[] = [];
  private input: Int32Array;
  private startPos: number;
  /** The next pass replays the journal on a pipeline placed again (its KV caches empty). */
  private replaying = false;
  /** Prompt tokens whose KV cache was reused from the previous request. */
  readonly cached: number;
  /** What the KV cache holds, kept for the next request once this one ends well. */
  readonly journal: KvJournal;
  // A device that joins during the request is placed at the next token: the ring is re-placed and
  // the prompt and the tokens sent so far replayed, as after a loss (without counting as one).
  private arrivalsSeen: number;
  private rejoining = false;
  /** A pause to place a device that joined: from the token before it, with where its time went. */
  private joinPause: { readonly at: number; parts: string } | null = null;
  /** Times the decode steps of the pipeline last run. */
  meter!: DecodeMeter;
  private before: Promise<RingStatuses | undefined> | undefined;

  constructor(private readonly host: RunHost, private readonly req: GenerationRequest, start: RunStart) {
    this.journal = start.journal;
    this.input = start.rest;
    this.startPos = start.startPos;
    this.cached = req.prompt.length - start.rest.length;
    this.arrivalsSeen = host.arrivals();
  }

  get firstTokenMs(): number | null {
    return this.firstAt === null ? null : this.firstAt - this.startedAt;
  }

  /** The ring's counters as decoding started, where one pipeline ran the whole request. */
  get countersAtDecode(): Promise<RingStatuses | undefined> | undefined {
    return this.parts.length === 1 ? this.before : undefined;
  }

  /** The request as the state shows it while it runs. */
  state(): RequestState {
    const tokens = this.emitted.length;
    const decodeS = this.firstAt === null ? 0 : (performance.now() - this.firstAt) / 1000;
    return {
      id: "", kind: this.req.kind, promptTokens: this.req.prompt.length, cachedTokens: this.cached, generatedTokens: tokens,
      tokensPerS: decodeS > 0 && tokens > 1 ? (tokens - 1) / decodeS : null, timeToFirstTokenMs: this.firstTokenMs, startedUnixMs: this.startedUnixMs,
    };
  }

  /** Generates on `current`, placing the layers again and replaying after a device's loss or (serve) a
   * join; resolves with the whole generation and what ran its end. */
  async decode(current: Current): Promise<{ current: Current; result: GenerationResult }> {
    const { req } = this;
    for (let recoveries = 0; ; ) {
      const ring = current.kind === "ring" ? current.ring : undefined;
      this.meter = this.meterFor(current);
      try {
        const left = req.maxTokens - this.emitted.length;
        if (left <= 0) break;
        if (this.replaying) ({ startPos: this.startPos, input: this.input } = await replayJournal(this.journal, this.host.model, this.meter, [...req.prompt, ...this.emitted]));
        this.replaying = false;
        this.parts.push(await generate(this.host.model, this.meter, this.input, {
          startPos: this.startPos, maxTokens: left, sampler: req.sampler, isEnd: req.isEnd, yieldEveryMs: YIELD_EVERY_MS,
          onPrompt: req.onPrompt && ((rows) => req.onPrompt!(rows, this.startPos)),
          journal: this.journal, contextShift: req.contextShift,
          onShift: (keep, d, pos) => this.host.log(req.contextShift?.h2o !== undefined
            ? `context full: evicted by H2O on every device (the first ${keep}, the most recent and the most attended kept, ${d} dropped, ${pos} left)`
            : `context full: shifted the KV cache on every device (kept ${keep}, dropped ${d}, ${pos} left)`),
          onToken: (id) => this.onToken(id),
        }));
        if (!this.rejoining) break;
        this.rejoining = false;
        this.arrivalsSeen = this.host.arrivals();
        this.replayTokens = req.prompt.length + this.emitted.length;
        this.host.event("info", `placing the layers again for a device that joined during the request; replaying ${this.replayTokens} tokens`);
        this.joinPause = { at: this.lastTokenAt, parts: "" };
        const placed = await this.replay();
        current = placed.current;
        this.replayFrom = performance.now();
        this.joinPause.parts = placed.placing;
      } catch (e) {
        // A loss while a device that joined was placed or replayed for: that work, cut short, is part of
        // the recovery's pause (which counts from the same token), not its detection.
        const joinCut = this.joinPause;
        this.joinPause = null;
        const failure = await ring?.failureWithin();
        if (!failure || req.signal?.aborted || recoveries++ >= MAX_RECOVERIES) throw e;
        // A device or link of the ring failed mid-request: place the layers on the devices left,
        // rebuild their KV caches by replaying the prompt and every token sent so far, and go on.
        // The pause the client sees: from the last token before the loss to the next one.
        const firstLoss = this.lostAt === null;
        this.lostAt ??= this.lastTokenAt;
        const detectedAt = performance.now();
        this.replayTokens = req.prompt.length + this.emitted.length;
        this.host.event("info", `recovering the request: ${failure.message}; replaying ${this.replayTokens} tokens on the devices left`);
        this.arrivalsSeen = this.host.arrivals(); // this placement takes every device there is
        const placed = await this.replay();
        current = placed.current;
        this.replayFrom = performance.now();
        // A second loss before the first token: its parts follow the first's.
        const found = joinCut
          ? `placing a device that joined and replaying until the loss was found ${((detectedAt - joinCut.at) / 1000).toFixed(2)} s`
          : `detection ${((detectedAt - this.lostAt) / 1000).toFixed(2)} s`;
        const parts = `${firstLoss ? "" : `${this.pauseParts}; then `}${found}, ${placed.placing}`;
        this.pauseParts = parts;
      }
    }
    return { current, result: this.result() };
  }

  /** A pipeline that reads every device's counters as decoding starts (run's report waits for them). */
  private meterFor(current: Current): DecodeMeter {
    const ring = current.kind === "ring" ? current.ring : undefined;
    return new DecodeMeter(ring ? ring.pipeline : (current as Extract<Current, { kind: "local" }>).pipeline, async () => {
      const read = ring ? ring.statuses(0).catch(() => undefined) : Promise.resolve(undefined);
      this.before = read;
      if (this.req.report) await read;
    });
  }

  private async replay(): Promise<{ current: Current; placing: string }> {
    const placed = await this.host.replace();
    this.replaying = true;
    return placed;
  }

  /** Each token on its way to the client; false stops the generation. */
  private onToken(id: number): boolean {
    const now = performance.now();
    if (this.firstAt === null) this.firstAt = now;
    if (this.lostAt !== null) this.recovered(now - this.lostAt, now - this.replayFrom);
    else if (this.joinPause) {
      this.host.event("info", `the request went on after a ${((now - this.joinPause.at) / 1000).toFixed(2)} s pause to place a device that joined ` +
        `(${((now - this.replayFrom) / 1000).toFixed(2)} s of it replaying ${this.replayTokens} tokens; ${this.joinPause.parts})`);
    }
    this.lostAt = null;
    this.joinPause = null;
    this.lastTokenAt = now;
    this.host.token();
    this.emitted.push(id);
    if (this.req.signal?.aborted) return false;
    if (this.req.onToken(id) === false) return false;
    if (this.host.autoPlace && this.host.arrivals() !== this.arrivalsSeen && this.emitted.length < this.req.maxTokens) {
      this.rejoining = true;
      return false;
    }
    return true;
  }

  private recovered(pauseMs: number, replayMs: number): void {
    this.host.counters.recovered(pauseMs);
    this.host.event("recovered", `the request went on after a ${(pauseMs / 1000).toFixed(2)} s pause (${(replayMs / 1000).toFixed(2)} s of it replaying ${this.replayTokens} tokens; ${this.pauseParts})`);
  }

  private result(): GenerationResult {
    const { parts } = this;
    const last = parts.at(-1);
    return {
      ids: this.emitted, stopReason: last?.stopReason ?? "length", promptTokens: this.req.prompt.length - this.cached, promptMs: parts[0]?.promptMs ?? 0,
      decodeSteps: parts.reduce((a, r) => a + r.decodeSteps, 0), decodeMs: parts.reduce((a, r) => a + r.decodeMs, 0), endPos: last?.endPos ?? this.startPos,
      shifts: parts.reduce((a, r) => a + r.shifts, 0), discarded: parts.reduce((a, r) => a + r.discarded, 0),
    };
  }
}
