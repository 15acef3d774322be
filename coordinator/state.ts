// What the service shows of itself: the JSON of `GET /api/state`, its push stream, `prima-coord status
// --json` and the dashboard all use this one shape. Units are in the field names; strings from devices
// and files are raw here (the page and the terminal escape them where they show them).

export const STATE_VERSION = 1;

export type DeviceStateName = "joining" | "profiling" | "loading" | "ready" | "busy" | "lost" | "left-out";

export interface WindowState {
  readonly firstLayer: number;
  /** Exclusive. */
  readonly endLayer: number;
  readonly cycle: number;
  /** Bytes of the window's weights in the page cache, out of totalBytes (null: not read yet). */
  readonly residentBytes: number | null;
  readonly totalBytes: number | null;
  /** A MoE window's experts (one per layer and expert) wholly in memory, of all of them (null: not read
   * yet, or a dense window). */
  readonly expertsResident?: number | null;
  readonly expertsTotal?: number | null;
}

/** Milliseconds per generated token, by where they go. */
export interface PredictedMs {
  readonly computeMs: number;
  readonly memoryMs: number;
  /** Re-reading weights that do not fit in RAM from disk, every token. */
  readonly diskMs: number;
  readonly commMs: number;
  readonly totalMs: number;
}

export interface MeasuredMs {
  readonly computeMs: number;
  readonly waitMs: number;
  readonly sendMs: number;
  /** Of computeMs and sendMs: the device's thread preempted (Status.descheduledMs). */
  readonly descheduledMs?: number;
  /** Major page faults per token (weights read from disk). */
  readonly majorFaultsPerToken: number;
  /** Over how many decode steps. */
  readonly tokens: number;
}

export interface DeviceState {
  /** "head" for the coordinator's own device; w1, w2... for workers (stable while joined). */
  readonly id: string;
  readonly name: string;
  readonly address: string;
  readonly isHead: boolean;
  readonly state: DeviceStateName;
  /** Why it is lost or left out, or what it is doing ("paging in its first window"). */
  readonly detail: string | null;
  /** 0..1 while loading. */
  readonly loadProgress: number | null;
  readonly os: string | null;
  readonly cpu: string | null;
  readonly threads: number | null;
  readonly ramTotalBytes: number | null;
  readonly ramAvailableBytes: number | null;
  readonly anonRssBytes: number | null;
  /** Largest drop of available memory in the last run, as a fraction of the total. */
  readonly memPressure: number | null;
  readonly diskReadBytesPerS: number | null;
  readonly gpu: { readonly present: boolean; readonly used: boolean; readonly name: string | null };
  /** Position in the ring (0 = first after the head), null when not in the ring. */
  readonly ringPosition: number | null;
  /** Halda's memory set: M1..M4 (M3: its window does not fit in RAM and streams from disk each token). */
  readonly set: string | null;
  readonly windows: readonly WindowState[];
  readonly predicted: PredictedMs | null;
  readonly measured: MeasuredMs | null;
  readonly joinedUnixMs: number;
}

export interface PlanState {
  /** Increases with every re-plan. */
  readonly generation: number;
  readonly planner: string;
  /** k: times a token goes around the ring. */
  readonly cycles: number;
  /** Device ids in ring order; the head is last. */
  readonly ringOrder: readonly string[];
  /** Layers per cycle, in ring order. */
  readonly layersPerCycle: readonly number[];
  readonly predictedMsPerToken: number | null;
  /** Every window of the plan: each layer appears exactly once per cycle. */
  readonly windows: readonly { readonly device: string; readonly firstLayer: number; readonly endLayer: number; readonly cycle: number }[];
  /** Devices that hold no layers, and why. */
  readonly leftOut: readonly { readonly device: string; readonly reason: string }[];
  readonly notes: readonly string[];
  readonly madeUnixMs: number;
}

export interface LinkState {
  readonly from: string;
  readonly to: string;
  /** Measured one-way time of one token's activations, when known. */
  readonly hopMs: number | null;
}

export interface RequestState {
  readonly id: string;
  readonly kind: "chat" | "completion";
  readonly promptTokens: number;
  /** Of the prompt, tokens whose KV was reused from the previous request. */
  readonly cachedTokens: number;
  readonly generatedTokens: number;
  readonly tokensPerS: number | null;
  readonly timeToFirstTokenMs: number | null;
  readonly startedUnixMs: number;
}

export interface EventState {
  readonly unixMs: number;
  readonly kind: "joined" | "lost" | "left" | "replan" | "recovered" | "error" | "info";
  readonly message: string;
}

export interface ClusterState {
  readonly version: number;
  readonly cluster: string;
  readonly model: {
    readonly name: string;
    readonly path: string;
    readonly architecture: string;
    readonly layers: number;
    readonly sizeBytes: number;
    readonly quantization: string;
    readonly fingerprint: string;
    readonly contextTokens: number;
    /** The KV cache's types and its bytes per token of context over every layer (model/kv-cache.ts). */
    readonly kvCache?: {
      readonly typeK: string; readonly typeV: string; readonly bytesPerToken: number; readonly attention?: string;
      /** serve --parallel N > 1: every device holds N caches of the context (absent: one). */
      readonly sequenceSlots?: number;
    };
  };
  readonly server: {
    readonly startedUnixMs: number;
    readonly nowUnixMs: number;
    /** The ring can serve (what /health says). */
    readonly ready: boolean;
    readonly status: string;
    readonly clusterPort: number;
  };
  readonly plan: PlanState | null;
  readonly devices: readonly DeviceState[];
  readonly links: readonly LinkState[];
  readonly requests: {
    readonly queueLength: number;
    readonly active: RequestState | null;
    /** serve --parallel N > 1: its sequence slots (absent otherwise). */
    readonly slots?: readonly SlotState[];
    readonly completed: number;
    readonly failed: number;
    readonly generatedTokens: number;
    /** Decode tokens/s, one point every few seconds over the last minutes. */
    readonly history: readonly { readonly unixMs: number; readonly tokensPerS: number }[];
  };
  /** The latest events, newest last: joins, losses, re-plans, recoveries. */
  readonly events: readonly EventState[];
}

/** A sequence slot of serve --parallel: a KV cache of nCtx tokens that one request at a time decodes in. */
export interface SlotState {
  readonly id: number;
  readonly state: "idle" | "processing";
  readonly nCtx: number;
  /** Tokens its KV cache holds (a request's cached prefix comes from them). */
  readonly cachedTokens: number;
  readonly request: RequestState | null;
}
