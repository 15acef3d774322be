// The head's model and the cluster around it, from the options run, chat and serve share.
import { LocalModel } from "../engine/index.js";
import { RING_COMPUTE_OPTIONS } from "../ring/index.js";
import type { ClusterArgs } from "./args.js";
import { Cluster } from "./cluster.js";

/** The model opened for a cluster: as head of a ring, its threads wait for the rest of the ring
 * between windows (RING_COMPUTE_OPTIONS). */
export function openHeadModel(a: ClusterArgs): LocalModel {
  const ring = a.minWorkers > 0 || a.layerWindows !== undefined;
  return LocalModel.open(a.model, { threads: a.threads, ...(ring ? RING_COMPUTE_OPTIONS : {}) });
}

export function clusterFor(a: ClusterArgs, model: LocalModel, log: (line: string) => void, extra: { name?: string; plannedTokens?: number; maxQueue?: number; autoPlace?: boolean; rotateToken?: boolean; allowAdvertise?: boolean } = {}): Cluster {
  return new Cluster({
    modelPath: a.model, model, name: extra.name ?? "prima", ctx: Math.min(a.ctx, model.desc.hparams.nCtxTrain), batch: a.batch,
    prefetch: a.prefetch, reprofile: a.reprofile, layerWindows: a.layerWindows, cycles: a.cycles, keepAll: a.keepAll,
    plannedTokens: extra.plannedTokens, maxQueue: extra.maxQueue, autoPlace: extra.autoPlace, minWorkers: a.minWorkers, log,
    rotateToken: extra.rotateToken, allowAdvertise: extra.allowAdvertise,
  });
}

