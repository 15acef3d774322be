// Command-line options shared by run, chat and serve: the engine, sampling and the ring. Each command
// adds its own; a usage error is a UsageError whose message is what to print.
import { parseArgs, type ParseArgsConfig } from "node:util";
import { Sampler, resolveKeep, type ContextShift } from "../engine/index.js";
import type { KvCacheTypes } from "../model/index.js";
import type { LayerWindowsArg } from "./cluster-options.js";
import type { PrefetchMode } from "./prefetch-choice.js";
import { KV_CACHE_HELP, KV_CACHE_OPTIONS, expandKvCacheShortFlags, kvCacheTypesFrom } from "./kv-cache-options.js";

export class UsageError extends Error {
  override name = "UsageError";
}

export function intArg(name: string, v: string | undefined, dflt: number, min = 0, max = Number.MAX_SAFE_INTEGER): number {
  if (v === undefined) return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n < min || n > max) throw new UsageError(`--${name} must be a whole number from ${min} to ${max} (got "${v}")`);
  return n;
}

export function numArg(name: string, v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n)) throw new UsageError(`--${name} must be a number (got "${v}")`);
  return n;
}

export const SAMPLING_HELP = `      --temp X             temperature, 0 = greedy (default 0.8)
      --top-k N            (default 40)      --top-p X   (default 0.95)
      --min-p X            (default 0.05)    --repeat-penalty X (default 1.0)
      --seed N             sampling seed (default random)`;

export const ENGINE_HELP = `  -t, --threads N          compute threads (default: all cores)
  -c, --ctx N              context size in tokens (default 2048, at most the model's)
  -b, --batch N            prompt batch size (default 128)
${KV_CACHE_HELP}
      --chat-template T    for a model without a template: chatml or llama2, or a Jinja file
      --keep N             past the context, keep the first N tokens after BOS (-1: the whole prompt; default 0)
      --no-context-shift   stop when the context is full instead of shifting it (--context-shift: the default)
      --kv-evict h2o       past the context, keep the --keep tokens, the most recent and the most attended
                           (H2O heavy hitters) instead of dropping the oldest half; run, chat and serve
      --kv-budget F        H2O: the fraction of the context kept (default 0.2)`;

export const RING_HELP = `      --min-workers N      wait for N workers before running (default 0: run alone)
      --layer-windows LIST layers per device per cycle: in ring order (workers by name, then the head),
                           or by name (laptop=8,phone=4,head=10); default: Halda places the layers
  -k, --cycles N           ring cycles per token (with --layer-windows; default: layers / sum of windows)
      --keep-all           place layers on every device, even those Halda would leave out
      --uniform-routing    MoE: price the plan as if every expert were as hot, instead of with each
                           layer's routing measured on this device (the default: once per model, then
                           kept; --measure-routing says so explicitly)
      --reprofile          measure this device again instead of using its cached profile
      --prefetch           read each device's next window ahead while the others compute
      --no-prefetch        never read ahead (default: each device reads ahead unless it shares a
                           machine's CPUs with another and its disk reads are CPU work)
      --expert-prefetch    MoE: advise the OS about each layer's predicted experts while it computes,
                           on devices whose windows do not fit in memory (off by default)
      --join-timeout S     seconds to wait for workers (default 60)`;

const SHARED_OPTIONS = {
  temp: { type: "string" },
  "top-k": { type: "string" },
  "top-p": { type: "string" },
  "min-p": { type: "string" },
  "repeat-penalty": { type: "string" },
  seed: { type: "string" },
  threads: { type: "string", short: "t" },
  ctx: { type: "string", short: "c" },
  batch: { type: "string", short: "b" },
  "chat-template": { type: "string" },
  keep: { type: "string" },
  "context-shift": { type: "boolean" },
  "no-context-shift": { type: "boolean" },
  "kv-evict": { type: "string" },
  "kv-budget": { type: "string" },
  "min-workers": { type: "string" },
  "layer-windows": { type: "string" },
  cycles: { type: "string", short: "k" },
  "keep-all": { type: "boolean" },
  "measure-routing": { type: "boolean" },
  "uniform-routing": { type: "boolean" },
  "no-prefetch": { type: "boolean" },
  prefetch: { type: "boolean" },
  "expert-prefetch": { type: "boolean" },
  reprofile: { type: "boolean" },
  "join-timeout": { type: "string" },
  ...KV_CACHE_OPTIONS,
  help: { type: "boolean", short: "h" },
} as const satisfies NonNullable<ParseArgsConfig["options"]>;

/** What run, chat and serve have in common. */
export interface ClusterArgs {
  readonly model: string;
  readonly samplerOptions: ConstructorParameters<typeof Sampler>[0];
  readonly threads?: number;
  readonly ctx: number;
  readonly batch: number;
  /** --cache-type-k/-v: the KV cache's types on every device. */
  readonly kvCacheTypes: KvCacheTypes;
  readonly chatTemplate?: string;
  /** --kv-evict h2o: past the context, evict by H2O keeping this fraction of it (--kv-budget). */
  readonly h2oBudget?: number;
  /** Past the context: shift it (--no-context-shift: stop), keeping --keep tokens after BOS. */
  readonly contextShift: boolean;
  readonly nKeep: number;
  readonly minWorkers: number;
  readonly layerWindows?: LayerWindowsArg;
  readonly cycles?: number;
  readonly keepAll: boolean;
  readonly measureRouting: boolean;
  readonly prefetch: PrefetchMode;
  readonly expertPrefetch: boolean;
  readonly reprofile: boolean;
  readonly joinTimeoutS: number;
}

/** `1,2,3` (ring order) or `laptop=8,phone=4,head=10` (by device name). */
export function parseLayerWindows(v: string): LayerWindowsArg {
  const parts = v.split(",").map((s) => s.trim());
  if (parts.some((p) => p.includes("="))) {
    const byName = new Map<string, number>();
    for (const p of parts) {
      const i = p.lastIndexOf("=");
      const name = p.slice(0, i).trim();
      if (i <= 0 || !name) throw new UsageError(`--layer-windows: "${p}" is not NAME=LAYERS (use names for every device, or none)`);
      if (byName.has(name)) throw new UsageError(`--layer-windows names "${name}" twice`);
      byName.set(name, intArg("layer-windows", p.slice(i + 1).trim(), 0));
    }
    if ([...byName.values()].every((w) => w === 0)) throw new UsageError("--layer-windows needs at least one non-zero window");
    return { byName };
  }
  const list = parts.map((s) => intArg("layer-windows", s, 0));
  if (list.length === 0 || list.every((w) => w === 0)) throw new UsageError("--layer-windows needs at least one non-zero window");
  return { list };
}

type Extra = NonNullable<ParseArgsConfig["options"]>;

/** Parses the shared options plus `extra`; exactly one positional (the model file) is required.
 * Throws UsageError (with the help text for -h). */
export function parseClusterArgs<E extends Extra>(argv: string[], extra: E, help: string, command: string) {
  const { values, positionals } = parseArgs({ args: expandKvCacheShortFlags(argv), allowPositionals: true, options: { ...SHARED_OPTIONS, ...extra } });
  const v = values as Record<string, string | boolean | undefined>;
  if (v.help) throw new UsageError(help);
  if (positionals.length !== 1) throw new UsageError(`${command} needs exactly one model file\n${help}`);
  const str = (k: string) => v[k] as string | undefined;
  const samplerOptions = {
    temperature: numArg("temp", str("temp")),
    topK: str("top-k") === undefined ? undefined : intArg("top-k", str("top-k"), 40),
    topP: numArg("top-p", str("top-p")),
    minP: numArg("min-p", str("min-p")),
    repeatPenalty: numArg("repeat-penalty", str("repeat-penalty")),
    seed: str("seed") === undefined ? undefined : intArg("seed", str("seed"), 0, 0, 2 ** 32 - 1),
  };
  try {
    new Sampler(samplerOptions); // checks the values now, as a usage error
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  let kvCacheTypes: KvCacheTypes;
  try {
    kvCacheTypes = kvCacheTypesFrom(v);
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  if (v["context-shift"] && v["no-context-shift"]) throw new UsageError("give --context-shift or --no-context-shift, not both");
  const kvEvict = str("kv-evict");
  if (kvEvict !== undefined && kvEvict !== "h2o") throw new UsageError(`--kv-evict ${JSON.stringify(kvEvict.slice(0, 40))}: the eviction prima has is h2o`);
  if (kvEvict === undefined && str("kv-budget") !== undefined) throw new UsageError("--kv-budget needs --kv-evict h2o");
  if (v.prefetch && v["no-prefetch"]) throw new UsageError("--prefetch and --no-prefetch: choose one");
  if (v["measure-routing"] && v["uniform-routing"]) throw new UsageError("--measure-routing and --uniform-routing: choose one");
  if (kvEvict) {
    if (command !== "run" && command !== "chat" && command !== "serve") throw new UsageError(`--kv-evict h2o: ${command} does not evict by H2O (run, chat and serve do)`);
    if (v["no-context-shift"]) throw new UsageError("--kv-evict h2o works past the context: not with --no-context-shift");
    if (kvCacheTypes.attention) throw new UsageError("--kv-evict h2o with --attention sparse: a landmark is no position to score; choose one");
    kvCacheTypes = { ...kvCacheTypes, evict: "h2o" };
  }
  const kvBudget = str("kv-budget") === undefined ? 0.2 : numArg("kv-budget", str("kv-budget"));
  if (kvBudget === undefined || !(kvBudget > 0 && kvBudget < 1)) throw new UsageError(`--kv-budget ${JSON.stringify(String(str("kv-budget")).slice(0, 40))}: a fraction between 0 and 1`);
  const cluster: ClusterArgs = {
    model: positionals[0],
    samplerOptions,
    threads: str("threads") === undefined ? undefined : intArg("threads", str("threads"), 1, 1, 1024),
    ctx: intArg("ctx", str("ctx"), 2048, 1),
    batch: intArg("batch", str("batch"), 128, 1),
    kvCacheTypes,
    chatTemplate: str("chat-template"),
    contextShift: !v["no-context-shift"],
    nKeep: intArg("keep", str("keep"), 0, -1),
    ...(kvEvict ? { h2oBudget: kvBudget } : {}),
    minWorkers: intArg("min-workers", str("min-workers"), 0),
    layerWindows: str("layer-windows") === undefined ? undefined : parseLayerWindows(str("layer-windows")!),
    cycles: str("cycles") === undefined ? undefined : intArg("cycles", str("cycles"), 1, 1),
    keepAll: (v["keep-all"] as boolean | undefined) ?? false,
    // measured unless asked otherwise (docs/HALDA.md "Where the shares come from")
    measureRouting: !v["uniform-routing"],
    prefetch: v.prefetch ? "on" : v["no-prefetch"] ? "off" : "auto",
    expertPrefetch: (v["expert-prefetch"] as boolean | undefined) ?? false,
    reprofile: (v.reprofile as boolean | undefined) ?? false,
    joinTimeoutS: intArg("join-timeout", str("join-timeout"), 60, 1),
  };
  return { cluster, values: v };
}

/** A request's context shift (undefined: --no-context-shift): nKeep tokens after BOS stay (-1: the
 * whole prompt), as llama-server resolves n_keep (engine resolveKeep). */
export function contextShiftFor(a: Pick<ClusterArgs, "contextShift" | "nKeep"> & { readonly h2oBudget?: number }, promptTokens: number, addBos: boolean,
  ctx: number, nKeep = a.nKeep, nDiscard?: number): ContextShift | undefined {
  return a.contextShift
    ? { keep: resolveKeep(nKeep, promptTokens, addBos, ctx), discard: nDiscard, ...(a.h2oBudget !== undefined ? { h2o: a.h2oBudget } : {}) }
    : undefined;
}

/** Runs a command's body, turning a UsageError into its message and exit code 2. */
export function usageExit(e: unknown): number {
  if (e instanceof UsageError || (e instanceof Error && e.name === "TypeError" && "code" in e && String((e as { code: unknown }).code).startsWith("ERR_PARSE_ARGS"))) {
    console.error((e as Error).message);
    return 2;
  }
  throw e;
}
