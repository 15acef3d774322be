// `prima-worker profile`: measure this device (or read its cached profile) and print it as a table
// or JSON. Also the profile a worker daemon announces when it joins, with its link probe.
import { randomBytes } from "node:crypto";
import { availableParallelism, hostname } from "node:os";
import { dirname, resolve } from "node:path";
import type { LocalModel } from "../engine/index.js";
import { describeModel, readGguf } from "../model/index.js";
import { parseWorkerArgs, threadsArg } from "./args.js";
import {
  LinkProbeServer, formatReport, genericWorkload, profileDevice, refreshMemory, type DeviceReport, type ProfileTarget,
} from "../profiler/index.js";

const HELP = `usage: prima-worker profile [--model model.gguf] [options]

  --model PATH     time the kernels on this model's weight types and shapes (default: a generic
                   4096-wide layer of Q4_K, Q6_K, Q8_0, F16 and F32)
  --name NAME      device name (default: the host name)
  --threads N      compute threads (default: all cores)
  --reprofile      measure again even if this device's profile is cached
  --quick          shorter timings
  --json           print the profile as JSON (what the worker sends when it joins)

Speeds are cached per device in $PRIMA_PROFILE_DIR (default ~/.cache/prima/profiles); memory is
always read fresh.`;

export async function profileCommand(argv: string[]): Promise<number> {
  const values = parseWorkerArgs(argv, {
    model: { type: "string" }, name: { type: "string" }, threads: { type: "string", short: "t" }, reprofile: { type: "boolean" },
    quick: { type: "boolean" }, json: { type: "boolean" }, help: { type: "boolean", short: "h" },
  }, HELP);
  if (typeof values === "number") return values;
  const threadsGiven = threadsArg(values.threads);
  if (threadsGiven === "bad") return 2;
  const threads = threadsGiven ?? availableParallelism();
  const name = values.name ?? hostname();
  // Without a model, generic shapes: the kernels alone.
  let target: ProfileTarget = { workload: genericWorkload() };
  let diskDirs: string[] = [];
  if (values.model) {
    try {
      const gguf = readGguf(values.model); // the header is enough: nothing mapped
      target = { model: { gguf, desc: describeModel(gguf) } };
    } catch (e) {
      console.error(`prima-worker profile: ${(e as Error).message}`);
      return 1;
    }
    diskDirs = [dirname(resolve(values.model))];
  }
  try {
    const report = await profileDevice({
      ...target, name, threads, diskDirs, reprofile: values.reprofile, quick: values.quick,
      progress: (line) => console.error(`[profile] ${line}`),
    });
    console.log(values.json ? JSON.stringify(report, null, 1) : formatReport(report));
    return 0;
  } catch (e) {
    console.error(`prima-worker profile: ${(e as Error).message}`);
    return 1;
  }
}

export interface JoinProfile {
  readonly hardwareId: string;
  /** The profile as JSON with memory read now: read each time the worker joins. */
  json(): string;
  /** Before a join: a profile older than PROFILE_REFRESH_MS is taken again (from the cache but for the
   * one-token pass, timed anew: a daemon's speed moves with its load and heat over hours); one that
   * failed, every time. */
  refresh(): Promise<void>;
  /** Takes the profile again now (from the cache but for the pass, timed anew): true when it was. */
  retime(): Promise<boolean>;
  close(): Promise<void>;
}

/** How old a worker's profile may be when it joins (again). */
export const PROFILE_REFRESH_MS = 10 * 60_000;

/** Profiles the daemon's device (cached after the first time) and starts its link probe. A device that
 *  cannot profile itself still joins: it says why, and only --layer-windows plans can use it. */
export async function joinProfile(model: LocalModel, modelPath: string, fingerprint: string, name: string, reprofile: boolean, log: (line: string) => void): Promise<JoinProfile> {
  let report: DeviceReport | undefined;
  let error = "";
  let takenAt = 0;
  const take = async (again: boolean) => {
    try {
      report = await profileDevice({
        name, model, threads: model.threads, diskDirs: [dirname(resolve(modelPath))], reprofile: reprofile && !again,
        // At start a cached pass serves: the coordinator times it again before it plans (retime below).
        passFromCache: !again,
        // Taken again, it says only what it timed anew.
        progress: (l) => (!again || /^forward pass|^profile done/.test(l) ? log(`profile: ${l}`) : undefined),
      });
      error = "";
    } catch (e) {
      const why = (e as Error).message;
      if (why !== error) log(`profile failed: ${why}${again ? "" : "; taken again before each join until it works"}`); // said once per reason
      error = why;
    }
    takenAt = Date.now();
  };
  await take(false);
  const probeKey = randomBytes(32);
  const probe = await LinkProbeServer.listen({ deviceId: `${name} link probe`, modelFingerprint: fingerprint, hiddenSize: model.nEmbd }, { linkKey: probeKey });
  return {
    get hardwareId() {
      return report?.profile.id ?? "";
    },
    json: () => JSON.stringify(report ? { ...refreshMemory(report), linkProbePort: probe.port, linkProbeKey: probeKey.toString("hex") } : { version: 1, error }),
    refresh: async () => {
      // A profile that failed (a disk too short for its probe) is taken again before every join: the
      // coordinator refuses the device until it has one, and admits it once it can be taken.
      if (error !== "" || Date.now() - takenAt >= PROFILE_REFRESH_MS) await take(true);
    },
    retime: async () => {
      await take(true);
      return report !== undefined && error === "";
    },
    close: () => probe.close(),
  };
}
