#!/usr/bin/env node
// prima-worker: a device's daemon. `prima-worker --join host:port --model model.gguf` joins the
// coordinator, runs the windows it is given, and rejoins when the run ends, until stopped. With
// `--join` alone it finds the coordinator over mDNS, before the first join and after every loss.
import { hostname } from "node:os";
import { clusterAddress, findCluster } from "../discovery/index.js";
import { LocalModel } from "../engine/index.js";
import { modelFingerprint } from "../model/index.js";
import { RING_COMPUTE_OPTIONS } from "../ring/index.js";
import { allowBare, parseWorkerArgs, threadsArg } from "./args.js";
import { WorkerDevice, reserveDataPort } from "./device.js";
import { joinProfile, profileCommand } from "./profile-command.js";
import { WorkerSession } from "./session.js";

const HELP = `usage: prima-worker --join [host:port] --model model.gguf [options]
       prima-worker profile [--model model.gguf] [--json] [--reprofile]   (measure this device)

  --join HOST:PORT     the coordinator to join (prima-coord run ... --min-workers N)
  --join               without an address: find the coordinator on the local network (mDNS), and
                       again whenever it goes away; PRIMA_MDNS_INTERFACE=lo|ADDRESS limits multicast
  --cluster NAME       with --join alone: the cluster to join when several answer (serve --name)
  --model PATH         this device's copy of the model (the same file as the coordinator's)
  --port N             data-plane port the predecessor connects to (default: any free port)
  --advertise HOST     address the predecessor should use (default: what the coordinator sees)
  --name NAME          device name in plans and logs (default: the host name)
  --threads N          compute threads (default: all cores)
  --once               exit when the first session ends instead of rejoining
  --no-native-lane     pass ring frames through JS instead of the native lane (a C thread; for comparison)
  --reprofile          measure this device again instead of using its cached profile`;

async function main(argv: string[]): Promise<number> {
  if (argv[0] === "profile") return profileCommand(argv.slice(1));
  const values = parseWorkerArgs(allowBare(argv, "join"), {
    join: { type: "string" }, cluster: { type: "string" }, model: { type: "string" }, port: { type: "string" }, advertise: { type: "string" },
    name: { type: "string" }, threads: { type: "string", short: "t" }, once: { type: "boolean" }, reprofile: { type: "boolean" },
    "no-native-lane": { type: "boolean" },
    help: { type: "boolean", short: "h" },
  }, HELP);
  if (typeof values === "number") return values;
  const discover = values.join === "";
  if (values.join === undefined || (!discover && !/^[^\s]+:\d+$/.test(values.join))) {
    console.error(`--join host:port (or --join alone, to find the coordinator on the network) is required\n${HELP}`);
    return 2;
  }
  if (values.cluster !== undefined && !discover) {
    console.error("--cluster chooses among the clusters --join finds on the network: give --join without an address");
    return 2;
  }
  if (!values.model) {
    console.error(`--model is required: every device maps its own copy of the model\n${HELP}`);
    return 2;
  }
  const threads = threadsArg(values.threads);
  if (threads === "bad") return 2;
  const port = Number(values.port ?? 0);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    console.error("--port must be a port number");
    return 2;
  }
  const name = values.name ?? hostname();
  const log = (line: string) => console.error(`[prima-worker ${name}] ${line}`);
  // A ring device's next frame comes only after the rest of the ring (RING_COMPUTE_OPTIONS).
  const model = LocalModel.open(values.model, { threads, ...RING_COMPUTE_OPTIONS });
  const fingerprint = modelFingerprint(model.gguf);
  // Measured (or read from the cache) before joining: the coordinator plans with it.
  const profile = await joinProfile(model, values.model, fingerprint, name, values.reprofile ?? false, log);
  const dataPort = await reserveDataPort(port, "0.0.0.0");
  let address = values.join; // where the current attempt dials (discovery changes it)
  let session: WorkerSession;
  const device = new WorkerDevice({
    model, fingerprint, deviceName: name, dataPort, dataHost: values.advertise ?? "", log,
    get coordinatorHost() { return address.slice(0, address.lastIndexOf(":")).replace(/^\[(.*)\]$/, "$1"); },
    fail: (e) => session.fail(e), nativeLane: !values["no-native-lane"],
  });
  session = new WorkerSession({
    coordinator: discover ? discoveryLookup(values.cluster, log, (a) => { address = a; }) : address,
    join: {
      deviceName: name, hardwareId: profile.hardwareId, dataHost: values.advertise ?? "", dataPort, modelFingerprint: fingerprint, modelPath: values.model,
      get profileJson() { return profile.json(); }, // memory read afresh at every join
    },
    log,
    once: values.once,
  }, device);
  const stop = () => session.stop();
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
  log(`model ${values.model} (${model.nLayers} layers), data plane port ${dataPort}`);
  try {
    await session.run();
  } finally {
    await profile.close(); // also when discovery gives up (several clusters): it holds the process open
  }
  return 0;
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

main(process.argv.slice(2)).then(
  (code) => { process.exitCode = code; },
  (e: unknown) => {
    console.error(`prima-worker: ${e instanceof Error ? e.message : String(e)}`);
    process.exitCode = 1;
  },
);
