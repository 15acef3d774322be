// The piped ring end to end: real worker processes on loopback give exactly the single-device
// tokens, and a worker killed mid-generation is named by the coordinator within 2 seconds.
import { execFileSync } from "node:child_process";
import { afterEach, describe, expect, it } from "vitest";
import { killAll, runRing, startCoordinator, startWorker } from "./cluster.js";

afterEach(killAll);

const model = "models/stories260K.gguf";
const gen = ["-p", "Once upon a time", "-n", "24", "--temp", "0"];

function singleDevice(args: string[]): number[] {
  const out = execFileSync(process.execPath, ["dist/coordinator/cli.js", "run", model, "--json", ...args], { encoding: "utf8" });
  return JSON.parse(out).generated_ids;
}

describe("piped ring on stories260K (5 layers)", () => {
  const expected = singleDevice(gen);

  it.each([
    [2, "3,2"],
    [3, "2,2,1"],
    [4, "1,2,1,1"],
    [3, "3,2,0"], // the head holds no layers: it only embeds, closes the cycle and samples
  ])("%i devices, windows %s: the same tokens as one device", async (devices, windows) => {
    const r = await runRing(model, [...gen, "--layer-windows", windows], devices - 1);
    expect(r.code, r.coordinator.stderr).toBe(0);
    expect(r.report?.generated_ids).toEqual(expected);
    expect(r.report?.devices).toBe(devices);
  }, 60_000);

  it("a worker killed mid-generation is reported by name within 2 s", async () => {
    const coord = startCoordinator(["run", model, "--port", "0", "--min-workers", "2", "--layer-windows", "2,2,1", "-n", "100000", "--ctx", "2048", "--temp", "0"]);
    const port = (await coord.waitFor(/listening for workers on port (\d+)/))[1];
    const a = startWorker(["--join", `127.0.0.1:${port}`, "--model", model, "--name", "alpha", "--once", "--threads", "1"]);
    await coord.waitFor(/"alpha" .*joined/);
    const b = startWorker(["--join", `127.0.0.1:${port}`, "--model", model, "--name", "bravo", "--once", "--threads", "1"]);
    await coord.waitFor(/Once upon a time.{20}/s);
    const killedAt = Date.now();
    b.child.kill("SIGKILL");
    const code = await coord.exited;
    const elapsedMs = Date.now() - killedAt;
    a.child.kill("SIGKILL");
    expect(code).not.toBe(0);
    expect(coord.stderr).toMatch(/device w2 "bravo" \(127\.0\.0\.1\)[^\n]*(failed|disconnected|lost)/);
    expect(elapsedMs).toBeLessThan(2000);
  }, 60_000);
});
