// `prima-worker --join` without an address, as a real process: it finds the published cluster and
// joins a real control-plane registry, rejoins the same cluster when it comes back on another port,
// says once that nothing answers (with the --join HOST:PORT form), lists the choices when several
// answer, and never browses when given an address. Multicast stays on loopback (mdns-helpers.ts).
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { WorkerRegistry } from "../../coordinator/registry.js";
import { PROTOCOL_VERSION } from "../../control/index.js";
import { publishCluster, type Publication } from "../../discovery/index.js";
import { modelFingerprint, readGguf } from "../../model/index.js";
import { killAll, root, startNode } from "../helpers/process.js";
import { LOOPBACK, freeUdpPort, loopbackMulticastWorks } from "./mdns-helpers.js";
import { testIdentity, testTrust } from "../helpers/trust.js";

const model = "models/stories260K.gguf";
const workerCli = `${root}dist/worker/cli.js`;
const fingerprint = modelFingerprint(readGguf(`${root}${model}`));

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  killAll();
  for (const c of cleanups.splice(0).reverse()) await c();
});

let loopback = false;
beforeAll(async () => {
  loopback = await loopbackMulticastWorks();
  if (!loopback) console.warn("skipping worker discovery tests: multicast on 127.0.0.1 does not come back on this machine");
});

async function coordinator(name: string, mdnsPort: number): Promise<{ registry: WorkerRegistry; port: number; pub: Publication; stop(): Promise<void> }> {
  const registry = new WorkerRegistry({ modelFingerprint: fingerprint, trust: await testTrust() });
  const port = await registry.listen(0, LOOPBACK);
  const pub = publishCluster({ name, port, model: "stories260K", fingerprint, protocolVersion: PROTOCOL_VERSION, interface: LOOPBACK, mdnsPort });
  let stopped = false;
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    await pub.stop();
    await registry.close();
  };
  cleanups.push(stop);
  return { registry, port, pub, stop };
}

async function worker(args: string[], mdnsPort: number, env: NodeJS.ProcessEnv = {}) {
  return startNode([workerCli, "--model", model, "--threads", "1", ...args],
    { PRIMA_MDNS_INTERFACE: LOOPBACK, PRIMA_MDNS_PORT: String(mdnsPort), PRIMA_TOKEN: (await testIdentity()).tokenText, ...env });
}

describe("prima-worker --join (no address)", () => {
  it("finds the only cluster, joins it, and after the coordinator goes away rejoins the same cluster where it comes back", async (ctx) => {
    if (!loopback) ctx.skip("multicast on loopback does not work here");
    const mdnsPort = await freeUdpPort();
    const first = await coordinator("home", mdnsPort);
    const w = await worker(["--join", "--name", "disc1"], mdnsPort);
    await w.waitFor(new RegExp(`found cluster "home" at 127\\.0\\.0\\.1:${first.port} \\(model stories260K\\)`));
    await first.registry.waitFor(1, 30_000);
    await w.waitFor(new RegExp(`joined 127\\.0\\.0\\.1:${first.port} as w1`));

    await first.stop();
    await w.waitFor(/session ended: .*; looking for the coordinator again/, 10_000);
    // Another cluster appears meanwhile: the worker waits for its own, by name.
    await coordinator("other", mdnsPort);
    await w.waitFor(/no cluster named "home" answered on mDNS within 3 s; these did:\n.*other/, 15_000);
    const second = await coordinator("home", mdnsPort);
    await w.waitFor(new RegExp(`found cluster "home" at 127\\.0\\.0\\.1:${second.port}`), 15_000);
    await second.registry.waitFor(1, 15_000);
    await w.waitFor(new RegExp(`joined 127\\.0\\.0\\.1:${second.port} as w1`));
    expect(w.stderr).not.toMatch(/joined .* to other/);
    w.child.kill("SIGTERM");
    expect(await Promise.race([w.exited, new Promise((r) => setTimeout(() => r("hung"), 10_000))])).toBe(0);
  });

  it("nothing answers: it says so once, shows the --join HOST:PORT form, keeps looking, and stops on SIGTERM", async (ctx) => {
    if (!loopback) ctx.skip("multicast on loopback does not work here");
    const mdnsPort = await freeUdpPort();
    const w = await worker(["--join", "--name", "lonely"], mdnsPort);
    await w.waitFor(/no prima cluster answered on mDNS within 3 s\. Multicast may not reach this device \(Docker bridge networks, WSL2, Wi-Fi client isolation, Termux\); join by address instead: prima-worker --join HOST:PORT.*Still looking on the network\./, 30_000);
    await new Promise((r) => setTimeout(r, 4000));
    expect(w.stderr.match(/no prima cluster answered/g)).toHaveLength(1);
    expect(w.child.exitCode).toBeNull();
    w.child.kill("SIGTERM");
    expect(await Promise.race([w.exited, new Promise((r) => setTimeout(() => r("hung"), 10_000))])).toBe(0);
  });

  it("several clusters: it lists them and exits; --cluster NAME joins the one named", async (ctx) => {
    if (!loopback) ctx.skip("multicast on loopback does not work here");
    const mdnsPort = await freeUdpPort();
    const a = await coordinator("alpha", mdnsPort);
    const b = await coordinator("beta", mdnsPort);
    const w = await worker(["--join", "--name", "torn"], mdnsPort);
    expect(await Promise.race([w.exited, new Promise((r) => setTimeout(() => r("hung"), 30_000))])).toBe(1);
    expect(w.stderr).toMatch(/2 prima clusters answered on mDNS; choose one with --cluster NAME or --join HOST:PORT:/);
    expect(w.stderr).toContain(`alpha  at 127.0.0.1:${a.port}`);
    expect(w.stderr).toContain(`beta  at 127.0.0.1:${b.port}`);
    const picked = await worker(["--join", "--cluster", "beta", "--name", "picky"], mdnsPort);
    await b.registry.waitFor(1, 30_000);
    await picked.waitFor(new RegExp(`joined 127\\.0\\.0\\.1:${b.port} as w1`));
    expect(a.registry.live()).toHaveLength(0);
  });

  it("--join HOST:PORT never browses (an unusable mDNS interface does not matter); --cluster needs --join alone", async () => {
    const c = new WorkerRegistry({ modelFingerprint: fingerprint, trust: await testTrust() });
    const port = await c.listen(0, LOOPBACK);
    cleanups.push(() => c.close());
    const w = await worker(["--join", `127.0.0.1:${port}`, "--name", "direct"], 1, { PRIMA_MDNS_INTERFACE: "no-such-if0" });
    await c.waitFor(1, 30_000);
    await w.waitFor(new RegExp(`joined 127\\.0\\.0\\.1:${port} as w1`));
    expect(w.stderr).not.toMatch(/mDNS|found cluster/);
    const bad = await worker(["--join", "127.0.0.1:1", "--cluster", "x"], 1);
    expect(await bad.exited).toBe(2);
    expect(bad.stderr).toMatch(/--cluster chooses among the clusters --join finds on the network/);
  });
});
