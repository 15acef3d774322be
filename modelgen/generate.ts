// Writes a random-weight GGUF in the shape of any family prima runs (model/arch/): normal weights
// (std 0.02), norms 1.0, qwen2 QKV biases, quantized with our reference quantizers (byte-equal to llama.cpp's quantize_row_*_ref)
// into the type mix llama-quantize would choose, with a real vocabulary's tokenizer metadata.
// Tensors are produced one at a time while the file is written: no model sits in memory whole.
import { statSync } from "node:fs";
import {
  FILE_TYPES, GgufValueType, bundledVocab, kv, shapeKeys, modelShapeByName, modelShapes, parseFileType, planTensors, shapeProblems, writeGguf,
  type BundledVocabName, type FileTypeName, type GgufKV, type GgufTensorToWrite, type ModelShape, type PlannedTensor,
} from "../model/index.js";
import { GgmlTypeId, quantizeRef, rowBytes } from "../native/index.js";
import { NormalStream } from "./random.js";

export class ModelGenError extends Error {
  override name = "ModelGenError";
}

export interface GenerateOptions {
  /** A named shape (modelShapes) or a full shape. */
  readonly shape: string | ModelShape;
  /** A file type (Q4_K_M, Q8_0, F16 ...; Q4_K means Q4_K_M as in llama-quantize). */
  readonly type: string;
  readonly out: string;
  /** Every quantized weight the file type's base type, as llama-quantize --pure. */
  readonly pure?: boolean;
  /** A bundled vocabulary by name, or tokenizer.* metadata (padded to the shape's vocabulary size). */
  readonly vocab?: BundledVocabName | readonly GgufKV[];
  readonly seed?: number;
  /** Standard deviation of the weights (default 0.02). */
  readonly weightStd?: number;
  /** general.name (default: the shape's name and type). */
  readonly name?: string;
  /** tokenizer.chat_template: a Jinja chat template the file carries (e.g. gpt-oss's harmony format). */
  readonly chatTemplate?: string;
  /** More metadata after the shape's and the vocabulary's (e.g. `<arch>.pooling_type`). */
  readonly extraMetadata?: readonly GgufKV[];
}

export interface GeneratedTensor {
  readonly name: string;
  readonly dims: readonly number[];
  readonly type: number;
}

export interface GenerateResult {
  readonly path: string;
  readonly shape: ModelShape;
  readonly fileType: FileTypeName;
  readonly tensors: readonly GeneratedTensor[];
  readonly fileBytes: number;
}

/** A tensor's bytes: generated and quantized a block of rows at a time. */
function tensorBytes(t: PlannedTensor, seed: number, std: number): Uint8Array {
  const rowElems = t.dims[0];
  const rows = t.dims.slice(1).reduce((a, b) => a * b, 1);
  const rowLen = rowBytes(t.type, rowElems);
  const out = new Uint8Array(rowLen * rows);
  if (t.fill === "factors") {
    // RoPE frequency factors: from 1 up, long ones stretching further, so the two tables differ
    const long = t.name.includes("long");
    const x = Float32Array.from({ length: rowElems * rows }, (_, i) => 1 + (i * (long ? 4 : 0.5)) / (rowElems * rows));
    out.set(quantizeRef(t.type, x));
    return out;
  }
  if (t.fill === "ones") {
    out.set(quantizeRef(t.type, new Float32Array(rowElems * rows).fill(1)));
    return out;
  }
  const stream = new NormalStream(seed, t.name);
  if (t.type === GgmlTypeId.MXFP4) return randomMxfp4(stream, out, t.fill === "bias" ? std / 2 : std);
  const chunkRows = Math.max(1, Math.floor((1 << 20) / rowElems));
  const buf = new Float32Array(chunkRows * rowElems);
  for (let r = 0; r < rows; r += chunkRows) {
    const n = Math.min(chunkRows, rows - r);
    const x = buf.subarray(0, n * rowElems);
    stream.fill(x, t.fill === "sinks" ? 1 : t.fill === "bias" ? std / 2 : std);
    quantizeRef(t.type, x, out.subarray(r * rowLen, (r + n) * rowLen));
  }
  return out;
}

/** Valid random MXFP4 blocks written directly (gpt-oss-20b's experts are 12 GB: quantizing floats would
 * take hours): every nibble uniform over the 16 E2M1 levels, and the E8M0 exponent that gives those
 * levels about the asked standard deviation (the levels' RMS is 5.85 units of 2^(e-128)), a block in
 * four one higher or lower. */
function randomMxfp4(stream: NormalStream, out: Uint8Array, std: number): Uint8Array {
  stream.bytes(out);
  const e = Math.max(2, Math.min(253, 128 + Math.round(Math.log2(std / 5.85))));
  for (let b = 0; b < out.length; b += 17) {
    const jitter = out[b] & 7; // a random byte decides the block's scale
    out[b] = e + (jitter === 0 ? -1 : jitter === 1 ? 1 : 0);
  }
  return out;
}

function archMetadata(shape: ModelShape, name: string, fileType: FileTypeName): GgufKV[] {
  const a = shape.arch;
  return [
    kv.str("general.architecture", a),
    kv.str("general.name", name),
    ...shapeKeys(a, shape).map((k) => (k.type === "str" ? kv.str(`${a}.${k.key}`, k.value) : (k.type === "u32" ? kv.u32 : kv.f32)(`${a}.${k.key}`, k.value))),
    kv.u32("general.file_type", FILE_TYPES[fileType].ftype),
    kv.u32("general.quantization_version", 2),
  ];
}

function vocabMetadata(shape: ModelShape, vocab: GenerateOptions["vocab"]): GgufKV[] {
  const meta = typeof vocab === "object" ? [...vocab] : [...bundledVocab(vocab ?? shape.defaultVocab).metadata];
  const tokens = meta.find((m) => m.key === "tokenizer.ggml.tokens");
  if (!tokens || tokens.type !== GgufValueType.ARRAY || typeof tokens.value !== "object") {
    throw new ModelGenError("vocabulary metadata has no tokenizer.ggml.tokens array");
  }
  const nTokens = tokens.value.items.length;
  if (nTokens > shape.nVocab) {
    throw new ModelGenError(`the vocabulary has ${nTokens} tokens, more than the shape's vocabulary size ${shape.nVocab}`);
  }
  if (nTokens === shape.nVocab) return meta;
  if (typeof vocab === "object") {
    throw new ModelGenError(`the vocabulary has ${nTokens} tokens, the shape needs ${shape.nVocab} (pad it with model/'s padVocab)`);
  }
  return [...bundledVocab(vocab ?? shape.defaultVocab, { vocabSize: shape.nVocab }).metadata];
}

/** general.name for a shape: llama.cpp gives a model whose name contains "phi3" or "phi-3" phi3's
 * token attributes, which needs phi3's own tokens (its vocabulary loading fails without "<|endoftext|>"),
 * and the vocabularies we write have none of them. */
function defaultName(shapeName: string): string {
  return shapeName.replace(/phi-?3/gi, "phi_3");
}

export function resolveShape(shape: string | ModelShape): ModelShape {
  const s = typeof shape === "string" ? modelShapeByName(shape) : shape;
  if (!s) throw new ModelGenError(`unknown shape "${String(shape)}" (known: ${modelShapes.map((x) => x.name).join(", ")})`);
  const problems = shapeProblems(s);
  if (problems.length) throw new ModelGenError(`shape ${s.name}: ${problems.join("; ")}`);
  return s;
}

/** Generates the model file; resolves when it is written. */
export async function generateModel(options: GenerateOptions): Promise<GenerateResult> {
  const shape = resolveShape(options.shape);
  const fileType = parseFileType(options.type);
  if (!fileType) throw new ModelGenError(`unknown file type "${options.type}" (known: ${Object.keys(FILE_TYPES).join(", ")})`);
  const seed = options.seed ?? 1;
  if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) throw new ModelGenError(`seed must be a whole number 0..2^32-1 (got ${seed})`);
  const std = options.weightStd ?? 0.02;
  if (!(std > 0 && std < 1e3)) throw new ModelGenError(`weight std must be positive (got ${std})`);
  const plan = planTensors(shape, fileType, options.pure ?? false);
  const metadata = [
    ...archMetadata(shape, options.name ?? `${defaultName(shape.name)}-${fileType}${options.pure ? "-pure" : ""}-random`, fileType),
    ...vocabMetadata(shape, options.vocab).filter((m) => options.chatTemplate === undefined || m.key !== "tokenizer.chat_template"),
    ...(options.chatTemplate !== undefined ? [kv.str("tokenizer.chat_template", options.chatTemplate)] : []),
    ...(options.extraMetadata ?? []),
  ];
  const tensors: GgufTensorToWrite[] = plan.map((t) => ({
    name: t.name, dims: t.dims, type: t.type, data: () => tensorBytes(t, seed, std),
  }));
  writeGguf(options.out, metadata, tensors);
  return {
    path: options.out, shape, fileType,
    tensors: plan.map(({ name, dims, type }) => ({ name, dims, type })),
    fileBytes: statSync(options.out).size,
  };
}
