// CPU throughput of our own kernels on the model's own matrix shapes (HALDA.md §1.1 cpuFlopsPerS),
// memory read bandwidth and the KV-write cost. prima.cpp times one small n x n matmul per type; we
// time every distinct matmul step of the model's layers (q/k/v, o, gate/up, down, as the forward pass
// groups them) for one token on all threads, over enough copies of the weights that they stream from
// memory as the real layers do, and weight the result by how often each step occurs, so that
// Sum_q F_q / cpuFlopsPerS[q] is the time of a layer's matmuls.
import type { LayerTensors, ModelDescription, TensorRef } from "../model/index.js";
import { ggmlTypeName, rowBytes } from "../model/index.js";
import { benchDispatchMs, benchKvCopy, benchMatmul, benchMemRead } from "../native/index.js";

/** One weight matrix: ne0 is the row length (inputs), ne1 the rows (outputs). */
export interface MatrixShape {
  readonly type: string;
  readonly typeId: number;
  readonly ne0: number;
  readonly ne1: number;
}

/** Matrices the forward pass runs as one step (q, k and v share their input and one thread-pool
 *  pass; so do gate and up), and how many times a layer runs it on average (0: a stand-in). */
export interface MatmulStep {
  readonly matrices: readonly MatrixShape[];
  readonly perLayer: number;
}

/** What of a model the device profile depends on. */
export interface ModelWorkload {
  readonly name: string;
  readonly nEmbd: number;
  /** n_embd_k_gqa + n_embd_v_gqa: floats written to the KV cache per token and layer. */
  readonly kvFloats: number;
  readonly weightBytes: number;
  /** Distinct steps of the layers, then the output matrix when its type is not among them, then F32
   *  and F16 stand-ins (norms, RoPE and softmax are F32 work; attention reads the F16 cache). */
  readonly steps: readonly MatmulStep[];
}

const shape = (t: TensorRef): MatrixShape => ({ type: ggmlTypeName(t.type), typeId: t.type, ne0: t.dims[0], ne1: t.dims[1] });

/** A layer's matmul steps as the forward pass groups them: q/k/v, o, gate/up, down. */
export function layerSteps(l: LayerTensors, nExpertUsed = 1): MatmulStep[] {
  if (!l.wGate || !l.wUp || !l.wDown) {
    // a mixture of experts: the router, then one expert's gate/up and down (its 2-D slice of the 3-D
    // tensors), run nExpertUsed times a layer
    const expert = (t: TensorRef | undefined): MatrixShape => ({ ...shape(t!), ne1: t!.dims[1] });
    return [
      { matrices: [l.wq, l.wk, l.wv].map(shape), perLayer: 1 }, { matrices: [shape(l.wo)], perLayer: 1 },
      { matrices: [shape(l.ffnGateInp!)], perLayer: 1 },
      { matrices: [expert(l.ffnGateExps), expert(l.ffnUpExps)], perLayer: nExpertUsed },
      { matrices: [expert(l.ffnDownExps)], perLayer: nExpertUsed },
    ];
  }
  return [[l.wq, l.wk, l.wv], [l.wo], [l.wGate, l.wUp], [l.wDown]].map((group) => ({ matrices: group.map(shape), perLayer: 1 }));
}

/** FLOPs of a step's matrices for one token (2 per weight). */
export const stepFlops = (ms: readonly { ne0: number; ne1: number }[]) => ms.reduce((s, m) => s + 2 * m.ne0 * m.ne1, 0);

/** "Q8_0 1024->1024 + Q8_0 1024->256 x2" for progress lines and tables. */
export function describeStep(s: { readonly matrices: readonly MatrixShape[] }): string {
  const parts: { text: string; n: number }[] = [];
  for (const m of s.matrices) {
    const text = `${m.type} ${m.ne0}->${m.ne1}`;
    const last = parts[parts.length - 1];
    if (last && last.text === text) last.n++;
    else parts.push({ text, n: 1 });
  }
  return parts.map((p) => (p.n > 1 ? `${p.text} x${p.n}` : p.text)).join(" + ");
}

/** Key of a step in the profile cache: its matrices' types and shapes. */
export function stepKey(s: { readonly matrices: readonly MatrixShape[] }): string {
  return s.matrices.map((m) => `${m.type}:${m.ne0}x${m.ne1}`).join("+");
}

export function modelWorkload(desc: ModelDescription): ModelWorkload {
  const hp = desc.hparams, t = desc.tensors;
  const byKey = new Map<string, { matrices: readonly MatrixShape[]; count: number }>();
  for (const l of t.layers) {
    for (const { matrices, perLayer } of layerSteps(l, hp.nExpertUsed)) {
      const key = stepKey({ matrices });
      const e = byKey.get(key);
      if (e) e.count += perLayer;
      else byKey.set(key, { matrices, count: perLayer });
    }
  }
  const steps: MatmulStep[] = [...byKey.values()].map(({ matrices, count }) => ({ matrices, perLayer: count / hp.nLayers }));
  const types = new Set(steps.flatMap((s) => s.matrices.map((m) => m.type)));
  const out = shape(t.output);
  if (!types.has(out.type)) {
    steps.push({ matrices: [out], perLayer: 0 });
    types.add(out.type);
  }
  for (const [type, typeId] of [["F32", 0], ["F16", 1]] as const) {
    if (!types.has(type)) steps.push({ matrices: [{ type, typeId, ne0: hp.nEmbd, ne1: hp.nEmbd }], perLayer: 0 });
  }
  const tied = t.output.name === t.tokenEmbd.name;
  const tensors = [...t.layers.flatMap((l) => Object.values(l) as (TensorRef | undefined)[]), t.tokenEmbd, t.outputNorm, tied ? undefined : t.output];
  return {
    name: desc.path,
    nEmbd: hp.nEmbd,
    kvFloats: hp.nHeadKv * hp.headDimK + hp.nHeadKv * hp.headDimV,
    weightBytes: tensors.reduce((s, x) => s + (x ? x.nBytes : 0), 0),
    steps,
  };
}

/** A generic workload for `prima-worker profile` without a model: 4096-wide matrices of common types. */
export function genericWorkload(): ModelWorkload {
  const m = (type: string, typeId: number): MatmulStep => ({ matrices: [{ type, typeId, ne0: 4096, ne1: 4096 }], perLayer: 1 });
  return { name: "generic 4096x4096", nEmbd: 4096, kvFloats: 2048, weightBytes: 2 ** 30, steps: [m("Q4_K", 12), m("Q6_K", 14), m("Q8_0", 8), m("F16", 1), m("F32", 0)] };
}

export interface StepTiming {
  readonly key: string;
  /** describeStep(): "Q8_0 1024->1024 + Q8_0 1024->256 x2". */
  readonly label: string;
  /** Rows timed per matrix (fewer than the model's when one copy alone would exceed the working set). */
  readonly rowsTimed: readonly number[];
  /** Mean seconds of the step as timed. */
  readonly secondsPerStep: number;
  /** FLOP/s of the step (2 per weight per token). */
  readonly flopsPerS: number;
  readonly workingSetBytes: number;
}

export interface ComputeBenchOptions {
  readonly threads: number;
  /** Bytes of weights cycled through (the model's size, capped). */
  readonly workingSetBytes: number;
  readonly minSeconds: number;
}

/** Times one step on this device. */
export function timeStep(step: MatmulStep, o: ComputeBenchOptions): StepTiming {
  // Throughput per FLOP does not depend on the number of rows: time a slice of a step too big to copy.
  const bytes = step.matrices.reduce((s, m) => s + rowBytes(m.typeId, m.ne0) * m.ne1, 0);
  const scale = Math.min(1, o.workingSetBytes / bytes);
  const timed = step.matrices.map((m) => ({ type: m.typeId, ne0: m.ne0, ne1: Math.max(1, Math.floor(m.ne1 * scale)) }));
  const r = benchMatmul(timed, { threads: o.threads, workingSetBytes: o.workingSetBytes, minSeconds: o.minSeconds });
  return { key: stepKey(step), label: describeStep(step), rowsTimed: timed.map((m) => m.ne1), secondsPerStep: r.secondsPerPass, flopsPerS: stepFlops(timed) / r.secondsPerPass, workingSetBytes: o.workingSetBytes };
}

/**
 * FLOP/s per weight type from the steps' timings: a step's time is shared among its matrices by their
 * FLOPs, and each type's FLOPs over its share of a layer's time is its throughput, so that
 * Sum_q F_q / cpuFlopsPerS[q] is the time of a layer's matmul steps. Types only in stand-ins (or the
 * output) take their one timing.
 */
export function flopsPerType(w: ModelWorkload, timings: ReadonlyMap<string, StepTiming>): Record<string, number> {
  const flops: Record<string, number> = {}, seconds: Record<string, number> = {};
  for (const s of w.steps) {
    const t = timings.get(stepKey(s));
    if (!t) continue;
    for (const m of s.matrices) {
      const weight = s.perLayer > 0 ? s.perLayer : flops[m.type] === undefined || seconds[m.type] === undefined ? 1 : 0;
      if (weight === 0) continue;
      const f = 2 * m.ne0 * m.ne1 * weight;
      flops[m.type] = (flops[m.type] ?? 0) + f;
      seconds[m.type] = (seconds[m.type] ?? 0) + f / t.flopsPerS;
    }
  }
  const out: Record<string, number> = {};
  for (const k of Object.keys(flops)) out[k] = flops[k] / seconds[k];
  return out;
}

/** Practical read bandwidth (B/s) over `bytes` (the paper's 100 MiB), all threads. */
export function measureMemoryBandwidth(bytes: number, threads: number, minSeconds: number): number {
  return benchMemRead(bytes, threads, minSeconds);
}

/** ms to write one token's K and V rows of one layer (F16) into the cache. */
export function measureKvCopyMs(kvFloats: number, nCtx: number, minSeconds: number): number {
  return benchKvCopy(kvFloats, nCtx, minSeconds) * 1000;
}

/**
 * ms a window's forward costs beyond its layers: dispatching the call to the compute threads, which
 * sleep between tokens on a ring device, and getting the result back to JS. Paid once per window.
 */
export function measureWindowCallMs(threads: number, calls: number): Promise<number> {
  return benchDispatchMs(threads, calls, 2);
}
