#!/usr/bin/env node
// prima-worker: a device's daemon. `prima-worker --join host:port --model model.gguf` joins the
// coordinator, runs the windows it is given, and rejoins when the run ends, until stopped. With
// `--join` alone it finds the coordinator over mDNS, before the first join and after every loss.
// It ends on the first SIGINT/SIGTERM, and on setup errors that cannot fix themselves, each with its
// own exit code (exit.ts).
import { hostname } from "node:os";
import type { Status, StatusRequest } from "../control/index.js";
import { clusterAddress, findCluster } from "../discovery/index.js";
import { LocalModel } from "../engine/index.js";
import { modelFingerprint } from "../model/index.js";
import { RING_COMPUTE_OPTIONS } from "../ring/index.js";
import { allowBare, parseWorkerArgs, threadsArg } from "./args.js";
import { WorkerDevice, reserveDataPort } from "./device.js";
import {
  EXIT_CODES_HELP, EXIT_ERROR, EXIT_MODEL_CHANGED, EXIT_MODEL_UNUSABLE, EXIT_OK, EXIT_USAGE, EXIT_WEIGHTS_DIFFER, WorkerExit,
} from "./exit.js";
import { ChunkHasher, WeightsMismatchError } from "./weights.js";
import type { GgufFile } from "../model/index.js";
import { joinProfile, profileCommand, type JoinProfile } from "./profile-command.js";
import { RemoteModel, type RemoteModelOptions } from "./remote-model.js";
import { WorkerSession, type SessionHandler } from "./session.js";
import { CacheError, ModelCache, NoRoomError } from "../transfer/index.js";
import { TrustError, workerToken, type JoinToken } from "../trust/index.js";

const HELP = `usage: prima-worker --join [host:port] [--model model.gguf] [options]
       prima-worker profile [--model model.gguf] [--json] [--reprofile]   (measure this device)

  --join HOST:PORT     the coordinator to join (prima-coord run ... --min-workers N)
  --join               without an address: find the coordinator on the local network (mDNS), and
                       again whenever it goes away; PRIMA_MDNS_INTERFACE=lo|ADDRESS limits multicast
  --cluster NAME       with --join alone: the cluster to join when several answer (serve --name)
  --token TOKEN        the cluster's join token (serve prints it; \`prima-coord token\` shows it again)
  --token-file FILE    the same, read from a file (the coordinator keeps it in ~/.config/prima/NAME.token);
                       without either, PRIMA_TOKEN. It pins the coordinator's certificate (any other
                       is refused) and proves this worker to it; the token itself never travels
  --model PATH         this device's copy of the model (the same file as the coordinator's); without
                       it, the worker fetches only its windows from the coordinator into its model cache
  --model-cache DIR    where fetched models are kept (default ~/.cache/prima/models); the cache
                       writes and evicts only its own files (listed in its manifest there)
  --cache-limit GIB    most disk the model cache may use; least recently used models go first
  --allow-cache-link   use a model cache folder that is a symbolic link (refused otherwise: the
                       folder it points at may hold files of yours)
  --port N             data-plane port the predecessor connects to (default: any free port)
  --advertise HOST     address the predecessor should use (default: what the coordinator sees)
  --name NAME          device name in plans and logs (default: the host name)
  --threads N          compute threads (default: all cores)
  --once               exit when the first session ends instead of rejoining
  --expert-prefetch    MoE: advise the OS about each layer's predicted experts while it computes,
                       while this device's windows do not fit in its memory (off by default)
  --no-native-lane     pass ring frames through JS instead of the native lane (a C thread; for comparison)
  --reprofile          measure this device again instead of using its cached profile

${EXIT_CODES_HELP}`;

/** After the first SIGINT/SIGTERM, what is still closing gets this long before the worker exits anyway. */
const STOP_DEADLINE_MS = 2000;
/** Once main() is done, handles that would keep the process up (a connection closing) get this long. */
const EXIT_GRACE_MS = 1000;

async function main(argv: string[]): Promise<number> {
  if (argv[0] === "profile") return profileCommand(argv.slice(1));
  const values = parseWorkerArgs(allowBare(argv, "join"), {
    join: { type: "string" }, cluster: { type: "string" }, token: { type: "string" }, "token-file": { type: "string" }, model: { type: "string" }, port: { type: "string" }, advertise: { type: "string" },
    name: { type: "string" }, threads: { type: "string", short: "t" }, once: { type: "boolean" }, reprofile: { type: "boolean" },
    "no-native-lane": { type: "boolean" }, "expert-prefetch": { type: "boolean" }, "model-cache": { type: "string" }, "cache-limit": { type: "string" }, "allow-cache-link": { type: "boolean" },
    help: { type: "boolean", short: "h" },
  }, HELP);
  if (typeof values === "number") return values;
  const discover = values.join === "";
  if (values.join === undefined || (!discover && !/^[^\s]+:\d+$/.test(values.join))) {
    console.error(`--join host:port (or --join alone, to find the coordinator on the network) is required\n${HELP}`);
    return EXIT_USAGE;
  }
  if (values.cluster !== undefined && !discover) {
    console.error("--cluster chooses among the clusters --join finds on the network: give --join without an address");
    return EXIT_USAGE;
  }
  const cacheLimitGiB = values["cache-limit"] === undefined ? Infinity : Number(values["cache-limit"]);
  if (!(cacheLimitGiB > 0)) {
    console.error("--cache-limit must be a positive number of GiB");
    return EXIT_USAGE;
  }
  let token: JoinToken | undefined;
  try {
    token = workerToken({ token: values.token, tokenFile: values["token-file"] });
  } catch (e) {
    console.error(`prima-worker: ${(e as TrustError).message}`);
    return EXIT_USAGE;
  }
  if (!token) {
    console.error("prima-worker: the cluster's join token is needed: --token TOKEN, --token-file FILE or PRIMA_TOKEN (the coordinator prints it when it starts; `prima-coord token` on its machine shows it again)");
    return EXIT_USAGE;
  }
  const threads = threadsArg(values.threads);
  if (threads === "bad") return EXIT_USAGE;
  const port = Number(values.port ?? 0);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    console.error("--port must be a port number");
    return EXIT_USAGE;
  }
  const name = values.name ?? hostname();
  const log = (line: string) => console.error(`[prima-worker ${name}] ${line}`);
  // The first SIGINT/SIGTERM stops the worker cleanly at any stage (a second one at once); whatever
  // is still closing after STOP_DEADLINE_MS does not hold it.
  let stopping = false;
  let session: WorkerSession | undefined;
  const onSignal = (signal: NodeJS.Signals) => {
    if (stopping) {
      log(`${signal} again: exiting now`);
      process.exit(EXIT_OK);
    }
    stopping = true;
    log(`${signal}: stopping`);
    session?.stop();
    setTimeout(() => {
      log(`still closing after ${STOP_DEADLINE_MS / 1000} s: exiting anyway`);
      process.exit(EXIT_OK);
    }, STOP_DEADLINE_MS).unref();
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);

  // A ring device's next frame comes only after the rest of the ring (RING_COMPUTE_OPTIONS).
  const openOptions = { threads, ...RING_COMPUTE_OPTIONS };
  let address = values.join; // where the current attempt dials (discovery changes it)
  const lookup = discover ? discoveryLookup(values.cluster, log, (a) => { address = a; }) : undefined;
  let own: LocalModel | undefined;
  let remote: RemoteModel | undefined;
  if (values.model) {
    try {
      own = LocalModel.open(values.model, openOptions);
    } catch (e) {
      throw new WorkerExit(EXIT_MODEL_UNUSABLE, `cannot use the model: ${(e as Error).message}`);
    }
  } else {
    try {
      // Before the coordinator is asked anything: a cache folder that will be refused ends the worker now.
      new ModelCache(values["model-cache"], { allowLink: values["allow-cache-link"] }).checkFolder();
    } catch (e) {
      throw new WorkerExit(EXIT_MODEL_UNUSABLE, (e as Error).message);
    }
    remote = await fetchHeader(() => lookup?.(new AbortController().signal) ?? Promise.resolve(address), {
      token, cacheDir: values["model-cache"], cacheLimitBytes: cacheLimitGiB * 2 ** 30, cacheAllowLink: values["allow-cache-link"], open: openOptions, log,
    }, () => stopping);
    if (!remote) return EXIT_OK;
  }
  const model = (): LocalModel => remote?.model ?? own!;
  const modelPath = remote?.path ?? values.model!;
  const fingerprint = modelFingerprint(model().gguf);
  // Before profiling: a port that is taken ends the worker at once.
  const dataPort = await reserveDataPort(port, "0.0.0.0", log);
  // Held to the end: each assignment's listener attaches to it (ring/listener.ts RingPort).
  try {
    if (stopping) return EXIT_OK;
    // Measured (or read from the cache) before joining: the coordinator plans with it.
    const profile = await joinProfile(model(), modelPath, fingerprint, name, values.reprofile ?? false, log);
    if (stopping) {
      await profile.close();
      return EXIT_OK;
    }
    const device = new WorkerDevice({
      get model() { return model(); }, fingerprint, deviceName: name, dataPort, dataHost: values.advertise ?? "", log,
      get coordinatorHost() { return address.slice(0, address.lastIndexOf(":")).replace(/^\[(.*)\]$/, "$1"); },
      fail: (e) => session?.fail(e), nativeLane: !values["no-native-lane"], expertPrefetch: values["expert-prefetch"] ?? false,
    });
    const worker = new WorkerSession({
      coordinator: lookup ?? address,
      token,
      join: {
        deviceName: name, get hardwareId() { return profile.hardwareId; }, dataHost: values.advertise ?? "", dataPort: dataPort.port, modelFingerprint: fingerprint, modelPath,
        get profileJson() { return profile.json(); }, // memory read afresh at every join
      },
      log,
      once: values.once,
      // A model file that changed under the worker (truncated, rewritten, replaced) ends it: a restart
      // maps the file again. Checked before every join and after every failure it reports.
      beforeJoin: () => profile.refresh(),
      check: () => {
        const problem = remote ? remote.fileProblem() : own!.native.fileProblem();
        return problem ? new WorkerExit(EXIT_MODEL_CHANGED, `${problem}; left the ring: restart the worker to map the file again`) : null;
      },
    }, handlerFor(device, remote, modelPath, () => model().gguf, profile, log));
    session = worker;
    log(`model ${modelPath} (${model().nLayers} layers), data plane port ${dataPort.port}`);
    try {
      await worker.run();
    } finally {
      await profile.close(); // also when discovery gives up (several clusters): it holds the process open
      remote?.close();
    }
    if (stopping) log("stopped");
    return EXIT_OK;
  } finally {
    await dataPort.close();
  }
}

/**
 * Finds the cluster before each attempt: the one named by --cluster, else the only one that answers,
 * then (after a loss) the same name again. Says once per search when nothing answers, and keeps
 * browsing; several clusters end the worker with the list to choose from.
 */
function discoveryLookup(cluster: string | undefined, log: (line: string) => void, use: (address: string) => void) {
  let joinedName = cluster;
  let lastAddress = "";
  return async (signal: AbortSignal): Promise<string> => {
    let silent = false;
    const found = await findCluster({
      cluster: joinedName, signal, log,
      onSilence: (message) => {
        if (silent) return;
        silent = true;
        log(`${message}. Still looking on the network.`);
      },
    });
    const address = clusterAddress(found);
    joinedName = found.name;
    if (address !== lastAddress) {
      log(`found cluster "${found.name}" at ${address} (model ${found.model || "?"})`);
      lastAddress = address;
    }
    use(address);
    return address;
  };
}

/** Without --model: the coordinator's model header into the cache, retried (saying so once) while
 * the coordinator is away or the disk has no room for it; undefined when stopped first. A cache that
 * refuses its folder or a file in it, or a limit that cannot take the header, ends the worker. */
async function fetchHeader(
  where: () => Promise<string>, o: Omit<RemoteModelOptions, "coordinator">, stopped: () => boolean,
): Promise<RemoteModel | undefined> {
  let said = "";
  while (!stopped()) {
    try {
      return await RemoteModel.open({ ...o, coordinator: await where() });
    } catch (e) {
      if (e instanceof WorkerExit) throw e;
      if (e instanceof CacheError || (e instanceof NoRoomError && e.short === "limit")) throw new WorkerExit(EXIT_MODEL_UNUSABLE, e.message);
      const why = (e as Error).message;
      if (why !== said) o.log(`${why}; trying again`);
      said = why;
      await new Promise((r) => setTimeout(r, 2000));
    }
  }
  return undefined;
}

/** What runs an assignment: the windows' chunks fetched first (without --model), then checked
 * against the coordinator's hashes, then set up. */
function handlerFor(device: WorkerDevice, remote: RemoteModel | undefined, path: string, gguf: () => GgufFile, profile: JoinProfile, log: (line: string) => void): SessionHandler {
  const hasher = new ChunkHasher(path, !remote);
  // Asked before a plan: the pass timed now, while the device holds no windows (the coordinator times
  // each device in turn, so that on a shared host one's timing never competes with another's).
  const status = async (request?: StatusRequest): Promise<Status> => {
    const timed = request?.timePass && device.idle ? await profile.retime() : false;
    return { ...device.status(), ...(timed ? { profileJson: profile.json() } : {}) };
  };
  const checked: SessionHandler = {
    assign: async (a, progress, deviceId, dropped) => {
      try {
        const t0 = performance.now();
        const hashed = await hasher.verify(a.windowChunks ?? [], a.chunkBytes ?? 0, gguf(), progress, dropped);
        if (hashed > 0) log(`checked this device's weights in ${((performance.now() - t0) / 1000).toFixed(2)} s (${hashed} chunks hashed, the rest known)`);
      } catch (e) {
        if (!(e instanceof WeightsMismatchError)) throw e;
        // A fetched copy is made right by fetching again; a copy of one's own needs another file.
        if (!remote) throw new WorkerExit(EXIT_WEIGHTS_DIFFER, e.message);
        remote.forgetChunks(e.chunks);
        hasher.forget(e.chunks);
        throw new Error(`${e.message}; they will be fetched again`);
      }
      return device.assign(a, progress, deviceId, dropped);
    },
    kv: (cmd) => device.kv(cmd),
    status,
    reset: (reason) => device.reset(reason),
  };
  return remote ? fetchingFirst(device, checked, remote, hasher) : checked;
}

/** A device that fetches the chunks of its windows before it sets them up. */
function fetchingFirst(device: WorkerDevice, next: SessionHandler, remote: RemoteModel, hasher: ChunkHasher): SessionHandler {
  const { status } = next;
  return {
    assign: async (a, progress, deviceId, dropped) => {
      await device.reset("fetching this device's windows"); // the old mapping goes before the file changes
      const layers = a.windows.flatMap((w) => Array.from({ length: w.endLayer - w.firstLayer }, (_, i) => w.firstLayer + i));
      // Hashed again after the fetch: what it writes (all of it, or part when it is cut off).
      hasher.forget(remote.missingFor(layers));
      await remote.fetchLayers(layers, progress);
      return next.assign(a, progress, deviceId, dropped);
    },
    kv: (cmd) => device.kv(cmd),
    status,
    reset: (reason) => device.reset(reason),
  };
}

/** Sets the exit code; a handle still open after EXIT_GRACE_MS (a connection closing) does not keep
 * the process alive: a daemon that ends must end. */
function exit(code: number): void {
  process.exitCode = code;
  setTimeout(() => process.exit(code), EXIT_GRACE_MS).unref();
}

main(process.argv.slice(2)).then(exit, (e: unknown) => {
  if (e instanceof WorkerExit) {
    console.error(`prima-worker: ${e.message} (exit code ${e.code})`);
    exit(e.code);
  } else {
    console.error(`prima-worker: ${e instanceof Error ? e.message : String(e)}`);
    exit(EXIT_ERROR);
  }
});
