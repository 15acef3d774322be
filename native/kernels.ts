// Typed surface over the addon's kernel table (native/src/kernels.h): quantize, dequantize and dot on
// caller-owned typed arrays. Used by tests, bench/kernels.ts and the model generator (quantizeRef).
import { addon } from "./binding.js";

/** ggml type ids as GGUF stores them (the subset prima has kernels or activation formats for). */
export const GgmlTypeId = {
  F32: 0, F16: 1, Q4_0: 2, Q4_1: 3, Q5_0: 6, Q5_1: 7, Q8_0: 8, Q8_1: 9,
  Q2_K: 10, Q3_K: 11, Q4_K: 12, Q5_K: 13, Q6_K: 14, Q8_K: 15, IQ4_NL: 20, IQ4_XS: 23, BF16: 30, MXFP4: 39,
} as const;
export type GgmlTypeName = keyof typeof GgmlTypeId;

/** Weight types with a dot kernel, in id order. */
export const WEIGHT_TYPES: readonly GgmlTypeName[] = [
  "F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "BF16", "MXFP4",
];

export type SimdLevel = "scalar" | "avx2" | "avx512" | "neon";

/** Timing of repeated passes over a weight matrix: totals and the fastest single pass. */
export interface BenchTiming { calls: number; seconds: number; bestPassSeconds: number }

export interface KernelTypeInfo {
  name: string;
  blockElems: number;
  blockBytes: number;
  /** Format the dot reads activations in (a GgmlTypeId). */
  actType: number;
  /** Level the dot at the asked level was written for ("scalar" where that level has no twin). */
  dotSimd: SimdLevel;
  /** Whether the level has a rows kernel (decode's streaming matrix-vector product) for the type; without
   * one, dotRows calls the dot row by row. */
  dotRows: boolean;
  /** Whether the level has a prompt kernel (gemm: blocks of weight rows against many tokens) for the type;
   * without one, gemm runs the dot over the tokens. */
  gemm: boolean;
}

interface KernelsAddon {
  simdLevel(): SimdLevel;
  simdLevels(): SimdLevel[];
  typeInfo(type: number, level?: SimdLevel): KernelTypeInfo | null;
  rowBytes(type: number, n: number): number;
  quantizeRef(type: number, src: Float32Array, dst: Uint8Array): void;
  dequantize(type: number, src: Uint8Array, dst: Float32Array, level?: SimdLevel): void;
  quantizeAct(actType: number, src: Float32Array, dst: Uint8Array, level?: SimdLevel): void;
  dot(type: number, n: number, w: Uint8Array, a: Uint8Array, aStride: number, nc: number, out: Float32Array,
    level?: SimdLevel): void;
  dotRows(type: number, n: number, w: Uint8Array, wStride: number, nr: number, a: Uint8Array, out: Float32Array,
    level?: SimdLevel): void;
  gemm(type: number, n: number, w: Uint8Array, wStride: number, nr: number, a: Uint8Array, aStride: number, nt: number,
    out: Float32Array, outStride: number, accumulate: boolean, level?: SimdLevel): void;
  benchDot(type: number, n: number, w: Uint8Array, a: Uint8Array, aStride: number, nc: number, rows: number,
    minSeconds: number, level?: SimdLevel, threads?: number): BenchTiming;
  fp32ToHalf(src: Float32Array, dst: Uint16Array, kind: "f16" | "bf16"): void;
  halfToFp32(src: Uint16Array, dst: Float32Array, kind: "f16" | "bf16"): void;
  geglu(gate: Float32Array, up: Float32Array, level?: SimdLevel): void;
  kvStore(type: number, x: Float32Array, dst: Uint8Array): void;
  kvAttend(kType: number, vType: number, k: Uint8Array, v: Uint8Array, nPos: number, ratio: number, d: number, q: Float32Array,
    scale: number, softcap: number, out: Float32Array, level?: SimdLevel): void;
  kvAttendRows(kType: number, vType: number, k: Uint8Array, v: Uint8Array, pos0: number, nTok: number, ratio: number, d: number,
    q: Float32Array, scale: number, softcap: number, window: number, out: Float32Array, level?: SimdLevel): boolean;
  kvAttendSparse(kType: number, vType: number, k: Uint8Array, v: Uint8Array, i: number, ratio: number, d: number, q: Float32Array,
    scale: number, softcap: number, sparse: SparseSettings, lmK: Float32Array, lmV: Float32Array, out: Float32Array, level?: SimdLevel): void;
  sparseLandmarks(kType: number, vType: number, k: Uint8Array, v: Uint8Array, nBlocks: number, d: number, block: number,
    lmK: Float32Array, lmV: Float32Array): void;
  sparseSelect(sparse: SparseSettings, i: number): SparseSelection;
  kvAttendBench(kType: number, vType: number, k: Uint8Array, v: Uint8Array, i: number, ratio: number, d: number, q: Float32Array,
    scale: number, sparse: SparseSettings | null, lmK: Float32Array, lmV: Float32Array, minSeconds: number): number;
  maxNc: number;
}

/** Sparse attention's settings as the native window takes them (native/src/sparse_attn.h). */
export interface SparseSettings {
  readonly window: number;
  readonly sinks: number;
  readonly logStride: boolean;
  readonly block: number;
}

/** What a query at position i attends to (native prima_sparse_select): positions [0, sinkEnd), the rungs,
 * [windowStart, i], and the landmarks of blocks [0, blocks). */
export interface SparseSelection {
  readonly sinkEnd: number;
  readonly windowStart: number;
  readonly rungs: number[];
  readonly blocks: number;
}

const k = addon.kernels as KernelsAddon;

/** Most activation rows one dot call takes (PRIMA_MAX_NC). */
export const MAX_NC: number = k.maxNc;

/** The level the kernels run at (best the CPU has, unless PRIMA_SIMD forces a lower one). */
export function simdLevel(): SimdLevel { return k.simdLevel(); }
/** Every level compiled in that this CPU runs. */
export function simdLevels(): SimdLevel[] { return k.simdLevels(); }

function typeId(type: number | GgmlTypeName): number {
  if (typeof type === "number") return type;
  const id = (GgmlTypeId as Record<string, number>)[type];
  if (id === undefined) throw new Error(`unknown ggml type name ${String(type)}`);
  return id;
}

/** Layout and activation format of a weight type with kernels, or null. */
export function typeInfo(type: number | GgmlTypeName, level?: SimdLevel): KernelTypeInfo | null {
  return k.typeInfo(typeId(type), level);
}

/** Bytes of a row of n elements (throws when n is not a whole number of blocks). */
export function rowBytes(type: number | GgmlTypeName, n: number): number { return k.rowBytes(typeId(type), n); }

/** Weight quantizer equal to llama.cpp's quantize_row_*_ref; returns a new buffer when dst is omitted. */
export function quantizeRef(type: number | GgmlTypeName, src: Float32Array, dst?: Uint8Array): Uint8Array {
  const id = typeId(type);
  const out = dst ?? new Uint8Array(k.rowBytes(id, src.length));
  k.quantizeRef(id, src, out);
  return out;
}

/** Blocks of any type with a dequantizer (weights, Q8_0/Q8_1/Q8_K activations) -> floats. */
export function dequantize(type: number | GgmlTypeName, src: Uint8Array, dst: Float32Array, level?: SimdLevel): Float32Array {
  k.dequantize(typeId(type), src, dst, level);
  return dst;
}

/** Floats -> the activation format a dot reads (F32 copy, F16, BF16, Q8_0, Q8_1, Q8_K). */
export function quantizeAct(actType: number | GgmlTypeName, src: Float32Array, dst?: Uint8Array, level?: SimdLevel): Uint8Array {
  const id = typeId(actType);
  const out = dst ?? new Uint8Array(k.rowBytes(id, src.length));
  k.quantizeAct(id, src, out, level);
  return out;
}

/** out[c] = dot(weight row w, activation row c), c < nc, activation rows aStride bytes apart. */
export function dot(type: number | GgmlTypeName, n: number, w: Uint8Array, a: Uint8Array, aStride: number, nc: number,
  out: Float32Array, level?: SimdLevel): Float32Array {
  k.dot(typeId(type), n, w, a, aStride, nc, out, level);
  return out;
}

/** out[r] = dot(weight row r, activation row a), r < nr, weight rows wStride bytes apart: decode's rows kernel
 * (equal bit for bit to dot with nc = 1 on each row, at the same level). */
export function dotRows(type: number | GgmlTypeName, n: number, w: Uint8Array, wStride: number, nr: number, a: Uint8Array,
  out: Float32Array, level?: SimdLevel): Float32Array {
  k.dotRows(typeId(type), n, w, wStride, nr, a, out, level);
  return out;
}

/** A prompt's product: out[t * outStride + r] = dot(weight row r, activation row t) (added to out when
 * accumulate) for nr weight rows wStride bytes apart and nt activation rows aStride bytes apart: the
 * level's gemm, or its dot over the tokens; either equals the dot (nc = 1) bit for bit. */
export function gemm(type: number | GgmlTypeName, n: number, w: Uint8Array, wStride: number, nr: number, a: Uint8Array,
  aStride: number, nt: number, out: Float32Array, outStride: number, accumulate: boolean, level?: SimdLevel): Float32Array {
  k.gemm(typeId(type), n, w, wStride, nr, a, aStride, nt, out, outStride, accumulate, level);
  return out;
}

/** Times the dot over `rows` weight rows (each against the same nc activation rows) for at least minSeconds;
 * with threads > 1 each pass splits the rows between that many threads. */
export function benchDot(type: number | GgmlTypeName, n: number, w: Uint8Array, a: Uint8Array, aStride: number, nc: number,
  rows: number, minSeconds: number, level?: SimdLevel, threads = 1): BenchTiming {
  return k.benchDot(typeId(type), n, w, a, aStride, nc, rows, minSeconds, level, threads);
}

export function fp32ToHalf(src: Float32Array, kind: "f16" | "bf16", dst = new Uint16Array(src.length)): Uint16Array {
  k.fp32ToHalf(src, dst, kind);
  return dst;
}

export function halfToFp32(src: Uint16Array, kind: "f16" | "bf16", dst = new Float32Array(src.length)): Float32Array {
  k.halfToFp32(src, dst, kind);
  return dst;
}

/** gate[i] = gelu(gate[i]) * up[i] in place (the feed-forward of gemma), at a SIMD level. */
export function geglu(gate: Float32Array, up: Float32Array, level?: SimdLevel): Float32Array {
  k.geglu(gate, up, level);
  return gate;
}

/** One KV cache row (F16, Q8_0 or Q4_0) as a window writes it (native/src/kv_cache.h prima_kv_store). */
export function kvStore(type: number | GgmlTypeName, x: Float32Array, dst?: Uint8Array): Uint8Array {
  const id = typeId(type);
  const out = dst ?? new Uint8Array(k.rowBytes(id, x.length));
  k.kvStore(id, x, out);
  return out;
}

/** A window's attention of `ratio` query heads (q: ratio x d floats) over nPos cached rows of one KV head,
 * the rows of k and v back to back in their cache types: softmax(scale * q·K, soft-capped when softcap > 0)·V. */
export function kvAttend(kType: number | GgmlTypeName, vType: number | GgmlTypeName, kRows: Uint8Array, vRows: Uint8Array, nPos: number,
  ratio: number, d: number, q: Float32Array, scale: number, softcap = 0, level?: SimdLevel): Float32Array {
  const out = new Float32Array(ratio * d);
  k.kvAttend(typeId(kType), typeId(vType), kRows, vRows, nPos, ratio, d, q, scale, softcap, out, level);
  return out;
}

/** A batch's attention: nTok consecutive tokens at positions pos0.. (ratio query heads each, nTok x ratio x d
 * floats) over the causal rows of one KV head (pos0 + nTok rows back to back), a sliding window of `window`
 * positions when > 0, as a window's forward pass computes it at that level; `tiled` says whether the tiled
 * kernel (native/src/attn_tile.c) ran rather than the per-row one. */
export function kvAttendRows(kType: number | GgmlTypeName, vType: number | GgmlTypeName, kRows: Uint8Array, vRows: Uint8Array,
  pos0: number, nTok: number, ratio: number, d: number, q: Float32Array, scale: number,
  o: { softcap?: number; window?: number; level?: SimdLevel } = {}): { out: Float32Array; tiled: boolean } {
  const out = new Float32Array(nTok * ratio * d);
  const tiled = k.kvAttendRows(typeId(kType), typeId(vType), kRows, vRows, pos0, nTok, ratio, d, q, scale, o.softcap ?? 0, o.window ?? 0, out, o.level);
  return { out, tiled };
}

/** The native rule of what a query at position i attends to under sparse settings. */
export function sparseSelect(sparse: SparseSettings, i: number): SparseSelection {
  return k.sparseSelect(sparse, i);
}

/** The landmarks (block means of keys and values, as attention reads the rows) of blocks [0, nBlocks) of
 * one KV head's rows back to back, nBlocks x d floats each: what a window keeps per layer and head. */
export function sparseLandmarks(kType: number | GgmlTypeName, vType: number | GgmlTypeName, kRows: Uint8Array, vRows: Uint8Array,
  nBlocks: number, d: number, block: number): { k: Float32Array; v: Float32Array } {
  const lk = new Float32Array(nBlocks * d), lv = new Float32Array(nBlocks * d);
  k.sparseLandmarks(typeId(kType), typeId(vType), kRows, vRows, nBlocks, d, block, lk, lv);
  return { k: lk, v: lv };
}

/** A window's sparse attention of `ratio` query heads at position i over rows 0..i of one KV head, with
 * the landmarks sparseLandmarks made from the same rows. */
export function kvAttendSparse(kType: number | GgmlTypeName, vType: number | GgmlTypeName, kRows: Uint8Array, vRows: Uint8Array, i: number,
  ratio: number, d: number, q: Float32Array, scale: number, sparse: SparseSettings, landmarks: { k: Float32Array; v: Float32Array },
  softcap = 0, level?: SimdLevel, out = new Float32Array(ratio * d)): Float32Array {
  k.kvAttendSparse(typeId(kType), typeId(vType), kRows, vRows, i, ratio, d, q, scale, softcap, sparse, landmarks.k, landmarks.v, out, level);
  return out;
}

/** Microseconds one query's attention at position i takes at the selected level, dense (sparse null) or
 * sparse with the landmarks sparseLandmarks made: timed in a native loop of at least minSeconds. */
export function kvAttendBench(kType: number | GgmlTypeName, vType: number | GgmlTypeName, kRows: Uint8Array, vRows: Uint8Array, i: number,
  ratio: number, d: number, q: Float32Array, scale: number, sparse: SparseSettings | null,
  landmarks: { k: Float32Array; v: Float32Array } = { k: new Float32Array(0), v: new Float32Array(0) }, minSeconds = 0.02): number {
  return k.kvAttendBench(typeId(kType), typeId(vType), kRows, vRows, i, ratio, d, q, scale, sparse, landmarks.k, landmarks.v, minSeconds);
}
