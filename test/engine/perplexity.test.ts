// `prima-coord perplexity` against llama.cpp: the same chunks (BOS first, the second half scored) over
// llama.cpp's own logits (node-llama-cpp) must give the same perplexity within 0.5%, on the shipped
// model and on a generated quantized one; the KL divergence file round-trips and hostile ones are refused.
import { execFile } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import type { Llama } from "node-llama-cpp";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KlStats, baseRowSlots, encodeBaseRow, negLogProb, summarizeKl } from "../../engine/index.js";
import type { KvCacheTypes } from "../../model/index.js";
import { generateModel, padHeads } from "../../modelgen/index.js";
import { root } from "../helpers/process.js";
import { tempDir } from "../helpers/temp.js";
import { ORACLE_THREADS, llamaRotates, loadOracle } from "./oracle-harness.js";

const run = promisify(execFile);
const CLI = join(root, "dist/coordinator/cli.js");
const TEXT = join(root, "test/fixtures/story.txt");
const SHIPPED = join(root, "models/stories260K.gguf");
const CTX = 128;
const dir = tempDir("prima-perplexity-");
let llama: Llama;

beforeAll(async () => {
  llama = await loadOracle();
}, 60_000);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

async function ours(model: string, ...extra: string[]): Promise<{ ppl: number; nChunks: number; scored: number; kl?: ReturnType<typeof summarizeKl> }> {
  const { stdout } = await run(process.execPath, [CLI, "perplexity", model, "-c", String(CTX), "-t", "2", "--json", ...extra], { cwd: root, timeout: 120_000 });
  return JSON.parse(stdout);
}

/** llama.cpp's perplexity of the text: its tokens and its logits, chunked and scored as llama-perplexity
 * does it, with the negative log-likelihood written out plainly here (not engine/perplexity.ts). */
async function oraclePerplexity(path: string, types?: KvCacheTypes): Promise<{ ppl: number; nChunks: number; scored: number }> {
  const model = await llama.loadModel({ modelPath: path, gpuLayers: 0 });
  if (types) llamaRotates(types);
  const ggml = (t: string) => t.replace("-rot", "").toUpperCase() as "F16" | "Q8_0" | "Q4_0";
  const context = await model.createContext({
    contextSize: CTX, batchSize: CTX, threads: ORACLE_THREADS,
    // a quantized V needs flash attention in llama.cpp
    ...(types ? { flashAttention: true, experimentalKvCacheKeyType: ggml(types.k), experimentalKvCacheValueType: ggml(types.v) } : {}),
  });
  try {
    const bos = model.tokens.bos;
    if (bos === null || !model.tokens.shouldPrependBosToken) throw new Error("expected a model that starts with BOS");
    const tokens = [bos, ...model.tokenize(readFileSync(TEXT, "utf8"), false)] as number[];
    const nChunks = Math.floor(tokens.length / CTX);
    const first = CTX / 2;
    let nll = 0;
    let scored = 0;
    const seq = context.getSequence();
    for (let c = 0; c < nChunks; c++) {
      const chunk = tokens.slice(c * CTX, (c + 1) * CTX);
      chunk[0] = bos;
      await seq.clearHistory();
      const out = await seq.controlledEvaluate(chunk.map((t, i) => (i >= first ? [t, { generateNext: { logits: true } }] : t)) as never);
      for (let pos = first; pos < CTX - 1; pos++) {
        const logits = (out[pos] as { next?: { logits?: Map<number, number> } }).next?.logits;
        if (!logits) throw new Error("node-llama-cpp returned no logits");
        const values = [...logits.values()];
        const max = Math.max(...values);
        const sumExp = values.reduce((s, v) => s + Math.exp(v - max), 0);
        nll += max + Math.log(sumExp) - logits.get(tokens[c * CTX + pos + 1])!;
        scored++;
      }
    }
    return { ppl: Math.exp(nll / scored), nChunks, scored };
  } finally {
    await context.dispose();
    await model.dispose();
  }
}

describe("perplexity as llama-perplexity computes it", () => {
  it.each([
    ["the shipped model", SHIPPED, undefined],
    ["a generated Q4_K_M model", join(dir, "small-llama-Q4_K_M.gguf"), "small-llama"],
  ] as const)("%s", async (_label, path, shape) => {
    if (shape) await generateModel({ shape, type: "Q4_K_M", out: path, pure: false, seed: 11, weightStd: 0.05 });
    const [mine, ref] = [await ours(path, "-f", TEXT), await oraclePerplexity(path)];
    console.log(`${_label}: prima ${mine.ppl}, llama.cpp ${ref.ppl} over ${ref.scored} tokens`);
    expect(mine.nChunks).toBe(ref.nChunks);
    expect(mine.scored).toBe(ref.scored);
    expect(Math.abs(mine.ppl / ref.ppl - 1), `prima ${mine.ppl}, llama.cpp ${ref.ppl}`).toBeLessThan(0.005);
  }, 180_000);
});

describe("quantized KV caches on trained weights (the shipped model, its heads padded to 64)", () => {
  // The only trained model that ships has heads of 8, too small for a quantized cache's 32-value
  // blocks; its padded twin computes the same function (modelgen/pad-heads.ts) and takes every type.
  it("computes the shipped model's perplexity, and each cache type's equals llama.cpp's with the same type", async () => {
    const padded = padHeads(SHIPPED, join(dir, "stories260K-hd64.gguf"), 64).out;
    const [shipped, f16] = [await ours(SHIPPED, "-f", TEXT), await ours(padded, "-f", TEXT)];
    // the same function up to float rounding (Q is scaled by sqrt(8)), far inside any cache type's effect
    expect(Math.abs(f16.ppl / shipped.ppl - 1), `padded ${f16.ppl}, shipped ${shipped.ppl}`).toBeLessThan(1e-3);
    const types: KvCacheTypes[] = [{ k: "q8_0", v: "q8_0" }, { k: "q4_0", v: "q4_0" }, { k: "q8_0-rot", v: "q8_0-rot" }, { k: "q4_0-rot", v: "q4_0-rot" }];
    for (const t of types) {
      const [mine, ref] = [await ours(padded, "-f", TEXT, "-ctk", t.k, "-ctv", t.v), await oraclePerplexity(padded, t)];
      console.log(`K ${t.k} V ${t.v}: prima ${mine.ppl}, llama.cpp ${ref.ppl} (F16 cache ${f16.ppl})`);
      expect(Math.abs(mine.ppl / ref.ppl - 1), `K ${t.k} V ${t.v}: prima ${mine.ppl}, llama.cpp ${ref.ppl}`).toBeLessThan(0.005);
      // the cache type is really in use: its perplexity is not the F16 cache's
      expect(Math.abs(mine.ppl / f16.ppl - 1), `K ${t.k} V ${t.v} against F16`).toBeGreaterThan(1e-3);
    }
  }, 240_000);
});

describe("KL divergence against a base file", () => {
  it("finds a model equal to its own base, and Q4_0 further from an F32 base than Q8_0", async () => {
    // Same shape and seed: the same random weights, quantized three ways.
    const [f32, q8, q4] = ["F32", "Q8_0", "Q4_0"].map((t) => join(dir, `kl-${t}.gguf`));
    for (const [type, out] of [["F32", f32], ["Q8_0", q8], ["Q4_0", q4]] as const) {
      await generateModel({ shape: "small-llama", type, out, pure: true, seed: 5, weightStd: 0.05 });
    }
    const base = join(dir, "base.kld");
    const made = await ours(f32, "-f", TEXT, "--kl-divergence-base", base);
    const self = (await ours(f32, "--kl-divergence-base", base, "--kl-divergence")).kl!;
    expect(self.ppl).toBeCloseTo(made.ppl, 6);
    expect(self.pplBase / made.ppl).toBeCloseTo(1, 3);
    expect(self.sameTop).toBe(1);
    const k8 = (await ours(q8, "--kl-divergence-base", base, "--kl-divergence")).kl!;
    const k4 = (await ours(q4, "--kl-divergence-base", base, "--kl-divergence")).kl!;
    console.log(`mean KLD against F32: itself ${self.meanKld}, Q8_0 ${k8.meanKld}, Q4_0 ${k4.meanKld}`);
    // Only the base file's 16-bit steps separate a model from itself.
    expect(Math.abs(self.meanKld)).toBeLessThan(k8.meanKld);
    expect(k4.meanKld).toBeGreaterThan(2 * k8.meanKld);
  }, 240_000);

  it("computes KL divergence, its uncertainty and same-top from base rows as defined", () => {
    // Two distributions over 5 tokens: KL(base || q) by the definition, against KlStats over rows
    // encoded in the base file's format.
    const nVocab = 5;
    const baseLogits = Float32Array.from([2, 1, 0.5, -1, -3]);
    const qLogits = Float32Array.from([1.5, 1.2, 0.4, -0.8, -3.5]);
    const row = new Uint16Array(baseRowSlots(nVocab));
    encodeBaseRow(baseLogits, nVocab, row);
    const logSoftmax = (l: Float32Array) => { const m = Math.max(...l); const z = Math.log([...l].reduce((s, v) => s + Math.exp(v - m), 0)); return [...l].map((v) => v - m - z); };
    const p = logSoftmax(baseLogits);
    const q = logSoftmax(qLogits);
    const kl = p.reduce((s, lp, i) => s + Math.exp(lp) * (lp - q[i]), 0);
    const stats = new KlStats();
    for (let i = 0; i < 12; i++) stats.add(qLogits, nVocab, row, i % nVocab);
    const sum = summarizeKl(stats);
    expect(sum.meanKld).toBeCloseTo(kl, 4);
    expect(sum.sameTop).toBe(1);
    expect(sum.count).toBe(12);
    expect(negLogProb(qLogits, nVocab, 1)).toBeCloseTo(-q[1], 6);
  });

  it("refuses a base file that is not one, is truncated, or has another vocabulary", async () => {
    const bad = join(dir, "bad.kld");
    writeFileSync(bad, "not a base file at all");
    await expect(ours(SHIPPED, "--kl-divergence-base", bad, "--kl-divergence")).rejects.toThrow(/does not look like a file of log-probabilities/);
    const header = Buffer.alloc(20);
    header.write("_logits_", 0, "latin1");
    header.writeUInt32LE(CTX, 8);
    header.writeInt32LE(512, 12);
    header.writeInt32LE(3, 16);
    writeFileSync(bad, header);
    await expect(ours(SHIPPED, "--kl-divergence-base", bad, "--kl-divergence")).rejects.toThrow(/is truncated/);
    header.writeInt32LE(1000, 12);
    writeFileSync(bad, Buffer.concat([header, Buffer.alloc(CTX * 3 * 4 + 3 * 63 * baseRowSlots(1000) * 2)]));
    await expect(ours(SHIPPED, "--kl-divergence-base", bad, "--kl-divergence")).rejects.toThrow(/vocabulary of 1000 tokens, this model has 512/);
  }, 60_000);
});
