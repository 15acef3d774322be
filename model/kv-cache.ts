// The KV cache's element types (llama.cpp's --cache-type-k / --cache-type-v: f16, q8_0, q4_0, and the
// quantized ones rotated by a Hadamard matrix, q8_0-rot and q4_0-rot, as llama.cpp rotates them by
// default where the head size is a multiple of 64) and the one
// rule for what a cache costs: every layer holds, per token of context, a K row and a V row of
// n_head_kv x head_dim elements in their types. The profiler, Halda's memory model, serve's log, the
// dashboard and the benches count KV bytes with kvBytesPerTokenLayer; the native window computes the same
// from its own type table (test/engine/kv-types.test.ts holds the two together).
import { landmarkBytesPerTokenLayer, type SparseAttention } from "./attention.js";
import { GgmlType, rowBytes } from "./ggml-types.js";

export const KV_CACHE_TYPES = ["f16", "q8_0", "q4_0", "q8_0-rot", "q4_0-rot"] as const;
export type KvCacheType = (typeof KV_CACHE_TYPES)[number];

/** Names llama.cpp accepts for --cache-type-k/-v that prima does not run (yet), refused by name. */
const NOT_SUPPORTED = ["f32", "bf16", "q4_1", "iq4_nl", "q5_0", "q5_1"];

export interface KvCacheTypes {
  readonly k: KvCacheType;
  readonly v: KvCacheType;
  /** How attention reads the cache: sparse with these settings (model/attention.ts; they travel with
   * the types to every window and worker), or dense when absent. */
  readonly attention?: SparseAttention;
  /** "h2o": the windows gather H2O's attention statistics (--kv-evict h2o; engine/h2o.ts evicts by them). */
  readonly evict?: "h2o";
}

export const DEFAULT_KV_CACHE_TYPES: KvCacheTypes = { k: "f16", v: "f16" };

/** A cache type from its name (as llama.cpp spells it, any case); throws naming the flag and the value. */
export function parseKvCacheType(flag: string, name: string): KvCacheType {
  const n = name.trim().toLowerCase();
  if ((KV_CACHE_TYPES as readonly string[]).includes(n)) return n as KvCacheType;
  const shown = JSON.stringify(name.slice(0, 40));
  if (NOT_SUPPORTED.includes(n)) throw new Error(`${flag} ${shown}: llama.cpp has this cache type, prima does not (use ${KV_CACHE_TYPES.join(", ")})`);
  if (/hadamard|rot/.test(n)) throw new Error(`${flag} ${shown} is not a KV cache type: the rotated ones are q8_0-rot and q4_0-rot`);
  throw new Error(`${flag} ${shown} is not a KV cache type (use ${KV_CACHE_TYPES.join(", ")})`);
}

/** The ggml type id a cache type stores its elements in. */
export function kvCacheGgmlType(t: KvCacheType): number {
  return t.startsWith("q8_0") ? GgmlType.Q8_0 : t.startsWith("q4_0") ? GgmlType.Q4_0 : GgmlType.F16;
}

/** Whether a cache type rotates its rows (and Q, or the attention's output) by a Hadamard matrix. */
export function kvCacheRotated(t: KvCacheType): boolean {
  return t.endsWith("-rot");
}

/** The flag of a rotated type in the native window's type argument (native/src/kv_cache.h PRIMA_KV_ROTATED). */
export const KV_ROTATED_FLAG = 0x100;

/** The native window's type argument: the ggml id, with KV_ROTATED_FLAG for a rotated type. */
export function kvCacheNativeType(t: KvCacheType): number {
  return kvCacheGgmlType(t) | (kvCacheRotated(t) ? KV_ROTATED_FLAG : 0);
}

/** The cache type of a native type argument (as a window reports it). */
export function kvCacheTypeOf(id: number): KvCacheType {
  const t = KV_CACHE_TYPES.find((name) => kvCacheNativeType(name) === id);
  if (!t) throw new Error(`ggml type ${id} is not a KV cache type`);
  return t;
}

interface KvShape {
  readonly nHeadKv: number;
  readonly headDimK: number;
  readonly headDimV: number;
}

/** Why a model cannot hold its cache in these types, or null: a quantized type's blocks of 32 must
 * divide the head size (llama.cpp refuses the same with flash attention on). */
export function kvCacheProblem(hp: KvShape, types: KvCacheTypes): string | null {
  for (const [which, t, d] of [["K", types.k, hp.headDimK], ["V", types.v, hp.headDimV]] as const) {
    if (t !== "f16" && d % 32 !== 0) return `${which} cache type ${t} has blocks of 32 elements, which do not divide the model's head size ${d}`;
    if (kvCacheRotated(t) && d % 64 !== 0) return `${which} cache type ${t} rotates chunks of 64 elements, which do not divide the model's head size ${d}`;
  }
  return null;
}

/** Bytes of KV cache per token of context and per layer: a K row and a V row in their types, and with
 * sparse attention its landmarks' share. */
export function kvBytesPerTokenLayer(hp: KvShape, types: KvCacheTypes = DEFAULT_KV_CACHE_TYPES): number {
  return rowBytes(kvCacheGgmlType(types.k), hp.nHeadKv * hp.headDimK) + rowBytes(kvCacheGgmlType(types.v), hp.nHeadKv * hp.headDimV) +
    landmarkBytesPerTokenLayer(hp, types.attention);
}

/** "f16" or "q8_0/q4_0" (K/V) for logs and the dashboard. */
export function kvCacheLabel(types: KvCacheTypes): string {
  return types.k === types.v ? types.k : `${types.k}/${types.v}`;
}
