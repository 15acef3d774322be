// Expert residency of a MoE window on the dashboard's state and /metrics: serve alone on a generated
// tiny MoE model reports, per window, experts resident of all of them (one per MoE layer and expert,
// taken from the model's shape), and /metrics says the same numbers as /api/state.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { modelShapeByName } from "../../model/index.js";
import { generateModel } from "../../modelgen/index.js";
import { startServe, until, type Served } from "./serve-harness.js";

const dir = mkdtempSync(join(tmpdir(), "prima-moe-residency-"));
const model = join(dir, "tiny-qwen3moe.gguf");
let s: Served | undefined;

beforeAll(async () => {
  await generateModel({ shape: "tiny-qwen3moe", type: "Q8_0", out: model, pure: true, seed: 3, weightStd: 0.05 });
  s = await startServe(["--ctx", "128"], { model });
}, 120_000);
afterAll(async () => {
  s?.proc.child.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});

interface StateWindow { firstLayer: number; endLayer: number; expertsResident?: number | null; expertsTotal?: number | null }
interface State { devices: { id: string; windows: StateWindow[] }[] }

it("shows experts resident / total per MoE window in /api/state and /metrics", async () => {
  const shape = modelShapeByName("tiny-qwen3moe")!;
  await s!.client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "Hello there" }], max_tokens: 4 });
  const state = await until<State>(`${s!.url}/api/state`, (st, b) => st === 200 && b.devices.some((d) => d.windows.some((w) => typeof w.expertsTotal === "number")));
  const windows = state.devices.flatMap((d) => d.windows.map((w) => ({ device: d.id, ...w })));
  const total = windows.reduce((a, w) => a + (w.expertsTotal ?? 0), 0);
  expect(total).toBe(shape.nLayers * shape.nExpert!);
  const metrics = await (await fetch(`${s!.url}/metrics`)).text();
  for (const w of windows) {
    const labels = `device="${w.device}",`;
    const line = (name: string) => metrics.split("\n").find((l) => l.startsWith(`${name}{${labels}`) && l.includes(`layers="${w.firstLayer}-${w.endLayer}"`));
    expect(line("prima_window_experts")).toMatch(new RegExp(` ${w.expertsTotal}$`));
    expect(line("prima_window_experts_resident")).toMatch(new RegExp(` ${w.expertsResident}$`));
    // the request routed its tokens through at least nExpertUsed experts in every MoE layer it ran
    expect(w.expertsResident!).toBeGreaterThanOrEqual(shape.nExpertUsed! * (w.endLayer - w.firstLayer));
    expect(w.expertsResident!).toBeLessThanOrEqual(w.expertsTotal!);
  }
}, 120_000);
