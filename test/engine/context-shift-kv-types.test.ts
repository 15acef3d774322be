// Context shift over quantized KV caches (native/src/kv_shift.c: each moved key row dequantized, its
// Hadamard rotation undone where the type has one, re-rotated by RoPE, rotated and quantized again as
// the forward pass writes it: llama.cpp's build_rope_shift). As kv-shift.test.ts does for F16: layer
// 0's keys depend only on the token and its position, so a shifted cache's layer 0 must equal, within
// the type's rounding (twice: once at the write, once after the shift), a cache that saw the shifted
// token list from the start; values move unchanged, bit for bit. llama.cpp cannot be the oracle here:
// the llama.cpp in node-llama-cpp crashes (SIGSEGV) evaluating after seq_rm + seq_add on a Q8_0 cache.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { LocalModel, LocalPipeline, Sampler, generate } from "../../engine/index.js";
import { kvCacheGgmlType, modelShapeByName, rowBytes, type KvCacheTypes } from "../../model/index.js";
import { generateModel } from "../../modelgen/index.js";
import { dequantize } from "../../native/index.js";

const dir = mkdtempSync(join(tmpdir(), "prima-shift-kvtypes-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const TOKENS = Array.from({ length: 40 }, (_, i) => 1 + ((i * 37 + 11) % 250));
const KEEP = 4, DISCARD = 13;

/** Layer 0's K and V rows as floats (kvSave: a 24-byte header, then K and V of each layer in their types). */
function layer0(file: string, types: KvCacheTypes): { k: Float32Array; v: Float32Array; kRaw: Buffer; vRaw: Buffer; filled: number } {
  const b = readFileSync(file);
  const h = new Int32Array(b.buffer, b.byteOffset, 6);
  const kvDim = h[3], filled = h[4];
  const kt = kvCacheGgmlType(types.k), vt = kvCacheGgmlType(types.v);
  const kLen = rowBytes(kt, kvDim) * filled, vLen = rowBytes(vt, kvDim) * filled;
  const kRaw = b.subarray(24, 24 + kLen), vRaw = b.subarray(24 + kLen, 24 + kLen + vLen);
  const k = dequantize(kt, new Uint8Array(kRaw), new Float32Array(kvDim * filled));
  const v = dequantize(vt, new Uint8Array(vRaw), new Float32Array(kvDim * filled));
  return { k, v, kRaw, vRaw, filled };
}

const maxAbsDiff = (a: Float32Array, b: Float32Array) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i])), 0);

const CASES: [string, KvCacheTypes][] = [
  ["tiny-llama", { k: "q8_0", v: "q8_0" }], ["tiny-qwen2", { k: "q8_0", v: "q4_0" }],
  ["tiny-llama", { k: "q8_0-rot", v: "q8_0-rot" }], ["tiny-gemma3", { k: "q8_0", v: "q8_0" }],
];

describe("context shift re-rotates quantized keys as if computed at their new positions", () => {
  it.each(CASES)("%s K %o", async (shape, types) => {
    const out = join(dir, `${shape}.gguf`);
    await generateModel({ shape: modelShapeByName(shape)!, type: "F32", out, pure: true, seed: 3 });
    const m = LocalModel.open(out, { threads: 2 });
    try {
      const a = m.window(0, 1, { ctx: 64, kvCacheTypes: types }), b = m.window(0, 1, { ctx: 64, kvCacheTypes: types });
      await a.forward(m.embed(Int32Array.from(TOKENS)), 0, TOKENS.length);
      a.kvSave(join(dir, "before.kv"));
      a.kvShift(KEEP, DISCARD, TOKENS.length);
      const shifted = [...TOKENS.slice(0, KEEP), ...TOKENS.slice(KEEP + DISCARD)];
      await b.forward(m.embed(Int32Array.from(shifted)), 0, shifted.length);
      a.kvSave(join(dir, "a.kv"));
      b.kvSave(join(dir, "b.kv"));
      a.close();
      b.close();
      const x = layer0(join(dir, "a.kv"), types), y = layer0(join(dir, "b.kv"), types), before = layer0(join(dir, "before.kv"), types);
      expect(x.filled).toBe(shifted.length);
      expect(x.vRaw.equals(y.vRaw)).toBe(true); // values move, unchanged
      const kvDim = x.k.length / x.filled, kRow = x.kRaw.length / x.filled;
      expect(x.kRaw.subarray(0, KEEP * kRow).equals(y.kRaw.subarray(0, KEEP * kRow))).toBe(true); // rows before p0: the same bytes
      const scale = y.k.reduce((s, v) => Math.max(s, Math.abs(v)), 0);
      expect(scale).toBeGreaterThan(0.1);
      // Q8_0 rounds each element by at most half its block's amax / 127, once at the write and once
      // after the shift (RoPE and the Hadamard matrix are orthonormal: they keep an error's size)
      const bound = (2 * scale) / 127;
      const diff = maxAbsDiff(x.k, y.k);
      expect(diff).toBeLessThanOrEqual(bound);
      // and the check can fail: the moved rows without their rotation are far outside it
      const unrotated = before.k.slice(0, shifted.length * kvDim);
      unrotated.set(before.k.subarray((KEEP + DISCARD) * kvDim, TOKENS.length * kvDim), KEEP * kvDim);
      expect(maxAbsDiff(unrotated, y.k)).toBeGreaterThan(4 * bound);
      console.log(`${shape} K ${types.k} V ${types.v}: shifted keys within ${(diff / scale).toExponential(2)} of their scale of the direct ones (bound ${(bound / scale).toExponential(2)})`);
    } finally {
      m.close();
    }
  });

  it("generation past the context runs its shifts on a quantized cache", async () => {
    const out = join(dir, "tiny-llama.gguf");
    await generateModel({ shape: modelShapeByName("tiny-llama")!, type: "F32", out, pure: true, seed: 3 });
    const m = LocalModel.open(out, { threads: 2 });
    const pipe = new LocalPipeline(m, 64, 128, { k: "q4_0-rot", v: "q8_0" });
    try {
      const r = await generate(m, pipe, Int32Array.from(TOKENS.slice(0, 8)), { maxTokens: 160, sampler: new Sampler({ temperature: 0 }), isEnd: () => false, contextShift: { keep: 2 } });
      expect(r.ids.length).toBe(160);
      expect(r.shifts).toBeGreaterThanOrEqual(3);
    } finally {
      pipe.close();
      m.close();
    }
  });
});
