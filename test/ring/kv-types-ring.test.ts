// --cache-type-k/-v reach every device of a ring: a ring of two loopback workers and the head with a
// q8_0 cache gives the single device's tokens with the same cache, and each worker's window holds its
// KV cache in q8_0 (the memory it reports shrinks by what the rule says).
import { afterEach, describe, expect, it } from "vitest";
import { kvBytesPerTokenLayer, modelShapeByName } from "../../model/index.js";
import { killAll, runRing, singleDevice, readyMiB } from "./cluster.js";
import { generatedModel } from "../helpers/models.js";

afterEach(killAll);

const CTX = 4096;
const gen = ["-p", "Once upon a time", "-n", "24", "--temp", "0", "--ctx", String(CTX)];



describe("a ring with a q8_0 KV cache", () => {
  it("two workers and the head, windows 2,2,2: the single device's tokens, the workers' caches in q8_0", async () => {
    const shape = { ...modelShapeByName("tiny-llama")!, nLayers: 6, contextLength: CTX };
    const path = await generatedModel({ shape, type: "Q8_0", seed: 3, weightStd: 0.08 });
    const q8 = ["-ctk", "q8_0", "-ctv", "q8_0"];
    const expected = singleDevice(path, [...gen, ...q8]);
    expect(expected.length).toBe(24);
    const r = await runRing(path, [...gen, ...q8, "--layer-windows", "2,2,2"], 2);
    expect(r.code, r.coordinator.stderr).toBe(0);
    expect(r.report?.devices).toBe(3);
    expect(r.report?.generated_ids).toEqual(expected);

    // the same ring with the default F16 cache: each worker's window (2 layers) is larger by the rule's difference
    const f16 = await runRing(path, [...gen, "--layer-windows", "2,2,2"], 2);
    expect(f16.code, f16.coordinator.stderr).toBe(0);
    const hp = { nHeadKv: shape.nHeadKv, headDimK: shape.nEmbd / shape.nHead, headDimV: shape.nEmbd / shape.nHead };
    const savedMiB = (kvBytesPerTokenLayer(hp) - kvBytesPerTokenLayer(hp, { k: "q8_0", v: "q8_0" })) * 2 * CTX / 2 ** 20;
    const [a, b] = [readyMiB(r.coordinator.stderr), readyMiB(f16.coordinator.stderr)];
    expect(a.length, r.coordinator.stderr).toBe(2);
    expect(b.length, f16.coordinator.stderr).toBe(2);
    for (let i = 0; i < 2; i++) expect(Math.abs(b[i] - a[i] - savedMiB), `worker ${i + 1}: f16 ${b[i]} MiB, q8_0 ${a[i]} MiB`).toBeLessThan(0.11);
  }, 180_000);
});
