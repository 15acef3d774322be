#!/usr/bin/env node
// prima-worker: a device's daemon. `prima-worker --join host:port --model model.gguf` joins the
// coordinator, runs the windows it is given, and rejoins when the run ends, until stopped.
import { hostname } from "node:os";
import { LocalModel } from "../engine/index.js";
import { modelFingerprint } from "../model/index.js";
import { RING_COMPUTE_OPTIONS } from "../ring/index.js";
import { parseWorkerArgs, threadsArg } from "./args.js";
import { WorkerDevice, reserveDataPort } from "./device.js";
import { joinProfile, profileCommand } from "./profile-command.js";
import { WorkerSession } from "./session.js";

const HELP = `usage: prima-worker --join host:port --model model.gguf [options]
       prima-worker profile [--model model.gguf] [--json] [--reprofile]   (measure this device)

  --join HOST:PORT     the coordinator to join (prima-coord run ... --min-workers N)
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
  const values = parseWorkerArgs(argv, {
    join: { type: "string" }, model: { type: "string" }, port: { type: "string" }, advertise: { type: "string" },
    name: { type: "string" }, threads: { type: "string", short: "t" }, once: { type: "boolean" }, reprofile: { type: "boolean" },
    "no-native-lane": { type: "boolean" },
    help: { type: "boolean", short: "h" },
  }, HELP);
  if (typeof values === "number") return values;
  if (!values.join || !/^[^\s]+:\d+$/.test(values.join)) {
    console.error(`--join host:port is required\n${HELP}`);
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
  const coordinatorHost = values.join.slice(0, values.join.lastIndexOf(":"));
  let session: WorkerSession;
  const device = new WorkerDevice({
    model, fingerprint, deviceName: name, dataPort, dataHost: values.advertise ?? "", coordinatorHost, log,
    fail: (e) => session.fail(e), nativeLane: !values["no-native-lane"],
  });
  session = new WorkerSession({
    coordinator: values.join,
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
  await session.run();
  await profile.close();
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => { process.exitCode = code; },
  (e: unknown) => {
    console.error(`prima-worker: ${e instanceof Error ? e.message : String(e)}`);
    process.exitCode = 1;
  },
);
