// One-token calls run inline only while they are quick; everything else stays asynchronous.
import { describe, expect, it } from "vitest";
import { INLINE_MAX_MS, QuickForward } from "../../engine/index.js";
import type { NativeWindow } from "../../native/index.js";

function fakeWindow(msPerCall: () => number): { window: NativeWindow; calls: string[] } {
  const calls: string[] = [];
  const busyWait = (ms: number) => {
    const end = performance.now() + ms;
    while (performance.now() < end);
  };
  const window = {
    forward: async (_a: Float32Array, _p: number, n: number) => {
      calls.push(`async ${n}`);
      busyWait(msPerCall());
    },
    forwardNow: (_a: Float32Array, _p: number, n: number) => {
      calls.push(`inline ${n}`);
      busyWait(msPerCall());
    },
  } as unknown as NativeWindow;
  return { window, calls };
}

describe("QuickForward", () => {
  it("runs a one-token call inline once the previous one was quick, prompt batches always asynchronously", async () => {
    const { window, calls } = fakeWindow(() => 1);
    const q = new QuickForward(window);
    const acts = new Float32Array(4);
    await q.forward(acts, 0, 8);
    await q.forward(acts, 8, 1);
    await q.forward(acts, 9, 1);
    await q.forward(acts, 10, 4);
    await q.forward(acts, 14, 1);
    expect(calls).toEqual(["async 8", "async 1", "inline 1", "async 4", "inline 1"]);
  });

  it("goes back to asynchronous calls after a slow step (a window paged in from disk)", async () => {
    let ms = 1;
    const { window, calls } = fakeWindow(() => ms);
    const q = new QuickForward(window);
    const acts = new Float32Array(4);
    await q.forward(acts, 0, 1);
    ms = INLINE_MAX_MS + 5;
    await q.forward(acts, 1, 1);
    ms = 1;
    await q.forward(acts, 2, 1);
    await q.forward(acts, 3, 1);
    expect(calls).toEqual(["async 1", "inline 1", "async 1", "inline 1"]);
  });
});

describe("QuickForward with a guard", () => {
  it("stays asynchronous while the guard says the window's pages may be missing", async () => {
    const { window, calls } = fakeWindow(() => 1);
    let fits = false;
    const q = new QuickForward(window, () => fits);
    const acts = new Float32Array(4);
    await q.forward(acts, 0, 1);
    await q.forward(acts, 1, 1);
    fits = true;
    await q.forward(acts, 2, 1);
    expect(calls).toEqual(["async 1", "async 1", "inline 1"]);
  });
});
