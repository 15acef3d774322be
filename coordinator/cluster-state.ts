// The cluster's state (state.ts's shape: GET /api/state, the dashboard, status --json) as a pure
// function of a snapshot of the cluster: its devices' records, the placement and its seats, the plan,
// the queue and the counters. The cluster takes the snapshot; nothing here reads a clock or a device.
import type { Status } from "../control/index.js";
import type { LocalModel } from "../engine/index.js";
import { ggmlTypeName, metaString, rowBytes, type KvCacheTypes } from "../model/index.js";
import type { DeviceReport, SystemInfo } from "../profiler/index.js";
import type { DeviceRecord, DeviceRecords } from "./devices.js";
import type { Seat } from "./placement.js";
import type { RingPlan } from "./plan-ring.js";
import type { WorkerHandle } from "./registry.js";
import { HEAD_ID } from "./ring-setup.js";
import { kvCacheState } from "./kv-cache-options.js";
import { STATE_VERSION, type ClusterState, type DeviceState, type EventState, type PlanState } from "./state.js";

export interface StateSnapshot {
  readonly cluster: string;
  readonly model: ClusterState["model"];
  readonly server: ClusterState["server"];
  readonly plan: PlanState | null;
  readonly placement: RingPlan | undefined;
  /** The current placement's seats (placement.ts). */
  readonly seats: readonly Seat[];
  /** Live workers in ring order. */
  readonly workers: readonly WorkerHandle[];
  readonly devices: DeviceRecords;
  readonly head: {
    readonly report: Partial<DeviceReport> | undefined;
    /** This machine, for a head without a profile (layers placed by hand). */
    readonly system: SystemInfo;
    readonly threads: number;
    readonly status: Status;
    readonly joinedUnixMs: number;
  };
  readonly requests: ClusterState["requests"];
  readonly events: readonly EventState[];
}

export function clusterState(s: StateSnapshot): ClusterState {
  const ringOrder = s.plan?.ringOrder ?? [];
  const haldaIndexOf = (w: WorkerHandle) => (s.placement ? s.seats.find((x) => x.worker === w)?.haldaIndex ?? -1 : -1);
  const devices: DeviceState[] = [
    ...s.workers.flatMap((w) => {
      const record = s.devices.get(w.id);
      return record ? [workerState(s, w, record, haldaIndexOf(w), record.lastStatus)] : [];
    }),
    deviceState(s, { id: HEAD_ID, name: `${HEAD_ID} (this coordinator)`, address: "this machine", isHead: true }, null, s.placement ? 0 : -1, s.head.status),
    ...s.devices.lost.map(({ handle, record }) => workerState(s, handle, record, -1, null)),
  ];
  const links = ringOrder.map((from, i) => {
    const to = ringOrder[(i + 1) % ringOrder.length];
    const w = s.workers.find((x) => x.id === to);
    const hi = w ? haldaIndexOf(w) : -1;
    const link = hi > 0 ? s.placement?.links[hi] : undefined;
    return { from, to, hopMs: link ? link.linkLatencyMs : null };
  }).filter((l) => ringOrder.length > 1 && l.from !== l.to);
  return {
    version: STATE_VERSION, cluster: s.cluster, model: s.model, server: s.server, plan: s.plan, devices, links, requests: s.requests,
    events: [...s.events],
  };
}

function workerState(s: StateSnapshot, w: WorkerHandle, record: DeviceRecord, haldaIndex: number, status: Status | null): DeviceState {
  return deviceState(s, { id: w.id, name: w.join.deviceName, address: w.dataHost, isHead: false }, record, haldaIndex, status);
}

/** One device's state; the head's record is the snapshot's head (record null). */
function deviceState(
  s: StateSnapshot, who: Pick<DeviceState, "id" | "name" | "address" | "isHead">, record: DeviceRecord | null, haldaIndex: number, status: Status | null,
): DeviceState {
  const { id, isHead } = who;
  const report = isHead ? s.head.report : record?.report;
  const d = report?.details, p = report?.profile;
  // Without a profile (layers placed by hand) the head still knows its own machine.
  const sys = d?.system ?? (isHead ? s.head.system : undefined);
  const pos = (s.plan?.ringOrder ?? []).indexOf(id);
  const seated = haldaIndex >= 0 ? s.placement?.plan.devices.find((x) => x.index === haldaIndex) : undefined;
  return {
    ...who,
    state: isHead ? s.devices.head.state : record!.state,
    detail: isHead ? s.devices.head.detail : record!.detail,
    loadProgress: record?.progress ?? null,
    os: sys ? `${sys.os} ${sys.kernelRelease} (${sys.arch})` : p?.os ?? null,
    cpu: sys?.cpuModel ?? null,
    threads: d?.threads ?? (isHead ? s.head.threads : null),
    ramTotalBytes: status ? Number(status.memTotalBytes) : p?.ramTotalBytes ?? null,
    ramAvailableBytes: status ? Number(status.memAvailableBytes) : p?.ramAvailableBytes ?? null,
    anonRssBytes: status ? Number(status.anonRssBytes) : null,
    memPressure: status ? status.memPressure : null,
    diskReadBytesPerS: p?.diskSeqReadBytesPerS ?? null,
    gpu: { present: (d?.gpus?.length ?? 0) > 0, used: false, name: d?.gpus?.[0]?.name ?? null },
    ringPosition: pos >= 0 ? pos : null,
    set: seated?.set ?? null,
    windows: windowStates(s.plan, id, status),
    predicted: seated ? { ...seated.latency } : null,
    measured: isHead ? s.devices.headMeasured : record?.measured ?? null,
    joinedUnixMs: record?.joinedUnixMs ?? s.head.joinedUnixMs,
  };
}

function windowStates(plan: PlanState | null, deviceId: string, status: Status | null): DeviceState["windows"] {
  const planned = plan?.windows.filter((w) => w.device === deviceId) ?? [];
  return planned.map((w) => {
    const s = status?.windows.find((x) => x.firstLayer === w.firstLayer && x.endLayer === w.endLayer);
    return { firstLayer: w.firstLayer, endLayer: w.endLayer, cycle: w.cycle, residentBytes: s ? Number(s.residentBytes) : null, totalBytes: s ? Number(s.totalBytes) : null,
      ...(s && Number(s.expertsTotal ?? 0) > 0 ? { expertsResident: Number(s.expertsResident ?? 0), expertsTotal: Number(s.expertsTotal) } : {}) };
  });
}

/** The state's model part (it never changes). */
export function modelState(model: LocalModel, path: string, name: string, fingerprint: string, contextTokens: number, kvCacheTypes?: KvCacheTypes, sequenceSlots = 1): ClusterState["model"] {
  return {
    // The name /v1/models lists (the file's), which the dashboard's chat sends back.
    name, path, architecture: metaString(model.gguf, "general.architecture") ?? "unknown", layers: model.nLayers, sizeBytes: model.desc.fileBytes,
    quantization: quantizationOf(model), fingerprint, contextTokens, kvCache: { ...kvCacheState(model.desc.hparams, kvCacheTypes), ...(sequenceSlots > 1 ? { sequenceSlots } : {}) },
  };
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
