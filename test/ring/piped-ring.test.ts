// The piped ring end to end: real worker processes on loopback give exactly the single-device
// tokens (workers' frames on the native lane, and through JS with --no-native-lane), and a worker
// killed mid-generation is named by the coordinator within 2 seconds.
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { modelShapeByName } from "../../model/index.js";
import { killAll, runRing, startCoordinator, startWorker, singleDevice } from "./cluster.js";
import { generatedModel } from "../helpers/models.js";

afterEach(killAll);

const model = "models/stories260K.gguf";
const gen = ["-p", "Once upon a time", "-n", "24", "--temp", "0"];


describe("piped ring on stories260K (5 layers)", () => {
  const expected = singleDevice(model, gen);

  it.each([
    [4, "1,2,1,1"],
    [3, "3,2,0"], // the head holds no layers: it only embeds, closes the cycle and samples
  ])("%i devices, windows %s: the same tokens as one device", async (devices, windows) => {
    const r = await runRing(model, [...gen, "--layer-windows", windows], devices - 1);
    expect(r.code, r.coordinator.stderr).toBe(0);
    expect(r.report?.generated_ids).toEqual(expected);
    expect(r.report?.devices).toBe(devices);
    // Decode-only timings per device: every device that holds layers computed, none stalled on faults.
    const perDevice = r.report!.devices_decode!;
    expect(perDevice.map((d) => d.device).filter((d) => d.includes("head"))).toHaveLength(1);
    expect(perDevice).toHaveLength(devices);
    const withLayers = windows.split(",").map(Number);
    perDevice.forEach((d, i) => {
      if (withLayers[i]! > 0) expect(d.compute_ms, d.device).toBeGreaterThan(0);
      expect(d.wait_ms, d.device).toBeGreaterThanOrEqual(0);
      expect(d.send_ms, d.device).toBeGreaterThanOrEqual(0);
      // Carried from every device (Status.descheduled_ms): part of its compute and sends, never more.
      expect(d.descheduled_ms, d.device).toBeGreaterThanOrEqual(0);
      expect(d.descheduled_ms, d.device).toBeLessThanOrEqual(d.compute_ms + d.send_ms + 1e-9);
    });
  }, 60_000);

  it("a worker killed mid-generation is named within 2 s, and the run goes on without it to the same tokens", async () => {
    const args = ["-n", "100000", "--ctx", "2048", "--temp", "0", "--no-context-shift"];
    const coord = startCoordinator(["run", model, "--port", "0", "--min-workers", "2", "--layer-windows", "2,2,1", "--json", ...args]);
    const port = (await coord.waitFor(/listening for workers on port (\d+)/))[1];
    const a = startWorker(["--join", `127.0.0.1:${port}`, "--model", model, "--name", "alpha", "--once", "--threads", "1"]);
    await coord.waitFor(/"alpha" .*joined/);
    const b = startWorker(["--join", `127.0.0.1:${port}`, "--model", model, "--name", "bravo", "--once", "--threads", "1"]);
    await coord.waitFor(/device w2 "bravo" .* ready/);
    await new Promise((r) => setTimeout(r, 200)); // mid-generation
    const killedAt = Date.now();
    b.child.kill("SIGKILL");
    const named = /device w2 "bravo" \(127\.0\.0\.1\)[^\n]*(failed|disconnected|lost|reset|closed)/;
    const reportedMs = await coord.waitFor(named, 10_000).then(() => Date.now() - killedAt, () => Infinity);
    const code = await coord.exited;
    a.child.kill("SIGKILL");
    const why = `named after ${reportedMs} ms; coordinator's last words:\n${coord.stderr.slice(-1500)}`;
    expect(code, why).toBe(0);
    expect(coord.stderr, why).toMatch(/recovering the request|spreading the layers evenly/);
    // Named (how soon is the liveness benchmarks' business: a loaded machine stretches it).
    expect(reportedMs, why).toBeLessThan(10_000);
    const report = JSON.parse(coord.stdout.split("\n").find((l) => l.startsWith("{"))!) as { generated_ids: number[] };
    expect(report.generated_ids).toEqual(singleDevice(model, args));
  }, 60_000);
});

describe("piped ring with k cycles on a generated 12-layer Q4_K_M model", () => {
  let path = "";
  let expected: number[] = [];
  beforeAll(async () => {
    path = await generatedModel({ shape: { ...modelShapeByName("tiny-llama")!, name: "ring12", nLayers: 12 }, type: "Q4_K_M", seed: 3, weightStd: 0.08 });
    expected = singleDevice(path, gen);
  }, 60_000);

  // devices, cycles, layers per device per cycle (ring order: workers, then the head). One cycle is
  // every other ring test's case; these cover k = 2 and 3 on two, three and four devices, with
  // uneven windows and a window of one layer per device.
  it.each([
    [2, 3, "2,2"], [3, 2, "2,3,1"], [4, 2, "2,1,2,1"], [4, 3, "1,1,1,1"],
  ])("%i devices, k = %i (windows %s): the same tokens as one device", async (devices, k, windows) => {
    const r = await runRing(path, [...gen, "--layer-windows", windows, "-k", String(k)], devices - 1);
    expect(r.code, r.coordinator.stderr).toBe(0);
    expect(r.report?.cycles).toBe(k);
    expect(r.report?.generated_ids).toEqual(expected);
    // The workers' frames ran on the native lane (ring/lane.ts), not through JS.
    for (const w of r.workers) expect(w.stderr).toContain("ring frames run on the native lane");
  }, 60_000);

  it("with --no-native-lane the frames go through JS, with the same tokens", async () => {
    const r = await runRing(path, [...gen, "--layer-windows", "2,3,1", "-k", "2"], 2, ["--no-native-lane"]);
    expect(r.code, r.coordinator.stderr).toBe(0);
    expect(r.report?.generated_ids).toEqual(expected);
    for (const w of r.workers) expect(w.stderr).not.toContain("native lane");
    // with several windows a device, the coordinator says whether each reads ahead, and why (these
    // share one machine: on or off by how much of a CPU reading this disk takes)
    for (const d of ["head", "\"dev1\"", "\"dev2\""]) expect(r.coordinator.stderr).toMatch(new RegExp(`prefetch (on|off) on [^\n]*${d}[^\n]*: [^\n]*(\\d+% of a CPU|CPU share was not measured)`));
  }, 60_000);

  it("a long prompt in small batches: batches of one prompt are on different devices at once", async () => {
    const long = ["-p", "Once upon a time there was a little dog named Max who loved to run in the park with his friends", "-n", "12", "--temp", "0", "-b", "3"];
    const r = await runRing(path, [...long, "--layer-windows", "2,3,1", "-k", "2", "--prefetch"], 2);
    expect(r.code, r.coordinator.stderr).toBe(0);
    expect(r.coordinator.stderr.match(/prefetch on on [^\n]*: --prefetch/g)).toHaveLength(3);
    expect(r.report!.prompt_ids.length).toBeGreaterThan(9);
    expect(r.report?.generated_ids).toEqual(singleDevice(path, long));
  }, 60_000);
});
