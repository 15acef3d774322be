// Discovery end to end (issue #15): `prima-coord serve` announces its cluster over mDNS and two
// `prima-worker --join` with no address find it by themselves; the ring they form serves a greedy
// request equal to `prima-coord run`. Where discovery cannot work (a worker browsing where nobody
// announces), the worker says so and names the `--join HOST:PORT` fallback, and that form joins.
// Multicast stays on loopback: every process gets PRIMA_MDNS_INTERFACE=127.0.0.1 and an mDNS port of
// this file's own (test/discovery/mdns-helpers.ts), so nothing leaves through the real interfaces.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ClusterState } from "../../coordinator/state.js";
import { LOOPBACK, freeUdpPort, loopbackMulticastWorks } from "../discovery/mdns-helpers.js";
import { killAll, type Proc } from "../ring/cluster.js";
import { discoverWorker, joinWorker, runOnce, startServe, until, type Served } from "./serve-harness.js";

const STORY = "Once upon a time";
/** A cluster name no other test announces. */
const CLUSTER = `disc-test-${process.pid}`;

let loopback = false;
let mdnsEnv: NodeJS.ProcessEnv = {};
const procs: Proc[] = [];

beforeAll(async () => {
  loopback = await loopbackMulticastWorks();
  if (!loopback) console.warn("skipping serve discovery tests: multicast on 127.0.0.1 does not come back on this machine");
  mdnsEnv = { PRIMA_MDNS_INTERFACE: LOOPBACK, PRIMA_MDNS_PORT: String(await freeUdpPort()) };
});

afterAll(() => {
  // Every process this file started, by PID; then the harness's own list.
  for (const p of procs) {
    if (p.child.exitCode !== null || p.child.signalCode !== null || !p.child.pid) continue;
    try { process.kill(p.child.pid, "SIGKILL"); } catch { /* exited meanwhile */ }
  }
  killAll();
});

describe("serve with mDNS discovery", () => {
  let s: Served | undefined;

  it("two workers given no address find serve by themselves, and the ring serves run's greedy text", async (ctx) => {
    if (!loopback) ctx.skip("multicast on loopback does not work here");
    s = await startServe(["--name", CLUSTER, "--min-workers", "2", "--layer-windows", "alpha=2,bravo=2,head=1"],
      { discovery: true, env: mdnsEnv, waitReady: false });
    procs.push(s.proc);
    await s.proc.waitFor(new RegExp(`announced as "${CLUSTER}" over mDNS`), 10_000);
    expect(s.proc.stderr).not.toMatch(/mDNS (error|failed)/i);

    const workers = ["alpha", "bravo"].map((name) => discoverWorker(name, mdnsEnv));
    procs.push(...workers);
    for (const w of workers) {
      // Found over mDNS, at the cluster port serve listens on, then joined there.
      const m = await w.waitFor(/found cluster "([^"]+)" at 127\.0\.0\.1:(\d+)/, 20_000);
      expect(m[1]).toBe(CLUSTER);
      expect(Number(m[2])).toBe(s.clusterPort);
      await w.waitFor(new RegExp(`joined 127\\.0\\.0\\.1:${s.clusterPort} as w\\d`), 20_000);
    }
    await until(`${s.url}/health`, (st) => st === 200, 30_000);
    const st = await until<ClusterState>(`${s.url}/api/state`, (_, b) => b.plan?.ringOrder.length === 3, 30_000);
    const name = new Map(st.devices.map((x) => [x.id, x.name]));
    expect(st.plan!.ringOrder.map((id) => name.get(id))).toEqual(["alpha", "bravo", st.devices.find((x) => x.isHead)!.name]);

    const ref = runOnce(["-p", STORY, "-n", "24", "--temp", "0"]);
    const r = await s.client.completions.create({ prompt: STORY, max_tokens: 24, temperature: 0 });
    expect(r.choices[0].text).toBe(ref.text);
    expect(r.usage?.completion_tokens).toBe(ref.generated_ids.length);
    // The request went round the ring: both workers ran their windows.
    for (const w of workers) expect(w.stderr).toMatch(/assigned layers/);
  }, 60_000);

  it("where nothing answers, the worker names the --join HOST:PORT fallback, and that form joins", async (ctx) => {
    if (!loopback) ctx.skip("multicast on loopback does not work here");
    if (!s) ctx.skip("needs the server of the previous test");
    // Browsing an mDNS port nobody announces on: as on a network that drops multicast.
    const silent = { ...mdnsEnv, PRIMA_MDNS_PORT: String(await freeUdpPort()) };
    const started = Date.now();
    const lonely = discoverWorker("charlie", silent);
    procs.push(lonely);
    await lonely.waitFor(/no prima cluster answered on mDNS within \d+ s/, 20_000);
    const saidMs = Date.now() - started;
    expect(lonely.stderr).toMatch(/join by address instead: prima-worker --join HOST:PORT/);
    expect(lonely.stderr).not.toMatch(/found cluster|joined /);
    expect(lonely.child.exitCode, "it keeps looking").toBeNull();
    expect(saidMs, `said so after ${saidMs} ms`).toBeLessThan(15_000);
    process.kill(lonely.child.pid!, "SIGTERM");
    expect(await Promise.race([lonely.exited, new Promise((r) => setTimeout(() => r("hung"), 10_000))])).toBe(0);

    // The fallback it names, with serve's cluster port: it joins.
    const direct = joinWorker(s!.clusterPort, "charlie");
    procs.push(direct);
    await direct.waitFor(new RegExp(`joined 127\\.0\\.0\\.1:${s!.clusterPort} as w\\d`), 20_000);
    await until<ClusterState>(`${s!.url}/api/state`, (_, b) => b.devices.some((x) => x.name === "charlie" && x.state !== "lost"), 10_000);
    expect(direct.stderr).not.toMatch(/mDNS/);
  }, 45_000);
});
