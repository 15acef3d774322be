// Wiring one ring: the head's node and pipeline, each member's assignment, the links between them,
// and the naming of whatever fails. A Ring lives until the set of devices changes (serve) or the run
// ends (run); placing layers is placement.ts's business, using the ring cluster.ts's.
import { randomBytes, randomUUID } from "node:crypto";
import type { ChunkHash, Status } from "../control/index.js";
import type { KvCacheTypes, LocalModel, LocalPipeline } from "../engine/index.js";
import { attentionSpec } from "../model/index.js";
import { WeightRoom, anonRssBytes, deviceMemory, storageReadBytes } from "../profiler/index.js";
import {
  RingListener, RingNode, RingPipeline, dialSuccessor, expertPrefetchStatus, type NodeStats, type RingLink, type WindowSpec,
} from "../ring/index.js";
import type { WorkerHandle, WorkerRegistry } from "./registry.js";
import { Phases } from "./phases.js";

/** How long to wait for the session loss that usually follows a neighbour's link failure. */
const FAILURE_GRACE_MS = 300;
export const HEAD_ID = "head";

export interface RingMember {
  readonly worker: WorkerHandle;
  readonly windows: readonly WindowSpec[];
  readonly releaseAfterUse: boolean;
  /** It reads its next window ahead while the others compute (coordinator/prefetch-choice.ts). */
  readonly prefetch: boolean;
}

export interface RingSpec {
  /** Workers that hold layers, in ring order; the head closes the ring after them. */
  readonly members: readonly RingMember[];
  readonly headWindows: readonly WindowSpec[];
  readonly headReleaseAfterUse: boolean;
  readonly cycles: number;
  readonly ctx: number;
  readonly maxBatch: number;
  /** The KV cache's types, the head's and every member's (their Assignment's cacheTypeK/V). */
  readonly kvCacheTypes?: KvCacheTypes;
  /** Sequence slots (serve --parallel): every device holds a KV cache per slot for each window. */
  readonly seqSlots?: number;
  /** The head reads its next window ahead (RingMember.prefetch). */
  readonly headPrefetch: boolean;
  /** The head's own MoE windows predict and advise their experts (a worker decides for itself). */
  readonly expertPrefetch?: boolean;
}

export interface RingOptions {
  readonly model: LocalModel;
  readonly fingerprint: string;
  readonly registry: WorkerRegistry;
  readonly log: (line: string) => void;
  /** The coordinator's hashes of the chunks holding these layers: each member checks its copy of
   * the weights against them before it reports Ready (worker/weights.ts). */
  readonly weights?: (layers: number[]) => Promise<{ chunkBytes: number; chunks: ChunkHash[] }>;
  /** Assignment progress of a member (0..1 and what it is doing). */
  readonly onProgress?: (worker: WorkerHandle, fraction: number, stage: string) => void;
  /** The ring broke (a device or link failed); the error names the device. Called once. */
  readonly onBroken?: (e: Error) => void;
  /** Where wiring's time goes (window hashes, assignments, the dial). */
  readonly phases?: Phases;
  /** Run once every member has its assignment, while they set their windows up. */
  readonly whileAssigning?: () => void;
}

/** Rewrites the ring links' names for their peers (`successor "w2" (ws://10.0.0.2:9000)`, by ring id)
 * as the devices the user knows (`successor device w2 "bravo" (10.0.0.2)`), for the ring's members. */
export function namePeerDevices(text: string, devices: readonly { id: string; label: string }[]): string {
  return text.replace(/\b(successor|predecessor) "([^"]*)" \([^)]*\)/g, (whole, role: string, id: string) => {
    const d = devices.find((x) => x.id === id);
    return d ? `${role} device ${d.label}` : whole;
  });
}

/** A device's Status for the head, in the workers' shape. */
export function headStatus(node: RingNode | undefined, pressure: number): Status {
  const s: NodeStats | undefined = node?.statsSnapshot();
  const mem = deviceMemory();
  return {
    windows: (s?.windows ?? []).map((w, i) => {
      const r = node!.windows[i].residency();
      return { ...w, residentBytes: r.residentBytes, totalBytes: r.totalBytes, ...node!.windows[i].expertResidency(), ...expertPrefetchStatus(node!.windows[i]) };
    }),
    waitMs: s?.waitMs ?? 0, sendMs: s?.sendMs ?? 0, descheduledMs: s?.descheduledMs ?? 0, frames: s?.frames ?? 0, anonRssBytes: anonRssBytes(), readBytes: storageReadBytes(), memTotalBytes: mem.totalBytes,
    memAvailableBytes: mem.availableBytes, memPressure: pressure, layerRoomBytes: 0,
  };
}

export class Ring {
  readonly ringId = randomUUID();
  readonly pipeline: RingPipeline;
  readonly node: RingNode;
  private link: RingLink | undefined;
  private listener: RingListener | undefined;
  private failures: { error: Error; lost: boolean }[] = [];
  private broken: Error | undefined;
  private failureTimer: NodeJS.Timeout | undefined;
  /** Set while build() waits for the wiring: a failure meanwhile ends it. */
  private brokenWhileWired: ((e: Error) => void) | undefined;
  private closed = false;
  private readonly unsubscribe: () => void;

  private constructor(readonly spec: RingSpec, private readonly o: RingOptions) {
    const { model } = o;
    // The head weighs its memory as workers do: how far to prefetch, and whether decode steps may run inline.
    const room = new WeightRoom(() => this.node?.residentWeightBytes() ?? 0);
    const pipelineRef: { p?: RingPipeline } = {};
    this.node = new RingNode({
      model, windows: spec.headWindows, cycles: spec.cycles, ctx: spec.ctx, maxBatch: spec.maxBatch, prefetch: spec.headPrefetch, expertPrefetch: spec.expertPrefetch, kvCacheTypes: spec.kvCacheTypes,
      seqSlots: spec.seqSlots, weightRoomBytes: () => room.bytes(), releaseAfterUse: spec.headReleaseAfterUse, isHead: true,
      send: async (f) => {
        if (!this.link) throw new Error("the ring is not connected");
        await this.link.send(f);
      },
      deliver: (f, logits) => void pipelineRef.p?.deliver(f, logits),
      shifted: (f) => pipelineRef.p?.shifted(f),
      h2oScored: (f) => pipelineRef.p?.h2oScored(f),
      logitsFor: (f) => pipelineRef.p?.logitsFor(f),
      seqDeliver: (f, logits) => void pipelineRef.p?.seqDeliver(f, logits),
      seqLogitsFor: (f) => pipelineRef.p?.seqLogitsFor(f),
      onError: (message) => this.fail(new Error(message)),
    });
    this.pipeline = new RingPipeline({ model, node: this.node, nCtx: spec.ctx, maxBatch: spec.maxBatch, wireDtype: "f32", h2o: spec.kvCacheTypes?.evict === "h2o" });
    pipelineRef.p = this.pipeline;
    const inRing = (w: WorkerHandle) => spec.members.some((m) => m.worker === w);
    const onLost = (w: WorkerHandle, reason: string) => {
      if (inRing(w)) this.fail(new Error(`device ${w.label} failed: ${reason}`), true);
    };
    const onFailure = (w: WorkerHandle, message: string) => {
      if (inRing(w)) this.fail(new Error(this.named(`device ${w.label}: ${message}`)));
    };
    o.registry.on("lost", onLost);
    o.registry.on("failure", onFailure);
    this.unsubscribe = () => {
      o.registry.off("lost", onLost);
      o.registry.off("failure", onFailure);
    };
  }

  /** Assigns every member its windows, wires the links and resolves when the ring can carry tokens. */
  static async build(spec: RingSpec, o: RingOptions): Promise<Ring> {
    const ring = new Ring(spec, o);
    try {
      // A member lost (or failing) while the ring is wired ends the wiring at once: what it still
      // waits for (an assignment, a dial to the lost device) would only run out its own limit.
      const wiring = ring.wire();
      wiring.catch(() => undefined);
      await Promise.race([wiring, new Promise<never>((_, reject) => (ring.brokenWhileWired = reject))]);
      ring.brokenWhileWired = undefined;
      return ring;
    } catch (e) {
      await ring.close();
      throw e;
    }
  }

  /** Device ids in ring order, the head last. */
  get order(): string[] {
    return [...this.spec.members.map((m) => m.worker.id), HEAD_ID];
  }

  /** Why the ring cannot carry tokens any more, once a device or link failed. */
  get failure(): Error | undefined {
    return this.broken;
  }

  /** The ring's failure, waiting for it a moment: a send that fails reaches the pipeline before the
   * ring has named the device behind it. Undefined when the ring is fine (the error was not its). */
  async failureWithin(ms = FAILURE_GRACE_MS + 200): Promise<Error | undefined> {
    const deadline = performance.now() + ms;
    while (!this.broken && !this.closed && performance.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    return this.broken;
  }

  private named(text: string): string {
    return namePeerDevices(text, this.spec.members.map((m) => m.worker));
  }

  private async wire(): Promise<void> {
    const { spec, o } = this;
    const identity = { deviceId: HEAD_ID, modelFingerprint: o.fingerprint, hiddenSize: o.model.nEmbd, ringId: this.ringId };
    const linkOpts = { identity, maxTokensPerFrame: spec.maxBatch, log: o.log };
    // A fresh key per link (keys[i]: the link into member i; the last: into the head), handed only to
    // the link's two ends over the control plane (ring/seal.ts).
    const keys = spec.members.map(() => randomBytes(32)).concat(randomBytes(32));
    const keyOf = (i: number) => ({ linkKey: keys[i] });
    const last = spec.members[spec.members.length - 1].worker.id;
    this.listener = await RingListener.listen({
      port: 0, ...linkOpts, ...keyOf(spec.members.length), expectedPeerDeviceId: last, singlePeer: true,
    });
    // The plan names exactly one predecessor, the last member: only it holds the key, and only once.
    this.listener.on("link", (l) => {
      l.on("frame", (f) => {
        if (f.type !== "hello") this.node.receive(f);
      });
      l.on("close", (c) => {
        if (c.error) this.fail(new Error(this.named(`link from ${l.peerName} failed: ${c.error.message}`)));
      });
    });
    const order = this.order;
    const phases = o.phases ?? new Phases();
    // The chunk hashes of every member's windows (kept once computed: after the first plan, none is read).
    const weights = await phases.time("window hashes", () => Promise.all(spec.members.map((m) => {
      const layers = m.windows.flatMap((w) => Array.from({ length: w.endLayer - w.firstLayer }, (_, j) => w.firstLayer + j));
      return o.weights ? o.weights(layers) : undefined;
    })));
    const assigned = phases.time("assignments", () => Promise.all(spec.members.map(async (m, i) => {
      const successorUrl = i + 1 < spec.members.length ? spec.members[i + 1].worker.dataUrl : `ws://:${this.listener!.port}`;
      const sent = performance.now();
      return m.worker.assign({
        ringId: this.ringId, windows: [...m.windows], successorUrl, ctx: spec.ctx, maxBatch: spec.maxBatch, cycles: spec.cycles,
        prefetch: m.prefetch, releaseAfterUse: m.releaseAfterUse, threads: 0, ringOrder: order, wireDtype: 0,
        ...(spec.kvCacheTypes ? { cacheTypeK: spec.kvCacheTypes.k, cacheTypeV: spec.kvCacheTypes.v, attention: attentionSpec(spec.kvCacheTypes.attention), kvEvict: spec.kvCacheTypes.evict ?? "" } : {}),
        predecessorLinkKey: keys[i], successorLinkKey: keys[i + 1], ...(spec.seqSlots && spec.seqSlots > 1 ? { seqSlots: spec.seqSlots } : {}),
        ...(weights[i] ? { windowChunks: weights[i]!.chunks, chunkBytes: weights[i]!.chunkBytes } : {}),
      }, (fraction, stage) => o.onProgress?.(m.worker, fraction, stage))
        .then((ready) => o.log(`device ${m.worker.label} ready in ${((performance.now() - sent) / 1000).toFixed(2)} s (${(ready.anonBytes / 2 ** 20).toFixed(1)} MiB for KV and scratch)`));
    })));
    assigned.catch(() => undefined); // awaited below, after the head's own work meanwhile
    if (o.whileAssigning) {
      await new Promise((r) => setImmediate(r)); // the assignments leave before the head's own work holds it
      const t0 = performance.now();
      o.whileAssigning();
      phases.meanwhile("collecting garbage", performance.now() - t0);
    }
    await assigned;
    if (this.closed) throw new Error("the ring was taken down while it was wired");
    const link = await phases.time("dial", () => dialSuccessor(spec.members[0].worker.dataUrl, { ...linkOpts, ...keyOf(0), expectedPeerDeviceId: spec.members[0].worker.id }));
    if (this.closed) {
      void link.close("ring closed");
      throw new Error("the ring was taken down while it was wired");
    }
    this.link = link;
    this.link.on("close", (c) => {
      if (c.error) this.fail(new Error(this.named(`link to ${this.link!.peerName} failed: ${c.error.message}`)));
    });
  }

  /** When a device dies, its neighbours' links fail too, often first. Collect what fails for a short
   * moment and name the device whose session was lost, if one was: that is the device to look at.
   * A lost session names it at once: the request waiting on the ring need not wait out the moment. */
  private fail(error: Error, lost = false): void {
    if (this.closed || this.broken) return;
    this.failures.push({ error, lost });
    if (lost) return this.decideFailure();
    if (this.failures.length > 1) return;
    this.failureTimer = setTimeout(() => this.decideFailure(), FAILURE_GRACE_MS);
    this.failureTimer.unref();
  }

  private decideFailure(): void {
    clearTimeout(this.failureTimer);
    if (this.broken || this.closed) return;
    const chosen = (this.failures.find((f) => f.lost) ?? this.failures[0]).error;
    this.broken = chosen;
    this.pipeline.fail(chosen);
    if (this.brokenWhileWired) return this.brokenWhileWired(chosen);
    this.o.onBroken?.(chosen);
  }

  /** Every member's status, in ring order, then the head's. */
  async statuses(headPressure: number): Promise<{ id: string; label: string; status: Status }[]> {
    const st = await Promise.all(this.spec.members.map((m) => m.worker.status()));
    return [
      ...this.spec.members.map((m, i) => ({ id: m.worker.id, label: m.worker.label, status: st[i] })),
      { id: HEAD_ID, label: `${HEAD_ID} (this coordinator)`, status: headStatus(this.node, headPressure) },
    ];
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.failureTimer);
    this.unsubscribe();
    this.pipeline.fail(new Error("the ring was taken down"));
    await Promise.allSettled([this.link?.close("ring closed"), this.listener?.close()]);
    await this.node.close();
  }
}

/** The head's Status when it runs alone: one window of every layer. */
export function aloneStatus(pipeline: LocalPipeline, nLayers: number, pressure: number): Status {
  const r = pipeline.window.residency();
  const base = headStatus(undefined, pressure);
  return { ...base, windows: [{ firstLayer: 0, endLayer: nLayers, cycle: 0, residentBytes: r.residentBytes, totalBytes: r.totalBytes, ...pipeline.window.expertResidency(), frames: 0, tokens: 0, computeMs: 0, majorFaults: 0 }] };
}
