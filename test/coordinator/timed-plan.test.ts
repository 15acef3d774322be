// Before a plan every device times its one-token pass again, in turn (workers first, then the head):
// the coordinator's status request asks for it (StatusRequest.timePass) and plans with the profile the
// answer carries, not the one from the join. And the worker side: a status that times the pass first
// is answered in the order asked, with the profile; a plain one after it is not overtaken.
import { afterEach, describe, expect, it } from "vitest";
import type { CoordinatorMessage, Status } from "../../control/index.js";
import { planRing } from "../../coordinator/plan-ring.js";
import { WorkerRegistry } from "../../coordinator/registry.js";
import { LocalModel } from "../../engine/index.js";
import { modelFingerprint, readGguf } from "../../model/index.js";
import { RereadStore, RingPassStore, parseDeviceReport, rereadKey, ringPassKey } from "../../profiler/index.js";
import { tempDir } from "../helpers/temp.js";
import type { SessionHandler } from "../../worker/session.js";
import { startSession } from "../helpers/worker-session.js";
import { root } from "../helpers/process.js";
import { testIdentity, testTrust } from "../helpers/trust.js";
import { fakeWorker } from "../control/fake-worker.js";

const modelPath = `${root}models/stories260K.gguf`;
const gguf = readGguf(modelPath);
const FP = modelFingerprint(gguf);
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A profile Halda accepts, at `gflops` for every weight type, on disk 8:0 of hardware named as the device. */
function profileJson(name: string, gflops: number): string {
  return JSON.stringify({
    version: 1,
    profile: {
      name, id: name, os: "linux", cpuFlopsPerS: { "*": gflops * 1e9 },
      ramTotalBytes: 8e9, ramAvailableBytes: 4e9, diskSeqReadBytesPerS: 1e9,
    },
    details: {
      memory: { totalBytes: 8e9, availableBytes: 5e9, physicalTotalBytes: 8e9, physicalAvailableBytes: 5e9 },
      disk: { dir: "/m", device: "8:0", throttle: {} },
    },
  });
}

const idleStatus = (extra: Partial<Status> = {}): Status => ({
  windows: [], waitMs: 0, sendMs: 0, anonRssBytes: 1, memTotalBytes: 8e9, memAvailableBytes: 5e9, memPressure: 0, frames: 0, layerRoomBytes: 4e9, ...extra,
});

async function registry() {
  const lines: string[] = [];
  const reg = new WorkerRegistry({ modelFingerprint: FP, trust: await testTrust(), log: (l) => lines.push(l) });
  const port = await reg.listen(0, "127.0.0.1");
  cleanups.push(() => reg.close());
  return { reg, address: `127.0.0.1:${port}`, lines };
}

/** A registry to join, the cluster's token, and the model a plan is made for (closed after the test). */
async function planningSetup() {
  const { reg, address } = await registry();
  const token = (await testIdentity()).token;
  const model = LocalModel.open(modelPath, { threads: 1 });
  cleanups.push(() => model.close());
  return { reg, address, token, model };
}

/** Two idle workers, joined at 30 GFLOP/s and answering the plan's status once, in name order. */
async function twoIdleWorkers(names: readonly [string, string]) {
  const { reg, address, token, model } = await planningSetup();
  for (const name of names) {
    const f = fakeWorker({ address, name, fingerprint: FP, token, join: { profileJson: profileJson(name, 30) } });
    cleanups.push(() => f.close());
    void f.next("statusRequest", 20_000).then(() => f.send({ status: idleStatus() }));
  }
  const workers = (await reg.waitFor(2, 5000)).sort((a, b) => a.join.deviceName.localeCompare(b.join.deviceName));
  return { model, workers };
}

describe("a plan times every device's pass first", () => {
  it("plans with the profile each worker timed just now, then times the head's; a broken one is said and the join's stands", async () => {
    const { reg, address, token, model } = await planningSetup();
    // Two workers joined at 30 GFLOP/s; now one times 12, the other answers with a profile that does
    // not parse.
    const answers: Record<string, string> = { slowed: profileJson("slowed", 12), broken: "{not json" };
    const order: string[] = [];
    for (const name of ["broken", "slowed"]) {
      const f = fakeWorker({ address, name, fingerprint: FP, token, join: { profileJson: profileJson(name, 30) } });
      cleanups.push(() => f.close());
      void f.next("statusRequest", 20_000).then((m: CoordinatorMessage) => {
        order.push(name);
        expect(m.msg === "statusRequest" && m.statusRequest.timePass).toBe(true);
        f.send({ status: idleStatus({ profileJson: answers[name] }) });
      });
    }
    const workers = (await reg.waitFor(2, 5000)).sort((a, b) => a.join.deviceName.localeCompare(b.join.deviceName));
    const log: string[] = [];
    const head = parseDeviceReport(profileJson("head", 30));
    const plan = await planRing({
      model, modelPath, fingerprint: FP, workers, head, ctx: 64, maxBatch: 8, tokens: 64, log: (l) => log.push(l), options: { keepAll: true },
      retimeHead: async () => {
        order.push("head");
        return parseDeviceReport(profileJson("head", 40));
      },
    });
    expect(order).toEqual(["broken", "slowed", "head"]);
    const said = log.join("\n");
    expect(said).toMatch(/device w\d "broken" \(127\.0\.0\.1\): the profile it timed now is not usable \(.*JSON.*\); its profile from the join is used/);
    const gflops = (label: string) => Number(new RegExp(`profile ${label}[^:]*: \\S+ ([\\d.]+) GFLOP/s`).exec(said)?.[1]);
    expect(gflops("head")).toBe(40);
    expect(gflops(`w\\d "slowed"`)).toBe(12);
    expect(gflops(`w\\d "broken"`)).toBe(30);
    expect(plan.labels).toHaveLength(3);
  });
});

describe("a plan prices rereads as the devices' rings saw them", () => {
  it("uses the median of a device's recent observations where it has some, its profile's figure where not, and says so", async () => {
    const { model, workers } = await twoIdleWorkers(["seen", "unseen"]);
    const head = parseDeviceReport(profileJson("head", 30));
    const rereads = new RereadStore(tempDir("prima-rereads-"));
    for (const [i, r] of [3e9, 2e9, 2.5e9].entries()) rereads.add(rereadKey(parseDeviceReport(profileJson("seen", 30))), r, Date.now() - 1000 + i);
    rereads.add(rereadKey(head), 4e9);
    const log: string[] = [];
    const plan = await planRing({ model, modelPath, fingerprint: FP, workers, head, ctx: 64, maxBatch: 8, tokens: 64, log: (l) => log.push(l), options: { keepAll: true }, rereads });
    const byName = new Map(plan.devices.map((d) => [d.name, d]));
    expect(byName.get(workers[0].id)!.diskSeqReadBytesPerS).toBe(2.5e9);
    expect(byName.get(workers[1].id)!.diskSeqReadBytesPerS).toBe(1e9);
    expect(byName.get("head")!.diskSeqReadBytesPerS).toBe(4e9);
    expect(log.join("\n")).toMatch(/device w\d "seen" \(127\.0\.0\.1\): rereads priced at 2500 MB\/s, the median of its last 3 in a ring within 60 minutes \(its profile: 1000 MB\/s\)/);
    expect(log.join("\n")).not.toMatch(/"unseen".*rereads priced/);
    // The keys the next decode's observations are kept under, by Halda index (0: the head).
    expect(plan.rereadKeys).toEqual([rereadKey(head), ...workers.map((w) => rereadKey(parseDeviceReport(w.join.profileJson)))]);
  });
});

describe("a plan prices compute as the devices' rings of this model ran it", () => {
  it("scales a device's compute by the middle of its recent ratios, leaves the others, says so and keeps the ratios for the next record", async () => {
    const { model, workers } = await twoIdleWorkers(["ran", "new"]);
    const head = parseDeviceReport(profileJson("head", 30));
    const passes = new RingPassStore(tempDir("prima-passes-"));
    const ran = parseDeviceReport(profileJson("ran", 30));
    for (const [i, r] of [0.7, 0.6, 0.75].entries()) passes.add(ringPassKey(ran, FP), r, Date.now() - 1000 + i);
    passes.add(ringPassKey(ran, "another model"), 0.1);
    const log: string[] = [];
    const plan = await planRing({ model, modelPath, fingerprint: FP, workers, head, ctx: 64, maxBatch: 8, tokens: 64, log: (l) => log.push(l), options: { keepAll: true }, passes });
    const byName = new Map(plan.devices.map((d) => [d.name, d]));
    const ranAt = workers.findIndex((w) => w.join.deviceName === "ran");
    const flops = (name: string) => Object.values(byName.get(name)!.cpuFlopsPerS)[0];
    expect(flops(workers[ranAt].id) / flops(workers[1 - ranAt].id)).toBeCloseTo(1 / 0.7, 6);
    expect(flops("head")).toBeCloseTo(flops(workers[1 - ranAt].id), 6);
    expect(log.join("\n")).toMatch(/device w\d "ran" \(127\.0\.0\.1\): compute priced at 0\.70x its profile's, the median of its last 3 rings of this model within 60 minutes/);
    expect(log.join("\n")).not.toMatch(/"new".*compute priced at/);
    expect(plan.passKeys).toEqual([head, ...workers.map((w) => parseDeviceReport(w.join.profileJson))].map((r) => ringPassKey(r, FP)));
    expect(plan.passRatios).toEqual([1, ...workers.map((_, j) => (j === ranAt ? 0.7 : 1))]);
  });
});

describe("a worker asked to time its pass", () => {
  it("answers in the order asked: the timed status with its profile, a plain one after it not first", async () => {
    const { reg, address } = await registry();
    const asked: (boolean | undefined)[] = [];
    const handler: SessionHandler = {
      assign: () => Promise.reject(new Error("not in this test")),
      kv: () => {},
      // The timed answer takes a while, as timing a pass does; the plain one is at once.
      status: (r) => {
        asked.push(r?.timePass);
        return r?.timePass ? new Promise((res) => setTimeout(() => res(idleStatus({ profileJson: profileJson("timer", 7) })), 300)) : idleStatus();
      },
      reset: async () => {},
    };
    startSession({ address, token: (await testIdentity()).token, name: "timer", fingerprint: FP, profileJson: profileJson("timer", 30), handler, cleanups });
    const [w] = await reg.waitFor(1, 5000);
    const [timed, plain] = await Promise.all([w.status(5000, true), w.status(5000)]);
    expect(asked).toEqual([true, false]);
    expect(parseDeviceReport(timed.profileJson!).profile.cpuFlopsPerS).toMatchObject({ "*": 7e9 });
    expect(plain.profileJson ?? "").toBe("");
  });
});
