// Halda's d_avail from a memory reading (issue #14): under a binding memory cgroup, the room the engine
// really gets (the limit less what the group holds, its unmapped page cache being reclaimable, less the
// runtime's growth); otherwise MemAvailable with prima.cpp's fifth kept back for the other programs.
import { expect, it } from "vitest";
import { LocalModel } from "../../engine/index.js";
import {
  RAM_AVAILABLE_FRACTION, RUNTIME_RESERVE_BYTES, cgroupLimitForRoom, layerRoomBytes, mappedResidentBytes, type CgroupMemory, type MemoryReading,
} from "../../profiler/index.js";
import { root } from "./cgroup.js";

const MiB = 2 ** 20;
const machine = { physicalTotalBytes: 24_000 * MiB, physicalAvailableBytes: 20_000 * MiB, swapTotalBytes: 0, swapFreeBytes: 0, swappableBytes: 0 };
const reading = (cg?: Partial<CgroupMemory>): MemoryReading => {
  const g: CgroupMemory | undefined = cg ? { version: 1, dir: "/x", limitBytes: 256 * MiB, usageBytes: 75 * MiB, fileBytes: 40 * MiB, mappedFileBytes: 7 * MiB, ...cg } : undefined;
  const avail = g ? Math.min(machine.physicalAvailableBytes, g.limitBytes - g.usageBytes + g.fileBytes) : machine.physicalAvailableBytes;
  return { ...machine, totalBytes: g ? Math.min(g.limitBytes, machine.physicalTotalBytes) : machine.physicalTotalBytes, availableBytes: avail, ...(g ? { cgroup: g } : {}) };
};

it("without a binding cgroup, the fifth of MemAvailable stays back", () => {
  expect(layerRoomBytes(reading())).toBe(Math.floor(20_000 * MiB * RAM_AVAILABLE_FRACTION));
  // a cgroup whose limit is above the machine's memory does not bind
  expect(layerRoomBytes(reading({ limitBytes: 30_000 * MiB }))).toBe(Math.floor(20_000 * MiB * RAM_AVAILABLE_FRACTION));
});

it("under a binding cgroup: the limit less what the group holds, its unmapped page cache reclaimable, less the runtime's reserve", () => {
  const base = layerRoomBytes(reading({}));
  // Every MiB of usage is a MiB less room, unless it is unmapped page cache (read once, e.g. the program's sources).
  expect(layerRoomBytes(reading({ usageBytes: 85 * MiB }))).toBe(base - 10 * MiB);
  expect(layerRoomBytes(reading({ usageBytes: 85 * MiB, fileBytes: 50 * MiB }))).toBe(base);
  // Mapped file pages (program text, libraries) are in use: not room.
  expect(layerRoomBytes(reading({ mappedFileBytes: 17 * MiB }))).toBe(base - 10 * MiB);
  // ... except the device's own model pages, which the next plan decides about.
  expect(layerRoomBytes(reading({ mappedFileBytes: 17 * MiB }), 10 * MiB)).toBe(base);
  // Nothing left: no room, never negative.
  expect(layerRoomBytes(reading({ usageBytes: 256 * MiB, fileBytes: 0 }))).toBe(0);
  // The machine's memory binds when it is the smaller: then its fifth stays back.
  const tight = { ...reading({ limitBytes: 8_000 * MiB }), physicalAvailableBytes: 1_000 * MiB };
  expect(layerRoomBytes(tight)).toBe(Math.floor(1_000 * MiB * RAM_AVAILABLE_FRACTION));
  // The reserve is what separates the room from the cgroup's plain headroom.
  expect(base).toBe(256 * MiB - 75 * MiB + (40 - 7) * MiB - RUNTIME_RESERVE_BYTES);
});

it("cgroupLimitForRoom is the limit under which the room reads as asked (how tests cap devices)", () => {
  for (const want of [1, 50 * MiB, 123_456_789]) {
    const cg = reading({}).cgroup!;
    const limit = cgroupLimitForRoom(cg, want);
    const got = layerRoomBytes(reading({ limitBytes: limit }));
    expect(got - want).toBeGreaterThanOrEqual(0);
    expect(got - want).toBeLessThan(2);
  }
});

it("mappedResidentBytes counts this process's resident pages of a mapped file", () => {
  const path = `${root}/models/stories260K.gguf`;
  expect(mappedResidentBytes(path)).toBe(0);
  const m = LocalModel.open(path, { threads: 1 });
  const w = m.window(0, m.nLayers, { ctx: 16 });
  try {
    w.forwardNow(new Float32Array(m.nEmbd), 0, 1);
    const res = w.residency().residentBytes;
    expect(res).toBeGreaterThan(0);
    // the whole window's pages are resident, and more of the file (header, embeddings) may be
    expect(mappedResidentBytes(path)).toBeGreaterThanOrEqual(res);
  } finally {
    w.close();
    m.close();
  }
});
