// Sparse attention in a model's windows (--attention sparse): below the window it is dense attention bit
// for bit; beyond it, what a query sees does not depend on how its tokens went through the window (one
// batch, one at a time, rewritten after a truncation, reloaded from a file, after a context shift, in a
// step of several sequences): the block landmarks the window keeps are always those of the rows its
// cache holds. The kernel's exactness over the selected set is test/native/sparse-attention.test.ts's.
// And the flags reach `run` and `perplexity`.
import { execFile } from "node:child_process";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import { LocalModel } from "../../engine/index.js";
import type { SparseAttention } from "../../model/index.js";
import type { NativeWindow } from "../../native/index.js";
import { root } from "../helpers/process.js";
import { tempDir } from "../helpers/temp.js";

const SHIPPED = join(root, "models/stories260K.gguf");
const CLI = join(root, "dist/coordinator/cli.js");
const TEXT = join(root, "test/fixtures/story.txt");
const dir = tempDir("prima-sparse-");
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const exec = promisify(execFile);

const m = LocalModel.open(SHIPPED, { threads: 2 });
afterAll(() => m.native.close());
const tokens = Int32Array.from({ length: 200 }, (_, i) => (i === 0 ? 1 : 260 + ((i * 37) % 200)));
const SMALL: SparseAttention = { window: 16, sinks: 2, logStride: true, block: 8 };

function windowOf(attention: SparseAttention | undefined, ctx = 256, maxBatch = 64): NativeWindow {
  return m.window(0, m.nLayers, { ctx, maxBatch, kvCacheTypes: { k: "f16", v: "f16", ...(attention ? { attention } : {}) } });
}

/** Feeds tokens[from, to) at their positions in batches of `batch`; the last row's logits. */
async function feed(w: NativeWindow, from: number, to: number, batch: number, ids: Int32Array = tokens): Promise<Float32Array> {
  let acts = new Float32Array(0);
  for (let p = from; p < to; p += batch) {
    const n = Math.min(batch, to - p);
    acts = m.embed(ids.subarray(p, p + n));
    await w.forward(acts, p, n);
  }
  return m.logits(acts.subarray(acts.length - m.nEmbd));
}

describe("sparse attention in a window", () => {
  it("equals dense attention bit for bit while the context is shorter than the window", async () => {
    const dense = windowOf(undefined), sparse = windowOf({ window: 128, sinks: 4, logStride: true, block: 64 });
    try {
      for (const [from, to, batch] of [[0, 100, 64], [100, 127, 1], [127, 128, 1]] as const) {
        expect(await feed(sparse, from, to, batch)).toEqual(await feed(dense, from, to, batch));
      }
      // one more and the first query's window no longer reaches position 0: now it differs
      expect(await feed(sparse, 128, 160, 1)).not.toEqual(await feed(dense, 128, 160, 1));
    } finally {
      dense.close();
      sparse.close();
    }
  });

  it("a query's result does not depend on how the positions went through the window", async () => {
    const a = windowOf(SMALL), b = windowOf(SMALL, 256, 1), c = windowOf(SMALL), d = windowOf(SMALL);
    try {
      const want = await feed(a, 0, 150, 64); // prompt batches of 64
      expect(await feed(b, 0, 150, 1)).toEqual(want); // one at a time: the landmarks computed block by block
      // c: 150 other tokens, truncated to 37, then the real ones from 37: blocks from 32 on are computed again
      const other = Int32Array.from(tokens, (t, i) => (i === 0 ? 1 : t === 300 ? 301 : 300));
      await feed(c, 0, 150, 64, other);
      c.kvTruncate(37);
      const mixed = Int32Array.from(tokens, (t, i) => (i < 37 ? other[i] : t));
      const wantMixed = await feed(d, 0, 150, 64, mixed);
      expect(await feed(c, 37, 150, 50, mixed)).toEqual(wantMixed);
      expect(wantMixed).not.toEqual(want);
      // reloaded from a file: the landmarks are computed again from the rows
      const file = join(dir, "kv.bin");
      a.kvSave(file);
      d.kvLoad(file);
      expect(await feed(d, 150, 170, 1)).toEqual(await feed(a, 150, 170, 1));
    } finally {
      for (const w of [a, b, c, d]) w.close();
    }
  });

  it("after a context shift the landmarks are those of the moved rows", async () => {
    const a = windowOf(SMALL), b = windowOf(SMALL);
    try {
      await feed(a, 0, 180, 64);
      a.kvShift(1, 60, 180); // positions 61..179 move down to 1..119
      const file = join(dir, "shifted.bin");
      a.kvSave(file);
      b.kvLoad(file); // b computes every landmark afresh from the same rows
      const next = Int32Array.from({ length: 10 }, (_, i) => 270 + i);
      for (let i = 0; i < next.length; i++) {
        expect(await feed(a, 120 + i, 121 + i, 1, new Int32Array(300).fill(next[i]))).toEqual(
          await feed(b, 120 + i, 121 + i, 1, new Int32Array(300).fill(next[i])));
      }
    } finally {
      a.close();
      b.close();
    }
  });

  it("a step of several sequences gives each the result it gets alone", async () => {
    const alone = [windowOf(SMALL), windowOf(SMALL)], seqs = [windowOf(SMALL), windowOf(SMALL)];
    try {
      await feed(alone[0], 0, 90, 64);
      await feed(alone[1], 0, 140, 64);
      await feed(seqs[0], 0, 90, 64);
      await feed(seqs[1], 0, 140, 64);
      const E = m.nEmbd, V = m.nVocab;
      for (let s = 0; s < 20; s++) {
        const ids = Int32Array.from([280 + s, 300 + s]), pos = Int32Array.from([90 + s, 140 + s]);
        const acts = m.embed(ids), logits = new Float32Array(2 * V);
        await seqs[0].forwardSeqs(seqs, acts, pos, logits);
        for (let r = 0; r < 2; r++) {
          const one = m.embed(ids.subarray(r, r + 1));
          await alone[r].forward(one, pos[r], 1);
          expect(acts.subarray(r * E, (r + 1) * E)).toEqual(one);
        }
      }
    } finally {
      for (const w of [...alone, ...seqs]) w.close();
    }
  });

  it("the landmarks' memory is what model/attention.ts counts", () => {
    const dense = windowOf(undefined, 256), sparse = windowOf(SMALL, 256);
    try {
      const hp = m.desc.hparams;
      const perTokenLayer = (hp.nHeadKv * (hp.headDimK + hp.headDimV) * 4) / SMALL.block;
      expect(sparse.info().anonBytes - dense.info().anonBytes).toBe(perTokenLayer * 256 * m.nLayers);
    } finally {
      dense.close();
      sparse.close();
    }
  });
});

describe("the flags", () => {
  const perplexity = async (...extra: string[]) =>
    JSON.parse((await exec(process.execPath, [CLI, "perplexity", SHIPPED, "-f", TEXT, "-c", "128", "-t", "2", "--json", ...extra], { cwd: root, timeout: 120_000 })).stdout) as { ppl: number };

  it("perplexity: sparse with a window of the whole chunk is dense; a small window changes it a little", async () => {
    const dense = await perplexity();
    expect((await perplexity("--attention", "sparse", "--sparse-window", "128")).ppl).toBe(dense.ppl);
    const sparse = await perplexity("--attention", "sparse", "--sparse-window", "16", "--sparse-block", "8", "--sparse-sinks", "2");
    expect(sparse.ppl).not.toBe(dense.ppl);
    expect(Math.abs(Math.log(sparse.ppl / dense.ppl))).toBeLessThan(0.5);
  });

  it("run generates with sparse attention; bad settings are refused by name", async () => {
    // past the context too (context shift moves the rows; the landmarks follow them)
    const { stdout } = await exec(process.execPath, [CLI, "run", SHIPPED, "-p", "Once upon a time", "-n", "200", "--temp", "0", "--ctx", "64", "--json",
      "--attention", "sparse", "--sparse-window", "8", "--sparse-block", "4"], { cwd: root, timeout: 120_000 });
    const out = JSON.parse(stdout) as { generated_ids: number[]; text: string };
    expect(out.generated_ids.length).toBe(200);
    expect(out.text).toMatch(/ the /);
    await expect(exec(process.execPath, [CLI, "run", SHIPPED, "-p", "x", "--sparse-window", "8"], { cwd: root, timeout: 60_000 }))
      .rejects.toThrow(/--sparse-window needs --attention sparse/);
    await expect(exec(process.execPath, [CLI, "run", SHIPPED, "-p", "x", "--attention", "sparse", "--sparse-block", "1"], { cwd: root, timeout: 60_000 }))
      .rejects.toThrow(/landmark block/);
    await expect(exec(process.execPath, [CLI, "run", SHIPPED, "-p", "x", "--attention", "lsh"], { cwd: root, timeout: 60_000 }))
      .rejects.toThrow(/--attention "lsh": use dense or sparse/);
  });
});
