// Halda's d_avail from a memory reading (issue #14): a memory cgroup's room is used exactly where its
// hard limit is what binds (the reading already leaves out the process's anonymous memory); otherwise
// MemAvailable with prima.cpp's fifth kept back for the other programs sharing it.
import { expect, it } from "vitest";
import { layerRoomBytes, RAM_AVAILABLE_FRACTION } from "../../profiler/index.js";

const MiB = 2 ** 20;

it("a binding cgroup limit gives its room exactly; MemAvailable keeps the 0.8 margin", () => {
  // 256 MiB cap, 28 MiB anonymous: 228 MiB, not the 182 MiB the margin left (issue #14).
  expect(layerRoomBytes({ availableBytes: 228 * MiB, physicalAvailableBytes: 20_000 * MiB, cgroupLimited: true })).toBe(228 * MiB);
  expect(layerRoomBytes({ availableBytes: 228 * MiB, physicalAvailableBytes: 20_000 * MiB, cgroupLimited: false })).toBe(Math.floor(228 * MiB * RAM_AVAILABLE_FRACTION));
  // A limit above what the machine has free: MemAvailable binds, and so does its margin.
  expect(layerRoomBytes({ availableBytes: 900 * MiB, physicalAvailableBytes: 900 * MiB, cgroupLimited: true })).toBe(Math.floor(900 * MiB * RAM_AVAILABLE_FRACTION));
});
