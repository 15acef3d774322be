// prima-coord serve model.gguf: the cluster as a home service. It loads the model once, accepts workers
// at any time (announced over mDNS unless --no-discovery), re-places layers when the devices change,
// and answers the OpenAI API, Ollama's and llama-server's, /health, /metrics and the dashboard on one
// HTTP port.
import { basename, extname } from "node:path";
import { hostname } from "node:os";
import { PROTOCOL_VERSION } from "../control/index.js";
import { publishCluster, type Publication } from "../discovery/index.js";
import { metaString, printable } from "../model/index.js";
import { REASONING_FORMATS, type ReasoningFormat } from "../tools/index.js";
import { POOLINGS, embeddingPooling, type Pooling } from "../engine/index.js";
import { ENGINE_HELP, RING_HELP, SAMPLING_HELP, UsageError, intArg, parseClusterArgs, usageExit, type ClusterArgs } from "./args.js";
import { checkApiKey } from "./http-guard.js";
import { ApiServer } from "./http-server.js";
import { clusterCtx, clusterFor, log, openHead } from "./head.js";
import { autoParallel } from "./slot-sizing.js";

const HELP = `usage: prima-coord serve model.gguf [options]

  --host HOST              address of the HTTP API and dashboard (default 127.0.0.1; 0.0.0.0 for the network)
  --port N                 HTTP port (default 8080)
  --cluster-port N         gRPC port workers join on (default 7400)
  --name NAME              the cluster's name, announced to workers (default: this host's name)
  --api-key KEY            require Authorization: Bearer KEY (also from PRIMA_API_KEY); repeat it for
                           several clients, each with a prompt cache of its own. An empty key is an error
  --allow-host NAME        a name the Host header may carry besides this machine's names and addresses
                           (a DNS name on your network, a reverse proxy's); repeatable; * allows any
  --cors ORIGIN            let web pages of ORIGIN (e.g. http://localhost:3000) call the API; repeatable;
                           * allows every site (only with --api-key)
  --no-discovery           do not announce the cluster over mDNS (workers then need --join host:port)
  --rotate-token           make a new join token (and certificate) first: workers need the new one
                           (prima-coord token --rotate does it for a running serve)
  --allow-advertise        accept a worker's --advertise address other than the one it connects from
  --queue N                requests that may wait for the ring; more get 503 (default 16)
  --parallel N|auto        decode up to N requests at once, each in a sequence slot with a KV cache of
                           --ctx tokens (N x ctx in all) on every device, their next tokens in one
                           pass over each device's weights per step (on a ring, in a group per
                           device whose steps are round the ring at once). Above 1 the layers stay
                           where they were first placed while requests decode; a request in flight
                           when a ring device fails is replayed on the devices left. At most --batch.
                           auto: as many slots as this device's memory holds beside the weights, at
                           most 4 (1 with --min-workers, --layer-windows, --keep-all or --cycles,
                           which ask for a ring). Default 1
  --pooling TYPE           how embeddings pool the final hidden states: mean, cls, last or none (none:
                           one vector per token, on llama-server's /embedding only). Default: the model
                           file's <arch>.pooling_type, else last
  --embeddings             accepted for llama-server's command lines: embeddings are always on
  --reasoning-format F     auto (default; deepseek is the same): a chat reply's reasoning (gpt-oss's
                           analysis channel, a <think> block) comes apart from its content, as
                           reasoning_content (Ollama: thinking); none: it stays in the content as written
  -n, --n-predict N        tokens a request generates when it names no max_tokens, and the most it may
                           name (default -1: until the context is full, as llama-server)
${ENGINE_HELP}
${RING_HELP}

Sampling defaults for requests that leave them out:
${SAMPLING_HELP}`;

interface ServeArgs extends ClusterArgs {
  readonly host: string;
  readonly port: number;
  readonly clusterPort: number;
  readonly name: string;
  readonly apiKeys: readonly string[];
  readonly allowHosts: readonly string[];
  readonly corsOrigins: readonly string[];
  readonly discovery: boolean;
  readonly queue: number;
  /** undefined: auto (sized from memory once the model is open: slot-sizing.ts). */
  readonly parallel?: number;
  /** Default and cap of a request's generated tokens; undefined: the context. */
  readonly nPredict?: number;
  readonly rotateToken: boolean;
  readonly allowAdvertise: boolean;
  readonly pooling?: Pooling;
  readonly reasoningFormat: ReasoningFormat;
}

function parseServeArgs(argv: string[]): ServeArgs {
  const { cluster, values } = parseClusterArgs(argv, {
    host: { type: "string" }, port: { type: "string" }, "cluster-port": { type: "string" }, name: { type: "string" },
    "api-key": { type: "string", multiple: true }, "allow-host": { type: "string", multiple: true }, cors: { type: "string", multiple: true },
    "no-discovery": { type: "boolean" }, queue: { type: "string" }, parallel: { type: "string" }, "n-predict": { type: "string", short: "n" },
    "rotate-token": { type: "boolean" }, "allow-advertise": { type: "boolean" },
    pooling: { type: "string" }, embeddings: { type: "boolean" }, "reasoning-format": { type: "string" },
  }, HELP, "serve");
  const str = (k: string) => values[k] as string | undefined;
  const apiKeys = apiKeysOf(values["api-key"] as unknown as string[] | undefined);
  const corsOrigins = corsOriginsOf(values.cors as unknown as string[] | undefined);
  if (corsOrigins.includes("*") && apiKeys.length === 0) throw new UsageError("--cors '*' lets every web site use the API: it needs --api-key");
  // auto: sized from this device's memory once the model is open; 1 where the command line asks for a
  // ring (the workers' memory is known only once they join, and Halda then places N slots' KV).
  const ring = cluster.minWorkers > 0 || cluster.layerWindows !== undefined || cluster.keepAll || cluster.cycles !== undefined;
  const auto = str("parallel") === "auto";
  // H2O evicts by one sequence's statistics: one slot (its scheduler's shifts are llama-server's)
  const parallel = auto ? (ring || cluster.h2oBudget !== undefined ? 1 : undefined) : intArg("parallel", str("parallel") ?? "1", 1, 1, 256);
  if (parallel !== undefined && parallel > 1 && cluster.h2oBudget !== undefined) throw new UsageError(`--kv-evict h2o evicts one sequence's cache: not with --parallel ${parallel}`);
  if (parallel !== undefined && parallel > cluster.batch) throw new UsageError(`--parallel ${parallel} needs a --batch of at least ${parallel} (a step takes one row per sequence)`);
  const pooling = str("pooling");
  if (pooling !== undefined && !(POOLINGS as readonly string[]).includes(pooling)) {
    throw new UsageError(`--pooling takes ${POOLINGS.join(", ")} (rank needs a classifier head, which this engine does not run), not "${pooling}"`);
  }
  const reasoningFormat = str("reasoning-format") ?? "auto";
  if (!(REASONING_FORMATS as readonly string[]).includes(reasoningFormat)) throw new UsageError(`--reasoning-format takes ${REASONING_FORMATS.join(", ")}, not "${printable(reasoningFormat, 40)}"`);
  return {
    ...cluster,
    reasoningFormat: reasoningFormat as ReasoningFormat,
    host: str("host") ?? "127.0.0.1",
    port: intArg("port", str("port"), 8080, 0, 65535),
    clusterPort: intArg("cluster-port", str("cluster-port"), 7400, 0, 65535),
    name: str("name") ?? hostname(),
    apiKeys,
    allowHosts: (values["allow-host"] as unknown as string[] | undefined) ?? [],
    corsOrigins,
    discovery: !values["no-discovery"],
    queue: intArg("queue", str("queue"), 16, 0, 10_000),
    parallel,
    nPredict: nonNegative(intArg("n-predict", str("n-predict"), -1, -1)),
    rotateToken: values["rotate-token"] === true,
    allowAdvertise: values["allow-advertise"] === true,
    pooling: pooling as Pooling | undefined,
  };
}

/** The keys from --api-key, else from PRIMA_API_KEY; an empty or blank one is a usage error, never
 * "no key" (`--api-key "$(cat missing-file)"` must not open the server). */
function apiKeysOf(flags: string[] | undefined): string[] {
  const env = process.env.PRIMA_API_KEY;
  const keys = flags ?? (env === undefined ? [] : [env]);
  keys.forEach((k) => {
    try {
      checkApiKey(k, flags ? "--api-key" : "PRIMA_API_KEY");
    } catch (e) {
      throw new UsageError((e as Error).message);
    }
  });
  return keys;
}

function corsOriginsOf(flags: string[] | undefined): string[] {
  return (flags ?? []).map((o) => {
    if (o === "*") return o;
    let u: URL | undefined;
    try {
      u = new URL(o);
    } catch {
      // reported below
    }
    if (!u || (u.protocol !== "http:" && u.protocol !== "https:") || u.origin !== o.replace(/\/$/, "").toLowerCase()) {
      throw new UsageError(`--cors takes an origin such as http://localhost:3000 (scheme, host and port only), not "${o}"`);
    }
    return u.origin;
  });
}

export async function serveCommand(argv: string[]): Promise<number> {
  let a: ServeArgs;
  try {
    a = parseServeArgs(argv);
  } catch (e) {
    return usageExit(e);
  }
  const { model, tok, prompts } = openHead(a, "chatml");
  try {
    if (prompts.chat.isFallback) log(`the model has no chat template: chat requests use ${a.chatTemplate ?? "chatml"}`);
  } catch (e) {
    log(`chat requests will fail: ${(e as Error).message}`);
  }
  try {
    const p = embeddingPooling(model.gguf, model.desc, a.pooling);
    log(`embeddings: ${p.pooling} pooling (${p.source})`);
  } catch (e) {
    log(`embeddings are refused: ${(e as Error).message}`);
  }
  const file = basename(a.model);
  const modelId = basename(file, extname(file));
  let parallel = a.parallel;
  if (parallel === undefined) {
    const auto = autoParallel(model, clusterCtx(a, model), a.batch, a.kvCacheTypes);
    log(auto.why);
    parallel = auto.n;
  }
  const cluster = clusterFor(a, model, log, { name: a.name, maxQueue: a.queue, parallel, autoPlace: true, rotateToken: a.rotateToken, allowAdvertise: a.allowAdvertise });
  const api = new ApiServer({
    cluster, tok, prompts, modelId, nPredict: a.nPredict, pooling: a.pooling, reasoningFormat: a.reasoningFormat, contextShift: a.contextShift, nKeep: a.nKeep,
    h2oBudget: a.h2oBudget, apiKeys: a.apiKeys, allowHosts: a.allowHosts, corsOrigins: a.corsOrigins,
    log, staticFiles: await dashboardFiles(log),
  });
  let stopping: Promise<void> | undefined;
  let announced: Publication | undefined;
  const stop = (why: string) => {
    stopping ??= (async () => {
      log(`stopping (${why})`);
      await announced?.stop();
      await api.close();
      await cluster.close();
      model.close();
    })();
    return stopping;
  };
  try {
    // The HTTP port first: /health answers 503 while this device is measured.
    const httpPort = await api.listen(a.port, a.host);
    const shown = a.host.includes(":") ? `[${a.host}]` : a.host;
    log(`listening on http://${shown}:${httpPort} (OpenAI API at /v1, Ollama's at /api, llama-server's at /completion, embeddings at /v1/embeddings, dashboard at /)`);
    const clusterPort = await cluster.start(a.clusterPort);
    log(`listening for workers on port ${clusterPort}`);
    if (a.discovery) {
      announced = publishCluster({
        name: a.name, port: clusterPort, model: metaString(model.gguf, "general.name") ?? modelId, fingerprint: cluster.fingerprint,
        protocolVersion: PROTOCOL_VERSION, log,
      });
      log(`announced as "${a.name}" over mDNS: on the same network, \`prima-worker --join --model <their copy>\` finds it`);
    }
    await cluster.ensurePlaced();
    log(`ready: ${modelId} on ${cluster.state().plan?.ringOrder.length ?? 1} device(s)`);
  } catch (e) {
    console.error(`prima-coord: ${e instanceof Error ? e.message : String(e)}`);
    await stop("setup failed");
    return 1;
  }
  const signalled = await new Promise<string>((resolve) => {
    process.once("SIGINT", () => resolve("SIGINT"));
    process.once("SIGTERM", () => resolve("SIGTERM"));
  });
  await stop(signalled);
  return 0;
}

/** The dashboard's file handler; without its files (a broken install) the API still works. */
async function dashboardFiles(log: (line: string) => void): Promise<StaticFiles | undefined> {
  try {
    const d = await import("../dashboard/index.js");
    d.dashboardAssetsDir(); // throws when the page's files are missing
    return d.serveDashboardAsset;
  } catch (e) {
    log(`no dashboard: ${(e as Error).message}`);
    return undefined;
  }
}

type StaticFiles = NonNullable<ConstructorParameters<typeof ApiServer>[0]["staticFiles"]>;

/** -1 (none) as undefined. */
function nonNegative(n: number): number | undefined {
  return n < 0 ? undefined : n;
}
