// A lane device for the lane's tests (lane.test.ts, sealed-link.test.ts): a RingNode over the whole
// model whose frames the native lane runs between two links the test holds; and a bounded wait.
import { expect } from "vitest";
import type { LocalModel } from "../../engine/index.js";
import { RingLane, RingNode, type Frame, type ResolvedLinkOptions, type RingLink } from "../../ring/index.js";

/** Waits (5 s at most) until cond holds; fails naming what it waited for. */
export async function until(cond: () => boolean, what: string, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** The device's node: every layer of the model in one window (with seqSlots sequence slots); JS never
 * sends (the lane does). */
export function laneNode(model: LocalModel, errors: string[], seqSlots = 1): RingNode {
  return new RingNode({
    model, windows: [{ firstLayer: 0, endLayer: model.nLayers, cycle: 0 }], cycles: 1, ctx: 32, maxBatch: 8, prefetch: false, seqSlots,
    releaseAfterUse: false, isHead: false, send: () => Promise.reject(new Error("the lane sends, not JS")), onError: (m) => errors.push(m),
  });
}

/** Hands the device's links (inLink from the predecessor, out to the successor) to the lane; the test's
 * successor end collects what arrives. Everything is stopped by the cleanup pushed on `cleanups`. */
export function startLane(o: {
  model: LocalModel; node: RingNode; link: ResolvedLinkOptions; inLink: RingLink; out: RingLink;
  predecessor: RingLink; successor: RingLink; errors: string[]; cleanups: Array<() => unknown>;
}): { lane: RingLane; received: Frame[] } {
  const lane = RingLane.start({ model: o.model.native, node: o.node, link: o.link, predecessor: o.inLink, successor: o.out, onError: (m) => o.errors.push(m) });
  expect(lane).not.toBeNull();
  o.inLink.on("frame", (f) => lane!.takeFrame(f));
  o.cleanups.push(async () => {
    lane!.stop();
    await Promise.allSettled([o.node.close(), o.predecessor.close(), o.successor.close()]);
  });
  const received: Frame[] = [];
  o.successor.on("frame", (f) => received.push(f));
  return { lane: lane!, received };
}
