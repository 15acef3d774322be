// Context shift on sliding-window layers whose KV cache is a ring (native kv_shift.c over model.c's
// kv_row): a generated gemma3 model with a 4-token window and a batch of 4 (rings of 8 rows in a
// 64-token context) generates 2x its context, shifting; every step's logits, fed our tokens, equal
// llama.cpp's over the same shifts (node-llama-cpp's eraseContextTokenRanges: seq_rm + seq_add; llama.cpp
// shifts an iSWA cache only when its SWA part is as large as the context, swaFullCache, whose masked
// rows are what our ring keeps). A shift whose next window needs positions the ring lost is refused by
// name, and the head's copy of the rule (model/ kvAfterShift, kvResumablePosition) agrees with the
// native one over random forwards, truncations and shifts; after a shift, a prompt reuses the cache only
// where the KV journal and the rings both allow it.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Llama } from "node-llama-cpp";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KvJournal, LocalModel, LocalPipeline, Sampler, discardFor, generate, type ContextShift } from "../../engine/index.js";
import { RecordingSampler as Recording } from "../helpers/recording-sampler.js";
import { kvAfterShift, kvCacheRows, kvResumablePosition } from "../../model/index.js";
import { generateModel } from "../../modelgen/index.js";
import { mulberry32 } from "../helpers/random.js";
import { ORACLE_THREADS, loadOracle } from "./oracle-harness.js";

const dir = mkdtempSync(join(tmpdir(), "prima-context-shift-swa-"));
let llama: Llama;
const path = join(dir, "tiny-gemma3.gguf");
beforeAll(async () => {
  llama = await loadOracle();
  await generateModel({ shape: "tiny-gemma3", type: "F32", out: path, pure: true, seed: 7, weightStd: 0.05 });
}, 60_000);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const CTX = 64;
const BATCH = 4;
const N = 2 * CTX;
const PROMPT = Int32Array.from([2, 403, 407, 261, 378, 432, 383, 286]);


/** llama.cpp fed `forced` tokens in a context of CTX, shifting as llama.cpp's completion does: its logits at each step. */
async function theirs(prompt: Int32Array, shift: ContextShift, forced: readonly number[]): Promise<Float32Array[]> {
  const model = await llama.loadModel({ modelPath: path, gpuLayers: 0 });
  const context = await model.createContext({ contextSize: CTX, batchSize: CTX, threads: ORACLE_THREADS, flashAttention: false, swaFullCache: true });
  try {
    const seq = context.getSequence();
    const step = async (tokens: number[]) => {
      const out = await seq.controlledEvaluate(tokens.map((t, i) => (i === tokens.length - 1 ? [t, { generateNext: { logits: true } }] : t)) as never);
      return (out.at(-1) as { next: { logits: Map<number, number> } }).next.logits;
    };
    let logits = await step(Array.from(prompt));
    const rows: Float32Array[] = [];
    let shifts = 0;
    for (let k = 0; k < forced.length; k++) {
      const row = new Float32Array(logits.size);
      for (const [t, v] of logits) row[t] = v;
      rows.push(row);
      if (k + 1 >= forced.length) break;
      if (seq.nextTokenIndex + 1 >= CTX) {
        // llama_memory_seq_rm + seq_add themselves, through node-llama-cpp's binding: its
        // eraseContextTokenRanges re-evaluates instead once the SWA cache's lowest position passes the
        // range's start (llama.cpp reuses masked SWA cells and purges positions below them, the kept
        // ones too), which is not a shift
        const d = discardFor(seq.nextTokenIndex, shift), n = seq.nextTokenIndex;
        const inner = seq as unknown as { _sequenceId: number; _contextTokens: number[]; _nextTokenIndex: number };
        const ctx = (context as unknown as { _ctx: { removeTokenCellsFromSequence(s: number, a: number, b: number): boolean; shiftSequenceTokenCells(s: number, a: number, b: number, d: number): void } })._ctx;
        expect(ctx.removeTokenCellsFromSequence(inner._sequenceId, shift.keep, shift.keep + d)).toBe(true);
        ctx.shiftSequenceTokenCells(inner._sequenceId, shift.keep + d, n, -d);
        inner._contextTokens.splice(shift.keep, d);
        inner._nextTokenIndex -= d;
        shifts++;
      }
      logits = await step([forced[k]]);
    }
    expect(shifts).toBeGreaterThanOrEqual(2);
    return rows;
  } finally {
    await context.dispose();
    await model.dispose();
  }
}

describe("context shift on sliding-window rings (tiny-gemma3, window 4)", () => {
  it("2x the context: every step's logits as llama.cpp's over the same shifts", async () => {
    const shift = { keep: 2 };
    const sampler = new Recording();
    const m = LocalModel.open(path, { threads: 2 });
    const hp = m.desc.hparams;
    // the sliding-window layers' caches are rings far smaller than the context
    expect(kvCacheRows(hp.layerWindow, CTX, BATCH).filter((r) => r === 4 + BATCH).length).toBeGreaterThan(0);
    const pipe = new LocalPipeline(m, CTX, BATCH);
    const r = await generate(m, pipe, PROMPT, { maxTokens: N, sampler, isEnd: () => false, contextShift: shift });
    pipe.close();
    m.close();
    expect(r.ids.length).toBe(N);
    expect(r.shifts).toBeGreaterThanOrEqual(2);
    const ref = await theirs(PROMPT, shift, r.ids);
    let worst = 0;
    for (let k = 0; k < N; k++) {
      const a = sampler.rows[k], b = ref[k];
      let lo = Infinity, hi = -Infinity, err = 0;
      for (let i = 0; i < b.length; i++) {
        lo = Math.min(lo, b[i]);
        hi = Math.max(hi, b[i]);
        err = Math.max(err, Math.abs(a[i] - b[i]));
      }
      worst = Math.max(worst, err / (hi - lo));
    }
    console.log(`tiny-gemma3 (rings of ${4 + BATCH}): ${N} steps, ${r.shifts} shifts, worst logit difference ${worst} of the spread`);
    expect(worst).toBeLessThan(5e-3);
  }, 300_000);

  it("a shift whose next window needs positions the ring no longer holds is refused by name, the cache untouched", async () => {
    const m = LocalModel.open(path, { threads: 2 });
    const w = m.window(0, m.nLayers, { ctx: CTX, maxBatch: BATCH });
    await w.forward(m.embed(Int32Array.from({ length: 60 }, (_, i) => 3 + i)), 0, 60);
    // keep 2, drop 57: position 3 would attend to 0..3, but the rings hold only 52..59
    expect(() => w.kvShift(2, 57, 60)).toThrow(/sliding window of 4 needs position 0 .*no longer holds it/);
    expect(w.info().filled).toBe(60);
    expect(w.kvResumable(60)).toBe(60);
    w.close();
    m.close();
  }, 60_000);

  it("the native rule and model/'s kvAfterShift + kvResumablePosition agree over random forwards, truncations and shifts", async () => {
    const m = LocalModel.open(path, { threads: 2 });
    const hp = m.desc.hparams;
    const rows = kvCacheRows(hp.layerWindow, CTX, BATCH);
    const w = m.window(0, m.nLayers, { ctx: CTX, maxBatch: BATCH });
    const r = mulberry32(5);
    let filled = 0, kv = { kvEnd: 0, kvFloor: 0 }, checked = 0, shifts = 0, refused = 0;
    for (let step = 0; step < 80; step++) {
      for (let pos = 0; pos <= filled; pos++) {
        expect(w.kvResumable(pos), `step ${step} position ${pos}`).toBe(kvResumablePosition(pos, kv.kvEnd, hp.layerWindow, rows, CTX, kv.kvFloor));
        checked++;
      }
      if (filled > 8 && r() < 0.3) {
        const p0 = Math.floor(r() * 4), d = 1 + Math.floor(r() * (filled - p0 - 1));
        try {
          w.kvShift(p0, d, filled);
        } catch (e) {
          expect((e as Error).message).toMatch(/no longer holds it/);
          refused++;
          continue;
        }
        kv = kvAfterShift(kv, p0, d, filled, hp.layerWindow, rows, CTX);
        filled -= d;
        shifts++;
        continue;
      }
      const want = Math.floor(r() * (filled + 1));
      const pos = kvResumablePosition(want, kv.kvEnd, hp.layerWindow, rows, CTX, kv.kvFloor);
      const n = Math.min(1 + Math.floor(r() * 9), CTX - pos);
      if (n < 1) {
        w.kvTruncate(0);
        filled = 0;
        continue;
      }
      w.kvTruncate(pos);
      await w.forward(m.embed(Int32Array.from({ length: n }, () => 3 + Math.floor(r() * 100))), pos, n);
      filled = pos + n;
      kv = { kvEnd: pos === 0 ? n : Math.max(kv.kvEnd, pos + n), kvFloor: pos === 0 ? 0 : kv.kvFloor };
    }
    expect(checked).toBeGreaterThan(500);
    expect(shifts).toBeGreaterThan(3);
    expect(refused).toBeGreaterThan(0);
    w.close();
    m.close();
  }, 60_000);

  it("a shifted cache is continued, or its prefix reused, only where the journal and the rings both allow it", async () => {
    const m = LocalModel.open(path, { threads: 2 });
    const pipe = new LocalPipeline(m, CTX, BATCH);
    const journal = new KvJournal();
    const r = await generate(m, pipe, PROMPT, { maxTokens: 70, sampler: new Sampler({ temperature: 0 }), isEnd: () => false, contextShift: { keep: 2 }, journal });
    expect(r.shifts).toBe(1);
    const history = [...PROMPT, ...r.ids.slice(0, -1)]; // the last token sampled was not forwarded
    // the conversation goes on: the whole history and more continues the cache where it is
    const next = journal.continueWith(Int32Array.from([...history, 7, 8]), (p) => pipe.resumable(p));
    expect(next.startPos).toBe(r.endPos);
    expect(Array.from(next.rest)).toEqual([7, 8]);
    // another prompt sharing the kept prefix: the journal would keep 2 positions, but the rings lost
    // what position 2's window needs (only the last positions were moved down), so it starts at 0
    expect(journal.continueWith(Int32Array.from([...PROMPT.subarray(0, 2), 9, 9, 9]))).toMatchObject({ startPos: 2 });
    const j2 = new KvJournal();
    j2.forwarded(history);
    j2.shift(2, r.discarded);
    expect(pipe.resumable(2)).toBe(0);
    expect(j2.continueWith(Int32Array.from([...PROMPT.subarray(0, 2), 9, 9, 9]), (p) => pipe.resumable(p)).startPos).toBe(0);
    expect(j2.tokens).toEqual([]);
    pipe.close();
    m.close();
  }, 60_000);
});
