// The token loop with a pipeline that computes elsewhere (a ring, Pipeline.computesElsewhere): the next
// token's pass starts before the caller sees the token, so streaming it overlaps the devices' work. The
// tokens are those of a pipeline that computes here; a caller that stops leaves the cache where it would
// have been without the pass already started, so a request that goes on from there gets the same text.
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { KvJournal, LocalModel, LocalPipeline, Sampler, generate, type GenerateOptions, type Pipeline } from "../../engine/index.js";
import { root } from "../helpers/process.js";

const m = LocalModel.open(join(root, "models/stories260K.gguf"), { threads: 2 });
afterAll(() => m.native.close());
const prompt = Int32Array.from([1, 403, 407, 261, 347, 300]);

/** A local pipeline made to behave as a ring's: forward hands the rows over and computes in a later
 * turn of the event loop. Logs each pass's start and end beside the tokens the caller saw. */
class Elsewhere implements Pipeline {
  readonly computesElsewhere = true;
  readonly log: string[] = [];
  constructor(readonly inner: LocalPipeline) {}
  get nCtx() { return this.inner.nCtx; }
  forward(acts: Float32Array, pos: number, n: number): Promise<Float32Array> {
    this.log.push(`start ${pos}`);
    const rows = acts.slice();
    return new Promise((resolve, reject) => setImmediate(() => this.inner.forward(rows, pos, n).then((l) => {
      this.log.push(`end ${pos}`);
      resolve(l);
    }, reject)));
  }
  truncate(pos: number) { this.inner.truncate(pos); }
  resumable(pos: number) { return this.inner.resumable(pos); }
}

const greedy = (o: Partial<GenerateOptions> = {}): GenerateOptions => ({ maxTokens: 24, sampler: new Sampler({ temperature: 0 }), ...o });

/** A pipeline that computes here and one that computes "elsewhere", each with a cache of ctx positions. */
async function withBoth(ctx: number, body: (here: LocalPipeline, there: Elsewhere) => Promise<void>): Promise<void> {
  const here = new LocalPipeline(m, ctx), there = new Elsewhere(new LocalPipeline(m, ctx));
  try {
    await body(here, there);
  } finally {
    here.close();
    there.inner.close();
  }
}

describe("a pipeline that computes elsewhere", () => {
  it("starts each token's pass before the caller sees the token, and gives the same tokens", async () => {
    await withBoth(128, async (here, there) => {
      const local = await generate(m, here, prompt, greedy());
      const ring = await generate(m, there, prompt, greedy({ onToken: (id) => void there.log.push(`token ${id}`) }));
      expect(ring.ids).toEqual(local.ids);
      expect(ring.endPos).toBe(local.endPos);
      expect(ring.decodeSteps).toBe(local.decodeSteps);
      // after the prompt's pass, token i (the pass of position p0 + i) is seen while its pass runs; the
      // last one (maxTokens reached) starts none
      const p0 = prompt.length, last = ring.ids.length - 1;
      const order = ["start 0", "end 0", ...ring.ids.flatMap((id, i) => (i < last ? [`start ${p0 + i}`, `token ${id}`, `end ${p0 + i}`] : [`token ${id}`]))];
      expect(there.log).toEqual(order);
    });
  });

  it("stopped by the caller: the pass already started is finished but not counted, and going on from there gives the uninterrupted text", async () => {
    await withBoth(128, async (here, there) => {
      const whole = await generate(m, here, prompt, greedy({ maxTokens: 30 }));
      const journal = new KvJournal();
      let n = 0;
      const first = await generate(m, there, prompt, greedy({ journal, onToken: () => ++n < 10 }));
      expect(first.stopReason).toBe("caller");
      expect(first.ids).toEqual(whole.ids.slice(0, 10));
      // the 10th token's pass ran (the ring finishes it) but the cache ends before it
      expect(there.log.at(-1)).toBe(`end ${prompt.length + 9}`);
      expect(first.endPos).toBe(prompt.length + 9);
      expect(journal.tokens).toEqual([...prompt, ...whole.ids.slice(0, 9)]);
      // a request that goes on: the 10th token forwarded at endPos (over the rows of the pass not counted)
      const rest = await generate(m, there, Int32Array.from([whole.ids[9]]), greedy({ startPos: first.endPos, maxTokens: 20 }));
      expect([...first.ids, ...rest.ids]).toEqual(whole.ids);
    });
  });

  it("stops where the context is full, with the tokens of a pipeline that computes here", async () => {
    await withBoth(16, async (here, there) => {
      const local = await generate(m, here, prompt, greedy({ maxTokens: 40 }));
      const ring = await generate(m, there, prompt, greedy({ maxTokens: 40 }));
      expect(local.stopReason).toBe("context");
      expect(ring.stopReason).toBe("context");
      expect(ring.ids).toEqual(local.ids);
      expect(ring.endPos).toBe(local.endPos);
    });
  });
});
