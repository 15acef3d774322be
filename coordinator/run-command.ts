// prima-coord run model.gguf -p "..." -n 128: generate text. With no workers the coordinator is a
// single-device engine; with --min-workers it waits for prima-worker daemons and drives the ring.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { LocalModel, LocalPipeline, Sampler, generate, type Pipeline } from "../engine/index.js";
import { Tokenizer, StreamingDecoder } from "../model/tokenizer.js";
import type { ChatTemplateOptions } from "../model/chat-template.js";
import { peakAnonTracker } from "../profiler/index.js";
import { RING_COMPUTE_OPTIONS } from "../ring/index.js";

const HELP = `usage: prima-coord run model.gguf [options]

  -p, --prompt TEXT        the prompt (default "Once upon a time")
  -n, --n-predict N        tokens to generate (default 128)
      --temp X             temperature, 0 = greedy (default 0.8)
      --top-k N            (default 40)      --top-p X   (default 0.95)
      --min-p X            (default 0.05)    --repeat-penalty X (default 1.0)
      --seed N             sampling seed (default random)
  -t, --threads N          compute threads (default: all cores)
  -c, --ctx N              context size in tokens (default 2048, at most the model's)
  -b, --batch N            prompt batch size (default 128)
      --chat               wrap the prompt in the model's chat template
      --system TEXT        system message for --chat
      --chat-template T    for a model without a template: chatml or llama2, or a Jinja file
      --json               print one JSON object instead of streaming text
      --no-special         do not parse special tokens in the prompt

ring (with workers):
      --port N             gRPC port workers join on (default 7400)
      --min-workers N      wait for N workers before running (default 0: run alone)
      --layer-windows LIST layers per device per cycle, ring order: workers in join order, then the head
                           (default: every device is profiled and Halda places the layers)
  -k, --cycles N           ring cycles per token (with --layer-windows; default: layers / sum of windows)
      --reprofile          measure this device again instead of using its cached profile
      --no-prefetch        do not advise the OS to page in the next window
      --join-timeout S     seconds to wait for workers (default 60)`;

export interface RunArgs {
  readonly model: string;
  readonly prompt: string;
  readonly nPredict: number;
  readonly sampler: Sampler;
  readonly threads?: number;
  readonly ctx: number;
  readonly batch: number;
  readonly chat: boolean;
  readonly system?: string;
  readonly chatTemplate?: string;
  readonly json: boolean;
  readonly parseSpecial: boolean;
  readonly port: number;
  readonly minWorkers: number;
  readonly layerWindows?: number[];
  readonly cycles?: number;
  readonly prefetch: boolean;
  readonly reprofile: boolean;
  readonly joinTimeoutS: number;
}

export class UsageError extends Error {
  override name = "UsageError";
}

function intArg(name: string, v: string | undefined, dflt: number, min = 0): number {
  if (v === undefined) return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n < min) throw new UsageError(`--${name} must be a whole number >= ${min} (got "${v}")`);
  return n;
}

function numArg(name: string, v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n)) throw new UsageError(`--${name} must be a number (got "${v}")`);
  return n;
}

export function parseRunArgs(argv: string[]): RunArgs {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      prompt: { type: "string", short: "p" },
      "n-predict": { type: "string", short: "n" },
      temp: { type: "string" },
      "top-k": { type: "string" },
      "top-p": { type: "string" },
      "min-p": { type: "string" },
      "repeat-penalty": { type: "string" },
      seed: { type: "string" },
      threads: { type: "string", short: "t" },
      ctx: { type: "string", short: "c" },
      batch: { type: "string", short: "b" },
      chat: { type: "boolean" },
      system: { type: "string" },
      "chat-template": { type: "string" },
      json: { type: "boolean" },
      "no-special": { type: "boolean" },
      port: { type: "string" },
      "min-workers": { type: "string" },
      "layer-windows": { type: "string" },
      cycles: { type: "string", short: "k" },
      "no-prefetch": { type: "boolean" },
      reprofile: { type: "boolean" },
      "join-timeout": { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) throw new UsageError(HELP);
  if (positionals.length !== 1) throw new UsageError(`run needs exactly one model file\n${HELP}`);
  const sampler = new Sampler({
    temperature: numArg("temp", values.temp),
    topK: values["top-k"] === undefined ? undefined : intArg("top-k", values["top-k"], 40),
    topP: numArg("top-p", values["top-p"]),
    minP: numArg("min-p", values["min-p"]),
    repeatPenalty: numArg("repeat-penalty", values["repeat-penalty"]),
    seed: values.seed === undefined ? undefined : intArg("seed", values.seed, 0),
  });
  let layerWindows: number[] | undefined;
  if (values["layer-windows"] !== undefined) {
    layerWindows = values["layer-windows"].split(",").map((s) => intArg("layer-windows", s.trim(), 0));
    if (layerWindows.length === 0 || layerWindows.every((w) => w === 0)) throw new UsageError("--layer-windows needs at least one non-zero window");
  }
  return {
    model: positionals[0],
    prompt: values.prompt ?? "Once upon a time",
    nPredict: intArg("n-predict", values["n-predict"], 128),
    sampler,
    threads: values.threads === undefined ? undefined : intArg("threads", values.threads, 1, 1),
    ctx: intArg("ctx", values.ctx, 2048, 1),
    batch: intArg("batch", values.batch, 128, 1),
    chat: values.chat ?? false,
    system: values.system,
    chatTemplate: values["chat-template"],
    json: values.json ?? false,
    parseSpecial: !values["no-special"],
    port: intArg("port", values.port, 7400, 0),
    minWorkers: intArg("min-workers", values["min-workers"], 0),
    layerWindows,
    cycles: values.cycles === undefined ? undefined : intArg("cycles", values.cycles, 1, 1),
    prefetch: !values["no-prefetch"],
    reprofile: values.reprofile ?? false,
    joinTimeoutS: intArg("join-timeout", values["join-timeout"], 60, 1),
  };
}

/** The prompt as token ids: optionally through the chat template, BOS as the vocabulary asks. */
export async function promptIds(tok: Tokenizer, a: RunArgs): Promise<Int32Array> {
  if (!a.chat) return tok.encode(a.prompt, { addSpecial: true, parseSpecial: a.parseSpecial });
  const { renderChat } = await import("../model/chat-template.js");
  const messages = [...(a.system ? [{ role: "system", content: a.system }] : []), { role: "user", content: a.prompt }];
  // The rendered text leaves out the BOS the tokenizer adds itself (as llama.cpp does).
  const t = a.chatTemplate;
  const choice: ChatTemplateOptions = t === undefined ? {} : t === "chatml" || t === "llama2" ? { fallback: t } : { template: readFileSync(t, "utf8") };
  const text = renderChat(tok, messages, { addGenerationPrompt: true, ...choice });
  return tok.encode(text, { addSpecial: true, parseSpecial: true });
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
}

/** Generates on `pipeline` and streams text to stdout (unless --json); returns the report. */
export async function runGeneration(a: RunArgs, model: LocalModel, tok: Tokenizer, pipeline: Pipeline, loadMs: number, devices: number): Promise<RunReport> {
  const mem = peakAnonTracker();
  const ids = await promptIds(tok, a);
  if (ids.length >= pipeline.nCtx) throw new UsageError(`the prompt has ${ids.length} tokens, the context only ${pipeline.nCtx}: raise --ctx`);
  const stream = new StreamingDecoder(tok);
  let text = "";
  let count = 0;
  // A story continues the prompt, so show it; a chat reply stands alone.
  if (!a.json && !a.chat) process.stdout.write(a.prompt);
  const res = await generate(model, pipeline, ids, {
    maxTokens: a.nPredict,
    sampler: a.sampler,
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
  return {
    prompt_ids: Array.from(ids),
    generated_ids: res.ids,
    text,
    stop_reason: res.stopReason,
    prompt_tok_s: res.promptTokens / (res.promptMs / 1000),
    decode_tok_s: res.decodeSteps > 0 ? res.decodeSteps / (res.decodeMs / 1000) : 0,
    load_ms: loadMs,
    peak_anon_rss_bytes: mem.peakBytes(),
    threads: model.threads,
    devices,
  };
}

export function timingLine(r: RunReport): string {
  const mib = (b: number) => (b / 2 ** 20).toFixed(1);
  return `prompt ${r.prompt_ids.length} tokens ${r.prompt_tok_s.toFixed(1)} tok/s | decode ${r.generated_ids.length} tokens ` +
    `${r.decode_tok_s.toFixed(1)} tok/s | load ${r.load_ms.toFixed(0)} ms | peak anon RSS ${mib(r.peak_anon_rss_bytes)} MiB | ` +
    `${r.threads} threads, ${r.devices} device${r.devices === 1 ? "" : "s"}`;
}

export async function runCommand(argv: string[]): Promise<number> {
  let a: RunArgs;
  try {
    a = parseRunArgs(argv);
  } catch (e) {
    console.error((e as Error).message);
    return 2;
  }
  const t0 = performance.now();
  const ring = a.minWorkers > 0 || a.layerWindows !== undefined;
  // As head of a ring, its threads wait for the rest of the ring between windows (RING_COMPUTE_OPTIONS).
  const model = LocalModel.open(a.model, { threads: a.threads, ...(ring ? RING_COMPUTE_OPTIONS : {}) });
  const tok = Tokenizer.fromGguf(model.gguf);
  const ctx = Math.min(a.ctx, model.desc.hparams.nCtxTrain);
  if (ring) {
    const { runRing } = await import("./ring-run.js");
    return runRing(a, model, tok, ctx, t0);
  }
  const pipeline = new LocalPipeline(model, ctx, a.batch);
  const report = await runGeneration(a, model, tok, pipeline, performance.now() - t0, 1);
  if (a.json) console.log(JSON.stringify(report));
  else console.error(timingLine(report));
  pipeline.close();
  model.close();
  return 0;
}
