// GET /metrics: the cluster's counters in Prometheus' text format (version 0.0.4).
import type { ClusterState } from "./state.js";

/** Escapes a label value (backslash, double quote and newline, as the format requires). */
function label(v: string): string {
  return v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}

/** What the HTTP API counts: how each request ended. */
export type RequestOutcomes = Record<"ok" | "error" | "rejected" | "cancelled" | "invalid", number>;

export function newRequestOutcomes(): RequestOutcomes {
  return { ok: 0, error: 0, rejected: 0, cancelled: 0, invalid: 0 };
}

/** What the cluster counts, for every front door (coordinator/cluster.ts). */
export interface ClusterCounters {
  readonly promptTokens: number;
  readonly cachedTokens: number;
  readonly ttftMsSum: number;
  readonly ttftCount: number;
  readonly decodeMsSum: number;
  readonly decodeSteps: number;
  readonly lost: number;
  readonly replans: number;
  readonly recoveries: number;
  readonly recoveryMsSum: number;
  readonly recoveryMsLast: number;
  readonly batchSteps?: number;
  readonly batchRows?: number;
  readonly batchWidest?: number;
  readonly batchInFlightMax?: number;
}

/** What constrained decoding (structured output, tools) cost: masks and accepts, and the tokens. */
export interface ConstraintCounters {
  readonly ms: number;
  readonly tokens: number;
}

export function formatMetrics(s: ClusterState, outcomes: RequestOutcomes, k: ClusterCounters, c: ConstraintCounters = { ms: 0, tokens: 0 }): string {
  const out: string[] = [];
  const metric = (name: string, type: string, help: string, samples: [string, number][]) => {
    out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
    for (const [labels, v] of samples) out.push(`${name}${labels} ${Number.isFinite(v) ? v : 0}`);
  };
  metric("prima_requests_total", "counter", "Requests by outcome.", Object.entries(outcomes).map(([k, v]) => [`{outcome="${k}"}`, v]));
  metric("prima_generated_tokens_total", "counter", "Tokens generated.", [["", s.requests.generatedTokens]]);
  metric("prima_prompt_tokens_total", "counter", "Prompt tokens of the requests that ran.", [["", k.promptTokens]]);
  metric("prima_prompt_tokens_cached_total", "counter", "Prompt tokens whose KV cache was reused from the previous request.", [["", k.cachedTokens]]);
  metric("prima_queue_length", "gauge", "Requests waiting for the ring.", [["", s.requests.queueLength]]);
  metric("prima_request_active", "gauge", "1 while a request is generating.", [["", s.requests.active ? 1 : 0]]);
  metric("prima_time_to_first_token_seconds", "summary", "Time from a request leaving the queue to its first token.", [
    ["_sum", k.ttftMsSum / 1000], ["_count", k.ttftCount],
  ]);
  metric("prima_decode_seconds_total", "counter", "Time spent in decode steps (one token each) at the server.", [["", k.decodeMsSum / 1000]]);
  metric("prima_decode_steps_total", "counter", "Decode steps (one token each).", [["", k.decodeSteps]]);
  if (s.requests.slots) {
    metric("prima_slots", "gauge", "Sequence slots (serve --parallel), by state.", ["idle", "processing"].map((st) => [`{state="${st}"}`, s.requests.slots!.filter((x) => x.state === st).length]));
    metric("prima_batch_steps_total", "counter", "Decode passes of the parallel sequences (one token of each active sequence per pass).", [["", k.batchSteps ?? 0]]);
    metric("prima_batch_rows_total", "counter", "Sequences those passes took: rows / steps is the mean batch.", [["", k.batchRows ?? 0]]);
    metric("prima_batch_rows_max", "gauge", "The most sequences one pass took since the server started.", [["", k.batchWidest ?? 0]]);
    metric("prima_batch_passes_in_flight_max", "gauge", "The most decode passes round the ring at once (groups of sequences on different devices) since the server started.", [["", k.batchInFlightMax ?? 0]]);
  }
  metric("prima_constraint_seconds_total", "counter", "Time the grammar constraint (structured output, tools) added to sampling.", [["", c.ms / 1000]]);
  metric("prima_constrained_tokens_total", "counter", "Tokens sampled under a grammar constraint.", [["", c.tokens]]);
  metric("prima_devices_lost_total", "counter", "Devices lost (exit, crash, hang, network).", [["", k.lost]]);
  metric("prima_replans_total", "counter", "Times layers were placed again (devices joined or left, or a request recovered).", [["", k.replans]]);
  metric("prima_recovery_seconds", "summary", "Pause of a request's stream from a lost device to its next token.", [
    ["_sum", k.recoveryMsSum / 1000], ["_count", k.recoveries],
  ]);
  metric("prima_last_recovery_seconds", "gauge", "The pause of the latest recovery.", [["", k.recoveryMsLast / 1000]]);
  metric("prima_ready", "gauge", "1 when the cluster can serve requests.", [["", s.server.ready ? 1 : 0]]);
  metric("prima_plan_generation", "counter", "Times the layers were placed.", [["", s.plan?.generation ?? 0]]);
  const states = new Map<string, number>();
  for (const d of s.devices) states.set(d.state, (states.get(d.state) ?? 0) + 1);
  metric("prima_devices", "gauge", "Devices by state.", [...states].map(([k, v]) => [`{state="${label(k)}"}`, v]));
  const perDevice: [string, number][] = [];
  for (const d of s.devices) {
    if (!d.measured) continue;
    const l = (part: string) => `{device="${label(d.id)}",name="${label(d.name)}",part="${part}"}`;
    perDevice.push([l("compute"), d.measured.computeMs], [l("wait"), d.measured.waitMs], [l("send"), d.measured.sendMs]);
  }
  metric("prima_device_ms_per_token", "gauge", "Each device's milliseconds per decode step in the last request, by part.", perDevice);
  const preempted: [string, number][] = s.devices.filter((d) => d.measured).map((d) => [`{device="${label(d.id)}",name="${label(d.name)}"}`, d.measured!.descheduledMs ?? 0]);
  metric("prima_device_preempted_ms_per_token", "gauge", "Of each device's compute and send: milliseconds per decode step another process had its CPU.", preempted);
  const predicted: [string, number][] = s.devices.filter((d) => d.predicted).map((d) => [`{device="${label(d.id)}",name="${label(d.name)}"}`, d.predicted!.totalMs]);
  metric("prima_device_predicted_ms_per_token", "gauge", "Halda's predicted milliseconds per token of each device.", predicted);
  const windowSamples = (f: (w: ClusterState["devices"][number]["windows"][number]) => number | null | undefined) => s.devices.flatMap((d) =>
    d.windows.filter((w) => typeof f(w) === "number").map((w): [string, number] => [`{device="${label(d.id)}",name="${label(d.name)}",layers="${w.firstLayer}-${w.endLayer}"}`, f(w)!]));
  metric("prima_window_resident_bytes", "gauge", "Bytes of each window's weights in the page cache.", windowSamples((w) => w.residentBytes));
  metric("prima_window_bytes", "gauge", "Bytes of each window's weights.", windowSamples((w) => w.totalBytes));
  metric("prima_window_experts_resident", "gauge", "Experts (one per MoE layer and expert) of each MoE window wholly in the page cache.", windowSamples((w) => w.expertsResident));
  metric("prima_window_experts", "gauge", "Experts (one per MoE layer and expert) of each MoE window.", windowSamples((w) => w.expertsTotal));
  return `${out.join("\n")}\n`;
}
