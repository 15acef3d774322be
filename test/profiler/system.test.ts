// What the device is (OS, GPU, cgroup layout) from the files and tools that say so, and the cost of a
// hop measured against a link probe, with and without a slow link in between.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, connect, type Server } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import {
  LinkProbeServer, WeightRoom, anonRssBytes, armCores, cpuName, cgroupMemory, cgroupPaths, detectGpus, detectOs, lastLevelCacheBytes, measureLink, parseCacheSize, timeHandOff, parseNvidiaSmi, readMemory,
  standInMinBytes,
} from "../../profiler/index.js";

/** An aarch64 /proc/cpuinfo: one block per core, (implementer, part) each. */
function armCpuinfo(cores: [number, number][], tail = ""): string {
  return cores.map(([impl, part], i) => `processor\t: ${i}\nBogoMIPS\t: 38.40\nFeatures\t: fp asimd evtstrm crc32 cpuid\n` +
    `CPU implementer\t: 0x${impl.toString(16)}\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0x${part.toString(16).padStart(3, "0")}\n` +
    "CPU revision\t: 3\n").join("\n") + tail;
}

/** lscpu's vendor and model names for a cpuinfo, read from a fake root (util-linux >= 2.38 has --sysroot). */
function lscpuNames(cpuinfo: string, n: number): string[][] | null {
  const root = mkdtempSync(join(tmpdir(), "prima-lscpu-"));
  try {
    mkdirSync(join(root, "proc"));
    mkdirSync(join(root, "sys", "devices", "system", "cpu"), { recursive: true });
    writeFileSync(join(root, "proc", "cpuinfo"), cpuinfo);
    for (const f of ["possible", "present", "online"]) writeFileSync(join(root, "sys", "devices", "system", "cpu", f), `0-${n - 1}\n`);
    const r = spawnSync("lscpu", ["--sysroot", root], { encoding: "utf8" });
    if (r.status !== 0) return null;
    const vendors = [...r.stdout.matchAll(/^Vendor ID:\s*(.+)$/gm)].map((m) => m[1].trim());
    const models = [...r.stdout.matchAll(/^\s*Model name:\s*(.+)$/gm)].map((m) => m[1].trim());
    return vendors.map((v, i) => [v, models[i]]);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}
const lscpuMissing = lscpuNames(armCpuinfo([[0x41, 0xd08]]), 1) === null;

describe("CPU name on ARM (cpuinfo has no model name there)", () => {
  const ARM_KNOWN: [number, number][] = [
    [0x41, 0xd03], [0x41, 0xd04], [0x41, 0xd05], [0x41, 0xd07], [0x41, 0xd08], [0x41, 0xd09], [0x41, 0xd0a], [0x41, 0xd0b],
    [0x41, 0xd0c], [0x41, 0xd0d], [0x41, 0xd40], [0x41, 0xd41], [0x41, 0xd44], [0x41, 0xd46], [0x41, 0xd47], [0x41, 0xd48],
    [0x41, 0xd49], [0x41, 0xd4d], [0x41, 0xd4e], [0x41, 0xd80], [0x41, 0xd81], [0x41, 0xd82],
    [0x51, 0x800], [0x51, 0x801], [0x51, 0x802], [0x51, 0x803], [0x51, 0x804], [0x51, 0x805],
  ];
  it.skipIf(lscpuMissing)("names every core kind it knows as lscpu does", () => {
    for (const core of ARM_KNOWN) {
      const info = armCpuinfo([core]);
      const [c] = armCores(info);
      expect([c.vendor, c.model], `implementer 0x${core[0].toString(16)} part 0x${core[1].toString(16)}`).toEqual(lscpuNames(info, 1)![0]);
    }
  });

  it.skipIf(lscpuMissing)("groups big.LITTLE cores by kind, in cpuinfo's order", () => {
    const kinds: [number, number][] = [[0x41, 0xd05], [0x41, 0xd0b], [0x41, 0xd44]];
    const info = armCpuinfo([kinds[0], kinds[0], kinds[0], kinds[0], kinds[1], kinds[1], kinds[1], kinds[2]]);
    const cores = armCores(info);
    expect(cores.map((c) => c.count)).toEqual([4, 3, 1]);
    // (lscpu --sysroot lists one kind without per-CPU sysfs: each kind is named by it alone)
    expect(cores.map((c) => [c.vendor, c.model])).toEqual(kinds.map((k) => lscpuNames(armCpuinfo([k]), 1)![0]));
  });

  it("prefers Node's name, then the board or SoC with its cores; says so when nothing is known", () => {
    const pi = armCpuinfo([[0x41, 0xd08], [0x41, 0xd08]], "\nRevision\t: c03114\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n");
    expect(cpuName("AMD EPYC", pi, undefined)).toBe("AMD EPYC");
    expect(cpuName("unknown", pi, "Raspberry Pi 4 Model B Rev 1.4\0")).toBe("Raspberry Pi 4 Model B Rev 1.4 (2x ARM Cortex-A72)");
    const phone = armCpuinfo([[0x51, 0x805], [0x51, 0x804]], "\nHardware\t: Qualcomm Technologies, Inc SM8150\n");
    expect(cpuName("", phone)).toBe("Qualcomm Technologies, Inc SM8150 (1x Qualcomm Kryo-4XX-Silver + 1x Qualcomm Kryo-4XX-Gold)");
    expect(cpuName("", armCpuinfo([[0x41, 0xfff]]))).toBe("1x ARM part 0xfff");
    expect(cpuName("", "")).toBe("unknown CPU");
  });
});

describe("operating system", () => {
  it("tells Android (Termux or its build.prop) from Linux, and macOS by platform", () => {
    const none = () => false;
    expect(detectOs({}, none, "linux")).toBe("linux");
    expect(detectOs({ TERMUX_VERSION: "0.118.0" }, none, "linux")).toBe("android");
    expect(detectOs({}, (p) => p === "/system/build.prop", "linux")).toBe("android");
    expect(detectOs({}, none, "android")).toBe("android");
    expect(detectOs({}, none, "darwin")).toBe("macos");
  });
});

describe("last-level cache", () => {
  it("is the largest data or unified cache sysfs lists, and sizes the stand-in five times over", () => {
    const dir = mkdtempSync(join(tmpdir(), "prima-cache-sysfs-"));
    try {
      const level = (i: number, type: string, size: string) => {
        mkdirSync(join(dir, `index${i}`));
        writeFileSync(join(dir, `index${i}`, "type"), `${type}\n`);
        writeFileSync(join(dir, `index${i}`, "size"), `${size}\n`);
      };
      level(0, "Data", "48K");
      level(1, "Instruction", "64M"); // an instruction cache holds no weights, however large
      level(2, "Unified", "1024K");
      level(3, "Unified", "32768K");
      expect(lastLevelCacheBytes(dir)).toBe(32 << 20);
      expect(standInMinBytes(lastLevelCacheBytes(dir))).toBe(160 << 20);
      expect(lastLevelCacheBytes(join(dir, "none"))).toBeUndefined();
      expect(standInMinBytes(undefined)).toBe(160 << 20); // 32 MiB assumed where none can be read
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    expect([parseCacheSize("96M"), parseCacheSize("512K"), parseCacheSize("junk"), parseCacheSize(undefined)]).toEqual([96 << 20, 512 << 10, undefined, undefined]);
  });
});

describe("GPUs", () => {
  it("reads nvidia-smi's CSV in MiB, skipping lines it cannot read", () => {
    const gpus = parseNvidiaSmi("NVIDIA GeForce RTX 3080, 10240, 9000\nNVIDIA T4, 15360, 15000\n\ngarbage\nX, -1, 5\n");
    expect(gpus).toEqual([
      { kind: "cuda", name: "NVIDIA GeForce RTX 3080", totalBytes: 10240 * 2 ** 20, freeBytes: 9000 * 2 ** 20, uma: false },
      { kind: "cuda", name: "NVIDIA T4", totalBytes: 15360 * 2 ** 20, freeBytes: 15000 * 2 ** 20, uma: false },
    ]);
  });

  it("reports Metal on Apple Silicon, nothing on an Intel Mac", () => {
    expect(detectGpus("darwin", "arm64")).toMatchObject([{ kind: "metal", uma: true }]);
    expect(detectGpus("darwin", "x64")).toEqual([]);
  });
});

describe("cgroup layout", () => {
  const mountinfo = [
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu",
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory",
    "38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio",
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw",
  ].join("\n");

  it("finds v1 groups under their controllers' mounts", () => {
    const p = cgroupPaths("4:memory:/svc/worker\n1:cpu:/svc\n7:blkio:/\n0::/", mountinfo, () => true);
    expect(p.memory).toEqual({ version: 1, dir: "/sys/fs/cgroup/memory/svc/worker" });
    expect(p.cpu).toEqual({ version: 1, dir: "/sys/fs/cgroup/cpu/svc" });
    expect(p.blkio).toEqual({ version: 1, dir: "/sys/fs/cgroup/blkio" });
  });

  it("takes the mount itself as the group when the listed path is not inside it (a container)", () => {
    const p = cgroupPaths("4:memory:/docker/abc123\n", mountinfo, (d) => d === "/sys/fs/cgroup/memory");
    expect(p.memory).toEqual({ version: 1, dir: "/sys/fs/cgroup/memory" });
  });

  it("finds this process's real groups: directories that list this process", () => {
    const p = cgroupPaths();
    for (const g of [p.memory, p.cpu, p.blkio]) {
      if (!g || g.version !== 1) continue;
      const procs = readFileSync(join(g.dir, "cgroup.procs"), "utf8").split("\n");
      expect(procs).toContain(String(process.pid));
    }
  });
});

describe("link probe over the ring's data plane", () => {
  const servers: { close(): unknown }[] = [];
  afterEach(async () => {
    for (const s of servers.splice(0)) await s.close();
  });
  const identity = { deviceId: "probe", modelFingerprint: "test-model", hiddenSize: 1024 };
  const client = { deviceId: "head", modelFingerprint: "test-model", hiddenSize: 1024 };

  /** A TCP relay that holds every chunk for delayMs in each direction: a slow link. */
  function slowRelay(targetPort: number, delayMs: number): Promise<Server & { port: number }> {
    const server = createServer((c) => {
      const up = connect(targetPort, "127.0.0.1");
      c.on("data", (d) => setTimeout(() => up.write(d), delayMs));
      up.on("data", (d) => setTimeout(() => c.write(d), delayMs));
      const end = () => { c.destroy(); up.destroy(); };
      c.on("close", end);
      up.on("close", end);
      c.on("error", end);
      up.on("error", end);
    });
    return new Promise((resolve) => server.listen(0, "127.0.0.1", () => {
      const a = server.address();
      resolve(Object.assign(server, { port: typeof a === "object" && a ? a.port : 0 }));
    }));
  }

  it("measures a loopback hop as fast, and a hop through a 15 ms relay as at least 15 ms each way", async () => {
    const probe = await LinkProbeServer.listen(identity, { host: "127.0.0.1" });
    servers.push(probe);
    const fast = await measureLink(`ws://127.0.0.1:${probe.port}`, { identity: client, bulkTokens: 128, rounds: 10 });
    expect(fast.messageBytes).toBe(4096); // one token of 1024 floats
    expect(fast.bulkBytes).toBe(128 * 4096);
    expect(fast.rttMs).toBeGreaterThan(0);
    expect(fast.rttMs).toBeLessThan(15);
    expect(fast.linkLatencyMs).toBeCloseTo(fast.rttMs / 2, 9);
    expect(fast.bytesPerS).toBeGreaterThan(1e7); // loopback moves far more than 10 MB/s
    const relay = await slowRelay(probe.port, 15);
    servers.push({ close: () => new Promise((r) => relay.close(() => r(undefined))) });
    const slow = await measureLink(`ws://127.0.0.1:${relay.port}`, { identity: client, bulkTokens: 16, rounds: 4 });
    expect(slow.rttMs).toBeGreaterThanOrEqual(30);
    expect(slow.linkLatencyMs).toBeGreaterThanOrEqual(15);
    expect(slow.linkLatencyMs).toBeGreaterThan(fast.linkLatencyMs * 3);
  });

  it("drops a peer that sends garbage or another model, and keeps serving", async () => {
    const probe = await LinkProbeServer.listen(identity, { host: "127.0.0.1" });
    servers.push(probe);
    const closed = await new Promise<boolean>((resolve) => {
      const s = connect(probe.port, "127.0.0.1", () => s.write(Buffer.from([0xff, 0xfe, 0x00, 0x01, 0x0d, 0x0a, 0x0d, 0x0a])));
      s.on("close", () => resolve(true));
      s.on("error", () => undefined);
    });
    expect(closed).toBe(true);
    await expect(measureLink(`ws://127.0.0.1:${probe.port}`, { identity: { ...client, modelFingerprint: "other" }, bulkTokens: 4 }))
      .rejects.toThrow(/link probe to ws:\/\/127\.0\.0\.1:\d+: .*fingerprint/);
    const ok = await measureLink(`ws://127.0.0.1:${probe.port}`, { identity: client, bulkTokens: 4, rounds: 3 });
    expect(ok.rttMs).toBeGreaterThan(0);
  });

  it("times the head's hand-off after each pass, without the pass: relax, encode, seal and write to a keyed loopback link", async () => {
    const passes: number[] = [];
    let relaxed = 0;
    const busy = (ms: number) => { const t = performance.now(); while (performance.now() - t < ms); };
    const times = await timeHandOff({ hiddenSize: 1024, rounds: 3, gapMs: 1, relax: () => relaxed++, pass: (pos) => { passes.push(pos); busy(20); } });
    expect(times).toHaveLength(3);
    // Three untimed rounds first, each pass at the next position, relaxed once before each send.
    expect(passes).toEqual([0, 1, 2, 3, 4, 5]);
    expect(relaxed).toBe(6);
    expect([...times].sort((a, b) => a - b)[1]).toBeGreaterThan(0); // the median
    expect(Math.max(...times)).toBeLessThan(20); // a 20 ms pass would be in it
  });

  it("says which peer it could not reach", async () => {
    const probe = await LinkProbeServer.listen(identity, { host: "127.0.0.1" });
    const port = probe.port;
    await probe.close();
    await expect(measureLink(`ws://127.0.0.1:${port}`, { identity: client, bulkTokens: 4 })).rejects.toThrow(new RegExp(`link probe to ws://127\\.0\\.0\\.1:${port}`));
    await expect(measureLink(`ws://127.0.0.1:${port}`, { identity: client, bulkTokens: 0 })).rejects.toThrow(/bulk of 0 tokens/);
  });
});

describe("cgroup memory files", () => {
  const dirs: string[] = [];
  afterEach(() => {
    for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
  });
  const tree = (files: Record<string, string>) => {
    const root = mkdtempSync(join(tmpdir(), "prima-cg-"));
    dirs.push(root);
    for (const [f, v] of Object.entries(files)) {
      mkdirSync(dirname(join(root, f)), { recursive: true });
      writeFileSync(join(root, f), v);
    }
    return root;
  };

  it("v2: the tightest memory.max on the way up, usage, and page cache as reclaimable", () => {
    const root = tree({
      "parent/memory.max": `${500 * 2 ** 20}\n`,
      "parent/child/memory.max": "max\n",
      "parent/child/memory.current": `${200 * 2 ** 20}\n`,
      "parent/child/memory.stat": `anon ${150 * 2 ** 20}\nactive_file ${30 * 2 ** 20}\ninactive_file ${20 * 2 ** 20}\nfile_mapped ${12 * 2 ** 20}\nfile_dirty ${2 * 2 ** 20}\nfile_writeback ${2 ** 20}\n`,
    });
    const m = cgroupMemory({ memory: { version: 2, dir: join(root, "parent/child") } });
    expect(m).toEqual({ version: 2, dir: join(root, "parent/child"), limitBytes: 500 * 2 ** 20, usageBytes: 200 * 2 ** 20, fileBytes: 50 * 2 ** 20, mappedFileBytes: 12 * 2 ** 20, dirtyFileBytes: 3 * 2 ** 20 });
    const r = readMemory(false, { memory: { version: 2, dir: join(root, "parent/child") } });
    expect(r.totalBytes).toBe(500 * 2 ** 20);
    expect(r.availableBytes).toBe(Math.min(r.physicalAvailableBytes, (500 - 200 + 50) * 2 ** 20));
  });

  it("v1: hierarchical_memory_limit counts, and an unlimited group is no limit at all", () => {
    const limited = tree({
      "memory.limit_in_bytes": "9223372036854771712\n",
      "memory.usage_in_bytes": `${64 * 2 ** 20}\n`,
      "memory.stat": `hierarchical_memory_limit ${256 * 2 ** 20}\ntotal_active_file ${8 * 2 ** 20}\ntotal_inactive_file ${8 * 2 ** 20}\ntotal_mapped_file ${3 * 2 ** 20}\ntotal_dirty ${2 ** 20}\ntotal_writeback ${2 ** 20}\n`,
    });
    expect(cgroupMemory({ memory: { version: 1, dir: limited } })).toMatchObject({
      limitBytes: 256 * 2 ** 20, usageBytes: 64 * 2 ** 20, fileBytes: 16 * 2 ** 20, mappedFileBytes: 3 * 2 ** 20, dirtyFileBytes: 2 * 2 ** 20,
    });
    const free = tree({
      "memory.limit_in_bytes": "9223372036854771712\n",
      "memory.usage_in_bytes": `${64 * 2 ** 20}\n`,
      "memory.stat": "hierarchical_memory_limit 9223372036854771712\n",
    });
    expect(cgroupMemory({ memory: { version: 1, dir: free } })).toBeUndefined();
  });
});

// Without a memory cgroup limit the room counts our resident weights, so each reading asks for them.
describe.skipIf(cgroupMemory() !== undefined)("weight room of a ring device", () => {
  it("answers from its last reading and renews a stale one after the current turn, not during the call", async () => {
    let readings = 0;
    const room = new WeightRoom(() => (readings++, 0));
    const first = room.bytes();
    expect(first).toBeGreaterThan(0);
    expect(readings).toBe(1);
    expect(room.bytes()).toBe(first);
    expect(readings).toBe(1); // fresh: no second reading
    await new Promise((r) => setTimeout(r, 1010));
    room.bytes(); // stale: answered from the old reading...
    room.bytes();
    expect(readings).toBe(1);
    await new Promise((r) => setImmediate(r));
    expect(readings).toBe(2); // ...and renewed once, after the turn
    room.forget();
    room.bytes();
    expect(readings).toBe(3); // forgotten: read at once
  });
});

describe.skipIf(process.platform !== "linux")("kernel files kept open", () => {
  it("read fresh on every call: anonymous memory grows with a touched 64 MiB buffer", () => {
    // RssAnon leaves out the file pages that rss counts (the node binary): a value below rss came
    // from /proc/self/status, not from the fallback.
    const before = anonRssBytes();
    expect(before).toBeLessThan(process.memoryUsage().rss);
    const buf = Buffer.alloc(64 * 2 ** 20, 1);
    const after = anonRssBytes();
    expect(after).toBeLessThan(process.memoryUsage().rss);
    expect(after).toBeGreaterThan(before + 48 * 2 ** 20);
    expect(buf[buf.length - 1]).toBe(1);
  });
});
