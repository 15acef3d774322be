// --attention sparse reaches every device of a ring (Assignment.attention, as the cache types travel): a
// ring of two loopback workers and the head gives the single device's sparse tokens, which differ from
// dense ones (so no device ran dense), and each worker's window holds the landmarks the rule counts.
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { generateModel } from "../../modelgen/index.js";
import { landmarkBytesPerTokenLayer, modelShapeByName } from "../../model/index.js";
import { killAll, runRing, singleDevice, readyMiB } from "./cluster.js";
import { tempDir } from "../helpers/temp.js";

afterEach(killAll);

const CTX = 1024;
const gen = ["-p", "Once upon a time", "-n", "80", "--temp", "0", "--ctx", String(CTX)];
const SPARSE = { window: 16, sinks: 2, logStride: true, block: 8 };
const sparse = ["--attention", "sparse", "--sparse-window", "16", "--sparse-sinks", "2", "--sparse-block", "8"];



describe("a ring with sparse attention", () => {
  const dir = tempDir("prima-sparse-ring-");
  it("two workers and the head, windows 2,2,2: the single device's sparse tokens", async () => {
    const path = join(dir, "sparse-ring.gguf");
    const shape = { ...modelShapeByName("tiny-llama")!, nLayers: 6, contextLength: CTX };
    await generateModel({ shape, type: "Q8_0", out: path, seed: 3, weightStd: 0.08 });
    const expected = singleDevice(path, [...gen, ...sparse]);
    expect(expected.length).toBe(80);
    expect(singleDevice(path, gen)).not.toEqual(expected);
    const r = await runRing(path, [...gen, ...sparse, "--layer-windows", "2,2,2"], 2);
    expect(r.code, r.coordinator.stderr).toBe(0);
    expect(r.report?.devices).toBe(3);
    expect(r.report?.generated_ids).toEqual(expected);

    const dense = await runRing(path, [...gen, "--layer-windows", "2,2,2"], 2);
    expect(dense.code, dense.coordinator.stderr).toBe(0);
    const d = shape.nEmbd / shape.nHead;
    const lmMiB = landmarkBytesPerTokenLayer({ nHeadKv: shape.nHeadKv, headDimK: d, headDimV: d }, SPARSE) * 2 * CTX / 2 ** 20;
    const [a, b] = [readyMiB(r.coordinator.stderr), readyMiB(dense.coordinator.stderr)];
    expect(a.length, r.coordinator.stderr).toBe(2);
    // MiB are printed to 0.1: each side rounds by up to 0.05 (the landmarks are 0.25 MiB here)
    for (let i = 0; i < 2; i++) expect(Math.abs(a[i] - b[i] - lmMiB), `worker ${i + 1}: sparse ${a[i]} MiB, dense ${b[i]} MiB`).toBeLessThan(0.101);
  }, 180_000);
});
