// Halda's d_avail from a memory reading (issue #14): a memory cgroup's room is used exactly where its
// hard limit is what binds (the reading already leaves out the process's anonymous memory); otherwise
// MemAvailable with prima.cpp's fifth kept back for the other programs sharing it.
import { expect, it } from "vitest";
import { layerRoomBytes, RAM_AVAILABLE_FRACTION } from "../../profiler/index.js";

const MiB = 2 ** 20;

it("the room keeps prima.cpp's fifth back, under a binding cgroup limit too", () => {
  // The exact cgroup room placed devices at their limit and they thrashed (test/ring/placement.test.ts).
  expect(layerRoomBytes({ availableBytes: 228 * MiB, physicalAvailableBytes: 20_000 * MiB, cgroupLimited: true })).toBe(Math.floor(228 * MiB * RAM_AVAILABLE_FRACTION));
  expect(layerRoomBytes({ availableBytes: 228 * MiB, physicalAvailableBytes: 20_000 * MiB, cgroupLimited: false })).toBe(Math.floor(228 * MiB * RAM_AVAILABLE_FRACTION));
  expect(layerRoomBytes({ availableBytes: 900 * MiB, physicalAvailableBytes: 900 * MiB, cgroupLimited: true })).toBe(Math.floor(900 * MiB * RAM_AVAILABLE_FRACTION));
});
