// A worker links its ring neighbours only under the keys its assignment carries: an assignment
// without both (a coordinator of another version, or one asking for plaintext links, which no
// product code does any more) is refused by name before any listener or link is made.
import { describe, expect, it } from "vitest";
import type { Assignment } from "../../control/index.js";
import type { LocalModel } from "../../engine/index.js";
import type { RingPort } from "../../ring/index.js";
import { WorkerDevice } from "../../worker/device.js";

function assignment(extra: Partial<Assignment> & Record<string, unknown>): Assignment {
  return {
    ringId: "r", windows: [{ firstLayer: 0, endLayer: 1, cycle: 0 }], successorUrl: "ws://127.0.0.1:1", ctx: 8, maxBatch: 1, cycles: 1,
    prefetch: false, releaseAfterUse: false, threads: 0, ringOrder: ["w1", "head"], wireDtype: 0, ...extra,
  } as Assignment;
}

describe("a worker's ring link keys", () => {
  // Nothing past the key check may run: the model and port are never touched.
  const device = () => new WorkerDevice({
    model: {} as LocalModel, fingerprint: "f", deviceName: "w1", dataPort: {} as RingPort, dataHost: "127.0.0.1", coordinatorHost: "127.0.0.1",
    log: () => {}, fail: () => {},
  });
  const key = () => new Uint8Array(32).fill(7);

  it.each([
    ["no keys", {}],
    ["only the predecessor's key", { predecessorLinkKey: key() }],
    ["a short key", { predecessorLinkKey: key(), successorLinkKey: new Uint8Array(16) }],
    ["the old plaintext switch", { plaintextLinks: true }],
  ])("refuses an assignment with %s", async (_, extra) => {
    await expect(device().assign(assignment(extra), () => {}, "w1")).rejects.toThrow(/carries no keys for this device's ring links.*not linking in the clear/);
  });
});
