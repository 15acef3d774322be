// What a finished request's run cost on each device (its counters before and after decoding, per
// decode step), kept in the device records and the reread store, and the outcome the client's front
// door reports with it (run's report: the placement, the prediction beside the measurement).
import type { GenerationResult } from "../engine/index.js";
import type { RereadStore, RingPassStore } from "../profiler/index.js";
import type { DeviceRecords } from "./devices.js";
import type { Seat } from "./placement.js";
import type { RingPlan } from "./plan-ring.js";
import { costPerStep, decodePrediction, recordPasses, recordRereads } from "./prediction.js";
import { HEAD_ID, aloneStatus } from "./ring-setup.js";
import type { Current, DeviceDecodeRow, GenerationOutcome, RequestRun, RingStatuses } from "./request-run.js";
import type { MeasuredMs } from "./state.js";

export interface MeasureInput {
  readonly current: Current;
  readonly run: RequestRun;
  readonly headPressure: number;
  readonly result: GenerationResult;
  /** Run's report waits for the counters; without it they are read beside the reply. */
  readonly report: boolean;
  readonly seats: readonly Seat[];
  /** Where each device's measurements are kept for the state. */
  readonly devices: DeviceRecords;
  readonly placement: RingPlan | undefined;
  readonly rereads: RereadStore;
  readonly passes: RingPassStore;
  readonly nLayers: number;
  readonly log: (line: string) => void;
}

/** Every device's counters after a run (per decode step where decoding was timed), kept in its record;
 * what streaming devices reread at goes to the reread store. */
export async function measureRun(i: MeasureInput): Promise<DeviceDecodeRow[]> {
  const { placement, current, log } = i;
  const { meter } = i.run;
  const measuring = (async () => {
    const rows = await measure(i, await i.run.countersAtDecode);
    // What streaming devices really reread at, and how the others' passes ran against their price:
    // the next plans price them by it.
    if (placement && current.kind === "ring" && meter.decodeSteps > 0) {
      try {
        for (const line of recordRereads(placement, rows, i.rereads)) log(line);
        for (const line of recordPasses(placement, rows, i.passes)) log(line);
      } catch (e) {
        log(`could not keep the devices' reread speeds and passes: ${(e as Error).message}`);
      }
    }
    return rows;
  })();
  if (i.report) return measuring;
  measuring.catch((e: unknown) => log(`reading the devices' counters failed: ${(e as Error).message}`));
  return [];
}

async function measure(i: MeasureInput, before: RingStatuses | undefined): Promise<DeviceDecodeRow[]> {
  const { current, headPressure, devices, result } = i;
  const { meter } = i.run;
  if (current.kind === "local") {
    const status = aloneStatus(current.pipeline, i.nLayers, headPressure);
    const cost = { computeMs: meter.meanDecodeMs, waitMs: 0, sendMs: 0, descheduledMs: 0, majorFaults: 0, readBytes: 0 };
    devices.measured(HEAD_ID, { computeMs: cost.computeMs, waitMs: 0, sendMs: 0, majorFaultsPerToken: 0, tokens: meter.decodeSteps }, status, true);
    return [{ id: HEAD_ID, label: `${HEAD_ID} (this coordinator)`, status, haldaIndex: 0, cost }];
  }
  const after = await current.ring.statuses(headPressure).catch(() => undefined);
  if (!after) return [];
  const decodeOnly = meter.decodeSteps > 0 && before !== undefined;
  const steps = decodeOnly ? meter.decodeSteps : result.ids.length + result.promptTokens;
  return after.map((s) => {
    const b = decodeOnly ? before!.find((x) => x.id === s.id)?.status : undefined;
    const cost = costPerStep(b, s.status, steps);
    const measured: MeasuredMs = { computeMs: cost.computeMs, waitMs: cost.waitMs, sendMs: cost.sendMs, descheduledMs: cost.descheduledMs, majorFaultsPerToken: cost.majorFaults / Math.max(1, steps), tokens: steps };
    devices.measured(s.id, measured, s.status, s.id === HEAD_ID);
    return { id: s.id, label: s.label, status: s.status, haldaIndex: i.seats.find((x) => x.id === s.id)?.haldaIndex ?? -1, before: b, cost };
  });
}

/** The run's outcome with every device's counters (measureRun) and, when decoding was timed on a
 * placement, the prediction beside them. */
export async function measuredOutcome(i: MeasureInput & { queueMs: number; cycles: number; perCycle: readonly number[] }): Promise<GenerationOutcome> {
  const { run, current, result, placement } = i;
  const perDevice = await measureRun(i);
  const { meter } = run;
  return {
    result, cachedTokens: run.cached, queueMs: i.queueMs, firstTokenMs: run.firstTokenMs, devices: current.devices, cycles: i.cycles,
    layersPerCycle: i.perCycle, placement, perDevice,
    prediction: placement && meter.decodeSteps > 0 ? decodePrediction(placement, perDevice, current.kind === "ring", meter) : undefined,
    meanDecodeMs: meter.meanDecodeMs,
  };
}
