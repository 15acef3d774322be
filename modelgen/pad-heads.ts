// A trained model with wider attention heads that computes the same function: every head zero-padded
// to `headDim` values. The only trained model that ships (models/stories260K.gguf) has heads of 8
// values, and a quantized KV cache needs 32-value blocks along a head; its padded twin lets the
// context bench measure the cache types on trained weights instead of random ones only.
//
// Why it is the same function (llama's RoPE turns adjacent pairs, pair i by pos * base^(-2i/n_rot)):
// - Q and K: a head's pair j moves to pair j * r (r = headDim / old head size), which turns by
//   base^(-2jr/(r * old)) = the same angle; the other values are zero and add nothing to a score.
// - Q is scaled by sqrt(r), undoing the wider head's 1/sqrt(head size) (exact for r = 4 or 16: a
//   power of two).
// - V's values keep their places at the head's start; the output projection reads only them.
import { readSync, openSync, closeSync } from "node:fs";
import { GgmlTypeId } from "../native/index.js";
import { kv, readGguf, writeGguf, type GgufKV, type GgufTensorInfo } from "../model/index.js";
import { ModelGenError } from "./generate.js";

export interface PadHeadsResult {
  readonly out: string;
  readonly fromHeadDim: number;
  readonly headDim: number;
}

/** Writes `out`: the llama F32 model at `src` with every attention head padded to `headDim` values. */
export function padHeads(src: string, out: string, headDim: number): PadHeadsResult {
  const f = readGguf(src);
  const str = (k: string) => f.metadata.get(k)?.value;
  const arch = str("general.architecture");
  if (arch !== "llama") throw new ModelGenError(`padding heads needs a llama model (RoPE on adjacent pairs); ${src} is ${JSON.stringify(arch)}`);
  const num = (k: string): number => {
    const v = str(`llama.${k}`);
    if (typeof v !== "number") throw new ModelGenError(`${src} has no llama.${k}`);
    return v;
  };
  const nEmbd = num("embedding_length"), nHead = num("attention.head_count"), nKv = num("attention.head_count_kv");
  const old = nEmbd / nHead;
  const ropeDims = typeof str("llama.rope.dimension_count") === "number" ? num("rope.dimension_count") : old;
  if (!Number.isInteger(old) || str("llama.attention.key_length") !== undefined || ropeDims !== old) {
    throw new ModelGenError(`padding heads needs heads of embedding_length / head_count values, all turned by RoPE (${src} has key_length or a partial rotation)`);
  }
  const r = headDim / old;
  if (!Number.isInteger(r) || r < 2) throw new ModelGenError(`head size ${headDim} is not a multiple (2x or more) of the model's ${old}`);
  const qScale = Math.sqrt(r);

  // Where each old row of a head's Q/K (pairs spread out) or V (kept at the start) goes.
  const rotatedAt = (i: number) => (i >> 1) * 2 * r + (i & 1);
  const keptAt = (i: number) => i;
  const fd = openSync(src, "r");
  const read = (t: GgufTensorInfo): Float32Array => {
    if (t.type !== GgmlTypeId.F32) throw new ModelGenError(`${t.name} is not F32 (padding reads F32 weights only)`);
    const b = Buffer.alloc(t.nBytes);
    readSync(fd, b, 0, t.nBytes, t.offset);
    return new Float32Array(b.buffer, b.byteOffset, t.nElements);
  };
  /** Rows of `heads` heads (old rows each), spread to headDim rows a head. */
  const padRows = (t: GgufTensorInfo, heads: number, at: (i: number) => number, scale: number) => {
    const w = read(t), cols = t.dims[0];
    const outRows = new Float32Array(cols * heads * headDim);
    for (let h = 0; h < heads; h++) {
      for (let i = 0; i < old; i++) {
        const from = (h * old + i) * cols, to = (h * headDim + at(i)) * cols;
        for (let c = 0; c < cols; c++) outRows[to + c] = w[from + c] * scale;
      }
    }
    return { dims: [cols, heads * headDim], data: outRows };
  };
  /** The output projection: each row reads a head's first `old` values of headDim. */
  const padColumns = (t: GgufTensorInfo) => {
    const w = read(t), rows = t.dims[1];
    const o = new Float32Array(nHead * headDim * rows);
    for (let row = 0; row < rows; row++) {
      for (let h = 0; h < nHead; h++) {
        for (let i = 0; i < old; i++) o[row * nHead * headDim + h * headDim + i] = w[row * nHead * old + h * old + i];
      }
    }
    return { dims: [nHead * headDim, rows], data: o };
  };
  try {
    const tensors = f.tensors.map((t) => {
      const kind = /^blk\.\d+\.(attn_[a-z]+)\./.exec(t.name)?.[1];
      if (t.name.endsWith(".bias") && kind) throw new ModelGenError(`${t.name}: attention biases are not padded`);
      const padded = kind === "attn_q" ? padRows(t, nHead, rotatedAt, qScale)
        : kind === "attn_k" ? padRows(t, nKv, rotatedAt, 1)
        : kind === "attn_v" ? padRows(t, nKv, keptAt, 1)
        : kind === "attn_output" ? padColumns(t)
        : undefined;
      if (padded) return { name: t.name, dims: padded.dims, type: GgmlTypeId.F32, data: new Uint8Array(padded.data.buffer) };
      return { name: t.name, dims: t.dims, type: t.type, data: () => { const b = Buffer.alloc(t.nBytes); readSync(fd, b, 0, t.nBytes, t.offset); return b; } };
    });
    const replaced = new Set(["llama.rope.dimension_count", "llama.attention.key_length", "llama.attention.value_length", "general.name"]);
    const metadata: GgufKV[] = [
      ...[...f.metadata.values()].filter((m) => !replaced.has(m.key)),
      kv.str("general.name", `${String(str("general.name") ?? "model")} (heads padded to ${headDim})`),
      kv.u32("llama.rope.dimension_count", headDim),
      kv.u32("llama.attention.key_length", headDim),
      kv.u32("llama.attention.value_length", headDim),
    ];
    writeGguf(out, metadata, tensors, f.alignment);
  } finally {
    closeSync(fd);
  }
  return { out, fromHeadDim: old, headDim };
}
