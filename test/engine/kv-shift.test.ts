// Context shift re-rotates cached keys (native/src/kv_shift.c): a key cached at position p and rotated
// back by d must equal the key computed at p - d, within F16 rounding. Layer 0's keys depend only on
// the token and its position, so a shifted cache's layer 0 is compared with a cache that saw the
// shifted token list from the start: normal RoPE (llama), neox (qwen2), partial rotary dims with
// long/short factors (phi3), sliding-window layers with their own base (gemma3: layer 0 slides), YaRN
// (gpt-oss: the rotation by the delta follows prima_rope_table_yarn's ramp, without its magnitude again).
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { LocalModel } from "../../engine/index.js";
import { modelShapeByName } from "../../model/index.js";
import { generateModel } from "../../modelgen/index.js";
import { root } from "../helpers/process.js";

const dir = mkdtempSync(join(tmpdir(), "prima-kv-shift-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const f16 = (h: number): number => {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 31, m = h & 1023;
  return e === 0 ? s * m * 2 ** -24 : e === 31 ? (m ? NaN : s * Infinity) : s * (1 + m / 1024) * 2 ** (e - 15);
};

/** Layer 0's K and V rows of a window's cache (kvSave: a 24-byte header, then K and V per layer). */
function layer0(m: LocalModel, file: string): { k: Float64Array; v: Float64Array; filled: number } {
  const b = readFileSync(file);
  const h = new Int32Array(b.buffer, b.byteOffset, 6);
  const kvDim = h[3], filled = h[4], n = kvDim * filled;
  const u = new Uint16Array(b.buffer.slice(b.byteOffset + 24, b.byteOffset + 24 + 4 * n));
  const k = Float64Array.from(u.subarray(0, n), f16), v = Float64Array.from(u.subarray(n, 2 * n), f16);
  void m;
  return { k, v, filled };
}

async function check(path: string, tokens: number[], keep: number, discard: number): Promise<{ maxDiff: number; scale: number }> {
  const m = LocalModel.open(path, { threads: 2 });
  try {
    const ctx = 64;
    const a = m.window(0, 1, { ctx }), b = m.window(0, 1, { ctx });
    await a.forward(m.embed(Int32Array.from(tokens)), 0, tokens.length);
    a.kvShift(keep, discard, tokens.length);
    expect(a.info().filled).toBe(tokens.length - discard);
    const shifted = [...tokens.slice(0, keep), ...tokens.slice(keep + discard)];
    await b.forward(m.embed(Int32Array.from(shifted)), 0, shifted.length);
    a.kvSave(join(dir, "a.kv"));
    b.kvSave(join(dir, "b.kv"));
    const x = layer0(m, join(dir, "a.kv")), y = layer0(m, join(dir, "b.kv"));
    expect(x.filled).toBe(shifted.length);
    expect(Array.from(x.v)).toEqual(Array.from(y.v)); // values move, unchanged
    let maxDiff = 0, scale = 0;
    for (let i = 0; i < x.k.length; i++) {
      maxDiff = Math.max(maxDiff, Math.abs(x.k[i] - y.k[i]));
      scale = Math.max(scale, Math.abs(y.k[i]));
    }
    // the rows before p0 are the same bits; the moved ones differ by F16 rounding at most
    const kvDim = x.k.length / x.filled;
    expect(Array.from(x.k.subarray(0, keep * kvDim))).toEqual(Array.from(y.k.subarray(0, keep * kvDim)));
    a.close();
    b.close();
    return { maxDiff, scale };
  } finally {
    m.close();
  }
}

const TOKENS = Array.from({ length: 40 }, (_, i) => 1 + ((i * 37 + 11) % 250));

describe("context shift re-rotates cached keys as if computed at their new positions", () => {
  it("stories260K (llama, normal RoPE)", async () => {
    const r = await check(join(root, "models/stories260K.gguf"), TOKENS, 1, 19);
    expect(r.scale).toBeGreaterThan(0.1);
    expect(r.maxDiff).toBeLessThanOrEqual(r.scale * 2e-3);
  });

  it.each(["tiny-llama", "tiny-qwen2", "tiny-phi3", "tiny-gemma3", "tiny-gpt-oss"])("%s", async (name) => {
    const shape = modelShapeByName(name)!;
    const out = join(dir, `${name}.gguf`);
    await generateModel({ shape, type: "F32", out, pure: true, seed: 3 });
    const r = await check(out, TOKENS, 4, 13);
    expect(r.scale).toBeGreaterThan(0.1);
    // F16 keys: the direct one rounded once, the rotated one twice (about 2^-11 relative each)
    expect(r.maxDiff).toBeLessThanOrEqual(r.scale * 2e-3);
  });

  it("refuses a range the cache does not hold", async () => {
    const m = LocalModel.open(join(root, "models/stories260K.gguf"), { threads: 1 });
    const w = m.window(0, m.nLayers, { ctx: 32 });
    await w.forward(m.embed(Int32Array.from(TOKENS.slice(0, 10))), 0, 10);
    expect(() => w.kvShift(4, 8, 10)).toThrow(/context shift of positions 4\.\.11 out of 10/);
    expect(() => w.kvShift(4, 2, 11)).toThrow(/the cache holds 10/);
    expect(() => w.kvShift(4, 0, 10)).toThrow(/nDiscard >= 1/);
    w.close();
    m.close();
  });
});
