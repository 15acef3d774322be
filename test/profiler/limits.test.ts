// A device with less reports less: processes in memory, CPU and blkio cgroups measure their limits,
// memory pressure follows the paper's definition inside a limit, and a file in the page cache is not
// taken for the disk. The parts that need a cgroup controller skip, saying why, where it is missing.
import { execFileSync } from "node:child_process";
import { writeFileSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { CPU_BOUND_READ_SHARE } from "../../coordinator/index.js";
import { reclaimIdlePages } from "../../profiler/index.js";
import { tmpfsDir } from "../helpers/temp.js";
import { PLACEMENT_SHAPE, privateModelCopy, testModel } from "./models.js";
import { blkioProblem, cgroupScope, controllerProblem, diskDeviceOf, distUrl, runScriptIn } from "./cgroup.js";

const tag = `prima-test-${process.pid}`;
const scope = cgroupScope();
const group = (name: string) => scope.group(`${tag}-${name}`);

const profiler = distUrl("profiler/index.js");
const memProblem = controllerProblem("memory");
const cpuProblem = controllerProblem("cpu");
const scratch = scope.tempDir("prima-limits-");
const diskProblem = blkioProblem(diskDeviceOf(scratch));

if (memProblem) console.warn(`limits.test: memory cgroup parts skipped: ${memProblem}`);
if (cpuProblem) console.warn(`limits.test: CPU cgroup parts skipped: ${cpuProblem}`);
if (diskProblem) console.warn(`limits.test: blkio parts skipped: ${diskProblem}`);

interface Mem { totalBytes: number; availableBytes: number; physicalTotalBytes: number; cgroup?: { limitBytes: number; version: number } }

describe.skipIf(memProblem !== null)(`memory cgroup limits${memProblem ? ` (skipped: ${memProblem})` : ""}`, () => {
  it("a process in a 300 MiB group reports at most 300 MiB, and less than one outside it", async () => {
    const limited = group("mem").add("memory", { "memory.limit_in_bytes": 300 * 2 ** 20 });
    const src = `import { readMemory } from ${JSON.stringify(profiler)}; console.log(JSON.stringify(readMemory()));`;
    const inside = await runScriptIn<Mem>([limited], src);
    const outside = await runScriptIn<Mem>([], src);
    expect(inside.cgroup?.version).toBe(1);
    expect(inside.cgroup?.limitBytes).toBe(300 * 2 ** 20);
    expect(inside.totalBytes).toBe(300 * 2 ** 20);
    expect(inside.availableBytes).toBeLessThan(300 * 2 ** 20);
    expect(inside.availableBytes).toBeGreaterThan(100 * 2 ** 20); // node itself needs a few tens of MiB
    expect(outside.totalBytes).toBeGreaterThan(inside.totalBytes);
    expect(outside.availableBytes).toBeGreaterThan(inside.availableBytes);
  });

  it("memory pressure is the drop of available memory over the group's memory: anonymous memory counts, page cache does not", async () => {
    const limited = group("pressure").add("memory", { "memory.limit_in_bytes": 400 * 2 ** 20 });
    const file = join(scratch, "cache-me.bin");
    writeFileSync(file, Buffer.alloc(64 * 2 ** 20, 7));
    const src = `
      import { memoryPressureTracker } from ${JSON.stringify(profiler)};
      const anon = memoryPressureTracker();
      const held = Buffer.alloc(40 * 2 ** 20, 1); // 40 MiB of anonymous memory, touched
      anon.sample();
      console.log(JSON.stringify({ anon: anon.pressure(), held: held.length }));`;
    const r = await runScriptIn<{ anon: number }>([limited], src);
    // 40 MiB of 400 MiB is 10 %; allocation noise of node itself stays within a few MiB.
    expect(r.anon).toBeGreaterThan(0.08);
    expect(r.anon).toBeLessThan(0.13);
    const fileOnly = `
      import { memoryPressureTracker } from ${JSON.stringify(profiler)};
      import { openSync, readSync, closeSync } from "node:fs";
      const t = memoryPressureTracker();
      const fd = openSync(${JSON.stringify(file)}, "r"); const b = Buffer.alloc(1 << 20);
      for (let off = 0; off < 64 * 2 ** 20; off += b.length) readSync(fd, b, 0, b.length, off);
      closeSync(fd); t.sample();
      console.log(JSON.stringify({ file: t.pressure() }));`;
    const f = await runScriptIn<{ file: number }>([limited], fileOnly);
    expect(f.file).toBeLessThan(0.02); // 64 MiB read through the page cache: reclaimable, not pressure
  });
});

describe.skipIf(memProblem !== null)(`idle pages reclaimed before a room reading${memProblem ? ` (skipped: ${memProblem})` : ""}`, () => {
  it("outside a binding cgroup nothing is held", async () => {
    expect(await reclaimIdlePages()).toBe(0);
  });

  it("mapped pages the process touched once and left count as room once reclaimIdlePages has run; nothing is killed, nothing kept", async () => {
    // A copy of its own: the shared file's pages stay resident while other test files map it.
    const model = privateModelCopy(await testModel(PLACEMENT_SHAPE, "Q8_0"), scope.tempDir("prima-limits-model-"));
    const limited = group("idle").add("memory", { "memory.limit_in_bytes": 200 * 2 ** 20 });
    // A window mapped and read once, then left mapped (as program start-up code is): pages the room
    // reading counts as held (it is not told they are this device's weights).
    const src = `
      import { dropFileCache, reclaimIdlePages, readMemory, layerRoomBytes, anonRssBytes } from ${JSON.stringify(profiler)};
      import { LocalModel } from ${JSON.stringify(distUrl("engine/index.js"))};
      dropFileCache(${JSON.stringify(model)}); // so that this group pays for the pages it reads
      const m = LocalModel.open(${JSON.stringify(model)}, { threads: 1 });
      const w = m.window(0, 6, { ctx: 16 });
      w.forwardNow(new Float32Array(m.nEmbd).fill(0.01), 0, 1);
      const state = () => { const r = readMemory(); return { room: layerRoomBytes(r), mapped: r.cgroup.mappedFileBytes, anon: anonRssBytes() }; };
      const before = state();
      const held = await reclaimIdlePages();
      const after = state();
      console.log(JSON.stringify({ before, held, after, window: w.residency().totalBytes, resident: w.residency().residentBytes }));
      w.close(); m.close();
    `;
    const r = await runScriptIn<{ before: { room: number; mapped: number; anon: number }; after: { room: number; mapped: number; anon: number }; held: number; window: number; resident: number }>([limited], src);
    // Every figure with each check: a full suite once read no more room after the press, which a
    // single run has not shown again.
    const seen = JSON.stringify(r);
    expect(r.before.mapped, seen).toBeGreaterThan(0.8 * r.window); // the window was counted as held
    expect(r.held, seen).toBeGreaterThan(100 * 2 ** 20); // the group's free memory and page cache, for a moment
    // most of the window was reclaimed, and its bytes are room now
    expect(r.after.mapped, seen).toBeLessThan(r.before.mapped - 0.5 * r.window);
    expect(r.after.room - r.before.room, seen).toBeGreaterThan(0.5 * r.window);
    expect(r.resident, seen).toBeLessThan(0.5 * r.window);
    // the memory it held is given back
    expect(Math.abs(r.after.anon - r.before.anon)).toBeLessThan(4 * 2 ** 20);
    expect(limited.read("memory", "memory.oom_control")).toMatch(/oom_kill 0/);
  });
});

describe.skipIf(cpuProblem !== null)(`CPU cgroup quota${cpuProblem ? ` (skipped: ${cpuProblem})` : ""}`, () => {
  it("a worker limited to a tenth of a CPU measures its kernels slower", async () => {
    const throttled = group("cpu").add("cpu", { "cpu.cfs_period_us": 20000, "cpu.cfs_quota_us": 2000 });
    // The script joins the group itself once loaded: node starting up on a tenth of a CPU takes long.
    const src = (dir: string | null) => `
      import { timeStep, cpuQuota } from ${JSON.stringify(profiler)};
      import { writeFileSync } from "node:fs";
      ${dir ? `writeFileSync(${JSON.stringify(`${dir}/cgroup.procs`)}, String(process.pid));` : ""}
      const step = { matrices: [{ type: "Q8_0", typeId: 8, ne0: 1024, ne1: 1024 }], perLayer: 1 };
      const t = timeStep(step, { threads: 2, workingSetBytes: 32 << 20, minSeconds: 0.3 });
      console.log(JSON.stringify({ flops: t.flopsPerS, quota: cpuQuota() ?? null }));`;
    // Interleaved, best of three each: other programs on this machine slow both alike.
    const fast: { flops: number; quota: number | null }[] = [], slow: { flops: number; quota: number | null }[] = [];
    for (let i = 0; i < 3; i++) {
      fast.push(await runScriptIn([], src(null)));
      slow.push(await runScriptIn([], src(throttled.dirs[0])));
    }
    expect(slow[0].quota).toBeCloseTo(0.1, 5);
    expect(fast[0].quota).toBeNull();
    // A tenth of a CPU against two: a twentieth of the throughput, give or take the scheduler.
    const best = (r: { flops: number }[]) => Math.max(...r.map((x) => x.flops));
    expect(best(slow)).toBeLessThan(best(fast) * 0.5);
  });
});

describe.skipIf(diskProblem !== null)(`disk reads bypass the page cache${diskProblem ? ` (skipped: ${diskProblem})` : ""}`, () => {
  it("a worker whose disk is throttled to 20 MB/s measures about 20 MB/s, though the file sits in the page cache", async () => {
    const dev = diskDeviceOf(scratch);
    const slow = group("disk").add("blkio", { "blkio.throttle.read_bps_device": `${dev} ${20_000_000}` });
    // A cached file reads at memory speed: that is what the profiler must not report as the disk.
    const file = join(scratch, "warm.bin");
    writeFileSync(file, Buffer.alloc(32 * 2 ** 20, 3));
    readFileSync(file);
    const t0 = performance.now();
    for (let i = 0; i < 4; i++) readFileSync(file);
    const cachedBytesPerS = (4 * 32 * 2 ** 20) / ((performance.now() - t0) / 1000);
    const src = (buffered: boolean) => `
      import { measureDisk } from ${JSON.stringify(profiler)};
      console.log(JSON.stringify(measureDisk(${JSON.stringify(scratch)}, { seqSeconds: 0.6, randSeconds: 0.2, fileBytes: 32 << 20, buffered: ${buffered} })));`;
    type Disk = { seqReadBytesPerS: number; seqReadCpuShare: number; randReadBytesPerS: number; direct: boolean; throttle: { readBytesPerS?: number } };
    const throttled = await runScriptIn<Disk>([slow], src(false));
    const free = await runScriptIn<Disk>([], src(false));
    // Where O_DIRECT is refused the file's pages are dropped before reading: still the disk's speed.
    const buffered = await runScriptIn<Disk>([slow], src(true));
    expect(throttled.direct).toBe(true);
    expect(buffered.direct).toBe(false);
    expect(buffered.seqReadBytesPerS).toBeLessThan(20_000_000 * 1.5);
    expect(throttled.throttle.readBytesPerS).toBe(20_000_000);
    expect(throttled.seqReadBytesPerS).toBeLessThan(20_000_000 * 1.5);
    expect(throttled.seqReadBytesPerS).toBeGreaterThan(20_000_000 * 0.3);
    expect(throttled.randReadBytesPerS).toBeLessThan(20_000_000 * 1.5);
    expect(cachedBytesPerS).toBeGreaterThan(10 * throttled.seqReadBytesPerS);
    expect(free.seqReadBytesPerS).toBeGreaterThan(2 * throttled.seqReadBytesPerS);
    // Waiting for a slow disk leaves the CPU idle: the share the prefetch choice reads
    // (coordinator/prefetch-choice.ts) is far under its line, buffered or not.
    for (const d of [throttled, buffered]) {
      expect(d.seqReadCpuShare).toBeGreaterThanOrEqual(0);
      expect(d.seqReadCpuShare).toBeLessThan(CPU_BOUND_READ_SHARE / 2);
    }
  }, 30_000);
});

describe("disk reads where O_DIRECT is refused", () => {
  it("reports a directory it cannot write to, or one with no room, with a clear error", async () => {
    const probe = async (dir: string) => (await runScriptIn<{ error?: string }>([], `
      import { measureDisk } from ${JSON.stringify(profiler)};
      try { measureDisk(${JSON.stringify(dir)}, { seqSeconds: 0.05, randSeconds: 0.05 }); console.log("{}"); }
      catch (e) { console.log(JSON.stringify({ error: e.message })); }`)).error;
    // Room but no writing: a read-only file system.
    const readOnly = tmpfsDir("prima-ro-disk-", "64m");
    execFileSync("mount", ["-o", "remount,ro", readOnly]);
    expect(await probe(readOnly)).toMatch(new RegExp(`cannot create the scratch file ${readOnly}/.*: `));
    // No room at all (/proc reports none free): the probe says so before it tries.
    expect(await probe("/proc")).toMatch(/too little disk under \/proc/);
  });
});
