// serve --parallel's default (auto): as many sequence slots as this device's memory holds beside the
// model's weights, at most AUTO_PARALLEL_CAP. llama-server's default (-np -1, "auto") is 4 slots
// sharing one KV cache of --ctx tokens (kv_unified); here each slot has a KV cache of its own of --ctx
// tokens (engine/seq-slots.ts), N x ctx in all, so the number is what the memory allows, not a fixed 4.
import type { LocalModel } from "../engine/index.js";
import { kvBytesPerLayer, modelProfile, type KvCacheTypes } from "../model/index.js";
import { layerRoomBytes, readMemory } from "../profiler/index.js";

/** At most this many slots by default: llama-server's default number of slots. */
export const AUTO_PARALLEL_CAP = 4;

export interface SlotBytes {
  /** The slot's KV cache at the context size: the rule Halda prices KV by (model/profile.ts). */
  readonly kv: number;
  /** The slot window's activations and RoPE tables (measured on a window of one layer). */
  readonly scratch: number;
  readonly ctx: number;
}

/** A sequence's KV cache at ctx tokens in its types, every layer: the rule Halda prices KV by (model/profile.ts). */
export function kvBytesPerSequence(model: LocalModel, ctx: number, batch: number, kvCacheTypes?: KvCacheTypes): number {
  return kvBytesPerLayer(modelProfile(model.desc, { nCtx: ctx, maxBatch: batch, kvCacheTypes })) * model.nLayers;
}

/** One sequence slot's memory: a window of every layer with a KV cache of ctx tokens. */
export function slotBytes(model: LocalModel, ctx: number, batch: number, kvCacheTypes?: KvCacheTypes): SlotBytes {
  const kv = kvBytesPerSequence(model, ctx, batch, kvCacheTypes);
  // Beside its KV a window holds scratch shared by its layers plus a little per layer: windows of one
  // and two layers tell the two apart without allocating every layer's cache.
  const beyondKv = (layers: number) => {
    const w = model.window(0, layers, { ctx, maxBatch: batch, kvCacheTypes });
    try {
      return w.info().anonBytes - w.info().kvBytes;
    } finally {
      w.close();
    }
  };
  const one = beyondKv(1);
  const perLayer = model.nLayers > 1 ? beyondKv(2) - one : 0;
  return { kv, scratch: Math.max(0, one + perLayer * (model.nLayers - 1)), ctx };
}

const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;

/**
 * How many slots `roomBytes` holds once the weights have their room: at least 1 (a model that does not
 * fit streams its layers and gets one sequence), at most `cap`; and the log line that says why.
 */
export function parallelForRoom(roomBytes: number, weightBytes: number, slot: SlotBytes, cap: number): { n: number; why: string } {
  const per = slot.kv + slot.scratch;
  const free = Math.max(0, roomBytes - weightBytes);
  const fits = per > 0 ? Math.floor(free / per) : cap;
  const n = Math.max(1, Math.min(cap, fits));
  const limit = fits >= cap ? `at most ${cap}` : fits < 1 ? "at least 1" : "all that fit";
  return {
    n,
    why: `--parallel ${n} (auto: ${limit}): ${mib(free)} of memory beside the model's ${mib(weightBytes)} of weights holds ${fits} sequence slot${fits === 1 ? "" : "s"} ` +
      `of ${slot.ctx} tokens, ${mib(per)} each (KV cache ${mib(slot.kv)}, scratch ${mib(slot.scratch)}); --parallel N sets it`,
  };
}

/** serve's default number of slots on this device, from its memory now (a memory cgroup's limit where
 * one binds: profiler/'s layerRoomBytes, the room Halda gives a device for layers and KV). Under a
 * cgroup the weights' pages already mapped count as held and again as weights: a conservative count. */
export function autoParallel(model: LocalModel, ctx: number, batch: number, kvCacheTypes?: KvCacheTypes): { n: number; why: string } {
  const weights = modelProfile(model.desc, { nCtx: ctx }).weightBytesTotal;
  return parallelForRoom(layerRoomBytes(readMemory()), weights, slotBytes(model, ctx, batch, kvCacheTypes), Math.min(AUTO_PARALLEL_CAP, batch));
}
