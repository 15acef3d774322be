// What the coordinator says when a ring link fails: links name their peers by ring id, and a
// worker's report of its own link failure may arrive before the dead device's session loss (seen in
// CI), so every such name is turned into the device the user knows.
import { describe, expect, it } from "vitest";
import { namePeerDevices } from "../../coordinator/ring-setup.js";

const devices = [
  { id: "w1", label: 'w1 "alpha" (127.0.0.1)' },
  { id: "w2", label: 'w2 "bravo" (127.0.0.1)' },
];

describe("namePeerDevices", () => {
  it("names the dead peer in a worker's report of its failed link to it", () => {
    const report = 'device w1 "alpha" (127.0.0.1): link to successor "w2" (ws://127.0.0.1:36777) failed: ' +
      'ring link successor "w2" (ws://127.0.0.1:36777): the connection was lost (no close frame)';
    expect(namePeerDevices(report, devices)).toBe(
      'device w1 "alpha" (127.0.0.1): link to successor device w2 "bravo" (127.0.0.1) failed: ' +
      'ring link successor device w2 "bravo" (127.0.0.1): the connection was lost (no close frame)');
  });

  it("names a predecessor, and leaves ids outside the ring and other text alone", () => {
    expect(namePeerDevices('link from predecessor "w1" (127.0.0.1:52852) failed', devices))
      .toBe('link from predecessor device w1 "alpha" (127.0.0.1) failed');
    const other = 'link to successor "head-7f3a" (ws://127.0.0.1:4000) failed; "w2" stays as it is';
    expect(namePeerDevices(other, devices)).toBe(other);
  });
});
