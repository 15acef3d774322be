// The cluster's own device and what it offers workers: its profile (profiler/), the model file workers
// without a copy fetch their windows from (transfer/), the worker registry that checks their joins
// against the cluster's trust (trust/), and the line that tells a person how workers join.
import { basename, dirname, join, resolve } from "node:path";
import { profileDevice, type DeviceReport } from "../profiler/index.js";
import { ModelSource, defaultModelCacheDir } from "../transfer/index.js";
import type { TrustStore } from "../trust/index.js";
import type { ClusterOptions } from "./cluster-options.js";
import { serveChunks } from "./model-store.js";
import { WorkerRegistry } from "./registry.js";
import { HEAD_ID } from "./ring-setup.js";

/** This device's profile: measured (or read from the cache) at start; `again` before each plan, from
 * the cache but for the pass and the output layer, timed anew, and the hand-off to a successor (only
 * a ring has one), saying only those. */
export function profileHead(o: ClusterOptions, again: boolean): Promise<DeviceReport> {
  return profileDevice({
    name: HEAD_ID, model: o.model, outputLayer: true, handOff: again, threads: o.model.threads,
    diskDirs: [dirname(resolve(o.modelPath))], nCtx: o.ctx, reprofile: o.reprofile && !again,
    // At start a cached pass serves: every plan times the head again first (again = true).
    passFromCache: !again,
    progress: (l) => (!again || /^forward pass|^output layer|^hand-off/.test(l) ? o.log(`profile: ${l}`) : undefined),
  });
}

/** The model file served to workers, and the registry they join (trust: the store start() opens). */
export function workerSide(o: ClusterOptions, fingerprint: string, trust: () => TrustStore): { modelSource: ModelSource; registry: WorkerRegistry } {
  // Workers without their own copy fetch their windows' chunks from this file (transfer/).
  const modelSource = new ModelSource({
    path: o.modelPath, fileBytes: o.model.gguf.fileBytes, dataOffset: o.model.gguf.dataOffset, fingerprint,
    name: basename(o.modelPath), hashDir: join(dirname(defaultModelCacheDir()), "chunk-hashes"),
  });
  const registry = new WorkerRegistry({
    modelFingerprint: fingerprint, log: o.log, chunks: serveChunks(modelSource, o.log), allowAdvertise: o.allowAdvertise,
    trust: { get identity() { return trust().identity; }, refresh: () => trust().refresh() },
  });
  return { modelSource, registry };
}

/** How workers join: the token file always; the token itself only when it is new or a person
 * watches (logs are kept and shared, and the token lets a device into the ring). */
export function sayJoinCommand(o: ClusterOptions, t: TrustStore, port: number): void {
  const model = `--model <their copy of ${basename(o.modelPath)}> (or none: they fetch their layers)`;
  if (t.created) o.log(`made a new join token for cluster "${o.name}" (${t.tokenFile}); workers with an older one are refused`);
  o.log(`workers join with: prima-worker --join HOST:${port} --token-file ${t.tokenFile} ${model}; HOST is this machine's address`);
  if (t.created || process.stderr.isTTY) o.log(`or: prima-worker --join HOST:${port} --token ${t.identity.tokenText}`);
}
