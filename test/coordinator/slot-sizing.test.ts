// serve --parallel auto: the number of sequence slots from the room the device has beside the weights
// (coordinator/slot-sizing.ts), and the figures it uses against the engine's own windows.
import { describe, expect, it } from "vitest";
import { LocalModel, SeqSlots } from "../../engine/index.js";
import { AUTO_PARALLEL_CAP, autoParallel, kvBytesPerSequence, parallelForRoom, slotBytes } from "../../coordinator/slot-sizing.js";

const MODEL = "models/stories260K.gguf";
const MiB = 2 ** 20;

describe("serve --parallel auto", () => {
  const slot = { kv: 10 * MiB, scratch: 2 * MiB, ctx: 512 };

  it("a small memory budget yields fewer slots, and the line says why", () => {
    const roomy = parallelForRoom(1000 * MiB, 70 * MiB, slot, AUTO_PARALLEL_CAP);
    expect(roomy.n).toBe(4);
    expect(roomy.why).toMatch(/^--parallel 4 \(auto: at most 4\): 930\.0 MiB of memory beside the model's 70\.0 MiB of weights holds 77 sequence slots of 512 tokens, 12\.0 MiB each \(KV cache 10\.0 MiB, scratch 2\.0 MiB\)/);
    const tight = parallelForRoom(100 * MiB, 70 * MiB, slot, AUTO_PARALLEL_CAP);
    expect(tight.n).toBe(2);
    expect(tight.why).toMatch(/^--parallel 2 \(auto: all that fit\): 30\.0 MiB .* holds 2 sequence slots of 512 tokens/);
    const none = parallelForRoom(60 * MiB, 70 * MiB, slot, AUTO_PARALLEL_CAP);
    expect(none.n).toBe(1);
    expect(none.why).toMatch(/^--parallel 1 \(auto: at least 1\): 0\.0 MiB .* holds 0 sequence slots/);
    // the cap is the batch's when that is smaller (a step takes one row per sequence)
    expect(parallelForRoom(1000 * MiB, 70 * MiB, slot, 2).n).toBe(2);
  });

  it("a slot's figure is what a window of every layer takes, its KV the rule Halda prices", () => {
    const m = LocalModel.open(MODEL, { threads: 1 });
    try {
      const b = slotBytes(m, 256, 32);
      const hp = m.desc.hparams;
      expect(b.kv).toBe(kvBytesPerSequence(m, 256, 32));
      expect(b.kv).toBe(2 * 2 * hp.nLayers * hp.nHeadKv * hp.headDimK * 256); // K and V in F16
      const w = m.window(0, m.nLayers, { ctx: 256, maxBatch: 32 });
      expect(b.kv + b.scratch).toBe(w.info().anonBytes);
      w.close();
      // and the slots serve makes take that each
      const slots = new SeqSlots(m, 3, 256, 32);
      expect(slots.windows.reduce((a, x) => a + x.info().anonBytes, 0)).toBe(3 * (b.kv + b.scratch));
      slots.close();
      const auto = autoParallel(m, 256, 32);
      expect(auto.n).toBeGreaterThanOrEqual(1);
      expect(auto.n).toBeLessThanOrEqual(AUTO_PARALLEL_CAP);
      expect(auto.why).toMatch(new RegExp(`^--parallel ${auto.n} \\(auto: `));
    } finally {
      m.close();
    }
  });
});
