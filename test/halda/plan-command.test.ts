// prima-coord plan: the table, the JSON, and clear messages with exit code 2 for bad arguments and
// bad device files (never a stack trace), 1 when no plan exists.

import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, test, vi } from "vitest";
import { planCommand } from "../../coordinator/plan-command.js";
import { halda, parseDeviceProfiles, selectDevices, type DroppedDevice } from "../../halda/index.js";
import { modelProfile, modelShapeByName, syntheticModelDescription } from "../../model/index.js";
import { tempDir } from "../helpers/temp.js";
import { generateModel } from "../../modelgen/index.js";

let out: string[] = [], err: string[] = [];
beforeEach(() => {
  out = []; err = [];
  vi.spyOn(console, "log").mockImplementation((...a: unknown[]) => { out.push(a.join(" ")); });
  vi.spyOn(console, "error").mockImplementation((...a: unknown[]) => { err.push(a.join(" ")); });
});
afterEach(() => vi.restoreAllMocks());

const dir = tempDir("prima-plan-");
function file(name: string, text: string): string {
  const p = join(dir, name);
  writeFileSync(p, text);
  return p;
}

describe("prima-coord plan", () => {
  test("the paper's cluster and Llama 3-70B: a table next to the baselines", async () => {
    const code = await planCommand(["--shape", "llama3-70b", "--type", "Q4_K_M", "--devices", "deploy/devices/paper-d1-d4.json"]);
    expect(code).toBe(0);
    const text = out.join("\n");
    for (const name of ["D1-mac-m1", "D2-laptop-i9-rtx3070", "D3-desktop-i9-rtx2080ti", "D4-mate40pro-termux"]) expect(text).toContain(name);
    expect(text).toMatch(/k = 1 cycle, predicted \d+ ms\/token \(runner-up k = 2/);
    expect(text).toMatch(/device +set +window +GPU/);
    for (const b of ["even", "memory", "flops"]) expect(text).toMatch(new RegExp(`^${b} +\\d+ +\\d+\\.\\d\\dx`, "m"));
    expect(err).toEqual([]);
  });

  test("--json carries the same plan Halda computes", async () => {
    const code = await planCommand(["--shape", "llama3-8b", "--type", "Q4_K_M", "--devices", "deploy/devices/paper-d1-d6.json", "--json", "--ctx", "2048"]);
    expect(code).toBe(0);
    const j = JSON.parse(out.join("\n"));
    const devices = parseDeviceProfiles(JSON.parse(readFileSync("deploy/devices/paper-d1-d6.json", "utf8"))).devices;
    const model = modelProfile(syntheticModelDescription(modelShapeByName("llama3-8b")!, "Q4_K_M"), { nCtx: 2048 });
    const expected = selectDevices(devices, model); // what `run` would do
    expect(j.plan.k).toBe(expected.k);
    expect(j.plan.latencyMs).toBeCloseTo(expected.latencyMs, 9);
    expect(j.plan.devices.map((d: { windowLayers: number }) => d.windowLayers)).toEqual(expected.devices.map((d) => d.windowLayers));
    expect(j.model.nCtx).toBe(2048);
    expect(Object.keys(j.baselines)).toEqual(["even", "memory", "flops"]);
  });

  test("-ctk/-ctv: Halda counts the KV cache in its types", async () => {
    const code = await planCommand(["--shape", "llama3-8b", "--type", "Q4_K_M", "--devices", "deploy/devices/paper-d1-d6.json", "--json", "--ctx", "8192", "-ctk", "q8_0", "-ctv", "q4_0"]);
    expect(code).toBe(0);
    const j = JSON.parse(out.join("\n"));
    const hp = modelShapeByName("llama3-8b")!, d = hp.nEmbd / hp.nHead;
    // per layer and token: a K row of 8 heads x 128 in Q8_0 (34 bytes per 32) and a V row in Q4_0 (18)
    expect(j.model.kvBytesPerTokenLayer).toBe(hp.nHeadKv * d * 34 / 32 + hp.nHeadKv * d * 18 / 32);
    const model = modelProfile(syntheticModelDescription(hp, "Q4_K_M"), { nCtx: 8192, kvCacheTypes: { k: "q8_0", v: "q4_0" } });
    expect(j.plan.latencyMs).toBeCloseTo(selectDevices(parseDeviceProfiles(JSON.parse(readFileSync("deploy/devices/paper-d1-d6.json", "utf8"))).devices, model).latencyMs, 9);
  });

  describe("dropped devices on the paper's D1-D6 with Llama 3-70B", () => {
    const args = ["--shape", "llama3-70b", "--type", "Q4_K_M", "--devices", "deploy/devices/paper-d1-d6.json"];
    const devices = parseDeviceProfiles(JSON.parse(readFileSync("deploy/devices/paper-d1-d6.json", "utf8"))).devices;
    const model = modelProfile(syntheticModelDescription(modelShapeByName("llama3-70b")!, "Q4_K_M"), { nCtx: 1024 });
    const fmt = (x: number) => x.toFixed(x >= 100 ? 0 : 2);

    test("each shows its own figures: the best plan with it (over every subset), the chosen plan without it", async () => {
      expect(await planCommand([...args, "--json"])).toBe(0);
      const plan = JSON.parse(out.join("\n")).plan as { latencyMs: number; dropped: DroppedDevice[] };
      expect(plan.dropped.length).toBeGreaterThan(0);
      // Independently: every subset that keeps the head, planned with all its devices.
      const best = new Map<number, number>();
      for (let mask = 0; mask < 2 ** (devices.length - 1); mask++) {
        const subset = devices.map((_, i) => i).filter((i) => i === 0 || (mask & (1 << (i - 1))) !== 0);
        const ms = halda(subset.map((i) => devices[i]), model, { keepAll: true }).latencyMs;
        for (const i of subset) best.set(i, Math.min(best.get(i) ?? Infinity, ms));
      }
      expect(plan.latencyMs).toBeCloseTo(best.get(0)!, 9);
      for (const d of plan.dropped) {
        expect(d.latencyWithMs).toBeCloseTo(best.get(d.index)!, 9);
        expect(d.latencyWithoutMs).toBeCloseTo(plan.latencyMs, 9);
        expect(d.latencyWithMs!).toBeGreaterThan(d.latencyWithoutMs);
      }
      out = [];
      expect(await planCommand(args)).toBe(0);
      const text = out.join("\n");
      for (const d of plan.dropped) {
        expect(text).toContain(`dropped ${d.name}: the ring is faster without it; predicted ${fmt(d.latencyWithMs!)} ms per token with it (its best plan, window of 1), ${fmt(d.latencyWithoutMs)} ms without it`);
      }
    });

    test("--paper-selection: prima.cpp's rule, still each device's own figures (the ring with it added back)", async () => {
      expect(await planCommand([...args, "--json", "--paper-selection"])).toBe(0);
      const plan = JSON.parse(out.join("\n")).plan as { latencyMs: number; devices: { index: number }[]; dropped: DroppedDevice[] };
      expect(plan.dropped.map((d) => d.name)).toEqual(["D4-mate40pro-termux", "D6-macbook-air-intel"]);
      const kept = plan.devices.map((d) => d.index);
      for (const d of plan.dropped) {
        const ring = [...kept, d.index].sort((a, b) => a - b);
        expect(d.latencyWithMs).toBeCloseTo(halda(ring.map((i) => devices[i]), model, { keepAll: true }).latencyMs, 9);
        expect(d.latencyWithoutMs).toBeCloseTo(plan.latencyMs, 9);
      }
      // The two differ: the group's figures would be the same on both lines.
      expect(plan.dropped[0].latencyWithMs).not.toBeCloseTo(plan.dropped[1].latencyWithMs!, 3);
    });

    test("--keep-all places layers on every device", async () => {
      expect(await planCommand([...args, "--json", "--keep-all"])).toBe(0);
      const plan = JSON.parse(out.join("\n")).plan as { latencyMs: number; devices: { windowLayers: number }[]; dropped: DroppedDevice[] };
      expect(plan.devices).toHaveLength(devices.length);
      expect(plan.devices.every((d) => d.windowLayers >= 1)).toBe(true);
      expect(plan.dropped).toEqual([]);
      expect(plan.latencyMs).toBeGreaterThan(halda(devices, model).latencyMs);
    });
  });

  test("a real GGUF file, forced k, faithful mode, no selection", async () => {
    expect(await planCommand(["models/stories260K.gguf", "--devices", "deploy/devices/home-example.json", "-k", "1", "--mode", "prima", "--keep-all"])).toBe(0);
    expect(out.join("\n")).toMatch(/halda-prima: k = 1/);
  });

  const bad: [string, string[], RegExp][] = [
    ["no devices", ["models/stories260K.gguf"], /missing --devices FILE/],
    ["no model", ["--devices", "deploy/devices/paper-d1-d4.json"], /missing the model/],
    ["both model and shape", ["models/stories260K.gguf", "--shape", "llama3-8b", "--type", "F16", "--devices", "x"], /either a model file or --shape\/--type/],
    ["unknown shape", ["--shape", "llama9", "--type", "F16", "--devices", "deploy/devices/paper-d1-d4.json"], /unknown --shape "llama9" \(known: tinyllama-1.1b/],
    ["unknown type", ["--shape", "llama3-8b", "--type", "Q3_XYZ", "--devices", "deploy/devices/paper-d1-d4.json"], /unknown --type "Q3_XYZ"/],
    ["bad ctx", ["models/stories260K.gguf", "--devices", "deploy/devices/paper-d1-d4.json", "--ctx", "lots"], /--ctx must be a whole number >= 1 \(got "lots"\)/],
    ["bad k", ["models/stories260K.gguf", "--devices", "deploy/devices/paper-d1-d4.json", "-k", "0"], /--k must be a whole number >= 1/],
    ["bad mode", ["models/stories260K.gguf", "--devices", "deploy/devices/paper-d1-d4.json", "--mode", "fast"], /--mode must be exact or prima/],
    ["unknown option", ["models/stories260K.gguf", "--devices", "deploy/devices/paper-d1-d4.json", "--fast"], /Unknown option '--fast'/],
    ["missing model file", ["nope.gguf", "--devices", "deploy/devices/paper-d1-d4.json"], /nope\.gguf: cannot open/],
    ["not a GGUF", ["deploy/README.md", "--devices", "deploy/devices/paper-d1-d4.json"], /not a GGUF file/],
    ["missing devices file", ["models/stories260K.gguf", "--devices", "nope.json"], /--devices nope\.json: cannot read: ENOENT/],
    ["devices not JSON", ["models/stories260K.gguf", "--devices", file("bad.json", "{ devices: ")], /not valid JSON/],
    ["device field", ["models/stories260K.gguf", "--devices", file("field.json", JSON.stringify([{ name: "x", os: "linux", cpuFlopsPerS: { "*": 1e11 }, diskSeqReadBytesPerS: 1e9 }]))], /device #0 \(x\): missing ramAvailableBytes/],
    ["k that does not divide", ["--shape", "llama3-70b", "--type", "Q4_K_M", "--devices", "deploy/devices/paper-d1-d4.json", "-k", "3"], /k = 3 does not divide the model's 80 layers/],
  ];
  for (const [what, args, message] of bad) {
    test(`exit 2: ${what}`, async () => {
      expect(await planCommand(args)).toBe(2);
      const text = err.join("\n");
      expect(text).toMatch(message);
      expect(text).not.toMatch(/\n\s+at /); // no stack trace
      expect(out).toEqual([]);
    });
  }

  test("exit 1 with the reason when the model cannot fit", async () => {
    const tiny = file("tiny.json", JSON.stringify([{ name: "pi", os: "linux", cpuFlopsPerS: { "*": 2e10 }, ramAvailableBytes: 3e8, diskSeqReadBytesPerS: 5e7 }]));
    expect(await planCommand(["--shape", "llama3-70b", "--type", "Q4_K_M", "--devices", tiny])).toBe(1);
    expect(err.join("\n")).toMatch(/no plan: the head pi cannot hold one layer/);
    const two = file("two.json", JSON.stringify([
      { name: "a", os: "linux", cpuFlopsPerS: { "*": 2e10 }, ramAvailableBytes: 8e9, diskSeqReadBytesPerS: 5e7 },
      { name: "b", os: "linux", cpuFlopsPerS: { "*": 2e10 }, ramAvailableBytes: 8e9, diskSeqReadBytesPerS: 5e7 },
    ]));
    expect(await planCommand(["--shape", "llama3-70b", "--type", "Q4_K_M", "--devices", two])).toBe(1);
    expect(err.join("\n")).toMatch(/the model does not fit/);
  });

  test("--help", async () => {
    expect(await planCommand(["--help"])).toBe(0);
    expect(out.join("\n")).toMatch(/usage: prima-coord plan model.gguf --devices devices.json/);
  });
});

describe("prima-coord plan on a mixture of experts (#29)", () => {
  test.each([["qwen3-30b-a3b", 128, 8], ["mixtral-8x7b", 8, 2]])("%s: active against total bytes a layer, and the routing it priced", async (shape, n, k) => {
    expect(await planCommand(["--shape", shape, "--type", "Q4_K_M", "--devices", "deploy/devices/paper-d1-d4.json"])).toBe(0);
    const text = out.join("\n");
    expect(text).toMatch(new RegExp(`^experts ${n} a layer, ${k} a token, [\\d.]+ MiB each: a layer is [\\d.]+ GiB in total, [\\d.]+ GiB active per token \\([\\d.]+ %\\)$`, "m"));
    expect(text).toMatch(/^routing uniform, not measured/m);
  });

  test("an overloaded device rereads the routed experts that are not resident, less than the excess a dense layer would", async () => {
    // one Linux box with room for about half of Mixtral 8x7B
    const box = file("moe-box.json", JSON.stringify([{ name: "box", os: "linux", cpuFlopsPerS: { "*": 2e11 }, ramAvailableBytes: 14 * 2 ** 30, diskSeqReadBytesPerS: 2e9, cpuComputeBufferBytes: 2 ** 29 }]));
    expect(await planCommand(["--shape", "mixtral-8x7b", "--type", "Q4_K_M", "--devices", box, "--json"])).toBe(0);
    const j = JSON.parse(out.join("\n"));
    const d = j.plan.devices[0];
    expect(d.set).toBe("M3");
    const bp = j.model.layerBytes + j.model.kvBytesPerTokenLayer * j.model.nCtx;
    const excess = d.layersPerToken * bp - d.ramLayerCapacityBytes;
    expect(j.model.moe.routing).toBe("uniform");
    expect(d.reloadBytesPerToken).toBeGreaterThan(0);
    expect(d.reloadBytesPerToken).toBeLessThan(excess);
  });

  test("--measure-routing runs a model file and says how skewed it found it; not with --shape", async () => {
    const path = join(dir, "tiny-qwen3moe.gguf");
    await generateModel({ shape: "tiny-qwen3moe", type: "F32", out: path, pure: true, seed: 7, weightStd: 0.05 });
    const one = file("one.json", JSON.stringify([{ name: "pi", os: "linux", cpuFlopsPerS: { "*": 2e10 }, ramAvailableBytes: 3e9, diskSeqReadBytesPerS: 5e8 }]));
    expect(await planCommand([path, "--devices", one, "--measure-routing"])).toBe(0);
    expect(out.join("\n")).toMatch(/^routing measured over \d+ tokens: the hottest 2 experts of a layer take [\d.]+ % of its assignments \(uniform: 25.0 %\)$/m);
    // each layer's own reach: a count per layer, each between the k a token runs and all 8
    const reach = /^experts reached by layer \(of 8\): ([\d, ]+)$/m.exec(out.join("\n"));
    const counts = reach![1].split(", ").map(Number);
    expect(counts).toHaveLength(modelShapeByName("tiny-qwen3moe")!.nLayers);
    for (const c of counts) { expect(c).toBeGreaterThanOrEqual(2); expect(c).toBeLessThanOrEqual(8); }
    expect(await planCommand(["--shape", "qwen3-30b-a3b", "--type", "Q4_K_M", "--devices", one, "--measure-routing"])).toBe(2);
    expect(err.join("\n")).toMatch(/--measure-routing runs the model: give a model file/);
  });
});
