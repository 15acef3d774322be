// prima-coord plan model.gguf --devices devices.json: Halda's plan for a cluster, as a table next to
// the baselines' predictions, or as JSON. The model is profiled from its GGUF header (no weights are
// read), or from a named shape when the file is not at hand (--shape llama3-70b --type Q4_K_M).
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { baselineNames, baselinePlan, halda, HaldaError, parseDeviceProfiles, type DeviceProfile, type HaldaOptions, type Plan } from "../halda/index.js";
import {
  describeModel, FILE_TYPE_NAMES, GgufError, kvBytesPerLayer, kvCacheProblem, modelProfile, modelShapeByName, modelShapes, parseFileType, readGguf,
  syntheticModelDescription, type KvCacheTypes, type ModelDescription, type ModelProfile,
} from "../model/index.js";
import { KV_CACHE_OPTIONS, expandKvCacheShortFlags, kvCacheTypesFrom } from "./kv-cache-options.js";
import { LocalModel } from "../engine/index.js";
import { measureExpertRouting } from "../profiler/index.js";

const HELP = `usage: prima-coord plan model.gguf --devices devices.json [options]
       prima-coord plan --shape NAME --type TYPE --devices devices.json [options]

  --devices FILE      device profiles, ring order, the head first (schema: deploy/README.md)
  --shape NAME        plan a model that is not on disk: ${modelShapes.map((s) => s.name).join(", ")}
  --type TYPE         its file type: ${FILE_TYPE_NAMES.join(", ")}
  -c, --ctx N         KV cache size in tokens (default 1024)
  -ctk, -ctv T        the KV cache's types (--cache-type-k/-v: f16, q8_0, q4_0, q8_0-rot, q4_0-rot)
  -k, --k N           ring cycles per token (default: Halda chooses)
  --mode MODE         exact (default: the model's global optimum) or prima (prima.cpp's Algorithm 1)
  --prefetch-guard    one overloaded window must fit in RAM (makes k > 1 worth it when memory is short)
  --keep-all          no device selection: place layers on every device, even those Halda would drop
  --paper-selection   prima.cpp's device selection (drop every device left with one layer, even when
                      that is slower) instead of the best subset of devices (as run does)
  --measure-routing   a mixture of experts given as a file: run a short text through it on this machine
                      and price rereads with the routing skew measured (default: uniform routing)
  --json              print one JSON object: the plan, the baselines and the model profile`;

class UsageError extends Error {
  override name = "UsageError";
}

interface PlanArgs {
  readonly model?: string;
  readonly shape?: string;
  readonly type?: string;
  readonly devices: string;
  readonly ctx: number;
  readonly kvCacheTypes: KvCacheTypes;
  readonly options: HaldaOptions;
  readonly json: boolean;
  readonly measureRouting: boolean;
}

function intArg(name: string, v: string | undefined, dflt: number, min: number): number {
  if (v === undefined) return dflt;
  const n = Number(v);
  if (v.trim() === "" || !Number.isInteger(n) || n < min) throw new UsageError(`--${name} must be a whole number >= ${min} (got "${v}")`);
  return n;
}

export function parsePlanArgs(argv: string[]): PlanArgs | "help" {
  let parsed;
  try {
    parsed = parseArgs({
      args: expandKvCacheShortFlags(argv),
      allowPositionals: true,
      options: {
        devices: { type: "string" },
        shape: { type: "string" },
        type: { type: "string" },
        ctx: { type: "string", short: "c" },
        k: { type: "string", short: "k" },
        mode: { type: "string" },
        "prefetch-guard": { type: "boolean" },
        "keep-all": { type: "boolean" },
        "paper-selection": { type: "boolean" },
        json: { type: "boolean" },
        "measure-routing": { type: "boolean" },
        help: { type: "boolean", short: "h" },
        ...KV_CACHE_OPTIONS,
      },
    });
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  const { values: v, positionals } = parsed;
  if (v.help) return "help";
  if (positionals.length > 1) throw new UsageError(`expected one model file, got ${positionals.length}: ${positionals.join(" ")}`);
  const model = positionals[0];
  if (model !== undefined && (v.shape !== undefined || v.type !== undefined)) throw new UsageError("give either a model file or --shape/--type, not both");
  if (model === undefined && (v.shape === undefined || v.type === undefined)) throw new UsageError("missing the model: give model.gguf, or --shape NAME --type TYPE");
  if (v.devices === undefined) throw new UsageError("missing --devices FILE");
  if (v["measure-routing"] && model === undefined) throw new UsageError("--measure-routing runs the model: give a model file, not --shape");
  let kvCacheTypes: KvCacheTypes;
  try {
    kvCacheTypes = kvCacheTypesFrom(v);
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  const mode = v.mode ?? "exact";
  if (mode !== "exact" && mode !== "prima") throw new UsageError(`--mode must be exact or prima (got "${mode}")`);
  return {
    model, shape: v.shape, type: v.type, devices: v.devices,
    ctx: intArg("ctx", v.ctx, 1024, 1),
    kvCacheTypes,
    json: v.json ?? false,
    measureRouting: v["measure-routing"] ?? false,
    options: {
      mode,
      k: intArg("k", v.k, 0, 1),
      prefetchGuard: v["prefetch-guard"] ?? false,
      // The selection `prima-coord run` applies (the best subset, in either mode), unless asked otherwise.
      selection: v["paper-selection"] ? "paper" : "best",
      keepAll: v["keep-all"] ?? false,
    },
  };
}

function loadModel(a: PlanArgs): { desc: ModelDescription; label: string } {
  if (a.model !== undefined) {
    try {
      return { desc: describeModel(readGguf(a.model)), label: a.model };
    } catch (e) {
      if (e instanceof GgufError) throw new UsageError(e.message);
      throw e;
    }
  }
  const shape = modelShapeByName(a.shape!);
  if (!shape) throw new UsageError(`unknown --shape "${a.shape}" (known: ${modelShapes.map((s) => s.name).join(", ")})`);
  const type = parseFileType(a.type!);
  if (!type) throw new UsageError(`unknown --type "${a.type}" (known: ${FILE_TYPE_NAMES.join(", ")})`);
  return { desc: syntheticModelDescription(shape, type), label: `${shape.name} ${type} (synthetic tensor table)` };
}

function loadDevices(path: string): { devices: DeviceProfile[]; warnings: string[] } {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new UsageError(`--devices ${path}: cannot read: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new UsageError(`--devices ${path}: not valid JSON: ${(e as Error).message}`);
  }
  try {
    return parseDeviceProfiles(json);
  } catch (e) {
    if (e instanceof HaldaError) throw new UsageError(`--devices ${path}: ${e.message}`);
    throw e;
  }
}

const GiB = 2 ** 30;
const ms = (x: number) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2));

function table(rows: string[][]): string {
  const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
  return rows.map((r) => r.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]) : cell.padStart(widths[c]))).join("  ").trimEnd()).join("\n");
}

function describePlan(plan: Plan): string {
  const rows = [["device", "set", "window", "GPU", "layers/token", "compute ms", "memory ms", "disk ms", "comm ms", "total ms", "reload/token"]];
  for (const d of plan.devices) {
    const l = d.latency;
    rows.push([d.name, d.set, String(d.windowLayers), String(d.gpuLayers), String(d.layersPerToken), ms(l.computeMs), ms(l.memoryMs), ms(l.diskMs), ms(l.commMs), ms(l.totalMs), `${(d.reloadBytesPerToken / GiB).toFixed(2)} GiB`]);
  }
  return table(rows);
}

interface BaselineResult {
  readonly name: string;
  readonly plan?: Plan;
  readonly error?: string;
}

function report(label: string, profile: ModelProfile, plan: Plan, baselines: BaselineResult[], warnings: string[]): string {
  const bp = profile.layerBytes + kvBytesPerLayer(profile);
  const out: string[] = [];
  for (const w of warnings) out.push(`warning: ${w}`);
  out.push(`model   ${label}: ${profile.nLayers} layers of ${(profile.layerBytes / GiB).toFixed(3)} GiB + ${(bp - profile.layerBytes) / 2 ** 20} MiB KV at ctx ${profile.nCtx}${profile.kvCacheTypes && (profile.kvCacheTypes.k !== "f16" || profile.kvCacheTypes.v !== "f16") ? ` (${profile.kvCacheTypes.k}/${profile.kvCacheTypes.v})` : ""}`);
  const x = profile.moe;
  if (x) {
    // A token reads k of a layer's n experts: Halda prices compute and rereads on the active bytes,
    // the RAM a window needs to run from memory on all of them (docs/HALDA.md "Mixture of experts").
    out.push(`experts ${x.nExpert} a layer, ${x.nExpertUsed} a token, ${(x.expertBytes / 2 ** 20).toFixed(2)} MiB each: a layer is ${(profile.layerBytes / GiB).toFixed(3)} GiB in total, ` +
      `${(x.activeLayerBytes / GiB).toFixed(3)} GiB active per token (${((100 * x.activeLayerBytes) / profile.layerBytes).toFixed(1)} %)`);
    const top = Math.ceil(x.nExpert / 4);
    const hot = x.routingShare.slice(0, top).reduce((a, b) => a + b, 0);
    out.push(x.routing === "measured"
      ? `routing measured over ${x.routingTokens} tokens: the hottest ${top} experts of a layer take ${(100 * hot).toFixed(1)} % of its assignments (uniform: ${((100 * top) / x.nExpert).toFixed(1)} %)`
      : `routing uniform, not measured (--measure-routing measures it on a model file): an overloaded device is priced as if every expert were as hot`);
    // layers differ in skew, and windows are priced by the layers they name (MoE-3)
    if (x.routingShareByLayer) out.push(`experts reached by layer (of ${x.nExpert}): ${x.routingShareByLayer.map((p) => p.filter((v) => v > 0).length).join(", ")}`);
  }
  out.push(`plan    ${plan.planner}: k = ${plan.k} cycle${plan.k === 1 ? "" : "s"}, predicted ${ms(plan.latencyMs)} ms/token` +
    (plan.runnerUp ? ` (runner-up k = ${plan.runnerUp.k}: ${ms(plan.runnerUp.latencyMs)} ms)` : ""));
  out.push("");
  out.push(describePlan(plan));
  for (const d of plan.dropped) out.push(`dropped ${d.name}: ${d.reason}`);
  for (const n of plan.notes) out.push(`note    ${n}`);
  out.push("");
  out.push("baselines (same devices, k, latency model):");
  const rows = [["planner", "ms/token", "vs halda", "windows", "GPU layers", "problems"]];
  rows.push(["halda", ms(plan.latencyMs), "1.00x", plan.devices.map((d) => d.windowLayers).join("/"), plan.devices.map((d) => d.gpuLayers).join("/"), ""]);
  for (const b of baselines) {
    if (!b.plan) { rows.push([b.name, "-", "-", "-", "-", b.error ?? ""]); continue; }
    const p = b.plan;
    rows.push([b.name, ms(p.latencyMs), `${(p.latencyMs / plan.latencyMs).toFixed(2)}x`, p.devices.map((d) => d.windowLayers).join("/"), p.devices.map((d) => d.gpuLayers).join("/"), p.problems.length ? `${p.problems.length}: ${p.problems[0]}` : ""]);
  }
  out.push(table(rows));
  return out.join("\n");
}

export async function planCommand(argv: string[]): Promise<number> {
  let args: PlanArgs | "help";
  try {
    args = parsePlanArgs(argv);
    if (args === "help") {
      console.log(HELP);
      return 0;
    }
    const a = args;
    const { desc, label } = loadModel(a);
    const { devices, warnings } = loadDevices(a.devices);
    const kvProblem = kvCacheProblem(desc.hparams, a.kvCacheTypes);
    if (kvProblem) throw new UsageError(kvProblem);
    let profile = modelProfile(desc, { nCtx: a.ctx, name: label, kvCacheTypes: a.kvCacheTypes });
    if (a.measureRouting && profile.moe) {
      const m = LocalModel.open(a.model!);
      try {
        profile = await measureExpertRouting(m, profile);
      } finally {
        m.close();
      }
    }
    let plan: Plan;
    try {
      plan = halda(devices, profile, a.options);
    } catch (e) {
      if (e instanceof HaldaError && e.reason === "infeasible") {
        console.error(`prima-coord plan: no plan: ${e.message}`);
        return 1;
      }
      throw e;
    }
    // The baselines keep every device, at Halda's k if it was forced, else k = 1.
    const baselines: BaselineResult[] = baselineNames.map((name) => {
      try {
        return { name, plan: baselinePlan(name, devices, profile, { k: a.options.k }) };
      } catch (e) {
        if (e instanceof HaldaError) return { name, error: e.message };
        throw e;
      }
    });
    if (a.json) {
      const { layerBytesEach: _each, ...summary } = profile;
      const base = Object.fromEntries(baselines.map((b) => [b.name, b.plan ?? { error: b.error }]));
      console.log(JSON.stringify({ model: summary, plan, baselines: base, warnings }, null, 2));
    } else {
      console.log(report(label, profile, plan, baselines, warnings));
    }
    return 0;
  } catch (e) {
    if (e instanceof UsageError || (e instanceof HaldaError && e.reason === "invalid-input")) {
      console.error(`prima-coord plan: ${e.message}\n(run "prima-coord plan --help" for usage)`);
      return 2;
    }
    throw e;
  }
}
