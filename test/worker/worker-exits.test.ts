// prima-worker as a real process (issue #17): setup errors that cannot fix themselves end it with their
// own exit code; a coordinator that refuses its model is asked again, said once; the first SIGINT or
// SIGTERM stops it at once, waiting or mid-run; and a model file truncated under a running worker is
// reported by name (the worker leaves the ring with exit code 5) instead of killing it with SIGBUS.
import { copyFileSync, mkdirSync, statSync, symlinkSync, truncateSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { WorkerRegistry } from "../../coordinator/registry.js";
import { modelFingerprint, readGguf } from "../../model/index.js";
import { root } from "../helpers/process.js";
import { killAll, startCoordinator, startWorker, type Proc } from "../ring/cluster.js";
import { testIdentity, testTrust } from "../helpers/trust.js";
import { tempDir } from "../helpers/temp.js";

/** A token for the workers that dial a test registry (or nothing at all). */
const TOKEN = ["--token", (await testIdentity()).tokenText];

const model = "models/stories260K.gguf";
const fingerprint = modelFingerprint(readGguf(`${root}${model}`));
const dir = tempDir("prima-worker-exits-");

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  killAll();
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** The exit code, or "running" if the process has not exited within ms. */
function exitWithin(p: Proc, ms: number): Promise<number | null | "running"> {
  return Promise.race([p.exited, new Promise<"running">((r) => setTimeout(() => r("running"), ms))]);
}

function count(text: string, re: RegExp): number {
  return text.match(new RegExp(re.source, "g"))?.length ?? 0;
}

describe("prima-worker setup errors", () => {
  it("exits with code 4 when its --port is taken", async () => {
    const taken: Server = createServer();
    await new Promise<void>((r) => taken.listen(0, "0.0.0.0", () => r()));
    cleanups.push(() => new Promise((r) => taken.close(r)));
    const port = (taken.address() as { port: number }).port;
    const w = startWorker(["--join", "127.0.0.1:9", "--model", model, "--port", String(port), "--threads", "1", ...TOKEN]);
    expect(await exitWithin(w, 20_000), w.stderr).toBe(4);
    expect(w.stderr).toContain(`cannot listen on the data-plane port 0.0.0.0:${port}: it is taken by another program`);
  });

  it("exits with code 3 when the model file is not a model", async () => {
    const bad = join(dir, "not-a-model.gguf");
    writeFileSync(bad, "this is not a GGUF file\n");
    const w = startWorker(["--join", "127.0.0.1:9", "--model", bad, "--threads", "1", ...TOKEN]);
    expect(await exitWithin(w, 20_000), w.stderr).toBe(3);
    expect(w.stderr).toMatch(/cannot use the model: .*not-a-model\.gguf: not a GGUF file/);
  });

  it("exits with code 3 when its --model-cache is a symbolic link, and uses it with --allow-cache-link", async () => {
    const real = join(dir, "models-of-mine");
    mkdirSync(real, { recursive: true });
    const link = join(dir, "cache-link");
    symlinkSync(real, link);
    const w = startWorker(["--join", "127.0.0.1:1", "--model-cache", link, "--threads", "1", ...TOKEN]);
    expect(await exitWithin(w, 20_000), w.stderr).toBe(3);
    expect(w.stderr).toMatch(/the model cache .*cache-link is a symbolic link \(to .*models-of-mine\): refused.*--allow-cache-link to use it \(exit code 3\)/);
    // Allowed, the worker goes on to ask the coordinator (port 1: nobody there) for the model.
    const allowed = startWorker(["--join", "127.0.0.1:1", "--model-cache", link, "--allow-cache-link", "--threads", "1", ...TOKEN]);
    await allowed.waitFor(/ECONNREFUSED 127\.0\.0\.1:1; trying again/, 15_000);
    expect(allowed.stderr).not.toMatch(/symbolic link/);
  });

  it("documents its exit codes in --help", async () => {
    const w = startWorker(["--help"]);
    expect(await exitWithin(w, 20_000), w.stderr).toBe(0); // a limit on the wait, not a speed (the machine may be loaded)
    for (const code of ["0", "1", "2", "3", "4", "5", "6", "7"]) expect(w.stdout).toMatch(new RegExp(`^  ${code}  `, "m"));
    expect(w.stdout).toMatch(/^  7  the disk of the model cache filled up while fetching the model/m);
  });
});

describe("prima-worker keeps trying what may fix itself, and stops on the first signal", () => {
  it("refused for its model, asks again without repeating itself, joins once the coordinator has its model, and stops on SIGTERM", async () => {
    const lines: string[] = [];
    const wrong = new WorkerRegistry({ modelFingerprint: "0".repeat(64), trust: await testTrust(), log: (l) => lines.push(l) });
    const port = await wrong.listen(0, "127.0.0.1");
    cleanups.push(() => wrong.close());
    const w = startWorker(["--join", `127.0.0.1:${port}`, "--model", model, "--name", "mismatch", "--threads", "1", ...TOKEN]);
    await w.waitFor(/refused this worker: model mismatch/, 15_000);
    await new Promise((r) => setTimeout(r, 4500)); // two more refusals at 2 s each
    expect(count(w.stderr, /refused this worker/), w.stderr).toBe(1);
    expect(count(lines.join("\n"), /refused a worker/), lines.join("\n")).toBe(1);
    expect(await exitWithin(w, 0)).toBe("running");

    // The coordinator comes back with the worker's model, on the same port.
    await wrong.close();
    const right = new WorkerRegistry({ modelFingerprint: fingerprint, trust: await testTrust() });
    await right.listen(port, "127.0.0.1");
    cleanups.push(() => right.close());
    await right.waitFor(1, 5000);
    await w.waitFor(/joined 127\.0\.0\.1:\d+ as w1/, 3000);

    const stopAt = Date.now();
    w.child.kill("SIGTERM");
    expect(await exitWithin(w, 20_000), w.stderr).toBe(0);
    expect(Date.now() - stopAt).toBeLessThan(3000);
  }, 40_000);

  it("stops on the first SIGINT while the coordinator is away", async () => {
    // Port 1 (tcpmux): nothing here listens there. A port found free a moment before was once taken by
    // another test file's listener meanwhile, and the worker's wait was for another reason.
    const port = 1;
    const w = startWorker(["--join", `127.0.0.1:${port}`, "--model", model, "--name", "lonely", "--threads", "1", ...TOKEN]);
    await w.waitFor(/waiting for the coordinator at 127\.0\.0\.1:\d+ \(coordinator unreachable\)/, 15_000);
    w.child.kill("SIGINT");
    expect(await exitWithin(w, 20_000), w.stderr).toBe(0);
    expect(w.stderr).toMatch(/SIGINT: stopping/);
  }, 60_000);

  it("stops on the first SIGTERM in the middle of a run, and the coordinator hears it at once", async () => {
    const coord = startCoordinator(["run", model, "--port", "0", "--min-workers", "1", "--layer-windows", "3,2", "-n", "100000", "--ctx", "2048", "--temp", "0", "--no-context-shift"]);
    const port = (await coord.waitFor(/listening for workers on port (\d+)/))[1];
    const w = startWorker(["--join", `127.0.0.1:${port}`, "--model", model, "--name", "leaver", "--threads", "1"]);
    await coord.waitFor(/Once upon a time.{20}/s);
    const stopAt = Date.now();
    w.child.kill("SIGTERM");
    expect(await exitWithin(w, 20_000), w.stderr).toBe(0);
    await coord.waitFor(/device w1 "leaver" \(127\.0\.0\.1\)[^\n]*(lost|failed)/, 3000);
    expect(Date.now() - stopAt).toBeLessThan(3000);
  }, 60_000);
});

describe("a model file that changes under a running worker", () => {
  it("truncated mid-run: the worker names the file, leaves the ring and exits with code 5 (no SIGBUS)", async () => {
    const copy = join(dir, "worker-copy.gguf");
    copyFileSync(`${root}${model}`, copy);
    const coord = startCoordinator(["run", model, "--port", "0", "--min-workers", "1", "--layer-windows", "3,2", "-n", "100000", "--ctx", "2048", "--temp", "0", "--no-context-shift"]);
    const port = (await coord.waitFor(/listening for workers on port (\d+)/))[1];
    const w = startWorker(["--join", `127.0.0.1:${port}`, "--model", copy, "--name", "victim", "--threads", "1"]);
    await coord.waitFor(/Once upon a time.{20}/s);
    truncateSync(copy, Math.floor(statSync(copy).size / 3));
    const code = await exitWithin(w, 20_000);
    const why = `worker:\n${w.stderr.slice(-1500)}\ncoordinator:\n${coord.stderr.slice(-1500)}`;
    expect(w.child.signalCode, why).toBeNull();
    expect(code, why).toBe(5);
    expect(w.stderr).toMatch(new RegExp(`model file ${copy.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")} (could not be read|changed)`));
    expect(w.stderr).toMatch(/restart the worker to map the file again \(exit code 5\)/);
    // The coordinator names the device and the file.
    await coord.waitFor(new RegExp(`device w1 "victim" \\(127\\.0\\.0\\.1\\)[^\\n]*model file [^\\n]*worker-copy\\.gguf`), 3000);
  }, 60_000);
});
