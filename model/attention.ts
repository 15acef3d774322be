// How attention reads the KV cache: dense (every cached position, the default) or sparse (after ruvllm's
// sparse-attention kernel: a local window, the first positions as sinks, log-stride rungs and block
// landmarks; native/src/sparse_attn.h holds the rule of what a query sees). The settings, their names on
// the command line and on the wire to a worker, and what the landmarks cost in memory.

/** Sparse attention's settings (native SparseSettings). */
export interface SparseAttention {
  /** The last `window` positions, the query's own included. */
  readonly window: number;
  /** Positions [0, sinks). */
  readonly sinks: number;
  /** Positions i - 2^k below the window. */
  readonly logStride: boolean;
  /** Landmarks (block means of K and V) of every whole block of `block` positions below the window; 0: none. */
  readonly block: number;
}

export const DEFAULT_SPARSE_ATTENTION: SparseAttention = { window: 128, sinks: 4, logStride: true, block: 64 };

const MAX_SETTING = 1 << 22;

/** Why the settings cannot run, or null (the native prima_sparse_problem refuses the same). */
export function sparseAttentionProblem(a: SparseAttention): string | null {
  const whole = (x: number, lo: number) => Number.isInteger(x) && x >= lo && x <= MAX_SETTING;
  if (!whole(a.window, 1)) return `the window must be a whole number of positions from 1 (got ${a.window})`;
  if (!whole(a.sinks, 0)) return `the sinks must be a whole number of positions from 0 (got ${a.sinks})`;
  if (!whole(a.block, 0) || a.block === 1) return `a landmark block must be 0 (none) or a whole number of positions from 2 (got ${a.block})`;
  return null;
}

/** "sparse window=128 sinks=4 log-stride block=64" for logs and the dashboard; "dense" for none. */
export function attentionLabel(a: SparseAttention | undefined): string {
  return a ? `sparse window=${a.window} sinks=${a.sinks}${a.logStride ? " log-stride" : ""} block=${a.block}` : "dense";
}

/** The settings as the coordinator sends them to a worker (Assignment.attention): "" for dense. */
export function attentionSpec(a: SparseAttention | undefined): string {
  return a ? `sparse:window=${a.window},sinks=${a.sinks},log-stride=${a.logStride ? 1 : 0},block=${a.block}` : "";
}

/** attentionSpec's string back (undefined: dense); throws naming what is wrong. */
export function parseAttentionSpec(spec: string): SparseAttention | undefined {
  if (spec === "" || spec === "dense") return undefined;
  const m = /^sparse:window=(\d{1,8}),sinks=(\d{1,8}),log-stride=([01]),block=(\d{1,8})$/.exec(spec);
  if (!m) throw new Error(`attention ${JSON.stringify(spec.slice(0, 80))} is not "dense" or sparse settings`);
  const a: SparseAttention = { window: Number(m[1]), sinks: Number(m[2]), logStride: m[3] === "1", block: Number(m[4]) };
  const problem = sparseAttentionProblem(a);
  if (problem) throw new Error(`sparse attention: ${problem}`);
  return a;
}

/** Bytes per token of context and per layer the landmarks take: a K and a V mean of n_head_kv x head_dim
 * floats per block (the native window keeps them for each of its layers). */
export function landmarkBytesPerTokenLayer(hp: { readonly nHeadKv: number; readonly headDimK: number; readonly headDimV: number },
  a: SparseAttention | undefined): number {
  return a && a.block > 0 ? (hp.nHeadKv * (hp.headDimK + hp.headDimV) * 4) / a.block : 0;
}
