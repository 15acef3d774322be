// `prima-coord run` with workers: wait for them, give each a window per cycle, wire the ring, and
// generate through it. The coordinator is the head: it embeds, holds the last windows of every cycle
// (if any), applies the output layer and samples. Any device that fails ends the run with its name.
import { randomUUID } from "node:crypto";
import { dirname, resolve } from "node:path";
import { LocalPipeline, type LocalModel } from "../engine/index.js";
import { modelFingerprint } from "../model/index.js";
import type { Tokenizer } from "../model/tokenizer.js";
import { WeightRoom, anonRssBytes, deviceMemory, memoryPressureTracker, modelWorkload, profileDevice, type DeviceReport } from "../profiler/index.js";
import {
  PlanError, RingListener, RingNode, RingPipeline, dialSuccessor, evenLayerWindows, ringWindows, type NodeStats, type RingLink,
} from "../ring/index.js";
import type { Status } from "../control/index.js";
import {
  DecodeMeter, costPerStep, formatPlan, formatPrediction, planRing, predictionReport, ringPosition,
  type MeasuredDevice, type PredictionReport, type RingPlan, type StepCost,
} from "./placement.js";
import { WorkerRegistry, type WorkerHandle } from "./registry.js";
import { promptIds, runGeneration, timingLine, type RunArgs } from "./run-command.js";

const log = (line: string) => console.error(`[prima-coord] ${line}`);
/** How long to wait for the session loss that usually follows a neighbour's link failure. */
const FAILURE_GRACE_MS = 300;

/** The head's row of the summary, in the workers' Status shape. */
function headStatus(node: RingNode, pressure: number): Status {
  const s: NodeStats = node.statsSnapshot();
  const mem = deviceMemory();
  return {
    windows: s.windows.map((w, i) => ({ ...w, ...(() => { const r = node.windows[i].residency(); return { residentBytes: r.residentBytes, totalBytes: r.totalBytes }; })() })),
    waitMs: s.waitMs, sendMs: s.sendMs, frames: s.frames, anonRssBytes: anonRssBytes(), memTotalBytes: mem.totalBytes,
    memAvailableBytes: mem.availableBytes, memPressure: pressure,
  };
}

/** Rewrites the ring links' names for their peers (`successor "w2" (ws://10.0.0.2:9000)`, by ring id)
 * as the devices the user knows (`successor device w2 "bravo" (10.0.0.2)`), for the ring's members. */
export function namePeerDevices(text: string, devices: readonly { id: string; label: string }[]): string {
  return text.replace(/\b(successor|predecessor) "([^"]*)" \([^)]*\)/g, (whole, role: string, id: string) => {
    const d = devices.find((x) => x.id === id);
    return d ? `${role} device ${d.label}` : whole;
  });
}

/** Per-device timings per token (`cost`: decode only when counters were read as decoding started, since
 * a prompt's first pass pays for mapping the weights in and would blur the per-token figures). */
export function summaryTable(rows: { device: string; status: Status; cost: StepCost }[], tokens: number): string {
  const ms = (v: number) => (tokens > 0 ? v.toFixed(2) : "-");
  const lines = [
    "device                      layers            compute ms/tok  wait ms/tok  send ms/tok  major faults  resident  anon RSS  mem pressure",
  ];
  for (const { device, status: s, cost: c } of rows) {
    const layers = s.windows.map((w) => `${w.firstLayer}-${w.endLayer - 1}`).join(",") || "-";
    const res = s.windows.reduce((a, w) => a + w.residentBytes, 0), tot = s.windows.reduce((a, w) => a + w.totalBytes, 0);
    lines.push(
      `${device.padEnd(27)} ${layers.padEnd(17)} ${ms(c.computeMs).padStart(14)} ${ms(c.waitMs).padStart(12)} ${ms(c.sendMs).padStart(12)} ` +
      `${String(c.majorFaults).padStart(13)} ${(tot ? `${((100 * res) / tot).toFixed(0)}%` : "-").padStart(9)} ` +
      `${`${(s.anonRssBytes / 2 ** 20).toFixed(0)} MiB`.padStart(9)} ${`${(100 * s.memPressure).toFixed(2)}%`.padStart(13)}`,
    );
  }
  return lines.join("\n");
}

/** The plan and how its prediction held, as --json reports them. */
function placementJson(placement: RingPlan, nWorkers: number, prediction: PredictionReport | undefined) {
  return {
    plan: placement.plan, labels: placement.labels, devices: placement.devices, per_cycle: placement.perCycle,
    release_after_use: placement.releaseAfterUse, links: placement.links, model: placement.model,
    ring_positions: placement.labels.map((_, hi) => ringPosition(hi, nWorkers)), prediction,
  };
}

/** Halda dropped every worker: generate on the head alone, and still compare with the prediction. */
async function runAlone(a: RunArgs, model: LocalModel, tok: Tokenizer, ctx: number, placement: RingPlan, loadMs: number): Promise<number> {
  const local = new LocalPipeline(model, ctx, a.batch);
  const pressure = memoryPressureTracker();
  const meter = new DecodeMeter(local, async () => {});
  try {
    const report = await runGeneration(a, model, tok, meter, loadMs, 1).finally(() => pressure.stop());
    pressure.sample();
    const measured = new Map<number, MeasuredDevice>([[0, { computeMs: meter.meanDecodeMs, sendMs: 0, memPressure: pressure.pressure() }]]);
    const prediction = meter.decodeSteps > 0 ? predictionReport(placement, placement.labels, measured, meter.meanDecodeMs, meter.decodeSteps) : undefined;
    if (a.json) {
      console.log(JSON.stringify({
        ...report, cycles: placement.cycles, layer_windows: placement.perCycle, placement: placementJson(placement, placement.labels.length - 1, prediction),
      }));
    } else console.error(timingLine(report));
    if (prediction) log(formatPrediction(prediction));
    return 0;
  } finally {
    local.close();
  }
}

export async function runRing(a: RunArgs, model: LocalModel, tok: Tokenizer, ctx: number, t0: number): Promise<number> {
  const fingerprint = modelFingerprint(model.gguf);
  // Without --layer-windows the ring places itself: the head measures itself (or reads its cached
  // profile) before it listens, so that on one machine it never competes with a worker's profile.
  let headReport: DeviceReport | undefined;
  if (a.layerWindows === undefined) {
    try {
      headReport = await profileDevice({
        name: "head", workload: modelWorkload(model.desc), threads: model.threads, diskDirs: [dirname(resolve(a.model))], nCtx: ctx,
        reprofile: a.reprofile,
        progress: (l) => log(`profile: ${l}`),
      });
    } catch (e) {
      console.error(`prima-coord: profiling this device failed: ${(e as Error).message}; give --layer-windows to place layers by hand`);
      model.close();
      return 1;
    }
  }
  const joinedAt = performance.now();
  const registry = new WorkerRegistry({ modelFingerprint: fingerprint, log });
  const port = await registry.listen(a.port);
  let link: RingLink | undefined;
  let listener: RingListener | undefined;
  let node: RingNode | undefined;
  let workers: WorkerHandle[] = [];
  try {
    log(`listening for workers on port ${port}; waiting for ${a.minWorkers}`);
    workers = await registry.waitFor(a.minWorkers, a.joinTimeoutS * 1000);
    const loadStart = performance.now();

    // Ring order: workers in join order, then the head.
    const L = model.nLayers;
    let placement: RingPlan | undefined;
    if (headReport) {
      const tokens = (await promptIds(tok, a)).length + a.nPredict;
      placement = await planRing({
        model, modelPath: a.model, fingerprint, workers, head: headReport, ctx, maxBatch: a.batch, tokens, options: { k: a.cycles }, log,
      });
      log(formatPlan(placement, placement.labels));
    }
    const perCycle = placement ? [...placement.perCycle] : a.layerWindows ?? evenLayerWindows(L, workers.length + 1, a.cycles ?? 1);
    if (perCycle.length !== workers.length + 1) {
      throw new PlanError(`--layer-windows lists ${perCycle.length} windows for ${workers.length} workers and the head (${workers.length + 1} expected)`);
    }
    const plan = ringWindows(L, perCycle, placement?.cycles ?? a.cycles);
    const releaseAfterUse = (pos: number) => placement?.releaseAfterUse[pos] ?? false;
    const inRing = workers.filter((_, i) => plan.perDevice[i].length > 0);
    if (inRing.length === 0 && placement) {
      for (const w of workers) log(`device ${w.label} takes no layers: Halda keeps every layer on this device`);
      return await runAlone(a, model, tok, ctx, placement, joinedAt - t0 + (performance.now() - loadStart));
    }
    if (inRing.length === 0) throw new PlanError("no worker takes a layer: run without --min-workers");
    const skipped = workers.filter((_, i) => plan.perDevice[i].length === 0);
    for (const w of skipped) log(`device ${w.label} takes no layers and stays out of the ring`);
    const haldaIndex = (w: WorkerHandle) => workers.indexOf(w) + 1;
    const ringId = randomUUID();
    const headId = "head";
    const identity = { deviceId: headId, modelFingerprint: fingerprint, hiddenSize: model.nEmbd, ringId };
    const wireDtype = "f32" as const;
    log(`plan: ${plan.cycles} cycle${plan.cycles === 1 ? "" : "s"} of [${perCycle.join(", ")}] layers (ring order: ${[...inRing.map((w) => w.id), headId].join(" -> ")})`);

    const pipelineRef: { p?: RingPipeline } = {};
    // The head weighs its memory as workers do: how far to prefetch, and whether decode steps may run inline.
    const room = new WeightRoom(() => node?.residentWeightBytes() ?? 0);
    node = new RingNode({
      model, windows: plan.perDevice[workers.length], cycles: plan.cycles, ctx, maxBatch: a.batch, prefetch: a.prefetch,
      weightRoomBytes: () => room.bytes(),
      releaseAfterUse: releaseAfterUse(workers.length), isHead: true,
      send: async (f) => {
        if (!link) throw new Error("the ring is not connected");
        await link.send(f);
      },
      deliver: (f, logits) => void pipelineRef.p?.deliver(f, logits),
      logitsFor: (f) => pipelineRef.p?.logitsFor(f),
      onError: (message) => failRun(new Error(message)),
    });
    const pipeline = new RingPipeline({ model, node, nCtx: ctx, maxBatch: a.batch, wireDtype });
    pipelineRef.p = pipeline;
    // When a device dies, its neighbours' links fail too, often first. Collect what fails for a short
    // moment and name the device whose session was lost, if one was: that is the device to look at.
    const failures: { error: Error; lost: boolean }[] = [];
    const failRun = (error: Error, lost = false) => {
      failures.push({ error, lost });
      if (failures.length === 1) {
        setTimeout(() => pipeline.fail((failures.find((f) => f.lost) ?? failures[0]).error), FAILURE_GRACE_MS).unref();
      }
    };
    // Links, ours and the workers', name their peers by ring id; say which joined device that is, as
    // the session loss would (which may come later than the grace above on a busy machine).
    const named = (text: string) => namePeerDevices(text, inRing);
    registry.on("lost", (w: WorkerHandle, reason: string) => {
      if (inRing.includes(w)) failRun(new Error(`device ${w.label} failed: ${reason}`), true);
    });
    registry.on("failure", (w: WorkerHandle, message: string) => {
      if (inRing.includes(w)) failRun(new Error(named(`device ${w.label}: ${message}`)));
    });

    const linkOpts = { identity, maxTokensPerFrame: a.batch, log };
    listener = await RingListener.listen({ port: 0, ...linkOpts });
    listener.on("link", (l) => {
      l.on("frame", (f) => {
        if (f.type !== "hello") node!.receive(f);
      });
      l.on("close", (c) => {
        if (c.error) failRun(new Error(named(`link from ${l.peerName} failed: ${c.error.message}`)));
      });
    });
    const ringOrder = [...inRing.map((w) => w.id), headId];
    await Promise.all(inRing.map((w, i) => {
      const idx = workers.indexOf(w);
      const successorUrl = i + 1 < inRing.length ? inRing[i + 1].dataUrl : `ws://:${listener!.port}`;
      return w.assign({
        ringId, windows: [...plan.perDevice[idx]], successorUrl, ctx, maxBatch: a.batch, cycles: plan.cycles, prefetch: a.prefetch,
        releaseAfterUse: releaseAfterUse(idx), threads: 0, ringOrder, wireDtype: 0,
      }).then((ready) => log(`device ${w.label} ready (${(ready.anonBytes / 2 ** 20).toFixed(1)} MiB for KV and scratch)`));
    }));
    link = await dialSuccessor(inRing[0].dataUrl, linkOpts);
    link.on("close", (c) => {
      if (c.error) failRun(new Error(named(`link to ${link!.peerName} failed: ${c.error.message}`)));
    });
    const pressure = memoryPressureTracker();
    // Load time: opening the model here plus setting up the ring (not the wait for workers to join).
    const loadMs = joinedAt - t0 + (performance.now() - loadStart);
    // Every device's counters are read when decoding starts: decode-only timings per device, and with a
    // plan, the comparison with its prediction.
    const atDecodeStart = new Map<number, Status>();
    const meter = new DecodeMeter(pipeline, async () => {
      const st = await Promise.all(inRing.map((w) => w.status()));
      inRing.forEach((w, i) => atDecodeStart.set(haldaIndex(w), st[i]));
      atDecodeStart.set(0, headStatus(node!, 0));
    });
    const report = await runGeneration(a, model, tok, meter, loadMs, inRing.length + 1).finally(() => pressure.stop());

    const statuses = await Promise.all(inRing.map(async (w) => ({ device: w.label, status: await w.status(), haldaIndex: haldaIndex(w) })));
    statuses.push({ device: `${headId} (this coordinator)`, status: headStatus(node, pressure.pressure()), haldaIndex: 0 });
    const decodeOnly = meter.decodeSteps > 0;
    const steps = decodeOnly ? meter.decodeSteps : report.generated_ids.length + report.prompt_ids.length;
    const rows = statuses.map((s) => {
      const before = decodeOnly ? atDecodeStart.get(s.haldaIndex) : undefined;
      return { ...s, before, cost: costPerStep(before, s.status, steps) };
    });
    let prediction: PredictionReport | undefined;
    if (placement && decodeOnly) {
      const measured = new Map<number, MeasuredDevice>();
      for (const r of rows) {
        if (r.before) measured.set(r.haldaIndex, { computeMs: r.cost.computeMs, sendMs: r.cost.sendMs, memPressure: r.status.memPressure });
      }
      prediction = predictionReport(placement, placement.labels, measured, meter.meanDecodeMs, meter.decodeSteps);
    }
    if (a.json) {
      const perDevice = ({ device, cost: c }: (typeof rows)[number]) =>
        ({ device, compute_ms: c.computeMs, wait_ms: c.waitMs, send_ms: c.sendMs, major_faults: c.majorFaults });
      console.log(JSON.stringify({
        ...report, cycles: plan.cycles, layer_windows: perCycle, devices_status: statuses.map(({ device, status }) => ({ device, status })),
        ...(decodeOnly ? { devices_decode: rows.map(perDevice) } : {}),
        ...(placement ? { placement: placementJson(placement, workers.length, prediction) } : {}),
      }));
    } else {
      console.error(timingLine(report));
      const what = decodeOnly ? `per decode step, ${steps} steps` : `per token of ${steps} through the ring`;
      console.error(`per device (${what}):\n${summaryTable(rows, steps)}`);
    }
    if (prediction) log(formatPrediction(prediction));
    return 0;
  } catch (e) {
    console.error(`prima-coord: ${e instanceof Error ? e.message : String(e)}`);
    return 1;
  } finally {
    for (const w of workers) w.shutdown("the run is over");
    await Promise.allSettled([link?.close("run over"), listener?.close()]);
    node?.close();
    await registry.close();
    model.close();
  }
}
