// Context shift on a ring (issue #33): the head sends a KV_SHIFT frame round the ring in order with
// the rows, every device shifts the windows it holds: the same tokens as one device, on the native
// lane and through JS, with several windows per device (k cycles), and after a worker dies
// mid-generation the journal's replay (the same forwards and shifts) goes on to the same tokens. H2O's
// eviction too: its statistics gathered round the ring in an H2O_SCORES frame.
import { afterEach, describe, expect, it } from "vitest";
import { modelShapeByName } from "../../model/index.js";
import { killAll, runRing, startCoordinator, startWorker, singleDevice } from "./cluster.js";
import { generatedModel } from "../helpers/models.js";

afterEach(killAll);

const model = "models/stories260K.gguf";
// 4x the context: 3 shifts and more
const gen = ["-p", "Once upon a time", "-n", "256", "--ctx", "64", "--keep", "2", "--temp", "0"];


describe("context shift on a two-worker loopback ring", () => {
  const expected = singleDevice(model, gen);

  // H2O scores positions by the attention they received over every layer: each device adds its windows'
  // sums to an H2O_SCORES frame round the ring, and the head evicts as one device holding every layer.
  const h2o = [...gen, "--kv-evict", "h2o", "--kv-budget", "0.25"];
  const expectedH2o = singleDevice(model, h2o);

  it("one device generates 4x its context, by a shift or by H2O's evictions (other tokens)", () => {
    expect(expected.length).toBe(256);
    expect(expectedH2o.length).toBe(256);
    expect(expectedH2o).not.toEqual(expected);
  });

  it.each([
    ["shifts", [] as string[], gen], ["shifts", ["--no-native-lane"], gen],
    ["--kv-evict h2o", [], h2o], ["--kv-evict h2o", ["--no-native-lane"], h2o],
  ])("stories260K, %s, windows 2,2,1 (worker args %j): the single device's tokens", async (_, workerArgs, args) => {
    const r = await runRing(model, [...args, "--layer-windows", "2,2,1"], 2, workerArgs);
    expect(r.code, r.coordinator.stderr).toBe(0);
    expect(r.report?.devices).toBe(3);
    expect(r.report?.generated_ids).toEqual(args === h2o ? expectedH2o : expected);
  }, 90_000);

  it("a 6-layer qwen2 (neox) in 2 cycles: each device shifts both its windows", async () => {
    const path = await generatedModel({ shape: { ...modelShapeByName("tiny-qwen2")!, nLayers: 6 }, type: "Q8_0", seed: 3, weightStd: 0.08 });
    const args = ["-p", "Once upon a time", "-n", "200", "--ctx", "64", "--temp", "0"];
    const want = singleDevice(path, args);
    expect(want.length).toBe(200);
    const r = await runRing(path, [...args, "--layer-windows", "1,1,1", "-k", "2"], 2);
    expect(r.code, r.coordinator.stderr).toBe(0);
    expect(r.report?.cycles).toBe(2);
    expect(r.report?.generated_ids).toEqual(want);
  }, 90_000);

  it.each([
    ["shifts", [] as string[], /context full: shifted the KV cache on every device \(kept 3, dropped 30, 33 left\)[^]*context full/],
    ["H2O evictions", ["--kv-evict", "h2o", "--kv-budget", "0.25"], /context full: evicted by H2O[^]*context full/],
  ])("a worker killed after %s: the replay rebuilds the caches (and H2O's statistics) and the run ends with the same tokens", async (_, extra, shifted) => {
    const args = ["-n", "3000", "--ctx", "64", "--keep", "2", "--temp", "0", ...extra];
    const coord = startCoordinator(["run", model, "--port", "0", "--min-workers", "2", "--layer-windows", "2,2,1", "--json", ...args]);
    const port = (await coord.waitFor(/listening for workers on port (\d+)/))[1];
    startWorker(["--join", `127.0.0.1:${port}`, "--model", model, "--name", "alpha", "--once", "--threads", "1"]);
    await coord.waitFor(/"alpha" .*joined/);
    const b = startWorker(["--join", `127.0.0.1:${port}`, "--model", model, "--name", "bravo", "--once", "--threads", "1"]);
    await coord.waitFor(/device w2 "bravo" .* ready/);
    await coord.waitFor(shifted, 60_000);
    b.child.kill("SIGKILL");
    const code = await coord.exited;
    expect(code, coord.stderr.slice(-1500)).toBe(0);
    expect(coord.stderr).toMatch(/recovering the request|spreading the layers evenly/);
    const report = JSON.parse(coord.stdout.split("\n").find((l) => l.startsWith("{"))!) as { generated_ids: number[] };
    expect(report.generated_ids.length).toBe(3000);
    expect(report.generated_ids).toEqual(singleDevice(model, args));
  }, 120_000);
});
