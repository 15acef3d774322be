// GGUF writer (version 3, little-endian), as llama.cpp's gguf.cpp defines the format: the metadata, the
// tensor table and the aligned data, for the model generator and the tokenizer's exports.

import { closeSync, openSync, writeSync } from "node:fs";
import { GgufError, GgufValueType, MAGIC, scalarSize, type GgufArray, type GgufKV, type GgufScalar, type GgufValue, type NumericArray } from "./gguf.js";
import { ggmlTypeInfo, ggmlTypeName } from "./ggml-types.js";
export interface GgufTensorToWrite {
  readonly name: string;
  readonly dims: readonly number[];
  readonly type: number;
  /** The tensor's bytes, produced when it is written so large models never sit in memory whole; null
   * leaves a hole (reads as zeros, takes no disk: a stand-in model's weights, profiler/forward.ts). */
  readonly data: Uint8Array | (() => Uint8Array) | null;
}

export const kv = {
  str: (key: string, value: string): GgufKV => ({ key, type: GgufValueType.STRING, value }),
  u32: (key: string, value: number): GgufKV => ({ key, type: GgufValueType.UINT32, value }),
  i32: (key: string, value: number): GgufKV => ({ key, type: GgufValueType.INT32, value }),
  f32: (key: string, value: number): GgufKV => ({ key, type: GgufValueType.FLOAT32, value }),
  bool: (key: string, value: boolean): GgufKV => ({ key, type: GgufValueType.BOOL, value }),
  strs: (key: string, items: readonly string[]): GgufKV => ({ key, type: GgufValueType.ARRAY, value: { itemType: GgufValueType.STRING, items } }),
  f32s: (key: string, items: ArrayLike<number>): GgufKV => ({ key, type: GgufValueType.ARRAY, value: { itemType: GgufValueType.FLOAT32, items: Float32Array.from(items) } }),
  i32s: (key: string, items: ArrayLike<number>): GgufKV => ({ key, type: GgufValueType.ARRAY, value: { itemType: GgufValueType.INT32, items: Int32Array.from(items) } }),
};

class ByteSink {
  private chunks: Buffer[] = [];
  length = 0;
  push(b: Buffer) { this.chunks.push(b); this.length += b.length; }
  u32(v: number) { const b = Buffer.alloc(4); b.writeUInt32LE(v >>> 0); this.push(b); }
  u64(v: number | bigint) { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); this.push(b); }
  str(s: string) { const b = Buffer.from(s, "utf8"); this.u64(b.length); this.push(b); }
  bytes(): Buffer { return Buffer.concat(this.chunks); }
}

function writeScalar(s: ByteSink, type: number, v: GgufScalar, key: string): void {
  const size = scalarSize(type);
  if (type === GgufValueType.STRING) { s.str(String(v)); return; }
  if (size === undefined) throw new GgufError(`key ${key}: cannot write value type ${type}`);
  const b = Buffer.alloc(size);
  switch (type) {
    case GgufValueType.UINT8: b.writeUInt8(Number(v)); break;
    case GgufValueType.INT8: b.writeInt8(Number(v)); break;
    case GgufValueType.UINT16: b.writeUInt16LE(Number(v)); break;
    case GgufValueType.INT16: b.writeInt16LE(Number(v)); break;
    case GgufValueType.UINT32: b.writeUInt32LE(Number(v)); break;
    case GgufValueType.INT32: b.writeInt32LE(Number(v)); break;
    case GgufValueType.FLOAT32: b.writeFloatLE(Number(v)); break;
    case GgufValueType.FLOAT64: b.writeDoubleLE(Number(v)); break;
    case GgufValueType.UINT64: b.writeBigUInt64LE(BigInt(v)); break;
    case GgufValueType.INT64: b.writeBigInt64LE(BigInt(v)); break;
    case GgufValueType.BOOL: b.writeUInt8(v ? 1 : 0); break;
  }
  s.push(b);
}

function writeValue(s: ByteSink, type: number, v: GgufValue, key: string): void {
  if (type !== GgufValueType.ARRAY) { writeScalar(s, type, v as GgufScalar, key); return; }
  const a = v as GgufArray;
  s.u32(a.itemType);
  s.u64(a.items.length);
  const size = scalarSize(a.itemType);
  if (size !== undefined && a.itemType !== GgufValueType.BOOL && ArrayBuffer.isView(a.items)) {
    const view = a.items as NumericArray;
    s.push(Buffer.from(view.buffer, view.byteOffset, view.byteLength));
    return;
  }
  for (const item of Array.from(a.items as ArrayLike<GgufValue>)) {
    writeValue(s, a.itemType, item, key);
  }
}

/** Writes a GGUF v3 file: header, then each tensor's bytes at its aligned offset. */
export function writeGguf(path: string, metadata: readonly GgufKV[], tensors: readonly GgufTensorToWrite[], alignment = 32): void {
  const head = new ByteSink();
  head.u32(MAGIC);
  head.u32(3);
  head.u64(tensors.length);
  head.u64(metadata.length);
  for (const m of metadata) {
    head.str(m.key);
    head.u32(m.type);
    writeValue(head, m.type, m.value, m.key);
  }
  let rel = 0;
  const offsets: number[] = [];
  for (const t of tensors) {
    const info = ggmlTypeInfo(t.type);
    if (!info) throw new GgufError(`tensor ${t.name}: unknown type ${t.type}`);
    const n = t.dims.reduce((a, b) => a * b, 1);
    if (t.dims[0] % info.blockElems !== 0) throw new GgufError(`tensor ${t.name}: row ${t.dims[0]} not a multiple of ${ggmlTypeName(t.type)} block`);
    head.str(t.name);
    head.u32(t.dims.length);
    for (const d of t.dims) head.u64(d);
    head.u32(t.type);
    head.u64(rel);
    offsets.push(rel);
    rel += Math.ceil(((n / info.blockElems) * info.blockBytes) / alignment) * alignment;
  }
  const header = head.bytes();
  const dataOffset = Math.ceil(header.length / alignment) * alignment;
  const fd = openSync(path, "w");
  try {
    writeSync(fd, header, 0, header.length, 0);
    let written = dataOffset;
    tensors.forEach((t, i) => {
      const info = ggmlTypeInfo(t.type)!;
      const expect = (t.dims.reduce((a, b) => a * b, 1) / info.blockElems) * info.blockBytes;
      if (t.data === null) return;
      const data = typeof t.data === "function" ? t.data() : t.data;
      if (data.length !== expect) throw new GgufError(`tensor ${t.name}: ${data.length} bytes given, ${expect} expected`);
      writeSync(fd, data, 0, data.length, dataOffset + offsets[i]);
      written = dataOffset + offsets[i] + data.length;
    });
    // Pad the end to whole alignment units, as llama.cpp writes.
    const end = dataOffset + rel;
    if (end > written) writeSync(fd, Buffer.alloc(1), 0, 1, end - 1);
  } finally {
    closeSync(fd);
  }
}
