// A ring of two loopback workers and the head gives the single device's tokens for every family
// beyond llama (piped-ring.test.ts runs llama): the head embeds (gemma's scaled embeddings) and
// samples, each device runs its window of layers (gemma's sliding-window layers split across them; a
// mixture-of-experts layer's experts all in its window; gpt-oss's sinks, alternating windows and MXFP4
// experts), and gemma3's sliding-window rings wrap on the workers.
import { afterEach, describe, expect, it } from "vitest";
import { modelShapeByName } from "../../model/index.js";
import { killAll, runRing, singleDevice } from "./cluster.js";
import { generatedModel } from "../helpers/models.js";

afterEach(killAll);

const gen = ["-p", "Once upon a time", "-n", "24", "--temp", "0"];


describe("two-worker ring per family", () => {
  it.each(["tiny-qwen2", "tiny-qwen3", "tiny-qwen3moe", "tiny-mixtral", "tiny-gemma2", "tiny-gemma3", "tiny-mistral3", "tiny-phi3", "tiny-gpt-oss"])("%s, 6 layers in windows 2,2,2: the same tokens as one device", async (shape) => {
    // gpt-oss in its release type: MXFP4 experts, the rest Q8_0
    const path = await generatedModel({ shape: { ...modelShapeByName(shape)!, nLayers: 6 }, type: shape === "tiny-gpt-oss" ? "MXFP4_MOE" : "Q8_0", seed: 3, weightStd: 0.08 });
    const expected = singleDevice(path, gen);
    expect(expected.length).toBe(24);
    const r = await runRing(path, [...gen, "--layer-windows", "2,2,2"], 2);
    expect(r.code, r.coordinator.stderr).toBe(0);
    expect(r.report?.devices).toBe(3);
    expect(r.report?.generated_ids).toEqual(expected);
  }, 90_000);

  it("tiny-qwen3moe placed by Halda: each layer's routing measured on the head by default (not with --uniform-routing), the same tokens as one device", async () => {
    const path = await generatedModel({ shape: { ...modelShapeByName("tiny-qwen3moe")!, nLayers: 6 }, type: "Q8_0", seed: 3, weightStd: 0.08 });
    const expected = singleDevice(path, gen);
    const r = await runRing(path, [...gen, "--keep-all"], 2);
    expect(r.code, r.coordinator.stderr).toBe(0);
    expect(r.coordinator.stderr).toMatch(/routing: each layer's expert hits measured over \d+ tokens/);
    expect(r.report?.devices).toBe(3);
    expect(r.report?.generated_ids).toEqual(expected);
    const uniform = await runRing(path, [...gen, "--keep-all", "--uniform-routing"], 2);
    expect(uniform.code, uniform.coordinator.stderr).toBe(0);
    // measured or kept, the routing is not used: nothing said of it
    expect(uniform.coordinator.stderr).not.toMatch(/routing: each layer's expert hits/);
    expect(uniform.report?.generated_ids).toEqual(expected);
  }, 120_000);

  it("tiny-gemma3 at a batch of 4: its sliding-window layers' rings of 8 rows wrap on every device, the same tokens as one device", async () => {
    const path = await generatedModel({ shape: { ...modelShapeByName("tiny-gemma3")!, nLayers: 6 }, type: "Q8_0", seed: 3, weightStd: 0.08 });
    const args = [...gen, "--batch", "4", "--ctx", "64"];
    const expected = singleDevice(path, args);
    expect(expected.length).toBe(24);
    const r = await runRing(path, [...args, "--layer-windows", "2,2,2"], 2);
    expect(r.code, r.coordinator.stderr).toBe(0);
    expect(r.report?.generated_ids).toEqual(expected);
  }, 90_000);
});
