// Issue #36, finding 4: TLS on the cluster port needs no secret, so strangers can open connections
// that never prove the join token. They must not keep the household's devices out: each is closed
// when it has not proven the token in time, and those from a few addresses cannot take every slot.
// The strangers here are idle HTTP/2 sessions (they answer pings) from 127.0.0.2-5, which route to lo.
import { connect, type ClientHttp2Session } from "node:http2";
import { afterEach, describe, expect, it } from "vitest";
import { WorkerRegistry } from "../../coordinator/registry.js";
import { SLOT_LIMITS } from "../../coordinator/slots.js";
import { killAll } from "../helpers/process.js";
import { testIdentity, testTrust } from "../helpers/trust.js";
import { startCoordinator, startWorker } from "../ring/cluster.js";
import { fakeWorker } from "./fake-worker.js";

const model = "models/stories260K.gguf";
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  killAll();
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** Idle HTTP/2 sessions over TLS (no token) from each of `hosts`, reopened as soon as one closes,
 * `perHost` wanted from each. Counts the sessions that were up and were closed by the other end. */
function strangers(port: number, hosts: string[], perHost: number) {
  const open = new Set<ClientHttp2Session>();
  const counts = { up: 0, closedByServer: 0 };
  let stopped = false;
  const dial = (localAddress: string) => {
    if (stopped) return;
    const s = connect(`https://127.0.0.1:${port}`, {
      localAddress, rejectUnauthorized: false, servername: "prima-cluster", ALPNProtocols: ["h2"], minVersion: "TLSv1.3",
    });
    open.add(s);
    let up = false;
    s.on("connect", () => {
      up = true;
      counts.up++;
    });
    s.on("error", () => {});
    s.on("close", () => {
      open.delete(s);
      if (up && !stopped) counts.closedByServer++;
      // Again, a moment later: a stranger that keeps trying.
      if (!stopped) setTimeout(() => dial(localAddress), 50).unref();
    });
  };
  for (const h of hosts) for (let i = 0; i < perHost; i++) dial(h);
  return {
    counts,
    get open() {
      return open.size;
    },
    stop() {
      stopped = true;
      for (const s of open) s.destroy();
    },
  };
}

describe("the cluster port's slots", () => {
  it("idle connections without the token from four addresses, kept up, do not keep a real worker out", async () => {
    const coord = startCoordinator(["run", model, "--port", "0", "--min-workers", "1", "--json", "-p", "Once upon a time", "-n", "8", "--threads", "1"]);
    const port = Number((await coord.waitFor(/listening for workers on port (\d+)/))[1]);
    // 40 wanted from each of four addresses: more than the port has slots for (128 in all, 32 per address).
    const s = strangers(port, ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"], 40);
    cleanups.push(() => s.stop());
    // The strangers hold what they can get before the worker comes.
    await coord.waitFor(/refused a connection from 127\.0\.0\.\d: too many connections/);
    const worker = startWorker(["--join", `127.0.0.1:${port}`, "--model", model, "--name", "home", "--once", "--threads", "1"]);
    const code = await Promise.race([coord.exited, new Promise((r) => setTimeout(() => r("still waiting"), 90_000))]);
    s.stop();
    expect(code, `coordinator:\n${coord.stderr.slice(-3000)}\nworker:\n${worker.stderr.slice(-2000)}`).toBe(0);
    expect(coord.stderr).toMatch(/device w1 "home" .*joined/);
    expect(JSON.parse(coord.stdout.split("\n").find((l) => l.startsWith("{"))!).generated_ids).toHaveLength(8);
    // The strangers' sessions were closed by the coordinator, and said so.
    expect(s.counts.closedByServer).toBeGreaterThan(0);
    expect(coord.stderr).toMatch(/closed a connection from 127\.0\.0\.\d: (it did not prove the join token|its connection was closed to make room)/);
  }, 120_000);

  it("closes a connection that has not proven the token in time, and keeps a joined worker's", async () => {
    const lines: string[] = [];
    // A short limit for the test: what counts is which connection is closed, not when.
    const reg = new WorkerRegistry({ modelFingerprint: "f".repeat(64), trust: await testTrust(), log: (l) => lines.push(l), slotLimits: { ...SLOT_LIMITS, proofMs: 400 } });
    const port = await reg.listen(0, "127.0.0.1");
    cleanups.push(() => reg.close());
    const f = fakeWorker({ address: `127.0.0.1:${port}`, name: "home", fingerprint: "f".repeat(64), token: (await testIdentity()).token });
    cleanups.push(() => f.close());
    await reg.waitFor(1, 10_000);
    const s = strangers(port, ["127.0.0.2"], 1);
    cleanups.push(() => s.stop());
    // The stranger is closed (and comes back, and is closed again) ...
    for (let i = 0; i < 400 && s.counts.closedByServer < 3; i++) await new Promise((r) => setTimeout(r, 50));
    expect(s.counts.closedByServer).toBeGreaterThanOrEqual(3);
    // ... while the worker that proved the token, on its own connection as old as those, stays.
    expect(reg.live().map((w) => w.join.deviceName)).toEqual(["home"]);
    expect(f.received.filter((m) => m.msg === "shutdown")).toEqual([]);
    expect(lines.join("\n")).toMatch(/closed a connection from 127\.0\.0\.2: it did not prove the join token within 0\.4 s/);
  }, 60_000);
});
