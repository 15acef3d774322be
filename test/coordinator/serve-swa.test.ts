// serve's prompt cache on a model with sliding-window layers (tiny-gemma3, 4-token windows, --batch 4:
// rings of 8 rows), alone and on a ring of two loopback workers: a prompt that shares only an old
// prefix with the cache runs again from its start (0 cached tokens) rather than failing, one that
// continues the cache reuses it, and both answer as `run` does.
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { generateModel } from "../../modelgen/index.js";
import { killAll } from "../ring/cluster.js";
import { tempDir } from "../helpers/temp.js";
import { joinWorker, runOnce, startServe, until, type Served } from "./serve-harness.js";

afterEach(() => killAll());

const dir = tempDir("prima-serve-swa-");
const path = join(dir, "tiny-gemma3.gguf");
const args = ["--ctx", "128", "--batch", "4"];
beforeAll(async () => {
  await generateModel({ shape: "tiny-gemma3", type: "F32", out: path, pure: true, seed: 7, weightStd: 0.05 });
}, 60_000);

const cached = (u: unknown) => (u as { prompt_tokens_details?: { cached_tokens?: number } }).prompt_tokens_details?.cached_tokens ?? 0;

async function checkPrefixes(s: Served): Promise<void> {
  const first = "Once upon a time there was a little girl named Lily";
  const a = await s.client.completions.create({ prompt: first, max_tokens: 24, temperature: 0 });
  expect(a.usage?.completion_tokens).toBe(24);
  // shares its first tokens, 30 positions behind the cache's end: the rings no longer hold them
  const other = "Once upon a time a dog";
  const b = await s.client.completions.create({ prompt: other, max_tokens: 16, temperature: 0 });
  expect(cached(b.usage)).toBe(0);
  expect(b.choices[0].text).toBe(runOnce(["-p", other, "-n", "16", "--temp", "0", ...args], path).text);
  // continues the cache where it ends: reused
  const more = other + b.choices[0].text;
  const c = await s.client.completions.create({ prompt: more, max_tokens: 8, temperature: 0 });
  expect(cached(c.usage)).toBeGreaterThan(10);
  expect(c.choices[0].text).toBe(runOnce(["-p", more, "-n", "8", "--temp", "0", ...args], path).text);
}

describe("serve on sliding-window layers", () => {
  it("alone: reuses the cache only where the rings still hold the window, and answers as run does", async () => {
    const s = await startServe(args, { model: path });
    try {
      await checkPrefixes(s);
    } finally {
      s.proc.child.kill("SIGKILL");
    }
  }, 60_000);

  it("on a ring of two workers: the same", async () => {
    const s = await startServe([...args, "--min-workers", "2", "--layer-windows", "alpha=1,bravo=1,head=1"], { model: path, waitReady: false });
    joinWorker(s.clusterPort, "alpha", path);
    joinWorker(s.clusterPort, "bravo", path);
    await until(`${s.url}/health`, (st) => st === 200);
    await checkPrefixes(s);
  }, 90_000);
});
