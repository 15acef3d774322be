// The native model surface refuses bad arguments with clear errors and keeps the process alive.
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { describeModel, readGguf } from "../../model/index.js";
import { nativeHParams, nativeTensorTable, LocalModel } from "../../engine/index.js";
import { openNativeModel } from "../../native/index.js";
import { tempDir } from "../helpers/temp.js";

const path = "models/stories260K.gguf";
const desc = describeModel(readGguf(path));

describe("native model surface", () => {
  it("refuses a tensor table that disagrees with the file", () => {
    const table = nativeTensorTable(desc);
    const hp = nativeHParams(desc);
    const past = table.map((t) => (t.name === "blk.3.ffn_up.weight" ? { ...t, offset: 1e9 } : t));
    expect(() => openNativeModel(path, past, hp, { threads: 1 })).toThrow(/blk.3.ffn_up.weight: offset 1000000000 .* past the end of the file/);
    const missing = table.filter((t) => t.name !== "blk.0.attn_q.weight");
    expect(() => openNativeModel(path, missing, hp, { threads: 1 })).toThrow(/missing tensor blk.0.attn_q.weight/);
    const wrongBytes = table.map((t) => (t.name === "output.weight" ? { ...t, nBytes: t.nBytes - 4 } : t));
    expect(() => openNativeModel(path, wrongBytes, hp, { threads: 1 })).toThrow(/output.weight: \d+ bytes expected/);
    expect(() => openNativeModel(path, table, { ...hp, nHeadKv: 3 }, { threads: 1 })).toThrow(/invalid hyper-parameters/);
    expect(() => openNativeModel("/nonexistent.gguf", table, hp, { threads: 1 })).toThrow(/cannot open/);
    expect(() => openNativeModel(path, [{ name: 5 } as never], hp, { threads: 1 })).toThrow(/tensor table entry 0/);
  });

  it("refuses a mixture-of-experts layer that is not whole, or expert counts out of range", async () => {
    const { generateModel } = await import("../../modelgen/index.js");
    const out = join(tempDir("prima-native-moe-"), "moe.gguf");
    await generateModel({ shape: "tiny-qwen3moe", type: "Q8_0", out, pure: true });
    const d = describeModel(readGguf(out));
    const table = nativeTensorTable(d), hp = nativeHParams(d);
    openNativeModel(out, table, hp, { threads: 1 }).close();
    expect(() => openNativeModel(out, table.filter((t) => t.name !== "blk.1.ffn_up_exps.weight"), hp, { threads: 1 }))
      .toThrow(/layer 1 has neither a whole dense feed-forward .* nor a whole mixture of experts/);
    expect(() => openNativeModel(out, table, { ...hp, nExpertUsed: 9 }, { threads: 1 })).toThrow(/invalid hyper-parameters/);
    expect(() => openNativeModel(out, table, { ...hp, nExpert: 4 }, { threads: 1 })).toThrow(/ffn_gate_inp.weight has shape \[256, 8\], expected \[256, 4\]/);
    expect(() => openNativeModel(out, table, { ...hp, nFfExp: -1 }, { threads: 1 })).toThrow(/nFfExp must be a whole number from 0/);
    expect(() => openNativeModel(out, table, { ...hp, moeGating: "sigmoid" as never }, { threads: 1 })).toThrow(/moeGating must be/);
  });

  it("gpt-oss: refuses part of the experts' biases, an unknown activation, YaRN without its betas, sinks of the wrong size", async () => {
    const { generateModel } = await import("../../modelgen/index.js");
    const out = join(tempDir("prima-native-oss-"), "oss.gguf");
    await generateModel({ shape: "tiny-gpt-oss", type: "Q8_0", out, pure: true });
    const d = describeModel(readGguf(out));
    const table = nativeTensorTable(d), hp = nativeHParams(d);
    openNativeModel(out, table, hp, { threads: 1 }).close();
    expect(() => openNativeModel(out, table.filter((t) => t.name !== "blk.2.ffn_down_exps.bias"), hp, { threads: 1 }))
      .toThrow(/layer 2 has only part of the experts' biases/);
    expect(() => openNativeModel(out, table, { ...hp, ffnAct: "relu" as never }, { threads: 1 })).toThrow(/ffnAct must be/);
    expect(() => openNativeModel(out, table, { ...hp, ropeYarnBetaFast: 0 }, { threads: 1 })).toThrow(/invalid hyper-parameters/);
    const sinks = table.find((t) => t.name === "blk.0.attn_sinks.weight")!;
    expect(() => openNativeModel(out, table.map((t) => (t === sinks ? { ...t, ne0: 4, nBytes: 16 } : t)), hp, { threads: 1 }))
      .toThrow(/attn_sinks.weight has shape \[4, 1\], expected \[8, 1\]/);
  });

  it("refuses bad windows, positions, lengths and token ids", async () => {
    const m = LocalModel.open(path, { threads: 2 });
    expect(() => m.window(3, 9, { ctx: 16 })).toThrow(/first < end <= 5/);
    expect(() => m.window(0, 5, { ctx: 0 })).toThrow(/ctx must be a positive integer/);
    const w = m.window(0, 5, { ctx: 16 });
    const acts = m.embed(Int32Array.of(1, 2, 3));
    await expect(w.forward(acts, 5, 3)).rejects.toThrow(/position 5 leaves a gap/);
    expect(() => w.forward(acts, 0, 4)).toThrow(/4 tokens need 256/);
    await w.forward(acts, 0, 3);
    await expect(w.forward(m.embed(new Int32Array(14)), 3, 14)).rejects.toThrow(/exceed the context of 16/);
    expect(() => m.embed(Int32Array.of(512))).toThrow(/token id 512 is outside the vocabulary of 512/);
    expect(() => m.embed(Int32Array.of(-1))).toThrow(/outside the vocabulary/);
    expect(() => w.kvTruncate(4)).toThrow(/0 <= position <= 3/);
    expect(w.info()).toMatchObject({ firstLayer: 0, endLayer: 5, ctx: 16, filled: 3 });
    expect(() => m.close()).toThrow(/open windows/);
    w.close();
    expect(() => w.info()).toThrow(/window is closed/);
    m.close();
  });

  it("forwardNow computes what forward does, on the calling thread, and refuses while a pass runs", async () => {
    const m = LocalModel.open(path, { threads: 2 });
    const a = m.window(0, 5, { ctx: 16 }), b = m.window(0, 5, { ctx: 16 });
    const la = new Float32Array(m.nVocab), lb = new Float32Array(m.nVocab);
    const prompt = Int32Array.of(1, 403, 407);
    await a.forward(m.embed(prompt), 0, 3);
    await b.forward(m.embed(prompt), 0, 3);
    const actsA = m.embed(Int32Array.of(261)), actsB = m.embed(Int32Array.of(261));
    await a.forward(actsA, 3, 1, la);
    b.forwardNow(actsB, 3, 1, lb);
    expect(Array.from(lb)).toEqual(Array.from(la));
    expect(Array.from(actsB)).toEqual(Array.from(actsA));
    expect(b.info().filled).toBe(4);
    expect(() => b.forwardNow(actsB, 9, 1)).toThrow(/position 9 leaves a gap/);
    expect(() => b.forwardNow(actsB, 4, 1, new Float32Array(3))).toThrow(/logits must be a Float32Array of the vocabulary size/);
    const running = a.forward(m.embed(Int32Array.of(5)), 4, 1);
    expect(() => a.forwardNow(m.embed(Int32Array.of(5)), 4, 1)).toThrow(/window is busy/);
    await running;
    a.close();
    b.close();
    m.close();
  });

  it("saves and restores a KV cache; refuses a cache of another window", async () => {
    const { mkdtempSync, writeFileSync } = await import("node:fs");
    const dir = tempDir("prima-kv-");
    const m = LocalModel.open(path, { threads: 2 });
    const logitsA = new Float32Array(m.nVocab), logitsB = new Float32Array(m.nVocab);
    const w = m.window(0, 5, { ctx: 32 });
    await w.forward(m.embed(Int32Array.of(1, 403, 407)), 0, 3);
    w.kvSave(`${dir}/kv`);
    await w.forward(m.embed(Int32Array.of(261)), 3, 1, logitsA);
    const w2 = m.window(0, 5, { ctx: 32 });
    w2.kvLoad(`${dir}/kv`);
    expect(w2.info().filled).toBe(3);
    await w2.forward(m.embed(Int32Array.of(261)), 3, 1, logitsB);
    expect(Array.from(logitsB)).toEqual(Array.from(logitsA));
    const w3 = m.window(0, 2, { ctx: 32 });
    expect(() => w3.kvLoad(`${dir}/kv`)).toThrow(/another window/);
    writeFileSync(`${dir}/junk`, "not a cache");
    expect(() => w3.kvLoad(`${dir}/junk`)).toThrow(/not a prima KV cache file/);
    for (const x of [w, w2, w3]) x.close();
    m.close();
  });
});
