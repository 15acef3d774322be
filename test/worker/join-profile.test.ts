// A worker daemon's profile as it joins: measured once at start (a cached pass taken as it is: every
// plan times it again), and before a join once it is older than PROFILE_REFRESH_MS taken again, the
// cache serving all but the one-token pass (timed anew: a daemon's speed moves with its load over hours).
import { afterAll, describe, expect, it, vi } from "vitest";
import { LocalModel } from "../../engine/index.js";
import { parseDeviceReport } from "../../profiler/index.js";
import { joinProfile, PROFILE_REFRESH_MS } from "../../worker/profile-command.js";
import { tempDir } from "../helpers/temp.js";
import { PLACEMENT_SHAPE, testModel } from "../profiler/models.js";

describe("a worker's join profile", async () => {
  const modelPath = await testModel({ ...PLACEMENT_SHAPE, name: "join-profile-test", nLayers: 4 }, "Q8_0");
  const model = LocalModel.open(modelPath, { threads: 2 });
  vi.stubEnv("PRIMA_PROFILE_DIR", tempDir("prima-join-profile-"));
  afterAll(() => {
    model.close();
    vi.unstubAllEnvs();
  });

  it("is taken again before a join only once it is old, and before every plan, from the cache but for the pass", async () => {
    const lines: string[] = [];
    const p = await joinProfile(model, modelPath, "fp", "unit", false, (l) => lines.push(l));
    try {
      const first = parseDeviceReport(p.json());
      expect(first.details.measured).toContain("forward pass");
      lines.length = 0;
      await p.refresh(); // fresh: nothing to do
      expect(lines).toEqual([]);
      const now = Date.now();
      const clock = vi.spyOn(Date, "now").mockReturnValue(now + PROFILE_REFRESH_MS + 1);
      try {
        await p.refresh();
      } finally {
        clock.mockRestore();
      }
      // It says only what it timed anew; everything else came from the cache.
      expect(lines.some((l) => /^profile: forward pass: .*\(timed now; the streamed passes cached\)/.test(l))).toBe(true);
      expect(lines.every((l) => /^profile: (forward pass|profile done)/.test(l))).toBe(true);
      const again = parseDeviceReport(p.json());
      expect(again.details.measured).toEqual([]);
      expect(again.details.kernels).toEqual(first.details.kernels);
      expect(again.details.forward!.windowMs).not.toBe(first.details.forward!.windowMs); // timed again (to the microsecond)
      // Before a plan (the coordinator's timed status) it is taken again however young.
      lines.length = 0;
      expect(await p.retime()).toBe(true);
      expect(lines.some((l) => /^profile: forward pass: .*\(timed now; the streamed passes cached\)/.test(l))).toBe(true);
      expect(parseDeviceReport(p.json()).details.forward!.windowMs).not.toBe(again.details.forward!.windowMs);
    } finally {
      await p.close();
    }
  });

  it("at a daemon's next start takes its pass from the cache (a plan times it again): nothing timed", async () => {
    const lines: string[] = [];
    const p = await joinProfile(model, modelPath, "fp", "unit", false, (l) => lines.push(l));
    try {
      expect(lines.some((l) => /^profile: forward pass: .*\(cached; timed again before a plan\)/.test(l)), lines.join("\n")).toBe(true);
      expect(lines.some((l) => /timed now/.test(l))).toBe(false);
      expect(parseDeviceReport(p.json()).details.measured).toEqual([]);
      // and a plan's retime does time it
      lines.length = 0;
      expect(await p.retime()).toBe(true);
      expect(lines.some((l) => /^profile: forward pass: .*\(timed now; the streamed passes cached\)/.test(l))).toBe(true);
    } finally {
      await p.close();
    }
  });
});
