// The hangs of issue #17 on the coordinator's side, as real processes on loopback: `prima-coord run`
// with a worker frozen mid-run (SIGSTOP), with a client that opens a control session and says nothing,
// and with a joined peer that never answers its assignment. Each fault is named (the run ends, or goes
// on without the device), and the coordinator process exits within 3 s of it.
import { afterEach, describe, expect, it } from "vitest";
import { modelFingerprint, readGguf } from "../../model/index.js";
import { killAll, startCoordinator, startWorker } from "../ring/cluster.js";
import { root, tokenFileFor } from "../helpers/process.js";
import { workerToken } from "../../trust/index.js";
import { fakeWorker, type FakeWorker } from "./fake-worker.js";

/** The join token of the coordinator this harness started on port. */
const tokenOf = (port: string) => workerToken({ tokenFile: tokenFileFor(Number(port)) })!;

const model = "models/stories260K.gguf";
const fingerprint = modelFingerprint(readGguf(`${root}${model}`));
const fakes: FakeWorker[] = [];
afterEach(() => {
  killAll();
  for (const f of fakes.splice(0)) f.close();
});

async function exitedWithin(p: { exited: Promise<number | null> }, ms: number): Promise<number | null | "running"> {
  return Promise.race([p.exited, new Promise<"running">((r) => setTimeout(() => r("running"), ms))]);
}

describe("prima-coord run never hangs on a worker", () => {
  it("a worker frozen mid-run (SIGSTOP) is named, and the coordinator exits within 3 s of the loss", async () => {
    const coord = startCoordinator(["run", model, "--port", "0", "--min-workers", "1", "--layer-windows", "3,2", "-n", "100000", "--ctx", "2048", "--temp", "0", "--no-context-shift"]);
    const port = (await coord.waitFor(/listening for workers on port (\d+)/))[1];
    const w = startWorker(["--join", `127.0.0.1:${port}`, "--model", model, "--name", "frosty", "--once", "--threads", "1"]);
    await coord.waitFor(/Once upon a time.{20}/s);
    let lastOutputAt = Date.now();
    for (const out of [coord.child.stdout!, coord.child.stderr!]) out.on("data", () => { lastOutputAt = Date.now(); });
    w.child.kill("SIGSTOP");
    const stoppedAt = Date.now();
    const named = /device w1 "frosty" \(127\.0\.0\.1\)[^\n]*(failed|lost)/;
    await coord.waitFor(named, 5000);
    const namedAt = Date.now();
    // The run either ends with an error naming the device, or goes on without it (failover, which
    // takes as long as the rest of the generation): either way, once it has said its last word, the
    // process exits within 3 s, whatever the frozen worker's connections do.
    const code = await exitedWithin(coord, 15_000);
    const exitAt = Date.now();
    const why = `named after ${namedAt - stoppedAt} ms, exited ${exitAt - lastOutputAt} ms after its last output; coordinator's last words:\n${coord.stderr.slice(-1500)}`;
    expect(code, why).not.toBe("running");
    expect(namedAt - stoppedAt, why).toBeLessThan(2500);
    expect(exitAt - lastOutputAt, why).toBeLessThan(3000);
  }, 30_000);

  it("a client that opens a control session and sends nothing does not keep the coordinator up after its run", async () => {
    const coord = startCoordinator(["run", model, "--port", "0", "--min-workers", "1", "--layer-windows", "3,2", "-n", "8", "--temp", "0", "-p", "Once"]);
    const port = (await coord.waitFor(/listening for workers on port (\d+)/))[1];
    const silent = fakeWorker({ address: `127.0.0.1:${port}`, name: "-", fingerprint, token: tokenOf(port), silent: true });
    fakes.push(silent);
    startWorker(["--join", `127.0.0.1:${port}`, "--model", model, "--name", "real", "--once", "--threads", "1"]);
    await coord.waitFor(/"real" .*joined/);
    const code = await exitedWithin(coord, 8000);
    expect(code, coord.stderr.slice(-1500)).toBe(0);
  }, 30_000);

  it("a joined peer that never answers its assignment ends the run naming it, and the coordinator exits", async () => {
    const coord = startCoordinator(["run", model, "--port", "0", "--min-workers", "1", "--layer-windows", "3,2", "-n", "8", "--temp", "0"]);
    const port = (await coord.waitFor(/listening for workers on port (\d+)/))[1];
    const mute = fakeWorker({ address: `127.0.0.1:${port}`, name: "mute", fingerprint, token: tokenOf(port) });
    fakes.push(mute);
    await mute.next("assignment");
    const assignedAt = Date.now();
    const code = await exitedWithin(coord, 8000);
    const why = coord.stderr.slice(-1500);
    expect(code, why).not.toBe("running");
    expect(code, why).not.toBe(0);
    expect(coord.stderr).toMatch(/device w1 "mute" \(127\.0\.0\.1\)[^\n]*sent no progress on its assignment for 5 s/);
    expect(Date.now() - assignedAt, why).toBeLessThan(5000 + 3000);
  }, 30_000);
});
