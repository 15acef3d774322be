// llama.cpp (through node-llama-cpp, CPU, offline) as the live oracle, and ours on the same file: the
// logits at every position of a prompt in one batch, and how far apart they are. Shared by the
// oracle test (every weight type) and the families test (every architecture).
import { getLlama, type Llama } from "node-llama-cpp";
import { cpuHasFlag } from "../../bench/cpu-flags.js";
import { LocalModel } from "../../engine/index.js";
import type { KvCacheTypes } from "../../model/index.js";

/** llama.cpp's CPU threads meet at a spinning barrier after every op: two of them on a busy 2-core
 * machine (the suite runs two files side by side) wait out each other's time slices, and stories260K
 * token by token took 0.9 s a step where one thread takes 25 ms. So every oracle runs on one thread
 * (node-llama-cpp's own default is 4). The logits do not depend on it: ggml splits each op's rows
 * between threads, and splits a sum only in flash attention over 512 or more cached F16/F32 rows,
 * which no oracle context here holds. */
export const ORACLE_THREADS = 1;

// llama.cpp rotates Q, K and V by a Hadamard matrix when the cache is quantized and the head size a
// multiple of 64 (llama-kv-cache.cpp attn_rot_k/v, on by default since 2026) unless
// LLAMA_ATTN_ROT_DISABLE=1 (read as each context is made): prima's q8_0-rot and q4_0-rot are the
// former, its plain q8_0 and q4_0 the latter.
export function llamaRotates(types: KvCacheTypes): void {
  if (types.k.endsWith("-rot") || types.v.endsWith("-rot")) delete process.env.LLAMA_ATTN_ROT_DISABLE;
  else process.env.LLAMA_ATTN_ROT_DISABLE = "1";
}

export async function loadOracle(): Promise<Llama> {
  return getLlama({ gpu: false, build: "never", skipDownload: true, logLevel: "error" as never, maxThreads: ORACLE_THREADS });
}

/** llama.cpp's logits at every prompt position, all positions in one batch. */
export async function oracleLogits(llama: Llama, path: string, prompt: readonly number[], flashAttention: boolean): Promise<Float32Array[]> {
  const model = await llama.loadModel({ modelPath: path, gpuLayers: 0 });
  const contextSize = Math.max(64, Math.ceil(prompt.length / 64) * 64);
  const context = await model.createContext({ contextSize, batchSize: contextSize, threads: ORACLE_THREADS, flashAttention });
  try {
    const seq = context.getSequence();
    const out = await seq.controlledEvaluate(prompt.map((t) => [t, { generateNext: { logits: true } }] as const) as never);
    return out.map((item) => {
      const m = (item as { next?: { logits?: Map<number, number> } } | undefined)?.next?.logits;
      if (!m) throw new Error("node-llama-cpp returned no logits");
      const v = new Float32Array(model.tokens.length ?? m.size);
      for (const [id, l] of m) v[id] = l;
      return v;
    });
  } finally {
    await context.dispose();
    await model.dispose();
  }
}

/** Ours at every prompt position, the prompt in one batch. */
export async function ourLogits(path: string, prompt: readonly number[]): Promise<Float32Array[]> {
  const m = LocalModel.open(path, { threads: 2 });
  const w = m.window(0, m.nLayers, { ctx: Math.max(64, prompt.length) });
  const acts = m.embed(Int32Array.from(prompt));
  await w.forward(acts, 0, prompt.length);
  const rows: Float32Array[] = [];
  for (let i = 0; i < prompt.length; i++) rows.push(await m.logits(acts.subarray(i * m.nEmbd, (i + 1) * m.nEmbd)));
  w.close();
  m.close();
  return rows;
}

export interface Agreement {
  /** max |ours - llama.cpp| over all positions, relative to the spread of llama.cpp's logits there */
  maxRelErr: number;
  /** positions where the top-1 differs although llama.cpp's top-1 leads its runner-up by more than tol */
  top1Mismatches: number[];
}

export function compare(ours: Float32Array[], ref: Float32Array[], tol: number): Agreement {
  let maxRelErr = 0;
  const top1Mismatches: number[] = [];
  ref.forEach((r, p) => {
    let max = -Infinity, min = Infinity, best = 0, second = -Infinity;
    for (let i = 0; i < r.length; i++) {
      if (r[i] > max) {
        second = max;
        max = r[i];
        best = i;
      } else if (r[i] > second) second = r[i];
      min = Math.min(min, r[i]);
    }
    const spread = max - min;
    let err = 0, oursBest = 0;
    for (let i = 0; i < r.length; i++) {
      err = Math.max(err, Math.abs(ours[p][i] - r[i]));
      if (ours[p][i] > ours[p][oursBest]) oursBest = i;
    }
    maxRelErr = Math.max(maxRelErr, err / spread);
    if (oursBest !== best && max - second > tol * spread) top1Mismatches.push(p);
  });
  return { maxRelErr, top1Mismatches };
}

// How close is close enough. At the first position attention is trivial (one key), so every difference
// is kernels and formats: both engines read the same quantized weights and quantize activations to
// the same bytes, so only float summation order differs (seen: about 1e-7 of the logit spread, F16
// 4e-5). Later positions add attention rounding: llama.cpp rounds attention probabilities (or, with
// flash attention, its accumulators) to F16 where we keep F32, and Q8 activations turn such small
// differences into whole quantization steps. That noise is measured, not assumed: llama.cpp with
// flash attention on versus off differs by as much, so ours must stay within twice that of
// llama.cpp's default (flash attention off). A format or kernel bug is orders of magnitude larger.
export const TOL_FIRST_POSITION = 2e-4;

/** Where the CPU has Intel's AMX, node-llama-cpp loads its sapphirerapids build, whose AMX buffer type
 * computes F16 and Q4_1 matmuls by kernels of their own that sum in another order than llama.cpp's
 * plain ones (F16: its AVX-512 tiles; Q4_1: the min term added block by block, which on the generated
 * model flips a Q8 rounding tie, see the SIMD-level test). On a Xeon 6 (2026-11-29) their first
 * position differed from prima's by 2.9e-4 and 3.9e-3 of the spread; with that build moved out of
 * node_modules/@node-llama-cpp/linux-x64/bins/linux-x64 (libggml-cpu-sapphirerapids.so), llama.cpp
 * loaded its zen4 one and both were within 2e-4 as on every other host. There the first
 * position of those types is held to the whole prompt's tolerance (`tol`), which still finds a wrong
 * format or kernel (those are off by tenths). */
const AMX_REORDERED_TYPES = new Set(["F16", "Q4_1"]);
const oracleHasAmx = cpuHasFlag("amx_int8");
export function firstPositionTolerance(type: string, tol: number): number {
  return oracleHasAmx && AMX_REORDERED_TYPES.has(type) ? Math.max(tol, TOL_FIRST_POSITION) : TOL_FIRST_POSITION;
}
export const TOL_FLOOR = 1e-3;

/** Ours against llama.cpp on a file: the first position within TOL_FIRST_POSITION, every position
 * within twice llama.cpp's own flash-attention noise (at least TOL_FLOOR), no top-1 difference but at
 * a near tie. Returns what was measured, for the caller's expectations. */
export async function agreement(llama: Llama, path: string, prompt: readonly number[]) {
  const ref = await oracleLogits(llama, path, prompt, false);
  const refFlash = await oracleLogits(llama, path, prompt, true);
  const ours = await ourLogits(path, prompt);
  const first = compare(ours.slice(0, 1), ref.slice(0, 1), TOL_FIRST_POSITION);
  // With attention sinks (gpt-oss) the first position's attention is a softmax over the key and the
  // sink, not 1: llama.cpp's plain path rounds that probability to F16 (as everywhere else), its flash
  // path keeps it in F32 as we do, so there the kernels and formats alone are compared to the latter.
  const firstFlash = compare(ours.slice(0, 1), refFlash.slice(0, 1), TOL_FIRST_POSITION);
  const noise = compare(refFlash, ref, 0).maxRelErr;
  const tol = Math.max(2 * noise, TOL_FLOOR);
  return { first, firstFlash, noise, tol, all: compare(ours, ref, tol), ours, ref };
}
