// --cache-type-k / --cache-type-v (llama.cpp's -ctk / -ctv) for run, chat, serve and perplexity: parsing
// them, and what the dashboard shows of the KV cache. The rule for the bytes is model/kv-cache.ts's.
import {
  DEFAULT_KV_CACHE_TYPES, DEFAULT_SPARSE_ATTENTION, attentionLabel, kvBytesPerTokenLayer, parseKvCacheType, sparseAttentionProblem,
  type KvCacheTypes, type SparseAttention,
} from "../model/index.js";

export const KV_CACHE_HELP = `  -ctk, --cache-type-k T    KV cache type of K: f16 (default), q8_0 or q4_0 (llama.cpp's names), or
                            q8_0-rot / q4_0-rot: rotated by a Hadamard matrix, as llama.cpp does
  -ctv, --cache-type-v T    the same for V
  --attention dense|sparse  sparse: each query attends to a local window, the first tokens (sinks),
                            log-stride rungs and block landmarks, O(N log N) (default dense)
  --sparse-window N         sparse: the local window in tokens (default ${DEFAULT_SPARSE_ATTENTION.window})
  --sparse-sinks N          sparse: the first N tokens every query sees (default ${DEFAULT_SPARSE_ATTENTION.sinks})
  --sparse-log-stride on|off  sparse: tokens 2, 4, 8, ... back below the window (default on)
  --sparse-block N          sparse: one landmark (mean K and V) per block of N tokens below the window;
                            0: none (default ${DEFAULT_SPARSE_ATTENTION.block})`;

export const KV_CACHE_OPTIONS = {
  "cache-type-k": { type: "string" },
  "cache-type-v": { type: "string" },
  attention: { type: "string" },
  "sparse-window": { type: "string" },
  "sparse-sinks": { type: "string" },
  "sparse-log-stride": { type: "string" },
  "sparse-block": { type: "string" },
} as const;

/** llama.cpp's short names (-ctk, -ctv) as the long ones: node's parseArgs reads only one-letter short options. */
export function expandKvCacheShortFlags(argv: readonly string[]): string[] {
  return argv.map((a) => (a === "-ctk" ? "--cache-type-k" : a === "-ctv" ? "--cache-type-v" : a));
}

/** The types the flags name (f16 where one is absent) and the attention; throws an Error naming a bad flag's value. */
export function kvCacheTypesFrom(values: Record<string, unknown>): KvCacheTypes {
  const k = values["cache-type-k"], v = values["cache-type-v"];
  const attention = attentionFrom(values);
  return {
    k: typeof k === "string" ? parseKvCacheType("--cache-type-k", k) : DEFAULT_KV_CACHE_TYPES.k,
    v: typeof v === "string" ? parseKvCacheType("--cache-type-v", v) : DEFAULT_KV_CACHE_TYPES.v,
    ...(attention ? { attention } : {}),
  };
}

/** --attention and its --sparse-* settings: undefined for dense; a --sparse-* flag without --attention sparse is refused. */
function attentionFrom(values: Record<string, unknown>): SparseAttention | undefined {
  const shown = (x: string) => JSON.stringify(x.slice(0, 40));
  const mode = values.attention;
  const flags = ["sparse-window", "sparse-sinks", "sparse-log-stride", "sparse-block"].filter((f) => typeof values[f] === "string");
  if (mode !== undefined && mode !== "dense" && mode !== "sparse") throw new Error(`--attention ${shown(String(mode))}: use dense or sparse`);
  if (mode !== "sparse") {
    if (flags.length > 0) throw new Error(`--${flags[0]} needs --attention sparse`);
    return undefined;
  }
  const int = (flag: string, fallback: number) => {
    const x = values[flag];
    if (typeof x !== "string") return fallback;
    if (!/^\d{1,8}$/.test(x.trim())) throw new Error(`--${flag} ${shown(x)} is not a whole number`);
    return Number(x.trim());
  };
  const stride = values["sparse-log-stride"];
  if (typeof stride === "string" && stride !== "on" && stride !== "off") throw new Error(`--sparse-log-stride ${shown(stride)}: use on or off`);
  const a: SparseAttention = {
    window: int("sparse-window", DEFAULT_SPARSE_ATTENTION.window),
    sinks: int("sparse-sinks", DEFAULT_SPARSE_ATTENTION.sinks),
    logStride: typeof stride === "string" ? stride === "on" : DEFAULT_SPARSE_ATTENTION.logStride,
    block: int("sparse-block", DEFAULT_SPARSE_ATTENTION.block),
  };
  const problem = sparseAttentionProblem(a);
  if (problem) throw new Error(`--attention sparse: ${problem}`);
  return a;
}

/** The dashboard's KV cache line: its types and bytes per token of context (every layer). */
export interface KvCacheState {
  readonly typeK: string;
  readonly typeV: string;
  readonly bytesPerToken: number;
  /** "dense", or the sparse attention's settings (model/attention.ts attentionLabel). */
  readonly attention: string;
}

export function kvCacheState(hp: Parameters<typeof kvBytesPerTokenLayer>[0] & { readonly nLayers: number }, types: KvCacheTypes = DEFAULT_KV_CACHE_TYPES): KvCacheState {
  return { typeK: types.k, typeV: types.v, bytesPerToken: kvBytesPerTokenLayer(hp, types) * hp.nLayers, attention: attentionLabel(types.attention) };
}
