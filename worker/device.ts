// What a worker does while joined: on an assignment it makes its windows, listens for its
// predecessor, dials its successor, pages its windows in (reporting progress), and then runs every
// activation frame that arrives through its ring node.
import type { Assignment, KvCommand, Status } from "../control/index.js";
import type { KvCacheTypes, LocalModel } from "../engine/index.js";
import { parseAttentionSpec, parseKvCacheType } from "../model/index.js";
import { WeightRoom, anonRssBytes, deviceMemory, storageReadBytes, idleLayerRoomBytes, memoryPressureTracker } from "../profiler/index.js";
import {
  RingLane, RingListener, RingNode, RingPort, dialSuccessorWithin, expertPrefetchStatus, resolveLinkOptions, type RingLink, type RingLinkOptions,
} from "../ring/index.js";
import { EXIT_PORT_UNAVAILABLE, WorkerExit } from "./exit.js";
import type { SessionHandler } from "./session.js";

export interface DeviceOptions {
  readonly model: LocalModel;
  readonly fingerprint: string;
  readonly deviceName: string;
  /** Data-plane port, held from before the join (so it can be announced) to the worker's end: each
   * assignment's listener attaches to it. */
  readonly dataPort: RingPort;
  readonly dataHost: string;
  /** Host the worker dialled the coordinator on: a successor URL with an empty host means it. */
  readonly coordinatorHost: string;
  readonly log: (line: string) => void;
  /** Reports a failure of this device to the coordinator. */
  readonly fail: (e: unknown) => void;
  /** Run the ring links' frames on the native lane (ring/lane.ts; default true); false keeps them in JS. */
  readonly nativeLane?: boolean;
  /** Its MoE windows predict and advise their experts while they do not fit in memory (--expert-prefetch). */
  readonly expertPrefetch?: boolean;
}

/** The longest a reset waits for the one before it (WorkerDevice.reset). */
const RESET_WAIT_MS = 5000;

/** Binds the data-plane port for the worker's life (port 0 = any free one) so the worker can announce it
 * when joining; a port that cannot be bound ends the worker (WorkerExit with EXIT_PORT_UNAVAILABLE).
 * Held from here on, no other program's socket can take it between assignments. */
export async function reserveDataPort(port: number, host: string, log: (line: string) => void = () => {}): Promise<RingPort> {
  try {
    return await RingPort.bind(port, host, log);
  } catch (e) {
    const { code, message } = e as NodeJS.ErrnoException;
    const why = code === "EADDRINUSE" ? "it is taken by another program"
      : code === "EACCES" ? "not allowed (ports below 1024 need privileges)"
      : message;
    throw new WorkerExit(EXIT_PORT_UNAVAILABLE, `cannot listen on the data-plane port ${host}:${port}: ${why}; choose another --port, or leave it out for any free port`);
  }
}

/** The KV cache's types the coordinator chose (empty: f16, as from a coordinator without the fields). */
function assignedKvCacheTypes(a: Assignment): KvCacheTypes {
  const attention = parseAttentionSpec(a.attention ?? "");
  const evict = a.kvEvict || undefined;
  if (evict !== undefined && evict !== "h2o") throw new Error(`KV eviction ${JSON.stringify(evict.slice(0, 40))} is not one this worker knows (h2o)`);
  return {
    k: parseKvCacheType("cache type K", a.cacheTypeK || "f16"), v: parseKvCacheType("cache type V", a.cacheTypeV || "f16"),
    ...(attention ? { attention } : {}), ...(evict ? { evict } : {}),
  };
}

/** An assignment's sequence slots: 1 to its batch (a step carries one row per slot); 0 or absent: 1. */
function assignedSeqSlots(a: Assignment): number {
  const n = a.seqSlots || 1;
  if (!Number.isInteger(n) || n < 1 || n > Math.max(1, a.maxBatch)) throw new Error(`sequence slots ${n}: from 1 to the batch (${a.maxBatch})`);
  return n;
}

/** This device's two link keys from the assignment (ring/seal.ts). An assignment without them is
 * refused, never linked in the clear. */
function linkKeys(a: Assignment): { in: Uint8Array; out: Uint8Array } {
  const ok = (k: Uint8Array | undefined): k is Uint8Array => k instanceof Uint8Array && k.length === 32;
  if (!ok(a.predecessorLinkKey) || !ok(a.successorLinkKey)) {
    throw new Error("the assignment carries no keys for this device's ring links (a coordinator of another version?): not linking in the clear");
  }
  return { in: a.predecessorLinkKey, out: a.successorLinkKey };
}

export class WorkerDevice implements SessionHandler {
  private node: RingNode | undefined;
  private listener: RingListener | undefined;
  private successor: RingLink | undefined;
  private predecessor: RingLink | undefined;
  /** The native data path, once both links are up (unless turned off: DeviceOptions.nativeLane). */
  private lane: RingLane | undefined;
  private laneSetup: (() => void) | undefined;
  private pressure: ReturnType<typeof memoryPressureTracker> | undefined;
  private readonly room = new WeightRoom(() => this.node?.residentWeightBytes() ?? 0);
  private resetting: Promise<void> = Promise.resolve();

  constructor(private readonly o: DeviceOptions) {}

  async assign(a: Assignment, progress: (fraction: number, stage: string) => void, deviceId: string, dropped?: AbortSignal): Promise<number> {
    // Where an assignment's time goes (a recovery waits for it): logged when it is done.
    const took: [string, number][] = [];
    let since = performance.now();
    const lap = (what: string) => {
      const now = performance.now();
      took.push([what, now - since]);
      since = now;
    };
    if (dropped?.aborted) throw new Error("a newer assignment replaced this one");
    await this.reset("new assignment");
    lap("dropping the last windows");
    // A newer assignment arrived meanwhile: it owns the device (its reset follows this one's).
    if (dropped?.aborted) throw new Error("a newer assignment replaced this one");
    this.room.forget();
    const { model } = this.o;
    const kvCacheTypes = assignedKvCacheTypes(a); // an unknown name fails the assignment, naming it
    const keys = linkKeys(a);
    // The plan names this device's neighbours: only they may link, each only with its link's key.
    const me = a.ringOrder.indexOf(deviceId);
    const neighbour = (step: number) => (me >= 0 && a.ringOrder.length > 1 ? a.ringOrder[(me + step + a.ringOrder.length) % a.ringOrder.length] : undefined);
    // Not worth setting up windows over a file that changed since it was mapped.
    const problem = model.native.fileProblem();
    if (problem) throw new Error(problem);
    const linkOptions = (id: string): RingLinkOptions => ({
      identity: { deviceId: id, modelFingerprint: this.o.fingerprint, hiddenSize: model.nEmbd, ringId: a.ringId },
      maxTokensPerFrame: Math.max(a.maxBatch, 1),
      log: this.o.log,
    });
    this.node = new RingNode({
      model,
      windows: a.windows.map((w) => ({ firstLayer: w.firstLayer, endLayer: w.endLayer, cycle: w.cycle })),
      cycles: a.cycles,
      ctx: a.ctx,
      maxBatch: a.maxBatch,
      kvCacheTypes,
      seqSlots: assignedSeqSlots(a),
      prefetch: a.prefetch,
      expertPrefetch: this.o.expertPrefetch,
      weightRoomBytes: () => this.room.bytes(),
      releaseAfterUse: a.releaseAfterUse,
      isHead: false,
      send: async (f) => {
        if (!this.successor) throw new Error("no successor link");
        await this.successor.send(f);
      },
      onError: (message) => this.o.fail(new Error(message)),
    });
    this.listener = RingListener.attach(this.o.dataPort, {
      ...linkOptions(deviceId), linkKey: keys.in, expectedPeerDeviceId: neighbour(-1), singlePeer: true,
    });
    this.listener.on("link", (link) => this.attachPredecessor(link));
    const url = a.successorUrl.replace(/^ws:\/\/:/, `ws://${this.o.coordinatorHost}:`);
    lap("windows");
    progress(0, "dialling the successor");
    const successor = await dialSuccessorWithin(url, { ...linkOptions(deviceId), linkKey: keys.out, expectedPeerDeviceId: neighbour(1) }, 5000);
    if (dropped?.aborted) {
      // The newer assignment's reset closed this one's node and listener; this link is closed here.
      void successor.close("the assignment was replaced");
      throw new Error("a newer assignment replaced this one");
    }
    this.successor = successor;
    this.successor.on("close", (c) => {
      if (c.error) this.o.fail(new Error(`link to ${this.successor?.peerName ?? url} failed: ${c.error.message}`));
    });
    lap("dialling the successor");
    const node = this.node;
    this.laneSetup = () => {
      // A device without layers only passes frames on: JS does that.
      if (this.o.nativeLane === false || this.lane || !this.predecessor || !this.successor || this.node !== node || node.weightBytes === 0) return;
      try {
        this.lane = RingLane.start({
          model: model.native, node, link: resolveLinkOptions({ ...linkOptions(deviceId), linkKey: keys.in }), predecessor: this.predecessor,
          successor: this.successor, onError: (message) => this.o.fail(new Error(message)),
        }) ?? undefined;
        this.o.log(this.lane ? "ring frames run on the native lane" : "the ring links could not be handed to the native lane now: frames go through JS");
      } catch (e) {
        this.o.log(`the native lane did not start (${e instanceof Error ? e.message : String(e)}): frames go through JS`);
      }
    };
    // A device whose windows together exceed what memory can hold is overloaded: each window's pages
    // go as soon as it has run, so the next one (being prefetched) has room.
    const windows = this.node.windows;
    const windowBytes = this.node.weightBytes;
    const budget = this.room.bytes();
    if (windows.length > 1 && windowBytes > budget && !this.node.releaseAfterUse) {
      this.node.releaseAfterUse = true;
      this.lane?.setReleaseAfterUse(true);
      this.o.log(`overloaded: ${(windowBytes / 2 ** 20).toFixed(0)} MiB of windows, room for ${(budget / 2 ** 20).toFixed(0)} MiB: releasing each window after use`);
    }
    // Page the first window to run in while the ring is wired (as far as it fits), in the background:
    // advice that reads, given here, would hold the event loop for as long as the disk takes to queue
    // the window's reads (seconds for a large window on a slow disk), and with it the heartbeats.
    if (windows.length > 0) windows[0].prefetch(Math.min(budget, windows[0].residency().totalBytes), true);
    progress(1, "paging in its first window");
    lap("paging in");
    this.pressure?.stop();
    this.pressure = memoryPressureTracker();
    this.laneSetup();
    this.o.log(`windows set up in ${(took.reduce((t, [, ms]) => t + ms, 0) / 1000).toFixed(2)} s (${took.map(([w, ms]) => `${w} ${(ms / 1000).toFixed(2)} s`).join(", ")})`);
    return this.node.anonBytes();
  }

  kv(cmd: KvCommand): void {
    if (this.lane) {
      if (cmd.op === "CLEAR") {
        this.lane.kvClear();
        this.lane.resetStats();
      } else this.lane.kvTruncate(cmd.position);
      return;
    }
    for (const w of this.node?.windows ?? []) {
      if (cmd.op === "CLEAR") w.kvClear();
      else w.kvTruncate(Math.min(cmd.position, w.info().filled));
    }
    if (cmd.op === "CLEAR") this.node?.resetStats();
  }

  /** Holds no windows and sets none up: its memory and CPU are its own, and a pass timed now is
   * what the next plan should price. */
  get idle(): boolean {
    return !this.node && !this.lane && !this.laneSetup;
  }

  status(): Status {
    const s = this.lane?.stats() ?? this.node?.statsSnapshot();
    const mem = deviceMemory();
    this.pressure?.sample();
    return {
      windows: (s?.windows ?? []).map((w, i) => {
        const r = this.node!.windows[i].residency();
        return { ...w, residentBytes: r.residentBytes, totalBytes: r.totalBytes, ...this.node!.windows[i].expertResidency(), ...expertPrefetchStatus(this.node!.windows[i]) };
      }),
      waitMs: s?.waitMs ?? 0,
      sendMs: s?.sendMs ?? 0,
      descheduledMs: s?.descheduledMs ?? 0,
      frames: s?.frames ?? 0,
      anonRssBytes: anonRssBytes(),
      readBytes: storageReadBytes(),
      memTotalBytes: mem.totalBytes,
      memAvailableBytes: mem.availableBytes,
      layerRoomBytes: this.node?.windows.length ? 0 : idleLayerRoomBytes(() => this.o.model.path),
      memPressure: this.pressure?.pressure() ?? 0,
    };
  }

  /** Resets run one after another: the session may give up waiting for one (a dead peer's close
   * grace) and rejoin, and the next assignment's reset must not find the old listener half-closed, nor
   * the old reset's tail close the new assignment's node and links. A reset still running after
   * RESET_WAIT_MS is not waited for longer (every close has its own limit; this one bounds them all). */
  reset(reason: string): Promise<void> {
    const previous = this.resetting;
    const next = Promise.race([previous, new Promise<void>((r) => setTimeout(r, RESET_WAIT_MS).unref())]).then(() => this.resetNow(reason));
    this.resetting = next.catch(() => undefined);
    return next;
  }

  private async resetNow(_reason: string): Promise<void> {
    this.pressure?.stop();
    // The lane runs the windows: it ends (after its close handshakes) before they are closed.
    const lane = this.lane;
    this.lane = this.laneSetup = undefined;
    await lane?.close("run ended");
    const closing = [this.node?.close(), this.successor?.close("run ended"), this.predecessor?.close("run ended"), this.listener?.close()];
    this.node = this.successor = this.predecessor = undefined;
    this.listener = undefined;
    await Promise.allSettled(closing);
  }

  private attachPredecessor(link: RingLink): void {
    if (this.lane) {
      void link.close("this device's ring links are already running");
      return;
    }
    void this.predecessor?.close("replaced by a new predecessor");
    this.predecessor = link;
    link.on("frame", (f) => {
      if (f.type === "hello") return;
      if (this.lane) this.lane.takeFrame(f);
      else this.node?.receive(f);
    });
    link.on("close", (c) => {
      if (c.error && this.predecessor === link) this.o.fail(new Error(`link from ${link.peerName} failed: ${c.error.message}`));
    });
    // After ws has finished with the message that brought this link (the HELLO), before it reads more.
    queueMicrotask(() => this.laneSetup?.());
  }
}
