// The head's model and the cluster around it, from the options run, chat and serve share.
import { LocalModel } from "../engine/index.js";
import { Tokenizer, attentionLabel, kvBytesPerLayer, kvBytesPerTokenLayer, kvCacheLabel, kvCacheProblem, modelProfile, type KvCacheTypes } from "../model/index.js";
import { RING_COMPUTE_OPTIONS } from "../ring/index.js";
import { UsageError, type ClusterArgs } from "./args.js";
import { Cluster } from "./cluster.js";
import { PromptRenderer, chatTemplateChoice } from "./prompt.js";

/** The coordinator's log lines go to stderr, marked. */
export const log = (line: string): void => console.error(`[prima-coord] ${line}`);

/** The head's model with its tokenizer and prompt renderer (chat: the model's template, else
 * `defaultChat` where the command has one). */
export function openHead(a: ClusterArgs, defaultChat?: "chatml"): { model: LocalModel; tok: Tokenizer; prompts: PromptRenderer } {
  const model = openHeadModel(a);
  const tok = Tokenizer.fromGguf(model.gguf);
  return { model, tok, prompts: new PromptRenderer(tok, chatTemplateChoice(a.chatTemplate, defaultChat)) };
}

/** The model opened for a cluster: as head of a ring, its threads wait for the rest of the ring
 * between windows (RING_COMPUTE_OPTIONS). */
export function openHeadModel(a: ClusterArgs): LocalModel {
  const ring = a.minWorkers > 0 || a.layerWindows !== undefined;
  return LocalModel.open(a.model, { threads: a.threads, ...(ring ? RING_COMPUTE_OPTIONS : {}) });
}

/** The KV cache's tokens: --ctx, at most what the model was trained on. */
export function clusterCtx(a: ClusterArgs, model: LocalModel): number {
  return Math.min(a.ctx, model.desc.hparams.nCtxTrain);
}

export function clusterFor(a: ClusterArgs, model: LocalModel, log: (line: string) => void, extra: { name?: string; meanCacheTokens?: number; maxQueue?: number; parallel?: number; autoPlace?: boolean; rotateToken?: boolean; allowAdvertise?: boolean } = {}): Cluster {
  const kvProblem = kvCacheProblem(model.desc.hparams, a.kvCacheTypes);
  if (kvProblem) throw new UsageError(`${kvProblem}: use --cache-type-k/-v f16 with this model`);
  const hp = model.desc.hparams, ctx = clusterCtx(a, model);
  if (a.kvCacheTypes.k !== "f16" || a.kvCacheTypes.v !== "f16") {
    // the one rule (model/profile.ts kvBytesPerLayer): bytes per token by type, sliding-window layers a ring
    const total = (kvCacheTypes?: KvCacheTypes) => kvBytesPerLayer(modelProfile(model.desc, { nCtx: ctx, maxBatch: a.batch, kvCacheTypes })) * hp.nLayers;
    const perToken = kvBytesPerTokenLayer(hp, a.kvCacheTypes) * hp.nLayers;
    log(`KV cache ${kvCacheLabel(a.kvCacheTypes)} (K/V) on every device: ${perToken} bytes per token, ${(total(a.kvCacheTypes) / 2 ** 20).toFixed(1)} MiB at ${ctx} tokens (F16: ${(total() / 2 ** 20).toFixed(1)} MiB)`);
  }
  if (a.kvCacheTypes.attention) log(`attention ${attentionLabel(a.kvCacheTypes.attention)} on every device (the full-attention layers)`);
  return new Cluster({
    modelPath: a.model, model, name: extra.name ?? "prima", ctx: clusterCtx(a, model), batch: a.batch,
    kvCacheTypes: a.kvCacheTypes,
    prefetch: a.prefetch, expertPrefetch: a.expertPrefetch, reprofile: a.reprofile, layerWindows: a.layerWindows, cycles: a.cycles, keepAll: a.keepAll, measureRouting: a.measureRouting,
    meanCacheTokens: extra.meanCacheTokens, maxQueue: extra.maxQueue, parallel: extra.parallel, autoPlace: extra.autoPlace, minWorkers: a.minWorkers, log,
    rotateToken: extra.rotateToken, allowAdvertise: extra.allowAdvertise,
  });
}

