// The steps of a recovery that keep its pause short and bounded under load (issue #36):
// - a ring being wired when one of its members is lost gives up at once, naming the lost device,
//   instead of waiting for the other members' assignments (or their dials to the lost device);
// - only the newest assignment of a worker is answered: a Ready names its ring, an older assignment's
//   wait ends when a newer one is sent, and the worker's session drops the older one unanswered;
// - a recovery plans from the statuses it read while asking who answers, and from each hop as it was
//   last probed (a worker restarted on the same device and address too): it asks the workers nothing
//   more and probes nothing;
// - a worker device stops an assignment a newer one replaced before it makes windows or links.
import { afterEach, describe, expect, it } from "vitest";
import type { Assignment, CoordinatorMessage, Status, WorkerMessage } from "../../control/index.js";
import { planRing } from "../../coordinator/plan-ring.js";
import { WorkerRegistry } from "../../coordinator/registry.js";
import { Ring } from "../../coordinator/ring-setup.js";
import { LocalModel } from "../../engine/index.js";
import { modelFingerprint, readGguf } from "../../model/index.js";
import { LinkProbeServer, parseDeviceReport } from "../../profiler/index.js";
import type { SessionHandler } from "../../worker/session.js";
import { startSession } from "../helpers/worker-session.js";
import { WorkerDevice } from "../../worker/device.js";
import type { RingPort } from "../../ring/index.js";
import { root } from "../helpers/process.js";
import { testIdentity, testTrust } from "../helpers/trust.js";
import { fakeWorker, type FakeWorker } from "../control/fake-worker.js";

const modelPath = `${root}models/stories260K.gguf`;
const FP = modelFingerprint(readGguf(modelPath));
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function profileJson(name: string, linkProbePort?: number): string {
  return JSON.stringify({
    version: 1, ...(linkProbePort ? { linkProbePort } : {}),
    profile: { name, id: name, os: "linux", cpuFlopsPerS: { "*": 30e9 }, ramTotalBytes: 8e9, ramAvailableBytes: 4e9, diskSeqReadBytesPerS: 1e9 },
    details: { memory: { totalBytes: 8e9, availableBytes: 5e9, physicalTotalBytes: 8e9, physicalAvailableBytes: 5e9 }, disk: { dir: "/m", device: "8:0", throttle: {} } },
  });
}

const idleStatus = (extra: Partial<Status> = {}): Status => ({
  windows: [], waitMs: 0, sendMs: 0, anonRssBytes: 1, memTotalBytes: 8e9, memAvailableBytes: 5e9, memPressure: 0, frames: 0, layerRoomBytes: 4e9, ...extra,
});

function assignment(ringId: string): Assignment {
  return {
    ringId, windows: [{ firstLayer: 0, endLayer: 1, cycle: 0 }], successorUrl: "ws://127.0.0.1:1", ctx: 8, maxBatch: 1, cycles: 1,
    prefetch: false, releaseAfterUse: false, threads: 0, ringOrder: ["w1", "head"], wireDtype: 0,
  };
}

async function setup() {
  const reg = new WorkerRegistry({ modelFingerprint: FP, trust: await testTrust(), log: () => {} });
  const port = await reg.listen(0, "127.0.0.1");
  cleanups.push(() => reg.close());
  return { reg, address: `127.0.0.1:${port}`, token: (await testIdentity()).token };
}

function joined(address: string, token: Awaited<ReturnType<typeof setup>>["token"], name: string, join: { profileJson?: string; hardwareId?: string } = {}): FakeWorker {
  const f = fakeWorker({ address, name, fingerprint: FP, token, join });
  cleanups.push(() => f.close());
  return f;
}

/** Resolves once every message the worker sent before this point has been read by the coordinator:
 * a status asked now is answered after them, on the same stream. */
async function caughtUp(w: { status(ms?: number): Promise<Status> }, f: FakeWorker): Promise<void> {
  const before = f.received.filter((m) => m.msg === "statusRequest").length;
  const asked = w.status(5000);
  for (;;) {
    const n = f.received.filter((m) => m.msg === "statusRequest").length;
    if (n > before) break;
    await new Promise((r) => setTimeout(r, 10));
  }
  f.send({ status: idleStatus() });
  await asked;
}

describe("a ring being wired", () => {
  it("gives up as soon as a member that was ready is lost, naming it, while another member still sets up", async () => {
    const { reg, address, token } = await setup();
    const model = LocalModel.open(modelPath, { threads: 1 });
    cleanups.push(() => model.close());
    const slow = joined(address, token, "a-slow");
    const doomed = joined(address, token, "b-doomed");
    const [a, b] = (await reg.waitFor(2, 5000)).sort((x, y) => x.join.deviceName.localeCompare(y.join.deviceName));
    // The slow member reports progress for as long as the test runs and never says it is ready: without
    // the loss ending the wiring, the build would wait for it for good.
    const progress = setInterval(() => slow.send({ progress: { fraction: 0.5, stage: "setting up" } }), 200);
    cleanups.push(() => clearInterval(progress));
    // The doomed member is ready first, then lost: what the wiring still waits for is the slow one.
    void doomed.next("assignment", 10_000).then((m) => doomed.send({ ready: { anonBytes: 1, ringId: m.msg === "assignment" ? m.assignment.ringId : "" } }));
    const windows = (first: number, end: number) => [{ firstLayer: first, endLayer: end, cycle: 0 }];
    const building = Ring.build({
      members: [{ worker: a, windows: windows(0, 1), releaseAfterUse: false, prefetch: false }, { worker: b, windows: windows(1, 2), releaseAfterUse: false, prefetch: false }],
      headWindows: windows(2, model.nLayers), headReleaseAfterUse: false, cycles: 1, ctx: 16, maxBatch: 4, headPrefetch: false,
    }, { model, fingerprint: FP, registry: reg, log: (l) => /"b-doomed".* ready in/.test(l) && doomed.close() });
    await expect(building).rejects.toThrow(new RegExp(`device ${b.id} "b-doomed" \\(127\\.0\\.0\\.1\\) failed`));
    expect(a.lost).toBeNull();
  });
});

describe("a worker's assignments", () => {
  it("the coordinator waits only for the newest: an older wait ends, a Ready naming another ring answers nothing", async () => {
    const { reg, address, token } = await setup();
    const f = joined(address, token, "w");
    const [w] = await reg.waitFor(1, 5000);
    const first = w.assign(assignment("ring-1"));
    const firstEnd = first.then(() => "ready", (e: Error) => e.message);
    let secondReady = false;
    const second = w.assign(assignment("ring-2"));
    void second.then(() => (secondReady = true), () => {});
    expect(await firstEnd).toMatch(/its assignment was replaced by a newer one/);
    // The worker's late answer to the first assignment: read by the coordinator, it answers nothing.
    f.send({ ready: { anonBytes: 1, ringId: "ring-1" } });
    await caughtUp(w, f);
    expect(secondReady).toBe(false);
    f.send({ ready: { anonBytes: 2, ringId: "ring-2" } });
    expect((await second).anonBytes).toBe(2);
    // A worker of an older version names no ring: its Ready answers the assignment waited for.
    const third = w.assign(assignment("ring-3"));
    f.send({ ready: { anonBytes: 3 } });
    expect((await third).anonBytes).toBe(3);
    expect(w.lost).toBeNull();
  });

  it("a worker's session drops an assignment a newer one reaches, unanswered, and answers the newer one naming its ring", async () => {
    const { reg, address, token } = await setup();
    const signals: AbortSignal[] = [];
    const release: (() => void)[] = [];
    const handler: SessionHandler = {
      // Each assignment is set up when the test says so.
      assign: (a, _progress, _id, dropped) => {
        signals.push(dropped);
        return new Promise((resolve) => release.push(() => resolve(a.ringId === "ring-1" ? 11 : 22)));
      },
      kv: () => {},
      status: () => idleStatus(),
      reset: async () => {},
    };
    startSession({ address, token, name: "w", fingerprint: FP, profileJson: profileJson("w"), handler, cleanups });
    const [w] = await reg.waitFor(1, 5000);
    const readies: WorkerMessage[] = [];
    const receive = w.receive.bind(w);
    w.receive = (m) => {
      if (m.msg === "ready") readies.push(m);
      return receive(m);
    };
    void w.assign(assignment("ring-1")).catch(() => {});
    for (let i = 0; i < 500 && signals.length < 1; i++) await new Promise((r) => setTimeout(r, 10));
    const second = w.assign(assignment("ring-2"));
    for (let i = 0; i < 500 && signals.length < 2; i++) await new Promise((r) => setTimeout(r, 10));
    expect(signals.map((s) => s.aborted)).toEqual([true, false]);
    release[0](); // the dropped one finishes anyway: nothing is sent for it
    release[1]();
    expect((await second).anonBytes).toBe(22);
    await w.status(5000); // anything the worker sent before its status answer has been read
    expect(readies.map((m) => m.msg === "ready" && m.ready)).toEqual([{ anonBytes: 22, ringId: "ring-2" }]);
  });
});

describe("a worker device given an assignment that a newer one replaces", () => {
  it("stops before it makes windows or links, saying why", async () => {
    // Nothing past the check may run: the model and port are never touched.
    const device = new WorkerDevice({
      model: {} as LocalModel, fingerprint: "f", deviceName: "w1", dataPort: {} as RingPort, dataHost: "127.0.0.1", coordinatorHost: "127.0.0.1",
      log: () => {}, fail: () => {},
    });
    const dropped = new AbortController();
    const setting = device.assign({ ...assignment("ring-1"), predecessorLinkKey: new Uint8Array(32), successorLinkKey: new Uint8Array(32) }, () => {}, "w1", dropped.signal);
    dropped.abort(); // the newer assignment arrives while this one drops the last windows
    await expect(setting).rejects.toThrow(/a newer assignment replaced this one/);
    expect(device.idle).toBe(true);
  });
});

describe("a recovery's plan", () => {
  it("uses the statuses it was given and each hop as last probed: no status request, no probe", async () => {
    const { reg, address, token } = await setup();
    const model = LocalModel.open(modelPath, { threads: 1 });
    cleanups.push(() => model.close());
    const probe = await LinkProbeServer.listen({ deviceId: "p", modelFingerprint: FP, hiddenSize: model.nEmbd }, { host: "127.0.0.1" });
    const f = joined(address, token, "probed", { profileJson: profileJson("probed", probe.port) });
    const [w] = await reg.waitFor(1, 5000);
    const head = parseDeviceReport(profileJson("head"));
    const base = { model, modelPath, fingerprint: FP, workers: [w], head, ctx: 64, maxBatch: 8, tokens: 64, options: { keepAll: true } };
    // The plan before the request: the pass timed (the fake answers with its join's profile) and the hop probed.
    void f.next("statusRequest", 10_000).then(() => f.send({ status: idleStatus() }));
    const first = await planRing({ ...base, log: () => {}, retimeHead: async () => head });
    expect(first.links[1]).not.toBeNull();
    await probe.close(); // a probe now would fail, and say so
    const asked = f.received.filter((m: CoordinatorMessage) => m.msg === "statusRequest").length;
    const log: string[] = [];
    const again = await planRing({ ...base, log: (l) => log.push(l), retime: false, statuses: [idleStatus({ layerRoomBytes: 3e9 })] });
    expect(again.links[1]).toEqual(first.links[1]);
    expect(log.join("\n")).not.toMatch(/link probe failed/);
    expect(f.received.filter((m: CoordinatorMessage) => m.msg === "statusRequest").length).toBe(asked);
    expect(again.devices.find((d) => d.name === w.id)!.ramAvailableBytes).toBe(3e9);
    // The same device restarted (same hardware, same address) rejoins during the request: its hop is
    // the one probed before; another device at the same address is probed, and with no probe there, said.
    f.close();
    joined(address, token, "probed", { profileJson: profileJson("probed", probe.port) });
    joined(address, token, "other", { profileJson: profileJson("other", probe.port), hardwareId: "another" });
    const newcomers = () => reg.live().filter((x) => x !== w).sort((x, y) => x.join.deviceName.localeCompare(y.join.deviceName));
    for (let i = 0; i < 500 && newcomers().length < 2; i++) await new Promise((r) => setTimeout(r, 10));
    const live = newcomers();
    expect(live.map((x) => x.join.deviceName)).toEqual(["other", "probed"]);
    const log2: string[] = [];
    const rejoined = await planRing({ ...base, workers: live, log: (l) => log2.push(l), retime: false, statuses: [idleStatus(), idleStatus()] });
    expect(rejoined.links[2]).toEqual(first.links[1]);
    expect(log2.join("\n")).toMatch(new RegExp(`device ${live[0].id} "other" \\(127\\.0\\.0\\.1\\): link probe failed`));
    expect(log2.join("\n")).not.toMatch(/"probed".*link probe failed/);
  });
});
