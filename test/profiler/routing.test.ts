// The routing skew measured on a generated mixture of experts: one pass of a short text, each layer's
// expert hits as a share by rank, stored with the model profile; Halda prices it.
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { LocalModel } from "../../engine/index.js";
import { predictLatency } from "../../halda/index.js";
import { generateModel } from "../../modelgen/index.js";
import { describeModel, modelProfile, modelShapeByName, readGguf } from "../../model/index.js";
import { cachedExpertRouting, measureExpertRouting } from "../../profiler/index.js";

const dir = mkdtempSync(join(tmpdir(), "prima-routing-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("measureExpertRouting", () => {
  it.each(["tiny-qwen3moe", "tiny-mixtral", "tiny-gpt-oss"])("%s: a share per expert rank, hottest first, from one pass", async (shape) => {
    const out = join(dir, `${shape}.gguf`);
    await generateModel({ shape, type: "F32", out, pure: true, seed: 7, weightStd: 0.05 });
    const s = modelShapeByName(shape)!;
    const profile = modelProfile(describeModel(readGguf(out)), { nCtx: 64 });
    expect(profile.moe!.routing).toBe("uniform");
    const m = LocalModel.open(out, { threads: 2 });
    let measured;
    try {
      measured = await measureExpertRouting(m, profile, { maxTokens: 32 });
    } finally {
      m.close();
    }
    const x = measured.moe!;
    expect(x.routing).toBe("measured");
    expect(x.routingTokens).toBeGreaterThan(8);
    expect(x.routingTokens).toBeLessThanOrEqual(32);
    expect(x.routingShare.length).toBe(s.nExpert);
    expect(x.routingShare.reduce((a, b) => a + b, 0)).toBeCloseTo(1, 9);
    for (let i = 1; i < x.routingShare.length; i++) expect(x.routingShare[i]).toBeLessThanOrEqual(x.routingShare[i - 1]);
    // a token's k experts are distinct: no rank takes more than 1/k; a few dozen tokens are not uniform
    expect(x.routingShare[0]).toBeLessThanOrEqual(1 / s.nExpertUsed! + 1e-12);
    expect(x.routingShare[0]).toBeGreaterThan(1 / s.nExpert!);
    // Halda takes the measured skew: a device with room for about half the layers rereads no more than uniform
    const room = measured.layerBytes * 0.6 * measured.nLayers + measured.outputBytes + 2 ** 20;
    const device = { name: "d", os: "linux" as const, cpuFlopsPerS: { "*": 1e10 }, ramAvailableBytes: room, diskSeqReadBytesPerS: 1e9, cpuComputeBufferBytes: 2 ** 20 };
    const reread = (p: typeof profile) => predictLatency([device], p, { k: 1, windowLayers: [p.nLayers], gpuLayers: [0] }).devices[0]!.reloadBytesPerToken;
    expect(reread(measured)).toBeLessThanOrEqual(reread(profile));
    expect(reread(profile)).toBeGreaterThan(0);
  });
});

describe("cachedExpertRouting", () => {
  it("measures each layer once per model, keeps it, and measures again over a file that is not this model's", async () => {
    const out = join(dir, "cached-qwen3moe.gguf");
    await generateModel({ shape: "tiny-qwen3moe", type: "F32", out, pure: true, seed: 3, weightStd: 0.05 });
    const profile = modelProfile(describeModel(readGguf(out)), { nCtx: 64 });
    const cache = join(dir, "routing-cache");
    const m = LocalModel.open(out, { threads: 2 });
    try {
      const lines: string[] = [];
      const first = await cachedExpertRouting(m, profile, "fp-1", (l) => lines.push(l), cache);
      expect(lines.filter((l) => /measured over \d+ tokens/.test(l))).toHaveLength(1);
      const byLayer = first.moe!.routingShareByLayer!;
      expect(byLayer).toHaveLength(profile.nLayers);
      for (const s of byLayer) {
        expect(s.reduce((a, b) => a + b, 0)).toBeCloseTo(1, 9);
        for (let i = 1; i < s.length; i++) expect(s[i]).toBeLessThanOrEqual(s[i - 1]);
      }
      // the mean of the layers' shares is the averaged p̄
      for (let i = 0; i < byLayer[0].length; i++) expect(first.moe!.routingShare[i]).toBeCloseTo(byLayer.reduce((a, s) => a + s[i], 0) / byLayer.length, 12);
      const again = await cachedExpertRouting(m, profile, "fp-1", (l) => lines.push(l), cache);
      const measured = () => lines.filter((l) => /measured over \d+ tokens/.test(l)).length;
      expect([measured(), lines.length]).toEqual([1, 2]);
      expect(lines[1]).toMatch(/as measured before over \d+ tokens \(kept for this model\)/);
      expect(again.moe).toEqual(first.moe);
      // another model's fingerprint, and a damaged file: measured afresh
      await cachedExpertRouting(m, profile, "fp-2", (l) => lines.push(l), cache);
      expect(measured()).toBe(2);
      for (const f of readdirSync(cache)) writeFileSync(join(cache, f), '{"version":1,"fingerprint":"fp-1","tokens":4,"hits":[[1e999]]}');
      const mended = await cachedExpertRouting(m, profile, "fp-1", (l) => lines.push(l), cache);
      expect(measured()).toBe(3);
      expect(mended.moe).toEqual(first.moe);
    } finally {
      m.close();
    }
  });
});
