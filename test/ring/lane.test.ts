// The native lane (ring/lane.ts, native/src/lane.c) between a predecessor and a successor played by
// this test over loopback: it runs frames in C with the same rows as a JS pass, passes ERROR frames
// on, refuses garbage (WebSocket-level and prima-level) with an error that names it while the process
// stays up, reports a successor that stops reading, and closes cleanly.
import { afterAll, afterEach, describe, expect, it } from "vitest";
import type { Socket } from "node:net";
import type WebSocket from "ws";
import { LocalModel } from "../../engine/index.js";
import { startNativeLane } from "../../native/index.js";
import { mulberry32 } from "../helpers/random.js";
import { laneNode, startLane, until } from "./lane-device.js";
import {
  CloseCode, RingListener, dialSuccessor, encodeFrame, f16ToF32, f32ToF16, resolveLinkOptions,
  type ActivationsFrame, type Frame, type RingLink, type RingLinkOptions, type SeqActivationsFrame,
} from "../../ring/index.js";

const model = LocalModel.open("models/stories260K.gguf", { threads: 1 });
const nLayers = model.desc.hparams.nLayers;
afterAll(() => model.close());

const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function options(deviceId: string, o: Partial<RingLinkOptions> = {}): RingLinkOptions {
  return {
    identity: { deviceId, modelFingerprint: "gguf:lane", hiddenSize: model.nEmbd, ringId: "ring-lane" },
    maxTokensPerFrame: 8, log: () => {}, ...o,
  };
}

function rows(pos: number, nTokens = 1): ActivationsFrame {
  const tokens = Int32Array.from({ length: nTokens }, (_, i) => pos + i + 1);
  return {
    type: "activations", requestId: 7, firstTokenPosition: pos, nTokens, cycle: 0, rowWidth: model.nEmbd, dtype: "f32",
    activations: model.embed(tokens),
  };
}

/** predecessor (the test) -> device (the lane) -> successor (the test). */
async function laneDevice(deviceOptions: Partial<RingLinkOptions> = {}, successorOptions: Partial<RingLinkOptions> = {},
  predecessorOptions: Partial<RingLinkOptions> = {}, seqSlots = 1) {
  const devOpts = options("device", deviceOptions);
  const deviceListener = await RingListener.listen({ port: 0, host: "127.0.0.1", ...devOpts });
  const successorListener = await RingListener.listen({ port: 0, host: "127.0.0.1", ...options("successor", successorOptions) });
  cleanups.push(() => deviceListener.close(), () => successorListener.close());
  const accepted = successorListener.accept();
  const out = await dialSuccessor(successorListener.url, devOpts);
  const successor = await accepted;
  const incoming = deviceListener.accept();
  const predecessor = await dialSuccessor(deviceListener.url, options("predecessor", predecessorOptions));
  const inLink = await incoming;
  const errors: string[] = [];
  const node = laneNode(model, errors, seqSlots);
  const { lane, received } = startLane({ model, node, link: resolveLinkOptions(devOpts), inLink, out, predecessor, successor, errors, cleanups });
  return { lane, node, predecessor, successor, inLink, out, errors, received };
}

/** The test's own end of a link, below RingLink: to write what a well-behaved peer never would. */
function rawSocket(link: RingLink): Socket {
  return (link as unknown as { socket: Socket }).socket;
}

function rawWs(link: RingLink): WebSocket {
  return (link as unknown as { ws: WebSocket }).ws;
}

describe("native lane", () => {
  it("runs each frame in C with the same rows as a JS pass, in order, and passes ERROR frames on", async () => {
    const d = await laneDevice();
    const sent = [rows(0, 3), rows(3), rows(4)];
    for (const f of sent) await d.predecessor.send(f);
    await d.predecessor.send({ type: "error", requestId: 7, firstTokenPosition: 5, nTokens: 1, cycle: 0, message: "upstream failed" });
    await until(() => d.received.length === 4, "four frames at the successor");

    const reference = model.window(0, nLayers, { ctx: 32 });
    try {
      for (let i = 0; i < sent.length; i++) {
        const got = d.received[i] as ActivationsFrame;
        const want = rows(sent[i].firstTokenPosition, sent[i].nTokens);
        await reference.forward(want.activations, want.firstTokenPosition, want.nTokens);
        expect([got.type, got.firstTokenPosition, got.nTokens]).toEqual(["activations", want.firstTokenPosition, want.nTokens]);
        expect(Array.from(got.activations)).toEqual(Array.from(want.activations));
      }
    } finally {
      reference.close();
    }
    expect(d.received[3]).toMatchObject({ type: "error", message: "upstream failed", firstTokenPosition: 5 });
    const stats = d.lane.stats();
    expect([stats.frames, stats.windows[0].frames, stats.windows[0].tokens]).toEqual([3, 3, 5]);
    // Time preempted is part of what the lane timed: never more than its compute and sends.
    expect(stats.descheduledMs).toBeGreaterThanOrEqual(0);
    expect(stats.descheduledMs).toBeLessThanOrEqual(stats.windows[0].computeMs + stats.sendMs);
    expect(d.errors).toEqual([]);

    // KV commands run between frames: after a truncate to 3, position 3 again gives the same rows.
    d.lane.kvTruncate(3);
    await d.predecessor.send(rows(3));
    await until(() => d.received.length === 5, "the frame after the truncate");
    expect(Array.from((d.received[4] as ActivationsFrame).activations)).toEqual(Array.from((d.received[1] as ActivationsFrame).activations));
  });

  it("rows of sequence slots (serve --parallel): a slot's prompt, decode steps of several slots and a slot's shift, as JS windows run them", async () => {
    const d = await laneDevice({}, {}, {}, 3);
    const seqRows = (slots: number[], positions: number[], dtype: "f32" | "f16" = "f32"): SeqActivationsFrame => ({
      type: "seqActivations", requestId: 9, nTokens: slots.length, cycle: 0, rowWidth: model.nEmbd, dtype,
      slots: Int32Array.from(slots), positions: Int32Array.from(positions), activations: model.embed(Int32Array.from(positions, (p, i) => p + 3 * slots[i] + 1)),
    });
    // slot 1's prompt (4 rows), slot 0's (2), then two steps of both (the first timed off the lane
    // thread, the next on it), one in f16, then slot 1's cache shifted and a step after it
    const sent = [seqRows([1, 1, 1, 1], [0, 1, 2, 3]), seqRows([0, 0], [0, 1]), seqRows([0, 1], [2, 4]), seqRows([1, 0], [5, 3], "f16")];
    for (const f of sent) await d.predecessor.send(f);
    await until(() => d.received.length === 4, "four frames of sequence rows");
    await d.predecessor.send({ type: "kvShift", requestId: 9, p0: 1, nDiscard: 2, nPast: 6, slot: 1 });
    const after = seqRows([1, 0], [4, 4]);
    await d.predecessor.send(after);
    await until(() => d.received.length === 6, "the shift and the step after it");

    const ref = [0, 1].map(() => model.window(0, nLayers, { ctx: 32, maxBatch: 8 }));
    try {
      const expectRows = (got: Frame, f: SeqActivationsFrame, want: Float32Array) => {
        expect(got).toMatchObject({ type: "seqActivations", nTokens: f.nTokens, dtype: f.dtype });
        const g = got as SeqActivationsFrame;
        expect([Array.from(g.slots), Array.from(g.positions)]).toEqual([Array.from(f.slots), Array.from(f.positions)]);
        expect(Array.from(g.activations)).toEqual(Array.from(want));
      };
      const prompt = async (i: number) => {
        const f = sent[i], want = f.activations.slice();
        await ref[f.slots[0]].forward(want, f.positions[0], f.nTokens);
        expectRows(d.received[i], f, want);
      };
      const step = async (got: Frame, f: SeqActivationsFrame) => {
        const want = f.dtype === "f16" ? f16ToF32(f32ToF16(f.activations)) : f.activations.slice();
        const wins = Array.from(f.slots, (s) => ref[s]);
        await wins[0].forwardSeqs(wins, want, f.positions);
        expectRows(got, f, f.dtype === "f16" ? f16ToF32(f32ToF16(want)) : want);
      };
      await prompt(0);
      await prompt(1);
      await step(d.received[2], sent[2]);
      await step(d.received[3], sent[3]);
      expect(d.received[4]).toMatchObject({ type: "kvShift", slot: 1, p0: 1, nDiscard: 2, nPast: 6 });
      ref[1].kvShift(1, 2, 6);
      await step(d.received[5], after);
    } finally {
      for (const w of ref) w.close();
    }
    expect(d.errors).toEqual([]);
    const stats = d.lane.stats();
    expect([stats.windows[0].frames, stats.windows[0].tokens]).toEqual([5, 12]);

    // a slot this device does not hold: an ERROR frame naming it, reported; the lane goes on
    await d.predecessor.send(seqRows([0, 3], [5, 0]));
    await until(() => d.received.length === 7, "the error frame");
    expect(d.received[6]).toMatchObject({ type: "error", message: "sequence slot 3 is not on this device (it holds 3)" });
    expect(d.errors).toEqual(["sequence slot 3 is not on this device (it holds 3)"]);
    await d.predecessor.send({ type: "kvShift", requestId: 9, p0: 0, nDiscard: 1, nPast: 5, slot: 5 });
    await until(() => d.received.length === 8, "the refused shift");
    expect(d.received[7]).toMatchObject({ type: "error", message: "sequence slot 5 is not on this device (it holds 3)" });
  });

  it("frames split into WebSocket fragments both ways: assembled, run and fragmented again", async () => {
    const d = await laneDevice({ fragmentBytes: 1024 }, {}, { fragmentBytes: 1024 });
    const f = rows(0, 8); // 2 KiB of rows: three fragments each way
    await d.predecessor.send(f);
    await until(() => d.received.length === 1, "the fragmented frame");
    const want = rows(0, 8);
    const reference = model.window(0, nLayers, { ctx: 32 });
    try {
      await reference.forward(want.activations, 0, 8);
    } finally {
      reference.close();
    }
    expect(Array.from((d.received[0] as ActivationsFrame).activations)).toEqual(Array.from(want.activations));
  });

  it("f16 rows: converted in and out as the JS codec does (ggml's rounding)", async () => {
    const d = await laneDevice();
    const f = { ...rows(0, 2), dtype: "f16" as const };
    await d.predecessor.send(f);
    await until(() => d.received.length === 1, "the f16 frame");
    const got = d.received[0] as ActivationsFrame;
    expect(got.dtype).toBe("f16");
    // What the JS path computes: the f16 rows as floats, the window, and f16 again on the way out.
    const want = f16ToF32(f32ToF16(f.activations));
    const reference = model.window(0, nLayers, { ctx: 32 });
    try {
      await reference.forward(want, 0, 2);
    } finally {
      reference.close();
    }
    expect(Array.from(got.activations)).toEqual(Array.from(f16ToF32(f32ToF16(want))));
  });

  it("a frame for a cycle it has no window for goes on as an ERROR frame and is reported", async () => {
    const d = await laneDevice();
    await d.predecessor.send({ ...rows(0), cycle: 1 });
    await until(() => d.received.length === 1, "the error frame");
    expect(d.received[0]).toMatchObject({ type: "error", message: "no window for cycle 1 on this device" });
    expect(d.errors).toEqual(["no window for cycle 1 on this device"]);
    // The lane goes on with the next frame.
    await d.predecessor.send(rows(0));
    await until(() => d.received.length === 2, "the next frame");
    expect(d.received[1].type).toBe("activations");
  });

  it("an invalid prima frame drops the predecessor with an error naming the field", async () => {
    const d = await laneDevice();
    const bad = encodeFrame(rows(0));
    bad[0] = 0x58; // magic
    rawWs(d.predecessor).send(bad);
    const closed = await d.inLink.closed;
    expect(closed.error?.kind).toBe("protocol");
    expect(closed.error?.message).toMatch(/invalid frame: .*magic bytes 0x58/);
    const theirs = await d.predecessor.closed;
    expect(theirs.code).toBe(CloseCode.protocol);
    expect(d.received).toEqual([]);
  });

  it("WebSocket-level garbage drops the predecessor with a clear error; the successor link stays up", async () => {
    const d = await laneDevice();
    rawSocket(d.predecessor).write(Buffer.from([0x83, 0x80, 0, 0, 0, 0])); // opcode 3, reserved
    const closed = await d.inLink.closed;
    expect(closed.error?.kind).toBe("protocol");
    expect(closed.error?.message).toMatch(/broke the WebSocket protocol \(invalid opcode 3\)/);
    expect(d.out.isOpen).toBe(true);
  });

  it("a text message and an oversized message are refused by name", async () => {
    const d1 = await laneDevice();
    rawWs(d1.predecessor).send("hello");
    expect((await d1.inLink.closed).error?.message).toMatch(/sent a text message/);
    const d2 = await laneDevice();
    rawWs(d2.predecessor).send(Buffer.alloc(resolveLinkOptions(options("device")).maxMessageBytes + 1));
    expect((await d2.inLink.closed).error?.message).toMatch(/sent a message over this link's limit of \d+ bytes/);
  });

  it("survives random bytes after the handshake: each link either waits for more or fails by name", async () => {
    const random = mulberry32(11);
    let failed = 0;
    for (let i = 0; i < 25; i++) {
      const d = await laneDevice();
      const bytes = Buffer.from(Array.from({ length: 1 + Math.floor(random() * 300) }, () => Math.floor(random() * 256)));
      if (i % 2 === 0) bytes[0] = 0x82; // a binary frame header half the time, so the parser gets past the first byte
      rawSocket(d.predecessor).write(bytes);
      const outcome = await Promise.race([d.inLink.closed, new Promise((r) => setTimeout(() => r("open"), 50))]);
      if (outcome !== "open") {
        failed++;
        expect((outcome as { error: Error | null }).error?.message).toMatch(/predecessor .*(WebSocket|message|frame|connection)/);
      }
      // The lane is still there for the other link.
      expect(d.out.isOpen).toBe(true);
      for (const c of cleanups.splice(0).reverse()) await c();
    }
    expect(failed).toBeGreaterThan(10);
  });

  it("a successor that stops reading and answering is reported dead within the liveness timeout", async () => {
    const d = await laneDevice({ livenessTimeoutMs: 400 }, { livenessTimeoutMs: 60_000 });
    const socket = rawSocket(d.successor);
    socket.pause();
    (socket as unknown as { _handle: { readStop(): void } })._handle.readStop();
    const t0 = performance.now();
    const closed = await d.out.closed;
    expect(closed.error?.kind).toBe("dead");
    expect(closed.error?.message).toMatch(/no answer to a ping/);
    // By the 400 ms limit, not the other side's 60 s one (however loaded the machine).
    expect(performance.now() - t0).toBeLessThan(30_000);
  });

  it("refuses a missing or out-of-range option by name instead of defaulting it", () => {
    const w = model.window(0, nLayers, { ctx: 8 });
    try {
      const good = {
        cycles: 1, maxTokensPerFrame: 8, maxPayloadBytes: 4096, maxMessageBytes: 8192, maxQueuedBytes: 1 << 20,
        tickMs: 250, quietMs: 125, deadAfterMs: 1000, closeGraceMs: 1000,
        fragmentBytes: 1024, prefetch: false, weightBytes: 0, quickPassMs: 50,
      };
      const { maxQueuedBytes: _, ...missing } = good;
      expect(() => startNativeLane(model.native, [w], [0], missing as typeof good, () => {})).toThrow(/options\.maxQueuedBytes must be a whole number/);
      const { deadAfterMs: __, ...noTiming } = good;
      expect(() => startNativeLane(model.native, [w], [0], noTiming as typeof good, () => {})).toThrow(/options\.deadAfterMs must be a number of ms/);
      expect(() => startNativeLane(model.native, [w], [0], { ...good, cycles: 0 }, () => {})).toThrow(/options\.cycles must be a whole number from 1/);
      // Another kind of native object where a model or a window belongs is refused, not read as one.
      const asAny = (x: unknown) => x as typeof w;
      expect(() => startNativeLane(model.native, [asAny(model.native)], [0], good, () => {})).toThrow(/windows must be open windows of this model/);
      expect(() => startNativeLane(asAny(w) as unknown as typeof model.native, [w], [0], good, () => {})).toThrow(/not a NativeModel/);
      expect(() => startNativeLane(model.native, [asAny({})], [0], good, () => {})).toThrow(/windows must be open windows of this model/);
      const lane = startNativeLane(model.native, [w], [0], good, () => {});
      lane.stop();
    } finally {
      w.close();
    }
  });

  it("a flood of frames is refused by name once its queue passes the bound; memory stays bounded", async () => {
    const d = await laneDevice();
    const ws = rawWs(d.predecessor);
    // Prompt-sized frames run off the lane thread (one at a time, the lane paused meanwhile): the rest queue.
    const frame = encodeFrame(rows(0, 8));
    const rss0 = process.memoryUsage().rss;
    let sentBytes = 0;
    let open = true;
    void d.inLink.closed.then(() => { open = false; });
    while (open && sentBytes < 256 << 20) {
      for (let i = 0; i < 64; i++) ws.send(frame);
      sentBytes += 64 * frame.length;
      while (open && ws.bufferedAmount > 1 << 20) await new Promise((r) => setTimeout(r, 1));
      await new Promise((r) => setImmediate(r));
    }
    const closed = await d.inLink.closed;
    expect(closed.error?.kind).toBe("protocol");
    expect(closed.error?.message).toMatch(/predecessor "predecessor" .*sent frames faster than this device runs them: \d+ bytes waiting would pass the queue's limit of \d+ bytes/);
    expect(sentBytes).toBeLessThan(64 << 20);
    expect(process.memoryUsage().rss - rss0).toBeLessThan(128 << 20);
    expect(d.out.isOpen).toBe(true);
    await new Promise((r) => setTimeout(r, 200)); // the pass in flight ends before the windows close
  });

  it("closes both links with a clean close handshake", async () => {
    const d = await laneDevice();
    await d.predecessor.send(rows(0));
    await until(() => d.received.length === 1, "a frame");
    await d.lane.close("done");
    expect((await d.predecessor.closed).error).toBeNull();
    expect((await d.successor.closed).error).toBeNull();
    expect((await d.inLink.closed).error).toBeNull();
  });
});
