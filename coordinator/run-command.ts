// prima-coord run model.gguf -p "..." -n 128: one request through the cluster, streamed to the
// terminal. With no workers the coordinator is a single-device engine; with --min-workers it waits for
// prima-worker daemons and drives the ring. The same cluster object as `serve`, with one request.
import { readFileSync } from "node:fs";
import { Sampler } from "../engine/index.js";
import { GrammarSet, closingStart, type ConstraintSpec, type GrammarConstraint } from "../grammar/index.js";
import { Tokenizer, StreamingDecoder } from "../model/index.js";
import { peakAnonTracker } from "../profiler/index.js";
import { ENGINE_HELP, RING_HELP, SAMPLING_HELP, UsageError, contextShiftFor, intArg, parseClusterArgs, usageExit, type ClusterArgs } from "./args.js";
import type { Cluster } from "./cluster.js";
import type { GenerationOutcome } from "./request-run.js";
import { clusterFor, log, openHead } from "./head.js";
import { ringPosition } from "./placement.js";
import type { RingPlan } from "./plan-ring.js";
import { formatPrediction, type PredictionReport } from "./prediction.js";

const HELP = `usage: prima-coord run model.gguf [options]

  -p, --prompt TEXT        the prompt (default "Once upon a time")
  -n, --n-predict N        tokens to generate (default 128)
${SAMPLING_HELP}
${ENGINE_HELP}
      --chat               wrap the prompt in the model's chat template
      --system TEXT        system message for --chat
      --json               print one JSON object instead of streaming text
      --no-special         do not parse special tokens in the prompt
      --json-schema FILE   the output is JSON valid for this JSON Schema (constrained decoding)
      --grammar FILE       the output follows this grammar (llama.cpp's GBNF, as XGrammar reads it)
  -i, --interactive        a multi-turn chat in the terminal (as prima-coord chat)

ring (with workers):
      --port N             gRPC port workers join on (default 7400)
${RING_HELP}`;

export interface RunArgs extends ClusterArgs {
  readonly prompt: string;
  readonly nPredict: number;
  readonly chat: boolean;
  readonly system?: string;
  readonly json: boolean;
  readonly parseSpecial: boolean;
  readonly port: number;
  /** -i: a multi-turn chat instead of one prompt. */
  readonly interactive: boolean;
  /** --json-schema / --grammar: what constrains the output. */
  readonly constraint?: ConstraintSpec;
}

export { UsageError };

export function parseRunArgs(argv: string[]): RunArgs {
  const { cluster, values } = parseClusterArgs(argv, {
    prompt: { type: "string", short: "p" },
    "n-predict": { type: "string", short: "n" },
    chat: { type: "boolean" },
    system: { type: "string" },
    json: { type: "boolean" },
    "no-special": { type: "boolean" },
    port: { type: "string" },
    interactive: { type: "boolean", short: "i" },
    "json-schema": { type: "string" },
    grammar: { type: "string" },
  }, HELP, "run");
  const str = (k: string) => values[k] as string | undefined;
  const file = (flag: string) => {
    try {
      return readFileSync(str(flag)!, "utf8");
    } catch (e) {
      throw new UsageError(`--${flag}: ${(e as Error).message}`);
    }
  };
  let constraint: ConstraintSpec | undefined;
  if (str("json-schema") !== undefined && str("grammar") !== undefined) throw new UsageError("give --json-schema or --grammar, not both");
  if (str("json-schema") !== undefined) {
    try {
      constraint = { kind: "json-schema", schema: JSON.parse(file("json-schema")) };
    } catch (e) {
      throw e instanceof UsageError ? e : new UsageError(`--json-schema: not JSON: ${(e as Error).message}`);
    }
  }
  if (str("grammar") !== undefined) constraint = { kind: "grammar", grammar: file("grammar") };
  return {
    ...cluster,
    prompt: str("prompt") ?? "Once upon a time",
    nPredict: intArg("n-predict", str("n-predict"), 128),
    chat: (values.chat as boolean | undefined) ?? false,
    system: str("system"),
    json: (values.json as boolean | undefined) ?? false,
    parseSpecial: !values["no-special"],
    port: intArg("port", str("port"), 7400, 0, 65535),
    interactive: (values.interactive as boolean | undefined) ?? false,
    constraint,
  };
}

export interface RunReport {
  prompt_ids: number[];
  generated_ids: number[];
  text: string;
  stop_reason: string;
  prompt_tok_s: number;
  decode_tok_s: number;
  load_ms: number;
  peak_anon_rss_bytes: number;
  threads: number;
  devices: number;
  /** With --json-schema or --grammar: the time the constraint added per token. */
  constraint_ms_per_token?: number;
}

export function timingLine(r: RunReport): string {
  const mib = (b: number) => (b / 2 ** 20).toFixed(1);
  return `prompt ${r.prompt_ids.length} tokens ${r.prompt_tok_s.toFixed(1)} tok/s | decode ${r.generated_ids.length} tokens ` +
    `${r.decode_tok_s.toFixed(1)} tok/s | load ${r.load_ms.toFixed(0)} ms | peak anon RSS ${mib(r.peak_anon_rss_bytes)} MiB | ` +
    `${r.threads} threads, ${r.devices} device${r.devices === 1 ? "" : "s"}` +
    (r.constraint_ms_per_token === undefined ? "" : ` | constraint ${r.constraint_ms_per_token.toFixed(3)} ms/token`);
}

/** Per-device timings per token (decode only when counters were read as decoding started, since a
 * prompt's first pass pays for mapping the weights in and would blur the per-token figures). */
export function summaryTable(rows: GenerationOutcome["perDevice"], tokens: number): string {
  const ms = (v: number) => (tokens > 0 ? v.toFixed(2) : "-");
  const lines = [
    "device                      layers            compute ms/tok  wait ms/tok  send ms/tok  preempted ms/tok  major faults  resident  anon RSS  mem pressure",
  ];
  for (const { label, status: s, cost: c } of rows) {
    const layers = s.windows.map((w) => `${w.firstLayer}-${w.endLayer - 1}`).join(",") || "-";
    const res = s.windows.reduce((a, w) => a + Number(w.residentBytes), 0), tot = s.windows.reduce((a, w) => a + Number(w.totalBytes), 0);
    lines.push(
      `${label.padEnd(27)} ${layers.padEnd(17)} ${ms(c.computeMs).padStart(14)} ${ms(c.waitMs).padStart(12)} ${ms(c.sendMs).padStart(12)} ${ms(c.descheduledMs).padStart(17)} ` +
      `${String(c.majorFaults).padStart(13)} ${(tot ? `${((100 * res) / tot).toFixed(0)}%` : "-").padStart(9)} ` +
      `${`${(Number(s.anonRssBytes) / 2 ** 20).toFixed(0)} MiB`.padStart(9)} ${`${(100 * s.memPressure).toFixed(2)}%`.padStart(13)}`,
    );
  }
  return lines.join("\n");
}

/** The plan and how its prediction held, as --json reports them. */
function placementJson(placement: RingPlan, prediction: PredictionReport | undefined) {
  const nWorkers = placement.labels.length - 1;
  return {
    plan: placement.plan, labels: placement.labels, devices: placement.devices, per_cycle: placement.perCycle,
    release_after_use: placement.releaseAfterUse, links: placement.links, model: placement.model,
    ring_positions: placement.labels.map((_, hi) => ringPosition(hi, nWorkers)), prediction,
  };
}

export async function runCommand(argv: string[]): Promise<number> {
  let a: RunArgs;
  try {
    a = parseRunArgs(argv);
  } catch (e) {
    return usageExit(e);
  }
  if (a.interactive) return (await import("./chat-command.js")).chatWith(a);
  const t0 = performance.now();
  const { model, tok, prompts } = openHead(a);
  let ids: Int32Array;
  try {
    ids = a.chat
      ? prompts.chatIds([...(a.system ? [{ role: "system", content: a.system }] : []), { role: "user", content: a.prompt }])
      : prompts.textIds(a.prompt, a.parseSpecial);
  } catch (e) {
    model.close();
    console.error(`prima-coord: ${(e as Error).message}`);
    return 1;
  }
  const ring = a.minWorkers > 0 || a.layerWindows !== undefined;
  // priced at the cache a decode step attends to on average: a token's attention grows with the cache, so
  // the mean over the run is at its middle (the whole run's cache priced every step: 4.18 ms a token
  // predicted at -n 160 and 5.06 at -n 480 for the MoE benchmark model on one device, 3.3-3.5 measured:
  // bench/history/2026-11-29-moe-capped-480-tokens.md)
  const cluster = clusterFor(a, model, log, { meanCacheTokens: ids.length + Math.ceil(a.nPredict / 2) });
  try {
    if (ids.length >= cluster.o.ctx) throw new UsageError(`the prompt has ${ids.length} tokens, the context only ${cluster.o.ctx}: raise --ctx`);
    let waitMs = 0;
    if (ring) {
      let port: number;
      try {
        port = await cluster.start(a.port);
      } catch (e) {
        if (a.layerWindows === undefined && !/cannot listen/.test((e as Error).message)) {
          throw new Error(`profiling this device failed: ${(e as Error).message}; give --layer-windows to place layers by hand`);
        }
        throw e;
      }
      log(`listening for workers on port ${port}; waiting for ${a.minWorkers}`);
      const w0 = performance.now();
      await cluster.registry.waitFor(a.minWorkers, a.joinTimeoutS * 1000);
      waitMs = performance.now() - w0;
    }
    await cluster.ensurePlaced();
    // Load time: opening the model (and profiling) plus setting up the ring, not the wait for workers.
    const loadMs = performance.now() - t0 - waitMs;
    const report = await generateOnce(a, cluster, tok, ids, loadMs);
    return report;
  } catch (e) {
    console.error(`prima-coord: ${e instanceof Error ? e.message : String(e)}`);
    return 1;
  } finally {
    await cluster.close();
    model.close();
  }
}

async function generateOnce(a: RunArgs, cluster: Cluster, tok: Tokenizer, ids: Int32Array, loadMs: number): Promise<number> {
  const mem = peakAnonTracker();
  const stream = new StreamingDecoder(tok);
  let text = "";
  let count = 0;
  // A story continues the prompt, so show it; a chat reply stands alone.
  let constraint: GrammarConstraint | undefined;
  if (a.constraint) constraint = await (await GrammarSet.forTokenizer(tok)).constraint(a.constraint);
  if (!a.json && !a.chat && !constraint) process.stdout.write(a.prompt);
  const sampler = new Sampler({ ...a.samplerOptions, constraint, closeAfter: closingStart(a.nPredict) });
  const out = await cluster.generate({
    kind: a.chat ? "chat" : "completion", report: true, prompt: ids, maxTokens: a.nPredict, sampler,
    contextShift: contextShiftFor(a, ids.length, tok.addBos, cluster.o.ctx),
    isEnd: (id) => tok.isEog(id),
    onToken: (id) => {
      const piece = stream.push(id);
      text += piece;
      if (!a.json && piece) process.stdout.write(piece);
      if ((count++ & 15) === 0) mem.sample();
    },
  });
  const tail = stream.flush();
  text += tail;
  if (!a.json) process.stdout.write(tail + "\n");
  mem.sample();
  const res = out.result;
  const report: RunReport = {
    prompt_ids: Array.from(ids), generated_ids: res.ids, text, stop_reason: res.stopReason,
    prompt_tok_s: res.promptTokens / (res.promptMs / 1000), decode_tok_s: res.decodeSteps > 0 ? res.decodeSteps / (res.decodeMs / 1000) : 0,
    load_ms: loadMs, peak_anon_rss_bytes: mem.peakBytes(), threads: cluster.model.threads, devices: out.devices,
    ...(constraint && constraint.steps > 0 ? { constraint_ms_per_token: constraint.ms / constraint.steps } : {}),
  };
  constraint?.dispose();
  const ring = out.devices > 1;
  const decodeOnly = out.perDevice.some((r) => r.before);
  const steps = decodeOnly ? res.decodeSteps : res.ids.length + res.promptTokens;
  if (a.json) {
    console.log(JSON.stringify({
      ...report,
      ...(ring || out.placement ? { cycles: out.cycles, layer_windows: out.layersPerCycle } : {}),
      ...(ring ? { devices_status: out.perDevice.map((r) => ({ device: r.label, status: r.status })) } : {}),
      ...(ring && decodeOnly ? {
        devices_decode: out.perDevice.map((r) => ({ device: r.label, compute_ms: r.cost.computeMs, wait_ms: r.cost.waitMs, send_ms: r.cost.sendMs, descheduled_ms: r.cost.descheduledMs, major_faults: r.cost.majorFaults, read_bytes: r.cost.readBytes })),
      } : {}),
      ...(out.placement ? { placement: placementJson(out.placement, out.prediction) } : {}),
    }));
  } else {
    console.error(timingLine(report));
    if (ring) {
      const what = decodeOnly ? `per decode step, ${steps} steps` : `per token of ${steps} through the ring`;
      console.error(`per device (${what}):\n${summaryTable(out.perDevice, steps)}`);
    }
  }
  if (out.prediction) console.error(`[prima-coord] ${formatPrediction(out.prediction)}`);
  return 0;
}
