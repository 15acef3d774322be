// Generating past the context by context shift (engine/context-shift.ts, native kv_shift.c): 4x the
// context on the shipped model and on a generated qwen2-shaped one (neox RoPE), compared token for
// token with llama.cpp making the same shifts through its sequence API (node-llama-cpp's
// eraseContextTokenRanges: llama_memory_seq_rm + seq_add, as llama.cpp's own completion and server
// do), with the same rule (n_discard = (n_past - n_keep) / 2 when n_past + 1 >= n_ctx). And a cache
// rebuilt from its journal (failover) generates what the uninterrupted one does.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Llama } from "node-llama-cpp";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KvJournal, LocalModel, LocalPipeline, Sampler, discardFor, generate, replayJournal, resolveKeep, type ContextShift } from "../../engine/index.js";
import { RecordingSampler as Recording } from "../helpers/recording-sampler.js";
import { Tokenizer, modelShapeByName } from "../../model/index.js";
import { generateModel } from "../../modelgen/index.js";
import { root } from "../helpers/process.js";
import { ORACLE_THREADS, TOL_FLOOR, loadOracle } from "./oracle-harness.js";

const dir = mkdtempSync(join(tmpdir(), "prima-context-shift-"));
let llama: Llama;
beforeAll(async () => {
  llama = await loadOracle();
}, 60_000);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const CTX = 64;
const N = 4 * CTX;
/** The logits comparison: llama.cpp's token-by-token calls are slow, 2x the context (3 shifts). */
const N_QWEN = 2 * CTX;
const STORIES = join(root, "models/stories260K.gguf");
const PROMPT = Int32Array.from([1, 403, 407, 261, 378, 432, 383, 286]);


async function ours(path: string, prompt: Int32Array, shift: ContextShift, journal?: KvJournal) {
  const m = LocalModel.open(path, { threads: 2 });
  const pipe = new LocalPipeline(m, CTX);
  try {
    return await generate(m, pipe, prompt, { maxTokens: N, sampler: new Sampler({ temperature: 0 }), isEnd: () => false, contextShift: shift, journal });
  } finally {
    pipe.close();
    m.close();
  }
}

const argmax = (l: Map<number, number>): number => {
  let best = -1, bl = -Infinity;
  for (const [id, v] of l) if (v > bl || (v === bl && id < best)) [best, bl] = [id, v];
  return best;
};

/** llama.cpp's greedy generation of N tokens in a context of CTX, shifting as llama.cpp's completion
 * does (or fed `forced` tokens instead of its own: its logits at each step), and at each step its top
 * two's margin as a share of the logits' spread. */
async function theirs(path: string, prompt: Int32Array, shift: ContextShift, forced?: readonly number[], n = N): Promise<{ ids: number[]; margins: number[]; logits: Float32Array[] }> {
  const model = await llama.loadModel({ modelPath: path, gpuLayers: 0 });
  const context = await model.createContext({ contextSize: CTX, batchSize: CTX, threads: ORACLE_THREADS, flashAttention: false });
  try {
    const seq = context.getSequence();
    const step = async (tokens: number[]) => {
      const out = await seq.controlledEvaluate(tokens.map((t, i) => (i === tokens.length - 1 ? [t, { generateNext: { logits: true } }] : t)) as never);
      return (out.at(-1) as { next: { logits: Map<number, number> } }).next.logits;
    };
    let logits = await step(Array.from(prompt));
    const ids: number[] = [], margins: number[] = [], rows: Float32Array[] = [];
    while (ids.length < n) {
      const id = forced ? forced[ids.length] : argmax(logits);
      const sorted = [...logits.values()].sort((a, b) => b - a);
      margins.push((sorted[0] - sorted[1]) / (sorted[0] - sorted[sorted.length - 1]));
      if (forced) {
        const row = new Float32Array(model.tokens.length ?? logits.size);
        for (const [t, v] of logits) row[t] = v;
        rows.push(row);
      }
      ids.push(id);
      if (ids.length >= n) break;
      if (seq.nextTokenIndex + 1 >= CTX) {
        const d = discardFor(seq.nextTokenIndex, shift);
        await seq.eraseContextTokenRanges([{ start: shift.keep, end: shift.keep + d }]);
      }
      logits = await step([id]);
    }
    return { ids, margins, logits: rows };
  } finally {
    await context.dispose();
    await model.dispose();
  }
}

function distinct(ids: readonly number[]): number {
  return new Set(ids).size;
}

/** Ours equals theirs; a difference only where llama.cpp's top two were a near tie (then the rest
 * differs): within TOL_FLOOR of the logits' spread, the near tie of every other oracle test. (Seen: a
 * margin of 8e-5 of the spread after two shifts on an AVX-512 host, whose F32 kernels sum in
 * another order than AVX2's, which gave llama.cpp's token there.) */
function expectSame(a: readonly number[], b: { ids: number[]; margins: number[] }, label: string): void {
  const k = a.findIndex((t, i) => t !== b.ids[i]);
  if (k < 0) return;
  console.log(`${label}: first difference at generated token ${k} (llama.cpp's top-2 margin there ${b.margins[k]} of the spread)`);
  expect(b.margins[k], `${label}: token ${k} differs: llama.cpp ${b.ids[k]}, prima ${a[k]}`).toBeLessThan(TOL_FLOOR);
}

describe("generation past the context (context shift)", () => {
  it("stories260K: 4x the context, sensible text, equal to llama.cpp's shifted generation", async () => {
    const tok = Tokenizer.fromGguf((await import("../../model/index.js")).readGguf(STORIES));
    const prompt = tok.encode("Once upon a time", { addSpecial: true });
    const shift = { keep: resolveKeep(0, prompt.length, tok.addBos, CTX) };
    expect(shift.keep).toBe(1); // the BOS
    const r = await ours(STORIES, prompt, shift);
    expect(r.ids.length).toBe(N);
    expect(r.stopReason).toBe("length");
    expect(r.shifts).toBeGreaterThanOrEqual(6);
    expect(r.endPos).toBeLessThan(CTX);
    // not one token over and over: each context's worth after the first shift uses many tokens
    for (let i = CTX; i < N; i += CTX) expect(distinct(r.ids.slice(i, i + CTX)), `tokens ${i}..${i + CTX}`).toBeGreaterThan(16);
    const text = tok.decode(r.ids);
    console.log(`stories260K, ${N} tokens in a context of ${CTX} (${r.shifts} shifts, ${distinct(r.ids)} distinct tokens): ${JSON.stringify(text.slice(-300))}`);
    expect(text).toMatch(/[a-z]+ [a-z]+ [a-z]+/);
    expectSame(r.ids, await theirs(STORIES, prompt, shift), "stories260K");
  }, 300_000);

  it("stories260K with --keep 4: the first tokens after BOS stay", async () => {
    const tok = Tokenizer.fromGguf((await import("../../model/index.js")).readGguf(STORIES));
    const prompt = tok.encode("Once upon a time, there was a dog", { addSpecial: true });
    const shift = { keep: resolveKeep(4, prompt.length, tok.addBos, CTX) };
    expect(shift.keep).toBe(5);
    const journal = new KvJournal();
    const r = await ours(STORIES, prompt, shift, journal);
    expect(journal.tokens.slice(0, 5)).toEqual(Array.from(prompt.subarray(0, 5)));
    expect(journal.pos).toBe(r.endPos);
    // llama.cpp's side runs a token per call (slow on a loaded machine): the first 2x the context
    expectSame(r.ids.slice(0, 2 * CTX), await theirs(STORIES, prompt, shift, undefined, 2 * CTX), "stories260K keep 4");
  }, 300_000);

  it("a generated llama-shaped model does not collapse into one token when shifted", async () => {
    const out = join(dir, "tiny-llama.gguf");
    await generateModel({ shape: modelShapeByName("tiny-llama")!, type: "F32", out, pure: true, seed: 5 });
    const r = await ours(out, PROMPT, { keep: 2 });
    expect(r.ids.length).toBe(N);
    expect(r.shifts).toBeGreaterThanOrEqual(6);
    // random weights: its unshifted greedy run uses 2-15 tokens per 64 (measured); shifted, no fewer than 5
    for (let i = CTX; i < N; i += CTX) expect(distinct(r.ids.slice(i, i + CTX)), `tokens ${i}..${i + CTX}`).toBeGreaterThan(4);
    expectSame(r.ids, await theirs(out, PROMPT, { keep: 2 }), "tiny-llama");
  }, 300_000);

  it("a generated qwen2-shaped model (neox RoPE): every step's logits as llama.cpp's over the same shifts", async () => {
    // random weights repeat one token whatever the context (so tokens alone would prove little): the
    // logits of every step, fed our tokens, are compared instead
    const out = join(dir, "tiny-qwen2.gguf");
    await generateModel({ shape: modelShapeByName("tiny-qwen2")!, type: "F32", out, pure: true, seed: 11 });
    const shift = { keep: 2 };
    const sampler = new Recording();
    const m = LocalModel.open(out, { threads: 2 });
    const pipe = new LocalPipeline(m, CTX);
    const r = await generate(m, pipe, PROMPT, { maxTokens: N_QWEN, sampler, isEnd: () => false, contextShift: shift });
    pipe.close();
    m.close();
    expect(r.shifts).toBeGreaterThanOrEqual(2);
    const ref = await theirs(out, PROMPT, shift, r.ids, N_QWEN);
    let worst = 0;
    for (let k = 0; k < N_QWEN; k++) {
      const a = sampler.rows[k], b = ref.logits[k];
      let lo = Infinity, hi = -Infinity, err = 0;
      for (let i = 0; i < b.length; i++) {
        lo = Math.min(lo, b[i]);
        hi = Math.max(hi, b[i]);
        err = Math.max(err, Math.abs(a[i] - b[i]));
      }
      worst = Math.max(worst, err / (hi - lo));
    }
    console.log(`tiny-qwen2: ${N_QWEN} steps, ${r.shifts} shifts, worst logit difference ${worst} of the spread`);
    expect(worst).toBeLessThan(5e-3);
  }, 300_000);

  it("a cache rebuilt from its journal (failover) goes on as the lost one would have", async () => {
    const prompt = Int32Array.from([1, 403, 407, 261, 378]);
    const shift = { keep: 1 };
    const whole = await ours(STORIES, prompt, shift);
    // the same generation stopped after 150 tokens (3 shifts in), its cache lost, rebuilt and continued
    const m = LocalModel.open(STORIES, { threads: 2 });
    const journal = new KvJournal();
    const first = new LocalPipeline(m, CTX);
    const sampler = new Sampler({ temperature: 0 });
    const a = await generate(m, first, prompt, { maxTokens: 150, sampler, isEnd: () => false, contextShift: shift, journal });
    first.close();
    expect(a.shifts).toBeGreaterThan(2);
    const fresh = new LocalPipeline(m, CTX);
    const { startPos, input } = await replayJournal(journal, m, fresh, [...prompt, ...a.ids]);
    expect(input.length).toBe(1); // the last token sampled was not forwarded yet
    const b = await generate(m, fresh, input, { startPos, maxTokens: N - 150, sampler, isEnd: () => false, contextShift: shift, journal });
    fresh.close();
    m.close();
    expect([...a.ids, ...b.ids]).toEqual(whole.ids);
  }, 60_000);

  it("a conversation's next turn continues a shifted cache (KvJournal.continueWith)", () => {
    const j = new KvJournal();
    j.forwarded([1, 2, 3, 4, 5, 6, 7, 8]);
    j.shift(1, 3);
    j.forwarded([9, 10]);
    expect(j.tokens).toEqual([1, 5, 6, 7, 8, 9, 10]);
    // the history and more: go on from the cache as it is
    expect(j.continueWith(Int32Array.from([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]))).toMatchObject({ startPos: 7 });
    // anything else: only what no shift moved is reused
    const other = j.continueWith(Int32Array.from([1, 5, 6, 99]));
    expect(other.startPos).toBe(1);
    expect(Array.from(other.rest)).toEqual([5, 6, 99]);
    expect(j.tokens).toEqual([1]);
    expect(j.shifted).toBe(false);
  });
});
