// Links over loopback: the HELLO handshake and its refusals, garbage peers dropped while a good
// link keeps streaming, liveness against frozen (SIGSTOP) and killed peers in child processes,
// large frames, ordering, and every dial failure as a RingLinkError.
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { createServer as createHttpServer } from "node:http";
import { connect, createServer as createTcpServer, type AddressInfo, type Server as TcpServer, type Socket } from "node:net";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import WebSocket from "ws";
import {
  dialSuccessor, encodeFrame, f16ToF32, f32ToF16, FrameError, PROTOCOL_VERSION, RingLinkError, RingListener,
  type ActivationsFrame, type DroppedPeer, type Frame, type Hello, type RingIdentity, type RingLink,
  type RingLinkOptions, type RingListenerOptions,
} from "../../ring/index.js";

const H = 64;
const logs: string[] = [];
const log = (m: string) => logs.push(m);

// Any unhandled rejection or uncaught exception anywhere in these tests is a failure.
const escaped: unknown[] = [];
const onEscape = (e: unknown) => escaped.push(e);
process.on("unhandledRejection", onEscape);
process.on("uncaughtException", onEscape);
afterAll(() => {
  process.off("unhandledRejection", onEscape);
  process.off("uncaughtException", onEscape);
  expect(escaped.map(String)).toEqual([]);
});

const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function identity(deviceId: string, o: Partial<RingIdentity> = {}): RingIdentity {
  return { deviceId, modelFingerprint: "gguf:1111", hiddenSize: H, ringId: "ring-A", ...o };
}

function helloOf(id: RingIdentity, maxTokensPerFrame = 512): Hello {
  return { protocolVersion: PROTOCOL_VERSION, ...id, maxTokensPerFrame, maxPayloadBytes: maxTokensPerFrame * id.hiddenSize * 4 };
}

async function listen(o: Partial<RingListenerOptions> = {}): Promise<RingListener> {
  const l = await RingListener.listen({ host: "127.0.0.1", port: 0, identity: identity("succ"), log, ...o });
  cleanups.push(() => l.close());
  return l;
}

async function dial(url: string, o: Partial<RingLinkOptions> = {}): Promise<RingLink> {
  const link = await dialSuccessor(url, { identity: identity("pred"), log, ...o });
  cleanups.push(() => link.close());
  return link;
}

async function pair(o: { listener?: Partial<RingListenerOptions>; dialer?: Partial<RingLinkOptions> } = {}) {
  const listener = await listen(o.listener);
  const [out, inn] = await Promise.all([dial(listener.url, o.dialer), listener.accept({ timeoutMs: 5000 })]);
  return { listener, out, inn };
}

function acts(requestId: number, nTokens = 2, width = H, dtype: "f32" | "f16" = "f32"): ActivationsFrame {
  const activations = new Float32Array(nTokens * width);
  for (let i = 0; i < activations.length; i++) activations[i] = requestId + i / 1024;
  return { type: "activations", requestId, firstTokenPosition: requestId * nTokens, nTokens, cycle: 0, rowWidth: width, dtype, activations };
}

async function rejection(p: Promise<unknown>): Promise<Error> {
  try {
    await p;
  } catch (e) {
    return e as Error;
  }
  throw new Error("expected a rejection");
}

function nextDropped(listener: RingListener, timeoutMs = 5000): Promise<DroppedPeer> {
  return once(listener, "dropped", { signal: AbortSignal.timeout(timeoutMs) }).then(([d]) => d as DroppedPeer);
}

/** A WebSocket client that connects to `url` and does whatever the test says (no ring code). */
async function rawClient(url: string): Promise<WebSocket> {
  const ws = new WebSocket(url);
  ws.on("error", () => {});
  cleanups.push(() => ws.terminate());
  await once(ws, "open");
  return ws;
}

const here = dirname(fileURLToPath(import.meta.url));

/** A peer in a child process (peer-child.mjs) that the test can freeze or kill. */
async function childPeer(args: string[]): Promise<{ child: ChildProcess; lines: AsyncIterator<string> }> {
  const child = spawn(process.execPath, [join(here, "peer-child.mjs"), ...args], { stdio: ["ignore", "pipe", "inherit"] });
  cleanups.push(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  });
  const lines = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
  return { child, lines };
}

async function nextLine(lines: AsyncIterator<string>): Promise<string> {
  const r = await lines.next();
  if (r.done) throw new Error("child peer exited");
  return r.value;
}

describe("handshake", () => {
  it("each side learns the other's HELLO, and frames flow both ways", async () => {
    const { out, inn } = await pair();
    expect(out.role).toBe("successor");
    expect(out.peer).toEqual(helloOf(identity("succ")));
    expect(inn.role).toBe("predecessor");
    expect(inn.peer.deviceId).toBe("pred");
    expect(out.peerName).toMatch(/^successor "succ" \(ws:\/\/127\.0\.0\.1:\d+\)$/);

    const sent: Frame[] = [acts(1), { type: "error", requestId: 1, firstTokenPosition: 0, nTokens: 2, cycle: 0, message: "window 2: out of memory" }];
    const stats = await Promise.all(sent.map((f) => out.send(f)));
    expect(stats[0].bytes).toBe(32 + 2 * H * 4);
    for (const s of stats) {
      expect(s.totalMs).toBeGreaterThanOrEqual(s.encodeMs + s.writeMs - 1e-6);
      expect(s.writeMs).toBeGreaterThanOrEqual(0);
    }
    const got: Frame[] = [];
    for await (const f of inn.frames()) {
      got.push(f);
      if (got.length === 2) break;
    }
    expect(got).toEqual(sent);

    const back = once(out, "frame");
    await inn.send({ type: "error", requestId: 9, firstTokenPosition: 0, nTokens: 0, cycle: 0, message: "back" });
    expect((await back)[0]).toMatchObject({ type: "error", message: "back" });
    expect(out.counters).toMatchObject({ framesSent: 2, framesReceived: 1 });
  });

  const mismatches: Array<[string, Partial<RingIdentity>, RegExp]> = [
    ["model fingerprint", { modelFingerprint: "gguf:2222" }, /model fingerprint differs: peer "pred" has "gguf:2222", this device \("succ"\) has "gguf:1111"/],
    ["hidden size", { hiddenSize: 128 }, /hidden size differs: peer "pred" has 128, this device \("succ"\) has 64/],
    ["ring", { ringId: "ring-B" }, /peer "pred" is in ring "ring-B", this device \("succ"\) in ring "ring-A"/],
  ];
  for (const [what, change, reason] of mismatches) {
    it(`refuses a peer with another ${what}, with the reason on both sides`, async () => {
      const listener = await listen();
      const dropped = nextDropped(listener);
      const err = await rejection(dialSuccessor(listener.url, { identity: identity("pred", change), log }));
      expect(err).toBeInstanceOf(RingLinkError);
      expect((err as RingLinkError).kind).toBe("refused");
      expect(err.message).toMatch(/the successor refused this device/);
      expect(err.message).toMatch(reason);
      expect((await dropped).reason).toMatch(reason);
      expect(logs.some((l) => reason.test(l))).toBe(true);
      // The listener still takes the right peer.
      const good = await dial(listener.url);
      expect(good.isOpen).toBe(true);
    });
  }

  it("the dialer refuses a successor that is not the device it expected", async () => {
    const listener = await listen();
    const accepted = listener.accept({ timeoutMs: 5000 });
    const err = await rejection(dialSuccessor(listener.url, { identity: identity("pred"), log, expectedPeerDeviceId: "other" }));
    expect((err as RingLinkError).kind).toBe("refused");
    expect(err.message).toMatch(/expected device "other" but peer "succ" answered/);
    // The listener had answered already; its link ends with the dialer's reason.
    const closed = await (await accepted).closed;
    expect(closed.code).toBe(4001);
    expect(closed.error?.message).toMatch(/expected device "other"/);
  });
});

describe("garbage", () => {
  it("drops every kind of garbage peer with a reason (logged once per address) while a good link keeps streaming", async () => {
    const { listener, out, inn } = await pair({ listener: { handshakeTimeoutMs: 400 } });
    const received: number[] = [];
    inn.on("frame", (f) => {
      if (f.type === "activations") received.push(f.requestId);
    });
    let sent = 0;
    let streaming = true;
    const stream = (async () => {
      while (streaming) {
        await out.send(acts(sent++, 4));
        await new Promise((r) => setTimeout(r, 2));
      }
    })();

    const url = listener.url;
    const port = listener.port;
    const attacks: Array<[string, () => Promise<unknown>, RegExp]> = [
      ["raw TCP bytes", async () => {
        const s = connect(port, "127.0.0.1");
        s.on("error", () => {});
        cleanups.push(() => s.destroy());
        await once(s, "connect");
        s.write(Buffer.from("\x00\x01garbage\r\n\r\n\xff\xfe"));
      }, /sent bytes that are not HTTP/],
      ["plain HTTP", async () => {
        const res = await fetch(`http://127.0.0.1:${port}/`);
        expect(res.status).toBe(426);
      }, /plain HTTP GET request/],
      ["a text message", async () => (await rawClient(url)).send("hello?"), /sent a text message/],
      ["bad magic", async () => (await rawClient(url)).send(Buffer.alloc(64, 7)), /sent garbage: frame: magic bytes 0x07 0x07 0x07 0x07/],
      ["a HELLO of header version 2", async () => {
        const frame = encodeFrame({ type: "hello", hello: helloOf(identity("evil")) });
        frame.writeUInt16LE(2, 4);
        (await rawClient(url)).send(frame);
      }, /header version 2 is not supported/],
      ["activations before HELLO", async () => (await rawClient(url)).send(encodeFrame(acts(1))), /activations frame before HELLO/],
      ["an oversized message", async () => (await rawClient(url)).send(Buffer.alloc(200_000)), /over the limit of \d+ bytes/],
      ["silence", async () => rawClient(url), /no HELLO within 400 ms/],
    ];
    const logFrom = logs.length;
    for (const [name, attack, reason] of attacks) {
      const dropped = nextDropped(listener);
      await attack();
      const d = await dropped;
      expect(d.reason, name).toMatch(reason);
      expect(d.remoteAddress).toMatch(/^127\.0\.0\.1:\d+$/);
    }
    // The log has a line for the first and counts the others (ring/drop-log.ts): one address cannot
    // flood it.
    // (A loaded machine may let an interval pass between two attacks: fewer lines than drops, not one.)
    const dropLines = logs.slice(logFrom).filter((l) => / dropped 127\.0\.0\.1:\d+: /.test(l));
    expect(dropLines[0]).toMatch(attacks[0][2]);
    expect(dropLines.length, dropLines.join("\n")).toBeLessThan(attacks.length);

    streaming = false;
    await stream;
    await new Promise((r) => setTimeout(r, 50));
    expect(inn.isOpen && out.isOpen).toBe(true);
    expect(received.length).toBe(sent);
    expect(received).toEqual(received.map((_, i) => i));
    // And a new good predecessor is still welcome.
    const again = await dial(url, { identity: identity("pred-2") });
    expect(again.peer.deviceId).toBe("succ");
  });

  it("a bad frame on an established link drops that link, naming the peer; the listener stays up", async () => {
    const listener = await listen();
    const ws = await rawClient(listener.url);
    ws.send(encodeFrame({ type: "hello", hello: helloOf(identity("evil")) }));
    await once(ws, "message");
    const inbound = await listener.accept({ timeoutMs: 5000 });
    const wsClosed = once(ws, "close");
    const reading = (async () => {
      for await (const f of inbound.frames()) void f;
    })();
    ws.send(Buffer.from("PRMX not a frame at all, long enough to have a header"));
    const closed = await inbound.closed;
    expect(await rejection(reading)).toBe(closed.error); // the iterator throws the link's error
    expect(closed.error?.kind).toBe("protocol");
    expect(closed.error?.message).toMatch(/^ring link predecessor "evil" \(127\.0\.0\.1:\d+\): sent an invalid frame: frame: magic bytes/);
    expect((await wsClosed)[0]).toBe(4002);
    expect((await dial(listener.url)).isOpen).toBe(true);
  });

  it("refuses locally a frame over the peer's limits, and the link stays up", async () => {
    const { out, inn } = await pair({ listener: { maxTokensPerFrame: 4 } });
    const err = await rejection(out.send(acts(1, 5)));
    expect(err).toBeInstanceOf(FrameError);
    expect(err.message).toMatch(/number of tokens 5 exceeds successor "succ" \(.*\)'s limit of 4 per frame/);
    const wrongWidth = await rejection(out.send(acts(1, 1, H + 1)));
    expect(wrongWidth.message).toMatch(/row width 65 does not match the model's hidden size 64/);
    await out.send(acts(2, 4));
    const [f] = await once(inn, "frame");
    expect(f.requestId).toBe(2);
  });
});

describe("liveness", () => {
  it("reports a frozen successor (SIGSTOP) dead within 2 s, naming it", async () => {
    const { child, lines } = await childPeer(["listen", JSON.stringify(helloOf(identity("frozen")))]);
    const port = Number((await nextLine(lines)).split(" ")[1]);
    const link = await dial(`ws://127.0.0.1:${port}`);
    expect(await nextLine(lines)).toBe("linked");
    await new Promise((r) => setTimeout(r, 300)); // a few ping rounds while it is healthy
    expect(link.isOpen).toBe(true);
    const errors: RingLinkError[] = [];
    link.on("error", (e) => errors.push(e));
    child.kill("SIGSTOP");
    const t0 = performance.now();
    const closed = await link.closed;
    const detectedMs = performance.now() - t0;
    expect(closed.error?.kind).toBe("dead");
    expect(closed.error?.message).toMatch(/^ring link successor "frozen" \(ws:\/\/127\.0\.0\.1:\d+\): no answer to a ping/);
    expect(errors).toEqual([closed.error]);
    expect(detectedMs).toBeLessThan(2000);
    expect(await rejection(link.send(acts(1)))).toBeInstanceOf(RingLinkError);
  });

  it("reports a frozen successor dead within 2 s while frames pour into it", async () => {
    const { child, lines } = await childPeer(["listen", JSON.stringify(helloOf({ ...identity("frozen"), hiddenSize: 4096 }))]);
    const port = Number((await nextLine(lines)).split(" ")[1]);
    const link = await dial(`ws://127.0.0.1:${port}`, { identity: identity("pred", { hiddenSize: 4096 }) });
    expect(await nextLine(lines)).toBe("linked");
    child.kill("SIGSTOP");
    const t0 = performance.now();
    const big = acts(1, 256, 4096); // 4 MiB frames: the kernel buffers fill and writes stall
    const sends = Array.from({ length: 8 }, () => link.send(big));
    const closed = await link.closed;
    expect(performance.now() - t0).toBeLessThan(2000);
    expect(closed.error?.kind).toBe("dead");
    expect(closed.error?.message).toMatch(/successor "frozen" .*: (the peer stopped reading|no answer to a ping)/);
    const results = await Promise.allSettled(sends);
    expect(results.some((r) => r.status === "rejected")).toBe(true);
  });

  it("reports a frozen predecessor dead within 2 s", async () => {
    const listener = await listen();
    const { child, lines } = await childPeer(["dial", listener.url, JSON.stringify(helloOf(identity("pred-child")))]);
    const inbound = await listener.accept({ timeoutMs: 5000 });
    expect(await nextLine(lines)).toBe("linked");
    expect(inbound.peer.deviceId).toBe("pred-child");
    child.kill("SIGSTOP");
    const t0 = performance.now();
    const closed = await inbound.closed;
    expect(performance.now() - t0).toBeLessThan(2000);
    expect(closed.error?.kind).toBe("dead");
    expect(closed.error?.message).toMatch(/predecessor "pred-child"/);
  });

  it("a closing listener gives its port up at once, while a frozen predecessor's close handshake waits", async () => {
    const listener = await listen();
    const { child, lines } = await childPeer(["dial", listener.url, JSON.stringify(helloOf(identity("pred-child")))]);
    await listener.accept({ timeoutMs: 5000 });
    expect(await nextLine(lines)).toBe("linked");
    child.kill("SIGSTOP");
    let closed = false;
    const closing = listener.close().then(() => { closed = true; });
    // The next assignment listens on the same port while the old link still waits for its peer.
    const again = await listen({ port: listener.port });
    expect(again.port).toBe(listener.port);
    expect(closed).toBe(false);
    await closing;
  });

  it("reports a killed peer at once, and a custom timeout is honoured", async () => {
    const { child, lines } = await childPeer(["listen", JSON.stringify(helloOf(identity("victim")))]);
    const port = Number((await nextLine(lines)).split(" ")[1]);
    const link = await dial(`ws://127.0.0.1:${port}`, { livenessTimeoutMs: 600 });
    expect(await nextLine(lines)).toBe("linked");
    child.kill("SIGKILL");
    const t0 = performance.now();
    const closed = await link.closed;
    expect(performance.now() - t0).toBeLessThan(600);
    expect(closed.error?.kind).toBe("closed");
    expect(closed.error?.message).toMatch(/successor "victim".*connection was lost/);
  });

  it("keeps a healthy idle link up well past the timeout", async () => {
    const { out, inn } = await pair({ dialer: { livenessTimeoutMs: 300 }, listener: { livenessTimeoutMs: 300 } });
    await new Promise((r) => setTimeout(r, 1000));
    expect(out.isOpen && inn.isOpen).toBe(true);
  });
});

describe("traffic", () => {
  it("carries 512 x 8192 frames intact, f32 and f16", async () => {
    const width = 8192;
    const nTokens = 512;
    const wide = (id: string) => identity(id, { hiddenSize: width });
    const { out, inn } = await pair({ listener: { identity: wide("succ") }, dialer: { identity: wide("pred") } });
    const x = new Float32Array(nTokens * width);
    for (let i = 0; i < x.length; i++) x[i] = Math.sin(i * 0.001) * 1000 + (i % 7) * 1e-3;
    const frames = inn.frames();
    const base = { type: "activations" as const, firstTokenPosition: 0, nTokens, cycle: 1, rowWidth: width, activations: x };
    const stats32 = await out.send({ ...base, requestId: 1, dtype: "f32" });
    const got32 = (await frames.next()).value as ActivationsFrame;
    expect(stats32.bytes).toBe(32 + nTokens * width * 4);
    expect(got32.activations.length).toBe(x.length);
    expect(Buffer.compare(Buffer.from(got32.activations.buffer, got32.activations.byteOffset, got32.activations.byteLength),
      Buffer.from(x.buffer))).toBe(0);

    const stats16 = await out.send({ ...base, requestId: 2, dtype: "f16" });
    const got16 = (await frames.next()).value as ActivationsFrame;
    expect(stats16.bytes).toBe(32 + nTokens * width * 2);
    expect(got16.dtype).toBe("f16");
    const want16 = f16ToF32(f32ToF16(x));
    expect(Buffer.compare(Buffer.from(got16.activations.buffer, got16.activations.byteOffset, got16.activations.byteLength),
      Buffer.from(want16.buffer))).toBe(0);
    await frames.return?.();
  });

  it("delivers 300 frames sent without waiting in order", async () => {
    const { out, inn } = await pair();
    const sizes = [1, 7, 300, 2, 64];
    const sends = Array.from({ length: 300 }, (_, i) => out.send(acts(i, sizes[i % sizes.length])));
    const ids: number[] = [];
    for await (const f of inn.frames()) {
      if (f.type !== "activations") continue;
      expect(f.activations[0]).toBe(f.requestId);
      ids.push(f.requestId);
      if (ids.length === 300) break;
    }
    expect(ids).toEqual(Array.from({ length: 300 }, (_, i) => i));
    expect((await Promise.all(sends)).every((s) => s.bytes > 32)).toBe(true);
  });

  it("copies the rows at send(), so the caller may reuse its array at once", async () => {
    const { out, inn } = await pair();
    const frame = acts(0, 300); // several fragments
    const sends = [];
    for (let v = 0; v < 3; v++) {
      frame.activations.fill(v);
      sends.push(out.send({ ...frame, requestId: v }));
    }
    frame.activations.fill(-1);
    await Promise.all(sends);
    const it = inn.frames();
    for (let v = 0; v < 3; v++) {
      const f = (await it.next()).value as ActivationsFrame;
      expect(f.activations.every((x) => x === v)).toBe(true);
    }
    await it.return?.();
  });

  it("keeps frames that arrive before anyone listens", async () => {
    const { out, inn } = await pair();
    await out.send(acts(1));
    await out.send(acts(2));
    await new Promise((r) => setTimeout(r, 50));
    const got: number[] = [];
    inn.on("frame", (f) => got.push((f as ActivationsFrame).requestId));
    await new Promise((r) => setTimeout(r, 10));
    expect(got).toEqual([1, 2]);
  });

  it("a clean close ends the peer's iterator without an error, and later sends reject", async () => {
    const { out, inn } = await pair();
    await out.send(acts(1));
    const seen: Frame[] = [];
    const reading = (async () => {
      for await (const f of inn.frames()) seen.push(f);
    })();
    await new Promise((r) => setTimeout(r, 30));
    const closedOut = await out.close("done");
    await reading;
    expect(seen.length).toBe(1);
    expect(closedOut.error).toBeNull();
    const closedIn = await inn.closed;
    expect(closedIn).toMatchObject({ code: 1000, reason: "done", error: null });
    const err = await rejection(out.send(acts(2)));
    expect((err as RingLinkError).kind).toBe("closed");
  });
});

describe("dial and accept failures", () => {
  it("nothing listening: unreachable, connection refused", async () => {
    const probe = await listen();
    const url = probe.url;
    await probe.close();
    const err = await rejection(dialSuccessor(url, { identity: identity("pred"), log }));
    expect(err).toBeInstanceOf(RingLinkError);
    expect((err as RingLinkError).kind).toBe("unreachable");
    expect(err.message).toBe(`ring link successor ${url}: nothing is listening there (connection refused)`);
  });

  it("a server that accepts and never answers: timeout", async () => {
    const sockets: Socket[] = [];
    const silent: TcpServer = createTcpServer((s) => {
      s.on("error", () => {});
      sockets.push(s);
    });
    await new Promise<void>((r) => silent.listen(0, "127.0.0.1", r));
    cleanups.push(() => new Promise((r) => {
      for (const s of sockets) s.destroy();
      silent.close(r);
    }));
    const port = (silent.address() as AddressInfo).port;
    const t0 = performance.now();
    const err = await rejection(dialSuccessor(`ws://127.0.0.1:${port}`, { identity: identity("pred"), log, handshakeTimeoutMs: 300 }));
    expect((err as RingLinkError).kind).toBe("timeout");
    expect(err.message).toMatch(/could not connect within 300 ms/);
    expect(performance.now() - t0).toBeLessThan(1500);
  });

  it("an HTTP server that is not a ring listener: protocol", async () => {
    const http = createHttpServer((_, res) => res.writeHead(404).end());
    await new Promise<void>((r) => http.listen(0, "127.0.0.1", r));
    cleanups.push(() => new Promise((r) => { http.closeAllConnections(); http.close(r); }));
    const port = (http.address() as AddressInfo).port;
    const err = await rejection(dialSuccessor(`ws://127.0.0.1:${port}`, { identity: identity("pred"), log }));
    expect((err as RingLinkError).kind).toBe("protocol");
    expect(err.message).toMatch(/not a prima ring listener \(Unexpected server response: 404\)/);
  });

  it("a bad URL or bad options fail clearly", async () => {
    const err = await rejection(dialSuccessor("not a url", { identity: identity("pred"), log }));
    expect((err as RingLinkError).kind).toBe("unreachable");
    expect(err.message).toMatch(/bad successor address/);
    expect(() => dialSuccessor("ws://127.0.0.1:1", { identity: identity(""), log })).toThrow(/bad identity: hello field deviceId/);
    expect(() => dialSuccessor("ws://127.0.0.1:1", { identity: identity("a", { hiddenSize: 0 }), log })).toThrow(RangeError);
    const busy = await listen();
    await expect(RingListener.listen({ host: "127.0.0.1", port: busy.port, identity: identity("x"), log }))
      .rejects.toThrow(`ring: cannot listen on 127.0.0.1:${busy.port}: listen EADDRINUSE`);
  });

  it("accept() times out, and closing the listener rejects waiters and closes its links", async () => {
    const listener = await listen();
    const err = await rejection(listener.accept({ timeoutMs: 100 }));
    expect((err as RingLinkError).kind).toBe("timeout");
    expect(err.message).toMatch(/no predecessor connected to port \d+ within 100 ms/);
    const out = await dial(listener.url);
    const inn = await listener.accept();
    const waiting = listener.accept();
    await listener.close();
    expect((await rejection(waiting)).message).toMatch(/closed/);
    expect((await inn.closed).error).toBeNull();
    expect((await out.closed).code).toBe(1000);
  });
});
