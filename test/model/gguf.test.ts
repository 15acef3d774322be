// The GGUF reader against hostile input: every malformed file is a GgufError naming the problem.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import {
  GgufError, GgufValueType, describeModel, kv, metaNumber, metaString, metaStrings, readGguf, writeGguf,
  type GgufKV,
} from "../../model/index.js";
import { tempDir } from "../helpers/temp.js";

const dir = tempDir("prima-gguf-");
let n = 0;
const tmp = (bytes?: Uint8Array) => {
  const p = join(dir, `f${n++}.gguf`);
  if (bytes) writeFileSync(p, bytes);
  return p;
};

function sampleFile(): string {
  const p = tmp();
  const meta: GgufKV[] = [
    kv.str("general.architecture", "llama"),
    kv.u32("llama.block_count", 1),
    kv.f32("x.f32", 1.5),
    kv.bool("x.bool", true),
    { key: "x.u64", type: GgufValueType.UINT64, value: 2n ** 60n },
    { key: "x.i8", type: GgufValueType.INT8, value: -5 },
    kv.strs("x.strs", ["a", "ü", ""]),
    kv.i32s("x.i32s", [1, -2, 3]),
    { key: "x.nested", type: GgufValueType.ARRAY, value: { itemType: GgufValueType.ARRAY, items: [{ itemType: GgufValueType.UINT8, items: Uint8Array.of(1, 2) }] } },
  ];
  writeGguf(p, meta, [
    { name: "a", dims: [4, 2], type: 0, data: new Uint8Array(32).fill(1) },
    { name: "b", dims: [32], type: 8, data: new Uint8Array(34).fill(2) },
  ]);
  return p;
}

const mustFail = (path: string, pattern: RegExp) => {
  let err: unknown;
  try {
    readGguf(path);
  } catch (e) {
    err = e;
  }
  expect(err, `expected a GgufError matching ${pattern}`).toBeInstanceOf(GgufError);
  expect((err as Error).message).toMatch(pattern);
};

describe("GGUF reader", () => {
  it("reads back what the writer wrote: every value type, tensors, offsets", () => {
    const f = readGguf(sampleFile());
    expect(f.version).toBe(3);
    expect(metaString(f, "general.architecture")).toBe("llama");
    expect(metaNumber(f, "x.f32")).toBe(1.5);
    expect(f.metadata.get("x.bool")?.value).toBe(true);
    expect(f.metadata.get("x.u64")?.value).toBe(2n ** 60n);
    expect(metaNumber(f, "x.i8")).toBe(-5);
    expect(metaStrings(f, "x.strs")).toEqual(["a", "ü", ""]);
    const i32s = f.metadata.get("x.i32s")!.value as { items: Int32Array };
    expect(Array.from(i32s.items)).toEqual([1, -2, 3]);
    expect(f.tensors.map((t) => [t.name, t.dims, t.type, t.nBytes])).toEqual([["a", [4, 2], 0, 32], ["b", [32], 8, 34]]);
    expect(f.tensors[0].offset % 32).toBe(0);
    expect(f.tensors[1].offset).toBe(f.dataOffset + 32);
  });

  it("reads the model that ships", () => {
    const f = readGguf("models/stories260K.gguf");
    expect(f.tensors.length).toBe(48);
    const d = describeModel(f);
    expect(d.hparams).toMatchObject({ arch: "llama", nEmbd: 64, nLayers: 5, nHead: 8, nHeadKv: 4, nFf: 172, nVocab: 512 });
  });

  it("refuses a file that is not GGUF, or a version it does not know", () => {
    const good = readFileSync(sampleFile());
    const bad = Uint8Array.from(good);
    bad[0] = 0x47; bad[1] = 0x47; bad[2] = 0x4d; bad[3] = 0x4c;
    mustFail(tmp(bad), /not a GGUF file/);
    mustFail(tmp(new Uint8Array(2)), /not a GGUF file/);
    const v1 = Uint8Array.from(good);
    v1[4] = 1;
    mustFail(tmp(v1), /version 1 is obsolete/);
    const v9 = Uint8Array.from(good);
    v9[4] = 9;
    mustFail(tmp(v9), /unsupported GGUF version 9/);
    const be = Uint8Array.from(good);
    be.set([0, 0, 0, 3], 4);
    mustFail(tmp(be), /big-endian/);
    mustFail(join(dir, "does-not-exist.gguf"), /cannot open/);
  });

  it("every truncation of the header or data is a clear error", () => {
    const path = sampleFile();
    const good = readFileSync(path);
    const end = Math.max(...readGguf(path).tensors.map((t) => t.offset + t.nBytes));
    for (let cut = 0; cut < end; cut++) {
      let err: unknown;
      try {
        readGguf(tmp(good.subarray(0, cut)));
      } catch (e) {
        err = e;
      }
      expect(err, `cut at ${cut}`).toBeInstanceOf(GgufError);
    }
  });

  it("random corruption never escapes as anything but a GgufError", () => {
    const good = readFileSync(sampleFile());
    let seed = 12345;
    const rand = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
    let rejected = 0;
    for (let i = 0; i < 400; i++) {
      const b = Uint8Array.from(good);
      const flips = 1 + Math.floor(rand() * 4);
      for (let k = 0; k < flips; k++) b[Math.floor(rand() * 200)] = Math.floor(rand() * 256);
      try {
        readGguf(tmp(b));
      } catch (e) {
        expect(e).toBeInstanceOf(GgufError);
        rejected++;
      }
    }
    expect(rejected).toBeGreaterThan(100);
  });

  it("names absurd counts, dimensions, types and offsets", () => {
    const hdr = (nTensors: bigint, nKv: bigint, rest: number[] = []) => {
      const b = Buffer.alloc(24 + rest.length);
      b.write("GGUF", 0, "latin1");
      b.writeUInt32LE(3, 4);
      b.writeBigUInt64LE(nTensors, 8);
      b.writeBigUInt64LE(nKv, 16);
      Buffer.from(rest).copy(b, 24);
      return b;
    };
    mustFail(tmp(hdr(2n ** 60n, 0n)), /tensor count .* more than the limit/);
    mustFail(tmp(hdr(0n, 2n ** 40n)), /metadata count .* more than the limit/);
    // a key whose length runs past the end
    const longKey = hdr(0n, 1n, [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
    mustFail(tmp(longKey), /metadata key #0 length/);
    const tensor = (nDims: number, dims: bigint[], type: number, offset: bigint) => {
      const name = Buffer.from("t");
      const parts = [Buffer.alloc(8), name, Buffer.alloc(4)];
      parts[0].writeBigUInt64LE(1n);
      parts[2].writeUInt32LE(nDims);
      const d = dims.map((x) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(x); return b; });
      const tail = Buffer.alloc(12);
      tail.writeUInt32LE(type, 0);
      tail.writeBigUInt64LE(offset, 4);
      const body = Buffer.concat([...parts, ...d, tail]);
      return tmp(Buffer.concat([hdr(1n, 0n), body, Buffer.alloc(64)]));
    };
    mustFail(tensor(5, [1n, 1n, 1n, 1n, 1n], 0, 0n), /5 dimensions/);
    mustFail(tensor(1, [0n], 0, 0n), /dim 0 is 0/);
    mustFail(tensor(2, [2n ** 40n, 2n ** 40n], 0, 0n), /absurdly large|past end of file/);
    mustFail(tensor(1, [4n], 99, 0n), /unknown type 99/);
    mustFail(tensor(1, [4n], 0, 4096n), /past end of file/);
    mustFail(tensor(1, [4n], 0, 3n), /not aligned/);
    mustFail(tensor(1, [33n], 8, 0n), /not a multiple of Q8_0's block/);
  });

  it("describeModel names a missing tensor, a wrong shape, an unsupported type or architecture", () => {
    const src = readGguf("models/stories260K.gguf");
    const meta = [...src.metadata.values()];
    const build = (edit: (name: string, dims: number[], type: number) => { dims: number[]; type: number } | null, metaEdit?: (m: GgufKV[]) => GgufKV[]) => {
      const p = tmp();
      const raw = readFileSync("models/stories260K.gguf");
      const tensors = src.tensors.flatMap((t) => {
        const e = edit(t.name, [...t.dims], t.type);
        if (!e) return [];
        const n = e.dims.reduce((a, b) => a * b, 1);
        const bytes = e.type === t.type ? raw.subarray(t.offset, t.offset + t.nBytes) : new Uint8Array(n * 4);
        return [{ name: t.name, dims: e.dims, type: e.type, data: e.type === t.type && n * 4 === t.nBytes ? bytes : new Uint8Array(e.type === 0 ? n * 4 : (n / 256) * 66) }];
      });
      writeGguf(p, metaEdit ? metaEdit(meta) : meta, tensors);
      return readGguf(p);
    };
    expect(() => describeModel(build((name, dims, type) => (name === "blk.2.ffn_up.weight" ? null : { dims, type })))).toThrow(/missing tensor blk.2.ffn_up.weight/);
    expect(() => describeModel(build((name, dims, type) => (name === "blk.1.attn_k.weight" ? { dims: [64, 64], type } : { dims, type })))).toThrow(/blk.1.attn_k.weight has shape \[64, 64\], expected \[64, 32\]/);
    expect(() => describeModel(build((name, dims, type) => (name === "token_embd.weight" ? { dims: [256, 128], type: 16 } : { dims, type })))).toThrow(/token_embd.weight has type IQ2_XXS, which prima does not support|shape/);
    expect(() => describeModel(build((_n, dims, type) => ({ dims, type }), (m) => m.map((x) => (x.key === "general.architecture" ? kv.str(x.key, "mamba") : x))))).toThrow(/architecture "mamba" is not supported/);
    expect(() => describeModel(build((_n, dims, type) => ({ dims, type }), (m) => m.map((x) => (x.key === "llama.attention.head_count_kv" ? kv.u32(x.key, 3) : x))))).toThrow(/not a multiple of 3 KV heads/);
    expect(() => describeModel(build((_n, dims, type) => ({ dims, type }), (m) => m.filter((x) => x.key !== "llama.embedding_length")))).toThrow(/missing metadata llama.embedding_length/);
  });
});
