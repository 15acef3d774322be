// --cache-type-k / --cache-type-v (llama.cpp's -ctk / -ctv) for run, chat, serve and perplexity: parsing
// them, and what the dashboard shows of the KV cache. The rule for the bytes is model/kv-cache.ts's.
import { DEFAULT_KV_CACHE_TYPES, kvBytesPerTokenLayer, parseKvCacheType, type KvCacheTypes } from "../model/index.js";

export const KV_CACHE_HELP = `  -ctk, --cache-type-k T    KV cache type of K: f16 (default), q8_0 or q4_0 (llama.cpp's names), or
                            q8_0-rot / q4_0-rot: rotated by a Hadamard matrix, as llama.cpp does
  -ctv, --cache-type-v T    the same for V`;

export const KV_CACHE_OPTIONS = {
  "cache-type-k": { type: "string" },
  "cache-type-v": { type: "string" },
} as const;

/** llama.cpp's short names (-ctk, -ctv) as the long ones: node's parseArgs reads only one-letter short options. */
export function expandKvCacheShortFlags(argv: readonly string[]): string[] {
  return argv.map((a) => (a === "-ctk" ? "--cache-type-k" : a === "-ctv" ? "--cache-type-v" : a));
}

/** The types the flags name (f16 where one is absent); throws an Error naming a bad flag's value. */
export function kvCacheTypesFrom(values: Record<string, unknown>): KvCacheTypes {
  const k = values["cache-type-k"], v = values["cache-type-v"];
  return {
    k: typeof k === "string" ? parseKvCacheType("--cache-type-k", k) : DEFAULT_KV_CACHE_TYPES.k,
    v: typeof v === "string" ? parseKvCacheType("--cache-type-v", v) : DEFAULT_KV_CACHE_TYPES.v,
  };
}

/** The dashboard's KV cache line: its types and bytes per token of context (every layer). */
export interface KvCacheState {
  readonly typeK: string;
  readonly typeV: string;
  readonly bytesPerToken: number;
}

export function kvCacheState(hp: Parameters<typeof kvBytesPerTokenLayer>[0] & { readonly nLayers: number }, types: KvCacheTypes = DEFAULT_KV_CACHE_TYPES): KvCacheState {
  return { typeK: types.k, typeV: types.v, bytesPerToken: kvBytesPerTokenLayer(hp, types) * hp.nLayers };
}
