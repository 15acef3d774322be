// A fetching worker (no --model) when things go wrong around it (issue #36, finding 5): its
// coordinator killed mid-fetch and started again, a model cache on a disk with too little room, and
// a disk that fills up mid-fetch. Small disks are tmpfs mounts (root only).
import { execFileSync } from "node:child_process";
import { closeSync, openSync, writeSync } from "node:fs";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { runOnce, startServe, until } from "../coordinator/serve-harness.js";
import { root, startNode } from "../helpers/process.js";
import { canMount, tempDir, tmpfsDir } from "../helpers/temp.js";
import { PLACEMENT_SHAPE, testModel } from "../profiler/models.js";
import { killAll } from "../ring/cluster.js";

const PROMPT = "Once upon a time";
const serveArgs = ["--ctx", "256", "--min-workers", "1", "--layer-windows", "alpha=4,head=8"];
let model: string;
let expected: string;
// The workers' caches (profiles, chunk hashes) in a temporary XDG folder, shared by this file's
// workers: the device is profiled once.
const xdg = tempDir("prima-fetch-faults-xdg-");

/** A worker without --model, fetching into `cache`. */
function fetchingWorker(clusterPort: number, cache: string) {
  return startNode([`${root}dist/worker/cli.js`, "--join", `127.0.0.1:${clusterPort}`, "--name", "alpha", "--threads", "1", "--model-cache", cache], { XDG_CACHE_HOME: xdg });
}

/** Fills the file system under dir to the last byte (a file of its own there). */
function fillDisk(dir: string): void {
  const fd = openSync(join(dir, "filler"), "w");
  const block = Buffer.alloc(1 << 20, 1);
  try {
    for (;;) writeSync(fd, block);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOSPC") throw e;
  } finally {
    closeSync(fd);
  }
}

const chunksAsked = (stderr: string) => [...stderr.matchAll(/fetching \d+ chunks \(([\d.]+) MiB\)/g)].map((m) => Number(m[1]));

beforeAll(async () => {
  model = await testModel(PLACEMENT_SHAPE, "Q8_0");
  expected = runOnce(["-p", PROMPT, "-n", "16", "--temp", "0", "--ctx", "256"], model).text;
}, 120_000);
afterEach(() => killAll());
afterAll(() => killAll());

describe("a fetching worker whose coordinator goes away", () => {
  it("waits when the coordinator is killed mid-fetch, resumes the fetch when it is back, and serves", async () => {
    const first = await startServe(serveArgs, { model, waitReady: false, env: { PRIMA_TEST_CHUNK_DELAY_MS: "400" } });
    const w = fetchingWorker(first.clusterPort, tempDir("prima-fetch-faults-cache-"));
    // At least one chunk of the windows written (the first progress line comes with the first chunk).
    await w.waitFor(/fetching layers: fetched [\d.]+ of [\d.]+ MiB/, 120_000);
    first.proc.child.kill("SIGKILL");
    await first.proc.exited;
    await w.waitFor(/waiting for the coordinator at 127\.0\.0\.1:\d+/, 60_000);
    expect(w.child.exitCode, w.stderr).toBeNull();
    // The same cluster (its token and port) started again, without the slow chunks.
    const again = await startServe([...serveArgs, "--cluster-port", String(first.clusterPort)], { model, waitReady: false });
    await until(`${again.url}/health`, (st) => st === 200, 120_000);
    const r = await again.client.completions.create({ prompt: PROMPT, max_tokens: 16, temperature: 0 });
    expect(r.choices[0].text).toBe(expected);
    expect(w.child.exitCode, w.stderr).toBeNull();
    expect(w.stderr).not.toMatch(/exit code/);
    // Resumed: the second fetch asked only for what the first had not written.
    const asked = chunksAsked(w.stderr);
    expect(asked.length, w.stderr).toBe(2);
    expect(asked[1]).toBeLessThan(asked[0]);
  }, 300_000);
});

describe.runIf(canMount)("a fetching worker short of disk", () => {
  it("is refused naming the bytes while its cache's disk has too little room, and admitted once it has", async () => {
    // Room for the header's 4 MiB chunk, not for the disk probe beside it.
    const disk = tmpfsDir("prima-fetch-faults-disk-", "5m");
    const s = await startServe(serveArgs, { model, waitReady: false });
    const w = fetchingWorker(s.clusterPort, join(disk, "cache"));
    await s.proc.waitFor(/refused a worker from [^\n]*too little disk under [^\n]* for the disk probe: \d+ bytes needed free [^\n]*, \d+ bytes free/, 120_000);
    await w.waitFor(/refused this worker: [^\n]*too little disk under [^\n]*: \d+ bytes needed free [^\n]*, \d+ bytes free/, 30_000);
    // Room made: the worker's next join profiles again and is admitted; the windows fit.
    execFileSync("mount", ["-o", "remount,size=96m", disk]);
    await until(`${s.url}/health`, (st) => st === 200, 180_000);
    const r = await s.client.completions.create({ prompt: PROMPT, max_tokens: 16, temperature: 0 });
    expect(r.choices[0].text).toBe(expected);
    expect(w.child.exitCode, w.stderr).toBeNull();
  }, 300_000);

  it("assigned windows its cache's disk cannot hold: says the bytes, stays, and serves once room is made", async () => {
    // Room for the header and the profile, not for the windows' 44 MiB.
    const disk = tmpfsDir("prima-fetch-faults-disk-", "24m");
    const s = await startServe(serveArgs, { model, waitReady: false });
    const w = fetchingWorker(s.clusterPort, join(disk, "cache"));
    await w.waitFor(/not enough room for this device's windows: \d+ bytes \([\d.]+ MiB\) needed, \d+ bytes \([\d.]+ MiB\) free on the disk of/, 180_000);
    execFileSync("mount", ["-o", "remount,size=96m", disk]);
    await until(`${s.url}/health`, (st) => st === 200, 180_000);
    const r = await s.client.completions.create({ prompt: PROMPT, max_tokens: 16, temperature: 0 });
    expect(r.choices[0].text).toBe(expected);
    expect(w.child.exitCode, w.stderr).toBeNull();
  }, 300_000);

  it("ends with exit code 7 when the disk fills up mid-fetch, naming the cache", async () => {
    const disk = tmpfsDir("prima-fetch-faults-disk-", "96m");
    const cache = join(disk, "cache");
    const s = await startServe(serveArgs, { model, waitReady: false, env: { PRIMA_TEST_CHUNK_DELAY_MS: "400" } });
    const w = fetchingWorker(s.clusterPort, cache);
    await w.waitFor(/fetching layers: fetched [\d.]+ of [\d.]+ MiB/, 120_000);
    fillDisk(disk);
    expect(await w.exited, w.stderr).toBe(7);
    expect(w.stderr).toMatch(new RegExp(`the disk of the model cache ${cache} filled up while fetching the model \\(\\d+ bytes free now\\): .*\\(exit code 7\\)`));
  }, 300_000);
});
