// A GGUF file opened for running: its checked description (model/) and the native mapping (native/).
// Windows of layers are made from it; the head's embed and output layer run on it directly.
import { describeModel, kvCacheNativeType, kvCacheProblem, readGguf, type GgufFile, type KvCacheTypes, type ModelDescription, type TensorRef } from "../model/index.js";
import { openNativeModel, type NativeHParams, type NativeModel, type NativeTensorDesc, type NativeWindow } from "../native/index.js";
import { availableParallelism } from "node:os";

export interface OpenOptions {
  /** Compute threads (default: every core). */
  readonly threads?: number;
  /** Idle spin of the compute threads between calls, in microseconds (see NativeModelOptions). */
  readonly idleSpinUs?: number;
  /** Hold the compute threads on distinct CPUs during each pass (see NativeModelOptions). */
  readonly spreadThreads?: boolean;
}

export interface WindowOptions {
  /** KV cache capacity in tokens. */
  readonly ctx: number;
  /** Most tokens one native call processes (prompt batches are split to this). Default 128. */
  readonly maxBatch?: number;
  /** The KV cache's element types (--cache-type-k/-v) and how attention reads it (--attention); default
   * f16 for both, dense. */
  readonly kvCacheTypes?: KvCacheTypes;
}

export class LocalModel {
  private constructor(
    /** The file mapped. */
    readonly path: string,
    readonly gguf: GgufFile,
    readonly desc: ModelDescription,
    readonly native: NativeModel,
    readonly threads: number,
  ) {}

  static open(path: string, options: OpenOptions = {}): LocalModel {
    const gguf = readGguf(path);
    const desc = describeModel(gguf);
    const threads = options.threads ?? availableParallelism();
    const native = openNativeModel(path, nativeTensorTable(desc), nativeHParams(desc), { threads, idleSpinUs: options.idleSpinUs, spreadThreads: options.spreadThreads });
    return new LocalModel(path, gguf, desc, native, threads);
  }

  get nEmbd(): number {
    return this.desc.hparams.nEmbd;
  }

  get nVocab(): number {
    return this.desc.hparams.nVocab;
  }

  get nLayers(): number {
    return this.desc.hparams.nLayers;
  }

  /** Layers [firstLayer, endLayer) with their own KV cache. */
  window(firstLayer: number, endLayer: number, options: WindowOptions): NativeWindow {
    const types = options.kvCacheTypes;
    if (types) {
      const problem = kvCacheProblem(this.desc.hparams, types);
      if (problem) throw new Error(problem);
    }
    return this.native.window(firstLayer, endLayer, {
      ctx: options.ctx, maxBatch: options.maxBatch ?? 128,
      ...(types ? { cacheTypeK: kvCacheNativeType(types.k), cacheTypeV: kvCacheNativeType(types.v) } : {}),
      ...(types?.attention ? { sparse: types.attention } : {}),
      ...(types?.evict === "h2o" ? { h2o: true } : {}),
    });
  }

  /** nTokens x nEmbd activations for the tokens. */
  embed(tokens: Int32Array, out: Float32Array = new Float32Array(tokens.length * this.nEmbd)): Float32Array {
    this.native.embed(tokens, out);
    return out;
  }

  /** Output norm + head over the last row of acts. */
  async logits(acts: Float32Array, out: Float32Array = new Float32Array(this.nVocab)): Promise<Float32Array> {
    await this.native.logits(acts, out);
    return out;
  }

  /** No pass is coming soon (a ring device handed its rows on): the compute threads sleep now rather
   * than spin for a next pass, leaving the cores to the devices that run next. */
  relax(): void {
    this.native.relax();
  }

  /** A pass is coming soon (a ring device's rows are arriving): the compute threads wake now and spin
   * for it, so their wake-up overlaps the work before the pass instead of delaying its start. */
  prewake(): void {
    this.native.prewake();
  }

  close(): void {
    this.native.close();
  }
}

function row(t: TensorRef): NativeTensorDesc {
  const ne1 = t.dims.slice(1).reduce((a, b) => a * b, 1);
  return { name: t.name, type: t.type, ne0: t.dims[0], ne1, offset: t.offset, nBytes: t.nBytes };
}

export function nativeTensorTable(desc: ModelDescription): NativeTensorDesc[] {
  const t = desc.tensors;
  const out: NativeTensorDesc[] = [row(t.tokenEmbd), row(t.outputNorm)];
  if (t.output !== t.tokenEmbd) out.push(row(t.output));
  for (const f of [t.ropeFreqs, t.ropeFactorsLong, t.ropeFactorsShort]) if (f) out.push(row(f));
  for (const l of t.layers) {
    for (const ref of Object.values(l) as (TensorRef | undefined)[]) if (ref) out.push(row(ref));
  }
  return out;
}

export function nativeHParams(desc: ModelDescription): NativeHParams {
  const h = desc.hparams;
  return {
    nVocab: h.nVocab, nEmbd: h.nEmbd, nLayers: h.nLayers, nHead: h.nHead, nHeadKv: h.nHeadKv,
    headDim: h.headDimK, nFf: h.nFf, ropeDims: h.ropeDims, ropeNeox: h.ropeNeox, normEps: h.normEps,
    ropeFreqBase: h.ropeFreqBase, ropeFreqScale: h.ropeFreqScale, ffnAct: h.ffnAct, embdScale: h.embdScale,
    queryScale: h.queryScale, scoreScale: h.scoreScale, layerWindow: h.layerWindow,
    ropeFreqBaseSwa: h.ropeFreqBaseSwa, ropeFreqScaleSwa: h.ropeFreqScaleSwa, ropeAttnFactor: h.ropeAttnFactor,
    nCtxOrig: h.nCtxOrig, attnSoftcap: h.attnSoftcap, finalSoftcap: h.finalSoftcap,
    nExpert: h.nExpert, nExpertUsed: h.nExpertUsed, nFfExp: h.nFfExp, moeGating: h.moeGating,
    ropeYarnExtFactor: h.ropeYarnExtFactor, ropeYarnBetaFast: h.ropeYarnBetaFast, ropeYarnBetaSlow: h.ropeYarnBetaSlow,
  };
}
