// Every wait of the coordinator's control plane has a limit, against fake workers (real gRPC sessions
// that join and then answer nothing): a stream that never joins is dropped, a peer that never answers
// a status request or an assignment is lost and named, one that goes silent is lost by the heartbeat
// rule, close() does not wait for a frozen peer, and a worker's name is escaped before it is printed.
import { afterEach, describe, expect, it } from "vitest";
import {
  ASSIGN_SILENCE_MS, HEARTBEAT_TIMEOUT_MS, JOIN_TIMEOUT_MS, SHUTDOWN_GRACE_MS, STATUS_TIMEOUT_MS, type Assignment,
} from "../../control/index.js";
import { WorkerLostError, WorkerRegistry, type WorkerHandle } from "../../coordinator/registry.js";
import { killAll, root, startNode } from "../helpers/process.js";
import { fakeWorker, type FakeWorker } from "./fake-worker.js";
import { testIdentity, testTrust } from "../helpers/trust.js";

const FP = "f".repeat(64);
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  killAll();
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A registry whose log lines are kept, not yet listening. */
async function quietRegistry(): Promise<{ reg: WorkerRegistry; lines: string[] }> {
  const lines: string[] = [];
  const reg = new WorkerRegistry({ modelFingerprint: FP, trust: await testTrust(), log: (l) => lines.push(l) });
  cleanups.push(() => reg.close());
  return { reg, lines };
}

async function registry(): Promise<{ reg: WorkerRegistry; address: string; lines: string[] }> {
  const { reg, lines } = await quietRegistry();
  const port = await reg.listen(0, "127.0.0.1");
  return { reg, address: `127.0.0.1:${port}`, lines };
}

async function fake(address: string, name: string, o: { silent?: boolean; heartbeats?: boolean } = {}): Promise<FakeWorker> {
  const f = fakeWorker({ address, name, fingerprint: FP, token: (await testIdentity()).token, ...o });
  cleanups.push(() => f.close());
  return f;
}

const assignment: Assignment = {
  ringId: "r", windows: [{ firstLayer: 0, endLayer: 1, cycle: 0 }], successorUrl: "ws://127.0.0.1:9", ctx: 64, maxBatch: 8, cycles: 1,
  prefetch: false, releaseAfterUse: false, threads: 0, ringOrder: ["w1"], wireDtype: 0,
};

function lostEvent(reg: WorkerRegistry): Promise<{ w: WorkerHandle; reason: string; at: number }> {
  return new Promise((resolve) => reg.once("lost", (w: WorkerHandle, reason: string) => resolve({ w, reason, at: Date.now() })));
}

describe("control plane limits", () => {
  it("drops a session stream that never sends a join", async () => {
    const { address, lines } = await registry();
    const start = Date.now();
    const f = await fake(address, "-", { silent: true });
    const shutdown = await f.next("shutdown", JOIN_TIMEOUT_MS + 2000);
    expect(shutdown.msg === "shutdown" && shutdown.shutdown.reason).toMatch(/no join within 3 s/);
    await f.ended;
    expect(Date.now() - start).toBeLessThan(JOIN_TIMEOUT_MS + 1000);
    expect(lines.join("\n")).toMatch(/refused a worker from .*no join within 3 s/);
  });

  it("loses and names a joined peer that never answers a status request", async () => {
    const { reg, address } = await registry();
    await fake(address, "mute");
    const [w] = await reg.waitFor(1, 5000);
    const lost = lostEvent(reg);
    const start = Date.now();
    const err = await w.status().then(() => null, (e: Error) => e);
    const took = Date.now() - start;
    expect(err).toBeInstanceOf(WorkerLostError);
    expect(err!.message).toBe(`device w1 "mute" (127.0.0.1) failed: did not answer a status request within 3 s`);
    expect(took).toBeGreaterThanOrEqual(STATUS_TIMEOUT_MS - 50);
    expect(took).toBeLessThan(STATUS_TIMEOUT_MS + 1000);
    expect((await lost).reason).toMatch(/status request/);
    expect(reg.live()).toHaveLength(0);
  });

  it("a neighbour's broken link reported while a status request waits does not count as the answer (the device stays)", async () => {
    const { reg, address } = await registry();
    const f = await fake(address, "successor");
    const [w] = await reg.waitFor(1, 5000);
    const asked = w.status();
    await f.next("statusRequest");
    // What a successor reports when its predecessor dies, arriving just after the coordinator asked who answers.
    f.send({ failure: { message: 'link from predecessor "w3" failed: the connection was lost' } });
    f.send({ status: { windows: [], waitMs: 0, sendMs: 0, descheduledMs: 0, frames: 0, anonRssBytes: 1, memTotalBytes: 2, memAvailableBytes: 1, layerRoomBytes: 0, memPressure: 0 } });
    expect((await asked).memTotalBytes).toBe(2);
    // A failure that says it is the answer (the device could not read its status) is one.
    const again = w.status();
    await new Promise((r) => setTimeout(r, 50));
    f.send({ failure: { message: "cannot read /proc/meminfo", answersStatus: true } });
    await expect(again).rejects.toThrow(/cannot read \/proc\/meminfo/);
    expect(reg.live()).toEqual([w]);
  });

  it("gives an assignment more time with every progress report, and loses the peer after a silence", async () => {
    const { reg, address } = await registry();
    const f = await fake(address, "slow");
    const [w] = await reg.waitFor(1, 5000);
    const fractions: number[] = [];
    const start = Date.now();
    const ready = w.assign(assignment, (fraction) => fractions.push(fraction), 800);
    await f.next("assignment");
    // Progress every 300 ms for 1.5 s: longer than the 800 ms silence limit in total, never silent that long.
    for (let i = 1; i <= 5; i++) {
      await new Promise((r) => setTimeout(r, 300));
      f.send({ progress: { fraction: i / 10, stage: `step ${i}` } });
    }
    const err = await ready.then(() => null, (e: Error) => e);
    const took = Date.now() - start;
    expect(fractions).toEqual([0.1, 0.2, 0.3, 0.4, 0.5]);
    expect(err?.message).toBe(`device w1 "slow" (127.0.0.1) failed: sent no progress on its assignment for 0.8 s`);
    expect(took).toBeGreaterThan(1500 + 700);
    expect(took).toBeLessThan(1500 + 800 + 700);
    expect(ASSIGN_SILENCE_MS).toBeGreaterThanOrEqual(3000); // the default leaves room for a busy device
  });

  it("a peer timing its pass at the coordinator's request may be silent until it answers; then the heartbeat rule holds again", async () => {
    const { reg, address } = await registry();
    const f = await fake(address, "slow-timer", { heartbeats: false });
    const [w] = await reg.waitFor(1, 5000);
    const lost = lostEvent(reg);
    const timed = w.status(10_000, true);
    await f.next("statusRequest");
    // Silent for twice the heartbeat limit, as a quarter-CPU device timing its pass in JS is.
    await new Promise((r) => setTimeout(r, 2 * HEARTBEAT_TIMEOUT_MS));
    expect(reg.live()).toHaveLength(1);
    f.send({ status: { windows: [], waitMs: 0, sendMs: 0, descheduledMs: 0, frames: 0, anonRssBytes: 1, memTotalBytes: 2, memAvailableBytes: 1, layerRoomBytes: 0, memPressure: 0 } });
    const answeredAt = Date.now();
    expect((await timed).memTotalBytes).toBe(2);
    // Still silent after its answer: lost by the usual rule, counted from the answer.
    const l = await lost;
    expect(l.reason).toMatch(/no heartbeat for 1\.\d s/);
    expect(l.at - answeredAt).toBeGreaterThanOrEqual(HEARTBEAT_TIMEOUT_MS - 100);
    expect(l.at - answeredAt).toBeLessThan(2000);
  });

  it("a stall of the coordinator's own (a long plan) does not lose a peer whose heartbeats wait unread", async () => {
    const { reg, address } = await registry();
    await fake(address, "patient");
    await reg.waitFor(1, 5000);
    let lost = "";
    reg.once("lost", (_w: WorkerHandle, reason: string) => { lost = reason; });
    // The event loop held for longer than the heartbeat limit, as a long synchronous plan holds it.
    const until = Date.now() + HEARTBEAT_TIMEOUT_MS + 700;
    while (Date.now() < until) { /* busy */ }
    await new Promise((r) => setTimeout(r, 1000));
    expect(lost).toBe("");
    expect(reg.live()).toHaveLength(1);
  });

  it("time between the registry's making and its listening (the head's first profile) is not logged as a stall", async () => {
    const { reg, lines } = await quietRegistry();
    await new Promise((r) => setTimeout(r, HEARTBEAT_TIMEOUT_MS + 300)); // the loop free all along
    await reg.listen(0, "127.0.0.1");
    await new Promise((r) => setTimeout(r, 600)); // two ticks
    expect(lines.filter((l) => /event loop was held/.test(l))).toEqual([]);
    // and a real stall after listening still is logged
    const until = Date.now() + HEARTBEAT_TIMEOUT_MS + 300;
    while (Date.now() < until) { /* busy */ }
    await new Promise((r) => setTimeout(r, 600));
    expect(lines.filter((l) => /event loop was held/.test(l))).toHaveLength(1);
  });

  it("a peer whose heartbeats come late (a device starved by a build) is kept through a longer gap; a silent one is still lost", async () => {
    const { reg, address } = await registry();
    const f = await fake(address, "starved", { heartbeats: false });
    await reg.waitFor(1, 5000);
    let lost = "";
    reg.once("lost", (_w: WorkerHandle, reason: string) => { lost = reason; });
    const beat = () => f.send({ heartbeat: { sentUnixMs: Date.now() } });
    const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
    // Beats 1.4 s apart, each late but each within the usual limit ...
    for (let i = 0; i < 4; i++) {
      beat();
      await sleep(1400);
    }
    beat();
    // ... then one gap longer than the usual limit, which such a device's lateness allows for.
    await sleep(HEARTBEAT_TIMEOUT_MS + 500);
    beat();
    expect(lost).toBe("");
    expect(reg.live()).toHaveLength(1);
    // Silent for good (frozen): still lost, by the limit its lateness set.
    const l = await Promise.race([lostEvent(reg), sleep(15_000).then(() => null)]);
    expect(l?.reason).toMatch(/no heartbeat for \d\.\d s/);
  }, 30_000);

  it("loses a joined peer that sends nothing by the heartbeat rule", async () => {
    const { reg, address, lines } = await registry();
    await fake(address, "quiet", { heartbeats: false });
    await reg.waitFor(1, 5000);
    const joinedAt = Date.now();
    const lost = await lostEvent(reg);
    expect(lost.reason).toMatch(/no heartbeat for 1\.\d s/);
    expect(lost.at - joinedAt).toBeGreaterThanOrEqual(HEARTBEAT_TIMEOUT_MS - 100);
    expect(lost.at - joinedAt).toBeLessThan(2000);
    expect(lines.join("\n")).toMatch(/device w1 "quiet" \(127\.0\.0\.1\) lost: no heartbeat/);
  });

  it("closes within its grace while a joined peer is frozen (SIGSTOP), and its process can exit", async () => {
    // The registry in a process of its own: what must end is the process, not only close()'s promise.
    const host = startNode(["--input-type=module", "-e", `
      import { WorkerRegistry } from "${root}dist/coordinator/registry.js";
      import { createIdentity } from "${root}dist/trust/index.js";
      const identity = await createIdentity();
      const reg = new WorkerRegistry({ modelFingerprint: "${FP}", trust: { identity } });
      console.log("port " + await reg.listen(0, "127.0.0.1") + " token " + identity.tokenText);
      // The handler before "joined": the test sends SIGTERM as soon as it reads that line.
      process.once("SIGTERM", async () => {
        const start = Date.now();
        await reg.close();
        console.log("closed in " + (Date.now() - start) + " ms");
      });
      await reg.waitFor(1, 10000);
      console.log("joined");`]);
    const [, port, token] = await host.waitFor(/port (\d+) token (\S+)/);
    const peer = startNode([`${root}test/control/fake-worker-child.mjs`, `127.0.0.1:${port}`, "frozen", FP, token]);
    await host.waitFor(/joined/, 10_000);
    peer.child.kill("SIGSTOP");
    const start = Date.now();
    host.child.kill("SIGTERM");
    const closed = Number((await host.waitFor(/closed in (\d+) ms/, 5000))[1]);
    const exited = await Promise.race([host.exited, new Promise((r) => setTimeout(() => r("running"), 3000))]);
    expect(closed).toBeLessThanOrEqual(SHUTDOWN_GRACE_MS + 200);
    expect(exited, host.stderr).toBe(0);
    expect(Date.now() - start).toBeLessThan(3000);
  });

  it("escapes a worker's name, address and reports before they reach a log", async () => {
    const { reg, address, lines } = await registry();
    const f = await fake(address, "evil\u001b[31m\r\nname\u202e");
    const [w] = await reg.waitFor(1, 5000);
    expect(w.label).toBe(`w1 "evil\\x1b[31m\\x0d\\x0aname\\u{202e}" (127.0.0.1)`);
    const failure = new Promise<string>((resolve) => reg.once("failure", (_w: WorkerHandle, m: string) => resolve(m)));
    f.send({ failure: { message: "bad\u001b]0;title\u0007 thing" } });
    expect(await failure).toBe("bad\\x1b]0;title\\x07 thing");
    const all = lines.join("\n");
    expect(all).toContain(`device w1 "evil\\x1b[31m\\x0d\\x0aname\\u{202e}" (127.0.0.1) joined`);
    expect(all).not.toMatch(/[\u001b\u0007\r\u202e]/);
  });
});
