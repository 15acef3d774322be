// The prediction report's measured side: a device's own work per token (compute and send, less the time
// another process held its CPU), set beside Halda's figure for it; and the counters it comes from.
import { describe, expect, it } from "vitest";
import type { Placement } from "../../coordinator/placement.js";
import { costPerStep, formatPrediction, predictionReport, type MeasuredDevice } from "../../coordinator/prediction.js";
import type { Status } from "../../control/proto.js";

const latency = (computeMs: number, commMs: number) => ({ computeMs, memoryMs: 0, diskMs: 0, commMs, totalMs: computeMs + commMs });

describe("prediction report", () => {
  it("compares Halda's figure for each device's own work with its compute and send less the time it was preempted, and the hops with the rest", () => {
    // Halda's device 0 is the head, 1 the worker (ring order: the worker, then the head).
    const placement = {
      devices: [{}, {}],
      plan: { latencyMs: 10.5, devices: [{ index: 0, set: "M4", windowLayers: 2, latency: latency(4, 0.2) }, { index: 1, set: "M4", windowLayers: 6, latency: latency(5.8, 0.2) }] },
    } as unknown as Placement;
    const measured = new Map<number, MeasuredDevice>([
      [0, { computeMs: 4.4, sendMs: 0.3, descheduledMs: 0.1, memPressure: 0 }],
      [1, { computeMs: 6.5, sendMs: 1.2, descheduledMs: 1.5, memPressure: 0.01 }],
    ]);
    const r = predictionReport(placement, ["head (this coordinator)", "w1 \"a\""], measured, 11.9, 40);
    expect(r.rows.map((x) => x.label)).toEqual(["w1 \"a\"", "head (this coordinator)"]);
    expect(r.rows[0].measuredMs).toBeCloseTo(6.5 + 1.2 - 1.5, 12);
    expect(r.rows[1].measuredMs).toBeCloseTo(4.4 + 0.3 - 0.1, 12);
    // Halda's figure for the same work leaves the hop out: the link's latency is in no device's counters.
    expect(r.rows.map((x) => x.predictedMs)).toEqual([5.8, 4]);
    expect(r.predictedHopsMs).toBeCloseTo(0.4, 12);
    expect(r.measuredRestMs).toBeCloseTo(11.9 - 6.2 - 4.6, 12);
    expect(r.error).toBeCloseTo((11.9 - 10.5) / 10.5, 12); // the token stays wall-clock time
    const text = formatPrediction(r);
    expect(text).toMatch(/predicted \(compute\+memory\+disk\+hand-off\) +measured \(compute\+send-preempted\)/);
    expect(text).toMatch(/w1 "a" +6 +5\.80 \(5\.80\+0\.00\+0\.00\+0\.00\) +6\.20 \(6\.50\+1\.20-1\.50\)/);
    // What no device's own time holds: hops, sampling, the waits for a CPU; beside it Halda's hops.
    expect(text).toMatch(new RegExp(`hops, sampling, CPU waits +0\\.40 \\(the hops\\) +${(11.9 - 6.2 - 4.6).toFixed(2)}`));
  });

  it("counts a device's timed hand-off (k a token, within its hop) in its own row, as its send counter does, and not in the hops", () => {
    // Two cycles: the head hands a token on twice, and Halda's comm term holds k times its hop.
    const placement = {
      devices: [{}, {}], cycles: 2, handOffMs: [0.3, 0],
      plan: { latencyMs: 12, devices: [{ index: 0, set: "M4", windowLayers: 2, latency: latency(4, 2 * (0.2 + 0.3)) }, { index: 1, set: "M4", windowLayers: 6, latency: latency(5.8, 2 * 0.2) }] },
    } as unknown as Placement;
    const measured = new Map<number, MeasuredDevice>([
      [0, { computeMs: 4.4, sendMs: 0.7, descheduledMs: 0.1, memPressure: 0 }],
      [1, { computeMs: 6.5, sendMs: 0.1, descheduledMs: 0, memPressure: 0 }],
    ]);
    const r = predictionReport(placement, ["head (this coordinator)", "w1 \"a\""], measured, 12.4, 40);
    expect(r.rows.map((x) => x.handOffMs)).toEqual([0, 0.6]);
    expect(r.rows[1].predictedMs).toBeCloseTo(4 + 0.6, 12);
    expect(r.predictedHopsMs).toBeCloseTo(4 * 0.2, 12);
    // The rows and the hops still add up to Halda's token.
    expect(r.rows.reduce((a, x) => a + x.predictedMs, 0) + r.predictedHopsMs).toBeCloseTo(5.8 + 4 + 2 * 0.5 + 2 * 0.2, 12);
    expect(formatPrediction(r)).toMatch(/head \(this coordinator\) +2 +4\.60 \(4\.00\+0\.00\+0\.00\+0\.60\)/);
  });

  it("takes the preempted time per step from two status snapshots, as zero from a worker that predates it", () => {
    const status = (computeMs: number, sendMs: number, descheduledMs?: number): Status => ({
      windows: [{ firstLayer: 0, endLayer: 4, cycle: 0, residentBytes: 1, totalBytes: 1, frames: 0, tokens: 0, computeMs, majorFaults: 0 }],
      waitMs: 0, sendMs, anonRssBytes: 1, memTotalBytes: 2, memAvailableBytes: 1, memPressure: 0, frames: 0, layerRoomBytes: 0,
      ...(descheduledMs === undefined ? {} : { descheduledMs }),
    });
    expect(costPerStep(status(10, 2, 1), status(30, 6, 5), 4)).toMatchObject({ computeMs: 5, sendMs: 1, descheduledMs: 1 });
    expect(costPerStep(undefined, status(30, 6), 3).descheduledMs).toBe(0);
  });
});
