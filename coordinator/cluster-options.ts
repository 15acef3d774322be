// What a cluster is made with: the model, the device's limits, how layers are placed and how many
// requests wait or run at once (serve-command.ts, run-command.ts and chat-command.ts fill it in).
import type { LocalModel } from "../engine/index.js";
import type { KvCacheTypes } from "../model/index.js";
import type { PrefetchMode } from "./prefetch-choice.js";

/** --layer-windows: in ring order, or by device name (`laptop=8,phone=4,head=10`). */
export type LayerWindowsArg = { readonly list: readonly number[] } | { readonly byName: ReadonlyMap<string, number> };

export interface ClusterOptions {
  readonly modelPath: string;
  readonly model: LocalModel;
  /** The cluster's name (mDNS, the dashboard). */
  readonly name: string;
  readonly ctx: number;
  readonly batch: number;
  /** The KV cache's types on every device (--cache-type-k/-v); default f16. */
  readonly kvCacheTypes?: KvCacheTypes;
  /** Reading each device's next window ahead (coordinator/prefetch-choice.ts). */
  readonly prefetch: PrefetchMode;
  /** The head's own MoE windows predict and advise their experts (--expert-prefetch; RingNode). */
  readonly expertPrefetch?: boolean;
  readonly reprofile: boolean;
  readonly layerWindows?: LayerWindowsArg;
  readonly cycles?: number;
  /** Place layers on every device, even where Halda would leave one out. */
  readonly keepAll?: boolean;
  /** MoE: plan with each layer's routing measured on the head (kept per model) instead of uniform. */
  readonly measureRouting?: boolean;
  /** The cache a request's decode steps attend to, on average (its prompt and half the tokens it will
   * generate), for Halda's attention term; absent: the whole context (serve's requests are unknown). */
  readonly meanCacheTokens?: number;
  /** Re-place layers soon after devices join or leave while idle (serve), instead of only before the
   *  next request (run and chat, which place once all the workers they wait for have joined). */
  readonly autoPlace?: boolean;
  /** Workers to wait for before placing layers on its own (with autoPlace). */
  readonly minWorkers?: number;
  /** Requests waiting beyond the running one; more are refused (QueueFullError). Default 16. */
  readonly maxQueue?: number;
  /** Sequences decoded together on this device, each with a KV cache of ctx tokens (serve --parallel).
   * Above 1 every layer runs here: workers that join are not placed. Default 1. */
  readonly parallel?: number;
  /** A new join token (and certificate) before listening: workers need the new one. */
  readonly rotateToken?: boolean;
  /** Workers may name a data host other than the address they connect from (registry.ts). */
  readonly allowAdvertise?: boolean;
  readonly log: (line: string) => void;
}
