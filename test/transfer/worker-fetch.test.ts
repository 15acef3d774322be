// A worker without its own copy of the model (`prima-worker --join` without --model): it fetches the
// header and only its windows' chunks from the coordinator into a sparse file, the ring's tokens
// equal one device's, a transfer cut halfway resumes, and a chunk corrupted in transit comes again.
import { mkdtempSync, readdirSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { readGguf } from "../../model/index.js";
import { CHUNK_BYTES, chunksFor, rangesForLayers } from "../../transfer/index.js";
import { killAll, startWorker } from "../ring/cluster.js";
import { PLACEMENT_SHAPE, testModel } from "../profiler/models.js";
import { runOnce, startServe, until } from "../coordinator/serve-harness.js";

const PROMPT = "Once upon a time";
let model: string;
let expected: string;
let windowBytes: number;
const dirs: string[] = [];

function cacheDir(): string {
  const d = mkdtempSync(join(tmpdir(), "prima-model-cache-"));
  dirs.push(d);
  return d;
}

function fetchingWorker(clusterPort: number, cache: string) {
  return startWorker(["--join", `127.0.0.1:${clusterPort}`, "--name", "alpha", "--threads", "1", "--model-cache", cache]);
}

const fetchedMiB = (stderr: string) => [...stderr.matchAll(/fetched ([\d.]+) MiB in/g)].reduce((a, m) => a + Number(m[1]), 0);

describe("a worker without the model fetches only its windows", () => {
  beforeAll(async () => {
    model = await testModel(PLACEMENT_SHAPE, "Q8_0");
    expected = runOnce(["-p", PROMPT, "-n", "16", "--temp", "0", "--ctx", "256"], model).text;
    const f = readGguf(model);
    const info = { fileBytes: f.fileBytes, chunkBytes: CHUNK_BYTES };
    windowBytes = chunksFor(rangesForLayers(f, [0, 1, 2, 3]), info).length * CHUNK_BYTES;
  }, 120_000);
  afterEach(() => killAll());
  afterAll(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  const serveArgs = ["--ctx", "256", "--min-workers", "1", "--layer-windows", "alpha=4,head=8"];

  it("joins with an empty cache, holds only its windows in a sparse file, and the ring gives one device's tokens", async () => {
    const s = await startServe(serveArgs, { model, waitReady: false });
    const cache = cacheDir();
    const w = fetchingWorker(s.clusterPort, cache);
    await until(`${s.url}/health`, (st) => st === 200, 60_000);
    const r = await s.client.completions.create({ prompt: PROMPT, max_tokens: 16, temperature: 0 });
    expect(r.choices[0].text).toBe(expected);
    const file = readdirSync(cache).find((f) => f.endsWith(".gguf"))!;
    const st = statSync(join(cache, file));
    expect(st.size).toBe(statSync(model).size);
    // Blocks written: the header and layers 0-3's chunks, not the 8 layers the head runs.
    expect(st.blocks * 512).toBeLessThanOrEqual(windowBytes + 64 * 1024);
    expect(st.blocks * 512).toBeLessThan(0.5 * st.size);
    expect(w.stderr).toMatch(/fetching \d+ chunks .* of this device's windows/);
  }, 90_000);

  it("a transfer cut halfway resumes after a restart, fetching well under twice the window", async () => {
    const s = await startServe(serveArgs, { model, waitReady: false, env: { PRIMA_TEST_CHUNK_DELAY_MS: "400" } });
    const cache = cacheDir();
    const first = fetchingWorker(s.clusterPort, cache);
    // 11 chunks at 0.4 s each: about half are in when it is killed.
    await first.waitFor(/fetching \d+ chunks .* of this device's windows/, 60_000);
    await new Promise((r) => setTimeout(r, 2200));
    first.child.kill("SIGKILL");
    await first.exited;
    const again = fetchingWorker(s.clusterPort, cache);
    await until(`${s.url}/health`, (st) => st === 200, 60_000);
    await again.waitFor(/fetched [\d.]+ MiB in/, 60_000);
    const r = await s.client.completions.create({ prompt: PROMPT, max_tokens: 16, temperature: 0 });
    expect(r.choices[0].text).toBe(expected);
    const secondMiB = Number(/fetching \d+ chunks \(([\d.]+) MiB\)/.exec(again.stderr)?.[1]);
    // The restart asked only for what the first run had not verified.
    expect(secondMiB * 2 ** 20).toBeLessThan(windowBytes);
    expect(fetchedMiB(again.stderr) * 2 ** 20 + 64 * 2 ** 20).toBeLessThan(2 * windowBytes);
  }, 120_000);

  it("a chunk corrupted in transit is noticed and fetched again; the tokens are still one device's", async () => {
    const f = readGguf(model);
    const chunk = chunksFor(rangesForLayers(f, [2]), { fileBytes: f.fileBytes, chunkBytes: CHUNK_BYTES }).at(-1)!; // not the header
    const s = await startServe(serveArgs, { model, waitReady: false, env: { PRIMA_TEST_CORRUPT_CHUNKS: String(chunk) } });
    const w = fetchingWorker(s.clusterPort, cacheDir());
    await until(`${s.url}/health`, (st) => st === 200, 60_000);
    const r = await s.client.completions.create({ prompt: PROMPT, max_tokens: 16, temperature: 0 });
    expect(r.choices[0].text).toBe(expected);
    expect(w.stderr, w.stderr).toMatch(/1 chunk failed its hash and came again/);
  }, 90_000);
});
