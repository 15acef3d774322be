// GGUF reader (versions 2 and 3, little-endian), as llama.cpp's gguf.cpp defines the format.
// The reader reads only the header (metadata and tensor table) and checks every count, length and
// offset against the file before trusting it: a hostile file gets a GgufError naming the problem.

import { closeSync, fstatSync, openSync, readSync } from "node:fs";
import { printable } from "../base/index.js";
import { ggmlTypeInfo } from "./ggml-types.js";

export class GgufError extends Error {
  override name = "GgufError";
}

/** GGUF metadata value types (gguf.h). */
export const GgufValueType = {
  UINT8: 0, INT8: 1, UINT16: 2, INT16: 3, UINT32: 4, INT32: 5, FLOAT32: 6, BOOL: 7,
  STRING: 8, ARRAY: 9, UINT64: 10, INT64: 11, FLOAT64: 12,
} as const;
export type GgufValueTypeId = (typeof GgufValueType)[keyof typeof GgufValueType];

export type GgufArray =
  | { readonly itemType: GgufValueTypeId; readonly items: readonly string[] }
  | { readonly itemType: GgufValueTypeId; readonly items: readonly boolean[] }
  | { readonly itemType: GgufValueTypeId; readonly items: readonly GgufArray[] }
  | { readonly itemType: GgufValueTypeId; readonly items: NumericArray };
export type NumericArray =
  | Uint8Array | Int8Array | Uint16Array | Int16Array | Uint32Array | Int32Array
  | Float32Array | Float64Array | BigUint64Array | BigInt64Array;
export type GgufScalar = number | bigint | boolean | string;
export type GgufValue = GgufScalar | GgufArray;

export interface GgufKV {
  readonly key: string;
  readonly type: GgufValueTypeId;
  readonly value: GgufValue;
}

export interface GgufTensorInfo {
  readonly name: string;
  /** ggml order: dims[0] is the row length (contiguous), as llama.cpp's ne[]. */
  readonly dims: readonly number[];
  readonly type: number;
  /** Offset from the start of the data section. */
  readonly relOffset: number;
  /** Absolute offset in the file. */
  readonly offset: number;
  readonly nBytes: number;
  readonly nElements: number;
}

export interface GgufFile {
  readonly path: string;
  readonly version: number;
  readonly fileBytes: number;
  readonly alignment: number;
  readonly dataOffset: number;
  readonly metadata: ReadonlyMap<string, GgufKV>;
  readonly tensors: readonly GgufTensorInfo[];
}

export const MAGIC = 0x46554747; // "GGUF" little-endian
const MAX_DIMS = 4;
// Bounds on what a header may make this process hold, each a few times what the largest real models
// need (vocabularies of ~260k tokens and ~450k merges make headers of ~20 MB): a hostile file gets a
// GgufError naming the bound, before it costs more memory than a real model's header does.
const MAX_TENSORS = 1 << 18;
const MAX_KEYS = 1 << 16;
/** Bytes of header (metadata and tensor table): what is decoded from it stays within a few times this. */
export const GGUF_MAX_HEADER_BYTES = 64 << 20;
/** One metadata string (the longest real ones are chat templates of tens of KB). */
export const GGUF_MAX_STRING_BYTES = 16 << 20;
const MAX_KEY_BYTES = 1024;
/** llama.cpp's GGML_MAX_NAME: a tensor name is shorter than 64 bytes. */
const MAX_TENSOR_NAME_BYTES = 63;
/** Strings, bools and nested arrays in all metadata arrays together (each is a JS value of its own,
 * tens of bytes beside its text). */
export const GGUF_MAX_ARRAY_ITEMS = 1 << 21;
/** A nested array weighs this many items (an object and a typed array of its own). */
const NESTED_ARRAY_WEIGHT = 64;
const MAX_NESTING = 4;
/** Bytes read ahead of the item being parsed. */
const READ_AHEAD = 1 << 20;

/** Reads the header front to back, never past the end of the file or GGUF_MAX_HEADER_BYTES. It holds
 * only the bytes not yet parsed (a window from the current item on), never the whole header. */
class Cursor {
  /** Bytes [base, base + buf.length) of the file. */
  private buf = Buffer.alloc(0);
  private base = 0;
  pos = 0;
  constructor(private readonly fd: number, readonly fileBytes: number, private readonly path: string) {}
  private ensure(end: number): void {
    if (end <= this.base + this.buf.length) return;
    if (end > this.fileBytes) {
      throw new GgufError(`${this.path}: truncated header: needs ${end} bytes, file has ${this.fileBytes}`);
    }
    if (end > GGUF_MAX_HEADER_BYTES) {
      throw new GgufError(`${this.path}: the header (metadata and tensor table) is larger than ${GGUF_MAX_HEADER_BYTES} bytes, the limit`);
    }
    const start = this.pos;
    const next = Buffer.allocUnsafe(Math.min(this.fileBytes, GGUF_MAX_HEADER_BYTES, Math.max(end, start + READ_AHEAD)) - start);
    // What was read ahead and not parsed yet moves to the front; the rest comes from the file.
    let off = 0;
    if (start - this.base < this.buf.length) off = this.buf.copy(next, 0, start - this.base);
    while (off < next.length) {
      const n = readSync(this.fd, next, off, next.length - off, start + off);
      if (n <= 0) throw new GgufError(`${this.path}: read failed at byte ${start + off}`);
      off += n;
    }
    this.buf = next;
    this.base = start;
  }
  take(n: number, what: string): Buffer {
    if (n < 0 || this.pos + n > this.fileBytes) {
      throw new GgufError(`${this.path}: ${what} at byte ${this.pos} needs ${n} bytes, past end of file (size ${this.fileBytes})`);
    }
    this.ensure(this.pos + n);
    const b = this.buf.subarray(this.pos - this.base, this.pos - this.base + n);
    this.pos += n;
    return b;
  }
  remaining(): number {
    return this.fileBytes - this.pos;
  }
  u8(w: string) { return this.take(1, w).readUInt8(0); }
  i8(w: string) { return this.take(1, w).readInt8(0); }
  u16(w: string) { return this.take(2, w).readUInt16LE(0); }
  i16(w: string) { return this.take(2, w).readInt16LE(0); }
  u32(w: string) { return this.take(4, w).readUInt32LE(0); }
  i32(w: string) { return this.take(4, w).readInt32LE(0); }
  f32(w: string) { return this.take(4, w).readFloatLE(0); }
  f64(w: string) { return this.take(8, w).readDoubleLE(0); }
  u64(w: string): bigint { return this.take(8, w).readBigUInt64LE(0); }
  i64(w: string): bigint { return this.take(8, w).readBigInt64LE(0); }
  /** A u64 that must fit a JS number and stay below `max`. */
  count(w: string, max: number): number {
    const v = this.u64(w);
    if (v > BigInt(max)) throw new GgufError(`${this.path}: ${w} is ${v}, more than the limit ${max}`);
    return Number(v);
  }
  string(w: string, maxBytes = GGUF_MAX_STRING_BYTES): string {
    const n = this.count(`${w} length`, Math.min(this.remaining(), maxBytes));
    return this.take(n, w).toString("utf8");
  }
}

/** A key or tensor name as it may appear in an error: escaped and bounded (it comes from the file). */
const q = (name: string) => `"${printable(name, 80)}"`;

/** What the metadata arrays have left to spend (GGUF_MAX_ARRAY_ITEMS). */
interface ItemBudget {
  left: number;
}

function spend(c: Cursor, budget: ItemBudget, n: number, key: string): void {
  budget.left -= n;
  if (budget.left < 0) {
    throw new GgufError(`key ${key}: the metadata arrays hold more than ${GGUF_MAX_ARRAY_ITEMS} strings, bools and nested arrays in all`);
  }
}

export function scalarSize(t: number): number | undefined {
  switch (t) {
    case GgufValueType.UINT8: case GgufValueType.INT8: case GgufValueType.BOOL: return 1;
    case GgufValueType.UINT16: case GgufValueType.INT16: return 2;
    case GgufValueType.UINT32: case GgufValueType.INT32: case GgufValueType.FLOAT32: return 4;
    case GgufValueType.UINT64: case GgufValueType.INT64: case GgufValueType.FLOAT64: return 8;
    default: return undefined;
  }
}

/** u64/i64 become numbers when exact, else bigint. */
function intOrBig(v: bigint): number | bigint {
  return v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
}

/** `key` is already escaped (q()); it only names things in errors. */
function readValue(c: Cursor, type: number, key: string, budget: ItemBudget): GgufValue {
  switch (type) {
    case GgufValueType.UINT8: return c.u8(key);
    case GgufValueType.INT8: return c.i8(key);
    case GgufValueType.UINT16: return c.u16(key);
    case GgufValueType.INT16: return c.i16(key);
    case GgufValueType.UINT32: return c.u32(key);
    case GgufValueType.INT32: return c.i32(key);
    case GgufValueType.FLOAT32: return c.f32(key);
    case GgufValueType.FLOAT64: return c.f64(key);
    case GgufValueType.UINT64: return intOrBig(c.u64(key));
    case GgufValueType.INT64: return intOrBig(c.i64(key));
    case GgufValueType.BOOL: {
      const b = c.u8(key);
      if (b > 1) throw new GgufError(`key ${key}: bool value ${b} is neither 0 nor 1`);
      return b === 1;
    }
    case GgufValueType.STRING: return c.string(key);
    case GgufValueType.ARRAY: return readArray(c, key, 0, budget);
    default: throw new GgufError(`key ${key}: unknown value type ${type}`);
  }
}

function readArray(c: Cursor, key: string, depth: number, budget: ItemBudget): GgufArray {
  if (depth >= MAX_NESTING) throw new GgufError(`key ${key}: arrays nested deeper than ${MAX_NESTING}`);
  const itemType = c.u32(`${key} array type`) as GgufValueTypeId;
  const size = scalarSize(itemType);
  // Every item takes at least one byte (strings 8), so the count is bounded by what is left.
  const minItem = size ?? 8;
  const n = c.count(`${key} array length`, Math.floor(c.remaining() / minItem));
  if (size !== undefined && itemType !== GgufValueType.BOOL) {
    const raw = c.take(n * size, `${key} array`);
    const copy = new Uint8Array(raw); // aligned copy for typed-array views
    const b = copy.buffer;
    const items: NumericArray = (() => {
      switch (itemType) {
        case GgufValueType.UINT8: return copy;
        case GgufValueType.INT8: return new Int8Array(b);
        case GgufValueType.UINT16: return new Uint16Array(b);
        case GgufValueType.INT16: return new Int16Array(b);
        case GgufValueType.UINT32: return new Uint32Array(b);
        case GgufValueType.INT32: return new Int32Array(b);
        case GgufValueType.FLOAT32: return new Float32Array(b);
        case GgufValueType.FLOAT64: return new Float64Array(b);
        case GgufValueType.UINT64: return new BigUint64Array(b);
        default: return new BigInt64Array(b);
      }
    })();
    return { itemType, items };
  }
  if (itemType === GgufValueType.BOOL) {
    spend(c, budget, n, key);
    const raw = c.take(n, `${key} array`);
    return { itemType, items: Array.from(raw, (v) => v !== 0) };
  }
  if (itemType === GgufValueType.STRING) {
    spend(c, budget, n, key);
    const items = new Array<string>(n);
    for (let i = 0; i < n; i++) items[i] = c.string(`${key}[${i}]`);
    return { itemType, items };
  }
  if (itemType === GgufValueType.ARRAY) {
    // Checked before the loop: a nested array's header is only 12 bytes, so a small file could ask for millions.
    spend(c, budget, n * NESTED_ARRAY_WEIGHT, key);
    const items = new Array<GgufArray>(n);
    for (let i = 0; i < n; i++) items[i] = readArray(c, `${key}[${i}]`, depth + 1, budget);
    return { itemType, items };
  }
  throw new GgufError(`key ${key}: unknown array item type ${itemType}`);
}

/** Reads and validates the header of a GGUF file. Throws GgufError on anything malformed. */
export function readGguf(path: string): GgufFile {
  let fd: number;
  try {
    fd = openSync(path, "r");
  } catch (e) {
    throw new GgufError(`${path}: cannot open: ${(e as Error).message}`);
  }
  try {
    const fileBytes = fstatSync(fd).size;
    return parse(new Cursor(fd, fileBytes, path), path, fileBytes);
  } finally {
    closeSync(fd);
  }
}

function parse(c: Cursor, path: string, fileBytes: number): GgufFile {
  if (fileBytes < 4) throw new GgufError(`${path}: not a GGUF file (only ${fileBytes} bytes)`);
  const magic = c.u32("magic");
  if (magic !== MAGIC) {
    throw new GgufError(`${path}: not a GGUF file (magic 0x${magic.toString(16).padStart(8, "0")}, expected "GGUF")`);
  }
  const version = c.u32("version");
  if (version === 1) throw new GgufError(`${path}: GGUF version 1 is obsolete; convert the file with a current llama.cpp`);
  if (version !== 2 && version !== 3) {
    const hint = (version & 0xffffff) === 0 && [2, 3].includes(version >>> 24) ? " (big-endian files are not supported)" : "";
    throw new GgufError(`${path}: unsupported GGUF version ${version}${hint}`);
  }
  const nTensors = c.count("tensor count", MAX_TENSORS);
  const nKV = c.count("metadata count", MAX_KEYS);

  const metadata = new Map<string, GgufKV>();
  const budget: ItemBudget = { left: GGUF_MAX_ARRAY_ITEMS };
  for (let i = 0; i < nKV; i++) {
    const key = c.string(`metadata key #${i}`, MAX_KEY_BYTES);
    const name = q(key);
    if (metadata.has(key)) throw new GgufError(`${path}: metadata key ${name} appears twice`);
    const type = c.u32(`type of ${name}`) as GgufValueTypeId;
    const value = readValue(c, type, name, budget);
    metadata.set(key, { key, type, value });
  }

  let alignment = 32;
  const alignKV = metadata.get("general.alignment");
  if (alignKV) {
    const a = alignKV.value;
    if (typeof a !== "number" || a <= 0 || (a & (a - 1)) !== 0 || a > 1 << 20) {
      throw new GgufError(`${path}: general.alignment ${String(a)} is not a power of two`);
    }
    alignment = a;
  }

  interface Raw { name: string; dims: number[]; type: number; relOffset: bigint }
  const raws: Raw[] = [];
  const names = new Set<string>();
  for (let i = 0; i < nTensors; i++) {
    const raw = c.string(`tensor #${i} name`, MAX_TENSOR_NAME_BYTES);
    // A name is printed in errors, plans and logs: control characters in one mean a hostile file.
    if (printable(raw, MAX_TENSOR_NAME_BYTES + 1) !== raw) throw new GgufError(`${path}: tensor #${i} name ${q(raw)} has control characters`);
    const name = raw;
    if (names.has(name)) throw new GgufError(`${path}: tensor ${name} appears twice`);
    names.add(name);
    const nDims = c.u32(`tensor ${name} dimension count`);
    if (nDims < 1 || nDims > MAX_DIMS) throw new GgufError(`${path}: tensor ${name} has ${nDims} dimensions (1..${MAX_DIMS} allowed)`);
    const dims: number[] = [];
    for (let d = 0; d < nDims; d++) {
      const v = c.u64(`tensor ${name} dim ${d}`);
      if (v < 1n || v > BigInt(Number.MAX_SAFE_INTEGER)) throw new GgufError(`${path}: tensor ${name} dim ${d} is ${v}`);
      dims.push(Number(v));
    }
    const type = c.u32(`tensor ${name} type`);
    const relOffset = c.u64(`tensor ${name} offset`);
    raws.push({ name, dims, type, relOffset });
  }

  const dataOffset = Math.ceil(c.pos / alignment) * alignment;
  const tensors: GgufTensorInfo[] = raws.map((r) => {
    const info = ggmlTypeInfo(r.type);
    if (!info) throw new GgufError(`${path}: tensor ${r.name} has unknown type ${r.type}`);
    let nElements = 1;
    for (const d of r.dims) {
      nElements *= d;
      if (nElements > Number.MAX_SAFE_INTEGER) throw new GgufError(`${path}: tensor ${r.name} is absurdly large (${r.dims.join("x")})`);
    }
    if (r.dims[0] % info.blockElems !== 0) {
      throw new GgufError(`${path}: tensor ${r.name} row of ${r.dims[0]} is not a multiple of ${info.name}'s block of ${info.blockElems}`);
    }
    const nBytes = (nElements / info.blockElems) * info.blockBytes;
    if (r.relOffset % BigInt(alignment) !== 0n) {
      throw new GgufError(`${path}: tensor ${r.name} offset ${r.relOffset} is not aligned to ${alignment}`);
    }
    const offset = BigInt(dataOffset) + r.relOffset;
    if (offset + BigInt(nBytes) > BigInt(fileBytes)) {
      throw new GgufError(`${path}: tensor ${r.name}: ${nBytes} bytes at offset ${offset} run past end of file (size ${fileBytes}); the file is truncated or corrupt`);
    }
    return { name: r.name, dims: r.dims, type: r.type, relOffset: Number(r.relOffset), offset: Number(offset), nBytes, nElements };
  });

  // Overlapping tensors mean a corrupt table.
  const sorted = [...tensors].sort((a, b) => a.offset - b.offset);
  for (let i = 1; i < sorted.length; i++) {
    const p = sorted[i - 1];
    if (p.offset + p.nBytes > sorted[i].offset) {
      throw new GgufError(`${path}: tensors ${p.name} and ${sorted[i].name} overlap`);
    }
  }
  return { path, version, fileBytes, alignment, dataOffset, metadata, tensors };
}

// ---- typed metadata access -------------------------------------------------------------------

export function metaValue(f: GgufFile, key: string): GgufValue | undefined {
  return f.metadata.get(key)?.value;
}

export function metaString(f: GgufFile, key: string): string | undefined {
  const v = metaValue(f, key);
  if (v === undefined) return undefined;
  if (typeof v !== "string") throw new GgufError(`${f.path}: metadata ${key} should be a string`);
  return v;
}

export function metaNumber(f: GgufFile, key: string): number | undefined {
  const v = metaValue(f, key);
  if (v === undefined) return undefined;
  if (typeof v === "number") return v;
  if (typeof v === "bigint") throw new GgufError(`${f.path}: metadata ${key} = ${v} is too large`);
  if (typeof v === "boolean") return v ? 1 : 0;
  throw new GgufError(`${f.path}: metadata ${key} should be a number`);
}

export function metaBool(f: GgufFile, key: string): boolean | undefined {
  const v = metaValue(f, key);
  if (v === undefined) return undefined;
  if (typeof v === "boolean") return v;
  if (typeof v === "number") return v !== 0;
  throw new GgufError(`${f.path}: metadata ${key} should be a bool`);
}

export function metaArray(f: GgufFile, key: string): GgufArray | undefined {
  const v = metaValue(f, key);
  if (v === undefined) return undefined;
  if (typeof v !== "object") throw new GgufError(`${f.path}: metadata ${key} should be an array`);
  return v;
}

export function metaStrings(f: GgufFile, key: string): readonly string[] | undefined {
  const a = metaArray(f, key);
  if (!a) return undefined;
  if (a.itemType !== GgufValueType.STRING) throw new GgufError(`${f.path}: metadata ${key} should be an array of strings`);
  return a.items as readonly string[];
}

export function metaNumbers(f: GgufFile, key: string): ArrayLike<number> | undefined {
  const a = metaArray(f, key);
  if (!a) return undefined;
  const items = a.items;
  if (items instanceof BigInt64Array || items instanceof BigUint64Array) return Array.from(items, (v) => Number(v));
  if (ArrayBuffer.isView(items)) return items as ArrayLike<number>;
  throw new GgufError(`${f.path}: metadata ${key} should be an array of numbers`);
}
