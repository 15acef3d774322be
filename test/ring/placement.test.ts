// The cluster places itself: workers measure their devices, the coordinator plans with Halda, drops
// the devices that only slow the ring, runs, and compares its prediction with what it measured.
// End to end on loopback with real processes, given different memory (memory cgroups), CPU (a CPU
// quota) and disk (blkio throttling) so that Halda has something to choose between.
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { describe, expect, it } from "vitest";
import { KEEP_PLAN_WITHIN, formatPlan, placeRing, priceRingWindows, ringPosition, windowsByIndex, type Placement } from "../../coordinator/placement.js";
import { PLANS_KEPT, recallPlan, rememberPlan } from "../../coordinator/plan-memory.js";
import { DecodeMeter } from "../../coordinator/prediction.js";
import { assignmentPlan, halda, selectDevices, type DeviceProfile, type Plan } from "../../halda/index.js";
import { modelProfile, modelShapeByName, syntheticModelDescription } from "../../model/index.js";
import { cgroupLimitForRoom, dropFileCache } from "../../profiler/index.js";
import { blkioProblem, cgroupScope, controllerProblem, diskDeviceOf, root, startIn, type Cgroup } from "../profiler/cgroup.js";
import { PLACEMENT_SHAPE, layerCosts, privateModelCopy, testModel } from "../profiler/models.js";
import { tempDir } from "../helpers/temp.js";

describe("placeRing: Halda's plan in ring order", () => {
  const model = modelProfile(syntheticModelDescription(modelShapeByName("llama3-8b")!, "Q4_K_M"), { nCtx: 1024 });
  const bPrime = model.layerBytes + model.kvBytesPerTokenLayer * model.nCtx;
  /** A device with room for `layers` layers (and half a layer to spare), no compute buffer. */
  const device = (name: string, flops: number, layers: number, head = false): DeviceProfile => ({
    name, os: "linux", cpuFlopsPerS: { "*": flops }, diskSeqReadBytesPerS: 2e9, linkLatencyMs: 0.2, cpuComputeBufferBytes: 0,
    ramAvailableBytes: (layers + 0.5) * bPrime + (head ? model.outputBytes + model.inputBytes / model.nVocab : 0),
  });

  it("maps Halda's head (device 0) to the end of the ring and workers to join order; dropped devices get no window", () => {
    // A slow worker is left with one layer and dropped; the others are all needed to hold the model.
    const p = placeRing(device("head", 1e11, 8, true), [device("w1", 1e11, 14), device("w2", 1e9, 2), device("w3", 1e11, 14)], model);
    expect(p.plan.dropped.map((d) => d.name)).toEqual(["w2"]);
    expect(p.perCycle).toHaveLength(4);
    expect(p.perCycle[1]).toBe(0);
    const byName = new Map(p.plan.devices.map((d) => [d.name, d.windowLayers]));
    expect(p.perCycle).toEqual([byName.get("w1"), 0, byName.get("w3"), byName.get("head")]);
    expect(p.perCycle[3]).toBe(8); // the head fills up first (masterPriority)
    expect(p.perCycle[0]).toBeGreaterThan(0);
    expect(p.perCycle[2]).toBeGreaterThan(0);
    expect(p.perCycle.reduce((a, b) => a + b, 0) * p.cycles).toBe(model.nLayers);
    expect(ringPosition(0, 3)).toBe(3);
    expect(ringPosition(2, 3)).toBe(1);
    expect(p.releaseAfterUse.every((r) => r === false)).toBe(true); // k = 1: nothing to release
  });

  it("drops only the devices that slow the ring, where prima.cpp's rule would drop a needed one", () => {
    // The head and w1 nearly hold the model; w2 and w3 are each left with one layer. Dropping both (the
    // paper's rule) forces an overload; dropping only the slow w3 leaves w2 to take two layers.
    const devices = [device("head", 1e11, 15, true), device("w1", 1e11, 15), device("w2", 1e11, 3), device("w3", 1e10, 40)];
    const paperRule = halda(devices, model, { selection: "paper" });
    expect(paperRule.dropped.map((d) => d.name)).toEqual(["w2", "w3"]);
    const chosen = selectDevices(devices, model);
    expect(halda(devices, model).latencyMs).toBe(chosen.latencyMs); // the default selection
    expect(chosen.dropped.map((d) => d.name)).toEqual(["w3"]);
    expect(chosen.devices.find((d) => d.name === "w2")?.windowLayers).toBeGreaterThanOrEqual(2);
    expect(chosen.latencyMs).toBeLessThan(paperRule.latencyMs);
    // Each device's own figures: w2 with it added back to the paper's ring is that ring's own plan with w2.
    expect(chosen.dropped[0].name).toBe("w3");
    expect(chosen.dropped[0].latencyWithoutMs).toBeCloseTo(chosen.latencyMs, 9);
    expect(chosen.dropped[0].latencyWithMs!).toBeGreaterThan(chosen.latencyMs);
    expect(chosen.dropped[0].reason).toMatch(/predicted [\d.]+ ms per token with it \(its best plan, window of 1\), [\d.]+ ms without it/);
    const w2 = paperRule.dropped.find((d) => d.name === "w2")!;
    expect(w2.latencyWithMs).toBeCloseTo(halda([devices[0], devices[1], devices[2]], model, { keepAll: true }).latencyMs, 9);
    expect(w2.latencyWithMs!).toBeLessThan(w2.latencyWithoutMs);
    // Indices are those of the full list, whatever subset was solved last.
    expect(chosen.devices.map((d) => [d.index, d.name])).toEqual([[0, "head"], [1, "w1"], [2, "w2"]]);
  });

  it("prints each dropped device's own figures; keepAll places layers on every device", () => {
    const head = device("head", 1e11, 15, true);
    const workers = [device("w1", 1e11, 15), device("w2", 1e11, 3), device("w3", 1e10, 40)];
    const labels = ["head", "w1", "w2", "w3"];
    const p = placeRing(head, workers, model);
    const w3 = p.plan.dropped.find((d) => d.name === "w3")!;
    const text = formatPlan(p, labels);
    expect(text).toContain(`${"w3".padEnd(32)} -    dropped (${w3.latencyWithMs!.toFixed(2)} ms with it, ${w3.latencyWithoutMs.toFixed(2)} ms without)`);
    expect(text).toContain(`dropped w3: ${w3.reason}`);
    const all = placeRing(head, workers, model, { keepAll: true });
    expect(all.plan.dropped).toEqual([]);
    expect(all.perCycle.every((w) => w >= 1)).toBe(true);
    expect(all.perCycle.reduce((a, b) => a + b, 0) * all.cycles).toBe(model.nLayers);
    expect(all.plan.latencyMs).toBeGreaterThan(p.plan.latencyMs);
    expect(formatPlan(all, labels)).not.toContain("dropped");
  });

  it("keeps the plan in force where Halda prices it within 5% of its new best, and moves where the new one is worth more", () => {
    // room to spare on every device: windows one layer apart cost nearly the same
    const head = device("head", 1e11, 16, true);
    const workers = [device("w1", 1e11, 16), device("w2", 1e11, 16)];
    const fresh = placeRing(head, workers, model);
    const windows = (p: Placement) => windowsByIndex(p.plan, 3);
    const best = windows(fresh);
    // the layers over all three devices: another plan (Halda leaves one out, a hop fewer), priced a little worse
    const near = [11, 11, 10];
    expect(best).not.toEqual(near);
    // (priced as a hand-made plan is: windows in ring order, the workers then the head)
    expect(priceRingWindows(fresh.devices, model, fresh.perCycle, fresh.cycles).latencyMs).toBeCloseTo(fresh.plan.latencyMs, 6);
    const nearMs = priceRingWindows([head, ...workers], model, [near[1], near[2], near[0]], fresh.cycles).latencyMs;
    expect(nearMs).toBeCloseTo(assignmentPlan([head, ...workers], model, { k: fresh.cycles, windowLayers: near, gpuLayers: [0, 0, 0] }, { ringOrder: [1, 2, 0], overloadReload: "stream" }).latencyMs, 6);
    expect(nearMs).toBeGreaterThan(fresh.plan.latencyMs);
    expect(nearMs).toBeLessThan(fresh.plan.latencyMs * (1 + KEEP_PLAN_WITHIN));
    const kept = placeRing(head, workers, model, {}, { k: fresh.cycles, windowLayers: near, gpuLayers: [0, 0, 0] });
    expect(windows(kept)).toEqual(near);
    expect(kept.plan.latencyMs).toBeCloseTo(nearMs, 6);
    expect(kept.plan.notes.join("\n")).toContain("kept the plan in force");
    expect(kept.perCycle.reduce((a, b) => a + b, 0) * kept.cycles).toBe(model.nLayers);
    // a plan that leaves a device short of room (it would stream) is worth moving from
    const far = [model.nLayers - 2, 1, 1];
    const moved = placeRing(head, workers, model, {}, { k: 1, windowLayers: far, gpuLayers: [0, 0, 0] });
    expect(windows(moved)).toEqual(best);
    // nor is a plan kept against what was asked (--keep-all with a device left out), nor one for other devices
    expect(windows(placeRing(head, workers, model, { keepAll: true }, { k: 1, windowLayers: [...best.slice(0, 2), 0], gpuLayers: [0, 0, 0] }))).toEqual(windows(placeRing(head, workers, model, { keepAll: true })));
    expect(windows(placeRing(head, workers, model, {}, { k: 1, windowLayers: [model.nLayers], gpuLayers: [0] }))).toEqual(best);
  });

  it("does not keep a plan in force that holds more layers beyond the devices' rooms than the new one, however near its price", () => {
    // w2 has room for 9 layers on a disk so fast that a window past its room is priced at almost nothing
    const head = device("head", 1e11, 16, true), w1 = device("w1", 1e11, 16);
    const w2 = { ...device("w2", 1e11, 9), diskSeqReadBytesPerS: 1e13 };
    const fresh = placeRing(head, [w1, w2], model);
    const beyond = (p: Placement) => p.plan.devices.reduce((s, d) => s + d.layersBeyondRoom, 0);
    expect(beyond(fresh)).toBe(0);
    // a plan of an older rule: w2 two layers past its room, priced within KEEP_PLAN_WITHIN of the best
    const stale = [11, 10, 11];
    const staleMs = assignmentPlan([head, w1, w2], model, { k: 1, windowLayers: stale, gpuLayers: [0, 0, 0] }, { ringOrder: [1, 2, 0], overloadReload: "stream" });
    expect(staleMs.devices.find((d) => d.index === 2)!.layersBeyondRoom).toBe(2);
    expect(staleMs.problems).toEqual([]);
    expect(staleMs.latencyMs).toBeLessThan(fresh.plan.latencyMs * (1 + KEEP_PLAN_WITHIN));
    const placed = placeRing(head, [w1, w2], model, {}, { k: 1, windowLayers: stale, gpuLayers: [0, 0, 0] });
    expect(windowsByIndex(placed.plan, 3)).toEqual(windowsByIndex(fresh.plan, 3));
    expect(placed.plan.notes.join("\n")).not.toContain("kept the plan in force");
    // the same windows with w2 in its room are kept (the price alone decides)
    const roomy = [12, 11, 9];
    expect(windowsByIndex(placeRing(head, [w1, w2], model, {}, { k: 1, windowLayers: roomy, gpuLayers: [0, 0, 0] }).plan, 3)).toEqual(roomy);
  });

  it("remembers the last plan per key in the profile folder, and a damaged file is no memory", () => {
    const dir = tempDir("prima-plans-");
    expect(recallPlan("a", dir)).toBeUndefined();
    rememberPlan("a", { k: 1, windowLayers: [3, 4, 5] }, dir);
    rememberPlan("b", { k: 2, windowLayers: [1, 2] }, dir);
    expect(recallPlan("a", dir)).toEqual({ k: 1, windowLayers: [3, 4, 5], gpuLayers: [0, 0, 0] });
    rememberPlan("a", { k: 1, windowLayers: [4, 4, 4] }, dir);
    expect(recallPlan("a", dir)?.windowLayers).toEqual([4, 4, 4]);
    expect(recallPlan("b", dir)?.k).toBe(2);
    for (let i = 0; i < PLANS_KEPT; i++) rememberPlan(`x${i}`, { k: 1, windowLayers: [1] }, dir);
    expect(recallPlan("a", dir)).toBeUndefined(); // the oldest forgotten first
    writeFileSync(join(dir, "plans.json"), "{ not json");
    expect(recallPlan("x1", dir)).toBeUndefined();
    writeFileSync(join(dir, "plans.json"), JSON.stringify({ version: 1, plans: [{ key: "h", k: 1, windowLayers: [-1, 2] }, { key: "g", k: 1, windowLayers: [2, 2] }] }));
    expect(recallPlan("h", dir)).toBeUndefined(); // a hostile entry is skipped, the others stand
    expect(recallPlan("g", dir)?.windowLayers).toEqual([2, 2]);
  });

  it("releases windows after use on overloaded devices that run several windows per token", () => {
    const p = placeRing(device("head", 1e11, 6, true), [device("w1", 1e11, 6)], model, { k: 4, dropWindowLayers: 0 });
    expect(p.cycles).toBe(4);
    const sets = new Map(p.plan.devices.map((d) => [d.index, d.set]));
    expect(p.releaseAfterUse).toEqual([sets.get(1) !== "M4", sets.get(0) !== "M4"]);
    expect(p.releaseAfterUse).toContain(true);
  });

  it("DecodeMeter times only one-token steps after the prompt and calls back once before them", async () => {
    let calls = 0;
    const inner = { nCtx: 64, forward: async () => new Float32Array(1), truncate: () => undefined };
    const m = new DecodeMeter(inner, async () => { calls++; });
    await m.forward(new Float32Array(4), 0, 4); // prompt
    expect(calls).toBe(0);
    for (let pos = 4; pos < 9; pos++) await m.forward(new Float32Array(1), pos, 1);
    expect(calls).toBe(1);
    expect(m.decodeSteps).toBe(5);
    expect(m.meanDecodeMs).toBeGreaterThanOrEqual(0);
  });
});

// ---- end to end --------------------------------------------------------------------------------

const coordCli = join(root, "dist/coordinator/cli.js");
const workerCli = join(root, "dist/worker/cli.js");
const memProblem = controllerProblem("memory");
const cpuProblem = controllerProblem("cpu");
const e2eProblem = memProblem ?? cpuProblem;
if (e2eProblem) console.warn(`placement.test: end-to-end placement skipped: ${e2eProblem}`);

interface RunJson {
  prompt_ids: number[];
  generated_ids: number[];
  devices: number;
  layer_windows: number[];
  devices_status: { device: string; status: { memPressure: number; windows: unknown[] } }[];
  placement: {
    plan: Plan;
    labels: string[];
    devices: DeviceProfile[];
    per_cycle: number[];
    model: { nKvForFlops: number };
    prediction: { predictedTokenMs: number; measuredTokenMs: number; error: number; decodeTokens: number; rows: { label: string; measured: { memPressure: number } }[] };
  };
}

describe.skipIf(e2eProblem !== null)(`the ring places itself${e2eProblem ? ` (skipped: ${e2eProblem})` : ""}`, () => {
  const tag = `prima-place-${process.pid}`;
  const scope = cgroupScope();

  const ctx = 256, nPredict = 48;
  // One compute thread per device: four devices share this machine's cores, and a device whose two
  // threads share them with its neighbours' event loops would not run as a device of its own does.
  const gen = ["-p", "Once upon a time", "-n", String(nPredict), "--temp", "0", "--ctx", String(ctx)];

  /** One placed run: fresh profiles (measured just before it), cgroup limits, three workers. */
  // The slow worker's profile is measured once (under its limits) and kept; the others' afresh each time.
  // (made by the first test that needs it: at collection time it was made, and left behind, by runs
  // that filter these tests out)
  let slowCache: string | undefined;

  async function attempt(modelPath: string, n: number, bPrime: number, scratch: number) {
    const cacheDir = scope.tempDir("prima-place-profiles-");
    const env = { PRIMA_PROFILE_DIR: cacheDir };
    const slowEnv = { PRIMA_PROFILE_DIR: (slowCache ??= scope.tempDir("prima-place-slow-")) };
    const make = (name: string) => scope.group(`${tag}-${n}-${name}`).add("memory");
    const head = make("head"), g1 = make("w1"), g2 = make("w2"), g3 = make("w3");
    // The fourth device: a quarter of a CPU, and where the disk allows, reads throttled to 20 MB/s.
    g3.add("cpu", { "cpu.cfs_period_us": 20000, "cpu.cfs_quota_us": 5000 });
    g3.set("memory", "memory.limit_in_bytes", 512 * 2 ** 20);
    const dev = diskDeviceOf(dirname(modelPath));
    const diskProblem = blkioProblem(dev);
    if (diskProblem) console.warn(`placement.test: no disk throttling for the slow worker: ${diskProblem}`);
    else g3.add("blkio", { "blkio.throttle.read_bps_device": `${dev} 20000000` });

    // Profiles first, each device's own (the slow one under its limits), then the unconstrained
    // machine, which the head and the two other workers read from the cache: the run follows within
    // seconds, so it sees the load the profile saw.
    // Shorter timings (--quick): what the test reads from them is the quarter CPU's and the throttled
    // disk's fourfold gaps, not their last percent (the plan times every pass again anyway).
    const slowProfile = startIn([g3], [workerCli, "profile", "--quick", "--model", modelPath, "--threads", "1"], slowEnv);
    expect(await slowProfile.exited, slowProfile.stderr).toBe(0);
    execFileSync(process.execPath, [workerCli, "profile", "--quick", "--model", modelPath, "--threads", "1"], { cwd: root, env: { ...process.env, ...env }, stdio: "ignore" });
    // Each device pages its own windows in, charged to its own cgroup.
    dropFileCache(modelPath);

    // Capacities in layers, set through memory limits: b' (a layer with its KV cache) plus the scratch
    // of a window, as the profiler reads room, on top of what the process already holds.
    const limitFor = (g: Cgroup, layers: number) => {
      g.set("memory", "memory.limit_in_bytes", cgroupLimitForRoom(g.memoryHeld(), layers * bPrime + scratch));
    };
    const coord = startIn([head], [coordCli, "run", modelPath, "--port", "0", "--min-workers", "3", "--threads", "1", "--json", ...gen], env);
    const port = (await coord.waitFor(/listening for workers on port (\d+)/))[1];
    const joinWorker = async (g: Cgroup, name: string, layers?: number) => {
      const p = startIn([g], [workerCli, "--join", `127.0.0.1:${port}`, "--model", modelPath, "--name", name, "--once", "--threads", "1"], g === g3 ? slowEnv : env);
      await coord.waitFor(new RegExp(`"${name}" .*joined`), 40_000);
      if (layers !== undefined) limitFor(g, layers);
      return p;
    };
    const workers = [await joinWorker(g1, "alpha", 6.5), await joinWorker(g2, "bravo", 3.5)];
    // The head's own use grows as workers connect: its limit is set last, just before it plans.
    limitFor(head, 4.5);
    workers.push(await joinWorker(g3, "delta"));
    const code = await Promise.race([coord.exited, new Promise((r) => setTimeout(() => r("timeout"), 40_000))]);
    expect(code, coord.stderr).toBe(0);
    await Promise.all(workers.map((w) => Promise.race([w.exited, new Promise((r) => setTimeout(r, 3000))])));
    const r = JSON.parse(coord.stdout.split("\n").find((l) => l.startsWith("{"))!) as RunJson;
    return { r, coord, workers, diskProblem };
  }

  it("three workers with different limits get different windows, the slow one takes no part, and the prediction is printed", async () => {
    const modelPath = privateModelCopy(await testModel(PLACEMENT_SHAPE, "Q8_0"), scope.tempDir("prima-place-model-"));
    // What one device generates, for the ring to match token for token.
    const alone = JSON.parse(execFileSync(process.execPath, [coordCli, "run", modelPath, "--json", ...gen], { encoding: "utf8", cwd: root })) as RunJson;
    const { bPrime, scratch } = layerCosts(modelPath, ctx);

    // This machine is shared: other programs can halve its speed between a profile and a run seconds
    // later, and other test files run beside this one. What follows from memory limits and the plan
    // is checked on every attempt; what rests on timing (the quarter-CPU worker measured slow and so
    // dropped) must hold on one of up to four attempts. How close the prediction comes to the measured
    // token is a speed figure, printed here and judged by `npm run bench -- --only capped`.
    const errors: string[] = [];
    const started = Date.now();
    for (let n = 0; n < 4 && (n === 0 || Date.now() - started < 150_000); n++) {
      const { r, coord, workers, diskProblem } = await attempt(modelPath, n, bPrime, scratch);
      const pl = r.placement;
      const windowOf = (i: number) => pl.per_cycle[ringPosition(i, 3)];
      const planText = coord.stderr.split("\n").filter((l) => /profile (head|w)|^w\d|^head|^dropped|^note|plan:/.test(l)).join("\n");
      // Halda saw the limits: less memory, less room; a throttled disk, a slow disk.
      const ram = pl.devices.map((d) => d.ramAvailableBytes);
      expect(ram[1]).toBeGreaterThan(ram[2]);
      if (!diskProblem) expect(pl.devices[3].diskSeqReadBytesPerS).toBeLessThan(30e6);
      expect(pl.devices[1].diskSeqReadBytesPerS).toBeGreaterThan(pl.devices[3].diskSeqReadBytesPerS!);

      // Different limits, different windows: the worker with more memory takes more layers.
      expect(pl.per_cycle.reduce((a, b) => a + b, 0)).toBe(PLACEMENT_SHAPE.nLayers);
      expect(windowOf(0), planText).toBeGreaterThan(0);
      expect(windowOf(2), planText).toBeGreaterThan(0);
      expect(windowOf(1), planText).toBeGreaterThan(windowOf(2));
      // Each window fits its device's memory, or the plan counts the weights it must read again: its
      // excess, as a device that keeps its window's first layers and drops the rest after each pass does.
      for (const d of pl.plan.devices) {
        if (d.set === "M4") expect(d.windowLayers * bPrime, d.name).toBeLessThanOrEqual(d.ramLayerCapacityBytes);
        else {
          expect(d.set, d.name).toBe("M3");
          expect(d.reloadBytesPerToken, d.name).toBeCloseTo(d.windowLayers * bPrime - d.ramLayerCapacityBytes, -3);
        }
      }
      // Devices Halda drops take no part: no assignment, and the ring runs through the others only.
      for (const d of pl.plan.dropped) {
        expect(windowOf(d.index)).toBe(0);
        expect(workers[d.index - 1].stderr).not.toMatch(/assigned layers/);
        expect(coord.stderr).toContain(`${pl.labels[d.index]} takes no layers and stays out of the ring`);
      }
      expect(r.devices).toBe(pl.plan.devices.length);
      expect(r.generated_ids).toEqual(alone.generated_ids);
      // Every worker timed its pass again when the plan asked, after it had joined, its streamed
      // passes from the cache though its memory limit (and so the layers it times in memory) changed.
      for (const w of workers) {
        expect(w.stderr.slice(w.stderr.indexOf("joined ")), w.stderr).toMatch(/profile: forward pass: [\d.]+ ms for \d+ layers? .*\(timed now; the streamed passes cached\)/);
      }

      // The plan and the comparison were printed.
      expect(coord.stderr).toMatch(/plan: Halda .* predicted [\d.]+ ms per token/);
      expect(coord.stderr).toMatch(/token latency: predicted [\d.]+ ms, measured [\d.]+ ms/);
      const pr = pl.prediction;
      expect(pr.decodeTokens).toBeGreaterThan(nPredict / 2);
      // attention priced at the cache a decode step attends to on average: the prompt and half of -n
      // (padded to 32 tokens, as llama.cpp pads the cache), not the whole run's
      expect(pl.model.nKvForFlops).toBe(Math.min(ctx, 32 * Math.ceil((r.prompt_ids.length + nPredict / 2) / 32)));
      expect(pl.model.nKvForFlops).toBeLessThan(32 * Math.ceil((r.prompt_ids.length + nPredict) / 32));

      // Memory pressure stays below 6 % of each device's memory (its cgroup limit).
      for (const row of pr.rows) expect(row.measured.memPressure, row.label).toBeLessThan(0.06);
      for (const s of r.devices_status) expect(s.status.memPressure, s.device).toBeLessThan(0.06);

      const slowFlops = pl.devices[3].cpuFlopsPerS.Q8_0, fastFlops = pl.devices[1].cpuFlopsPerS.Q8_0;
      const error = Math.abs(pr.measuredTokenMs - pr.predictedTokenMs) / pr.measuredTokenMs;
      const line = `attempt ${n + 1}: windows ${JSON.stringify(pl.per_cycle)}, dropped ${JSON.stringify(pl.plan.dropped.map((d) => d.name))}, ` +
        `slow worker ${(slowFlops / 1e9).toFixed(1)} vs ${(fastFlops / 1e9).toFixed(1)} GFLOP/s, predicted ${pr.predictedTokenMs.toFixed(2)} ms, ` +
        `measured ${pr.measuredTokenMs.toFixed(2)} ms per token (${(100 * error).toFixed(0)}% off)`;
      console.log(`placement: ${line}`);
      errors.push(`${line}\n${coord.stderr.split("\n").filter((l) => /predicted|^w\d|^head|token latency/.test(l)).join("\n")}`);
      if (slowFlops < 0.7 * fastFlops && windowOf(3) === 0) return;
    }
    expect.fail(`no attempt had the slow worker measured slow and dropped:\n${errors.join("\n")}`);
  }, 240_000);
});
