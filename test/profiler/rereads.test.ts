// A device's reread speed as its ring's decode shows it, kept and used by the next plans: the rule that
// reads it off a decode's counters, the store beside the profiles, and the plan's pricing by it.
import { closeSync, openSync, readSync, rmSync, statfsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import type { RingPlan } from "../../coordinator/plan-ring.js";
import { recordRereads, type StepCost } from "../../coordinator/prediction.js";
import { dropFileCache } from "../../native/profile.js";
import {
  MIN_OBSERVED_REREAD_BYTES, RECENT_REREAD_MS, RereadStore, observedRereadBytesPerS, recentRereads, rereadFigure, rereadKey, storageReadBytes, type DeviceReport,
} from "../../profiler/index.js";
import { tempDir } from "../helpers/temp.js";

const MiB = 2 ** 20;

describe("a reread speed read off a decode", () => {
  it("is the bytes read over the time the device's own work took beyond its in-memory figure", () => {
    // 190 MiB a token in the 27 ms the head's 35 ms took beyond its 8 ms of compute.
    expect(observedRereadBytesPerS(190 * MiB, 35, 8, 5e9)).toBeCloseTo((1000 * 190 * MiB) / 27, 0);
  });

  it("is none where the device hardly read, took no longer than its compute, or the figure is implausible", () => {
    expect(observedRereadBytesPerS(MIN_OBSERVED_REREAD_BYTES - 1, 35, 8, 5e9)).toBeUndefined(); // compute noise, not a stream
    expect(observedRereadBytesPerS(190 * MiB, 8, 8, 5e9)).toBeUndefined();
    expect(observedRereadBytesPerS(190 * MiB, 7, 8, 5e9)).toBeUndefined();
    expect(observedRereadBytesPerS(190 * MiB, 8.01, 8, 5e9)).toBeUndefined(); // 20 TB/s: not a disk
    expect(observedRereadBytesPerS(190 * MiB, 35, 8, 1e12)).toBeUndefined(); // 8x below what it was priced at
    expect(observedRereadBytesPerS(Number.NaN, 35, 8, 5e9)).toBeUndefined();
  });
});

describe("the store of observations", () => {
  it("keeps a device's last three within the hour, in a file, and prices by their median", () => {
    const dir = tempDir("prima-rereads-");
    const store = new RereadStore(dir);
    const t0 = 1_800_000_000_000;
    expect(store.recent("a", t0)).toEqual([]);
    store.add("a", 4e9, t0);
    store.add("a", 7e9, t0 + 1000);
    store.add("b", 1e9, t0 + 1500);
    store.add("a", 5e9, t0 + 2000);
    store.add("a", 6e9, t0 + 3000);
    // Another process's store reads the same file.
    const again = new RereadStore(dir);
    expect(again.recent("a", t0 + 4000).map((o) => o.bytesPerS)).toEqual([7e9, 5e9, 6e9]);
    expect(rereadFigure(again.recent("a", t0 + 4000))).toBe(6e9);
    expect(again.recent("b", t0 + 4000).map((o) => o.bytesPerS)).toEqual([1e9]);
    // An hour on, none counts.
    expect(again.recent("a", t0 + 3000 + RECENT_REREAD_MS)).toEqual([]);
    expect(rereadFigure([])).toBeUndefined();
  });

  it("reads a broken or hostile file as no observations, and a new observation replaces it", () => {
    const dir = tempDir("prima-rereads-");
    const file = join(dir, "rereads.json");
    const now = 1_800_000_000_000;
    for (const text of ["not json", "[1,2]", "null", JSON.stringify({ a: "x", b: [{ bytesPerS: -1, atMs: now }, { bytesPerS: 1e9, atMs: now + 60_000 }, { bytesPerS: "9", atMs: now }] })]) {
      writeFileSync(file, text);
      expect(new RereadStore(dir).recent("a", now)).toEqual([]);
      expect(new RereadStore(dir).recent("b", now)).toEqual([]); // from the future, negative, a string: none
    }
    new RereadStore(dir).add("a", 3e9, now);
    expect(new RereadStore(dir).recent("a", now)).toEqual([{ bytesPerS: 3e9, atMs: now }]);
    expect(recentRereads({ not: "a list" }, now)).toEqual([]);
  });

  it("keys a device by its hardware, disk and throttle, from whatever a worker's report holds", () => {
    const report = (id: string, device: string, readBytesPerS?: number) =>
      ({ profile: { id }, details: { disk: { device, dir: "/m", throttle: readBytesPerS ? { readBytesPerS } : {} } } }) as unknown as DeviceReport;
    expect(rereadKey(report("h1", "8:0"))).toBe(rereadKey(report("h1", "8:0")));
    expect(new Set([rereadKey(report("h1", "8:0")), rereadKey(report("h2", "8:0")), rereadKey(report("h1", "8:16")), rereadKey(report("h1", "8:0", 5e7))]).size).toBe(4);
    // A report without details still has a key, and a long one is bounded.
    expect(rereadKey({ profile: { id: "x".repeat(5000) } } as unknown as DeviceReport).length).toBeLessThanOrEqual(300);
  });
});

describe("a decode's rereads recorded for the next plan", () => {
  const cost = (o: Partial<StepCost>): StepCost => ({ computeMs: 0, waitMs: 0, sendMs: 0, descheduledMs: 0, majorFaults: 0, readBytes: 0, ...o });
  const lat = (computeMs: number, diskMs: number) => ({ computeMs, memoryMs: 0, diskMs, commMs: 0.4, totalMs: computeMs + diskMs + 0.4 });
  // Halda's device 0, the head, streams its window; device 1, a worker, holds its own.
  const plan = {
    cycles: 1, handOffMs: [0.25, 0], labels: ["head (this coordinator)", "w1 \"a\""], rereadKeys: ["disk-h", "disk-a"],
    devices: [{ diskSeqReadBytesPerS: 5e9 }, { diskSeqReadBytesPerS: 5e9 }],
    plan: { devices: [{ index: 0, latency: lat(7.5, 30) }, { index: 1, latency: lat(4, 0) }] },
  } as unknown as RingPlan;

  it("keeps what a streaming device's decode showed, beyond its compute and hand-off, and nothing for a device that held its window", () => {
    const store = new RereadStore(tempDir("prima-rereads-"));
    const said = recordRereads(plan, [
      { haldaIndex: 0, before: {}, cost: cost({ computeMs: 35, sendMs: 0.8, descheduledMs: 0.3, readBytes: 190 * MiB }) },
      { haldaIndex: 1, before: {}, cost: cost({ computeMs: 4.2, readBytes: 0 }) },
    ], store);
    const diskMs = 35 + 0.8 - 0.3 - 7.5 - 0.25;
    expect(store.recent("disk-h")[0].bytesPerS).toBeCloseTo((1000 * 190 * MiB) / diskMs, 0);
    expect(store.recent("disk-a")).toEqual([]);
    expect(said).toHaveLength(1);
    expect(said[0]).toMatch(/^device head \(this coordinator\) reread 190 MiB a token at \d+ MB\/s \(priced at 5000\)$/);
  });

  it("says what the plan priced the disk at by Halda's rule: sequential on Linux, random elsewhere", () => {
    const priced = (os: string) => {
      const p = { ...plan, devices: [{ os, diskSeqReadBytesPerS: 5e9, diskRandReadBytesPerS: 4e9 }, plan.devices[1]] } as unknown as RingPlan;
      return recordRereads(p, [{ haldaIndex: 0, before: {}, cost: cost({ computeMs: 35, readBytes: 190 * MiB }) }], new RereadStore(tempDir("prima-rereads-")))[0];
    };
    expect(priced("linux")).toMatch(/\(priced at 5000\)$/);
    expect(priced("macos")).toMatch(/\(priced at 4000\)$/);
  });

  it("keeps nothing from counters that do not cover the decode alone", () => {
    const store = new RereadStore(tempDir("prima-rereads-"));
    expect(recordRereads(plan, [{ haldaIndex: 0, cost: cost({ computeMs: 35, readBytes: 190 * MiB }) }], store)).toEqual([]);
    expect(store.recent("disk-h")).toEqual([]);
  });
});

/** tmpfs: no disk behind it to read from. */
const TMPFS_MAGIC = 0x01021994;
const scratch = tempDir("prima-rereads-");

describe("storageReadBytes", () => {
  it.runIf(process.platform === "linux" && statfsSync(scratch).type !== TMPFS_MAGIC)("counts a read that had to go to the disk", () => {
    const dir = scratch;
    const path = join(dir, "data");
    writeFileSync(path, Buffer.alloc(8 * MiB, 7));
    dropFileCache(path); // written back and dropped: the read below goes to the disk
    const before = storageReadBytes();
    const fd = openSync(path, "r");
    const buf = Buffer.alloc(MiB);
    for (let off = 0; off < 8 * MiB; off += MiB) readSync(fd, buf, 0, MiB, off);
    closeSync(fd);
    rmSync(path);
    expect(storageReadBytes() - before).toBeGreaterThanOrEqual(8 * MiB);
  });
});
