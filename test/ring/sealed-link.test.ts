// Keyed links (ring/seal.ts): a link made with the right key carries frames both ways, on the JS path
// and the native lane; a peer without the key learns nothing (every byte it receives is checked for
// the ring id, the fingerprint and the device names) and changes nothing; a tap on a link sees no
// activation row in clear; a replayed frame is refused and named; a listener for one predecessor
// takes exactly one.
import { createCipheriv, createDecipheriv, randomBytes } from "node:crypto";
import { createServer } from "node:net";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { LocalModel } from "../../engine/index.js";
import {
  RingListener, RingPort, dialSuccessor, dialSuccessorWithin, encodeFrame, resolveLinkOptions,
  type ActivationsFrame, type Frame, type RingIdentity, type RingLink, type RingLinkOptions, type RingListenerOptions,
} from "../../ring/index.js";
import { LinkCipher } from "../../ring/seal.js";
import { laneNode, startLane, until } from "./lane-device.js";
import { holdsAnyRun, startTap, type Tap } from "./tap.js";

const H = 64;
const SECRETS = ["ring-7f3a-secret", "gguf:fp-secret-91c2", "succ-device-alpha", "pred-device-bravo"];
const [RING, FP, SUCC, PRED] = SECRETS;
const logs: string[] = [];
const log = (m: string) => logs.push(m);

const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function identity(deviceId: string, o: Partial<RingIdentity> = {}): RingIdentity {
  return { deviceId, modelFingerprint: FP, hiddenSize: H, ringId: RING, ...o };
}

async function listen(o: Partial<RingListenerOptions> = {}): Promise<RingListener> {
  const l = await RingListener.listen({ host: "127.0.0.1", port: 0, identity: identity(SUCC), log, ...o });
  cleanups.push(() => l.close());
  return l;
}

async function dial(url: string, o: Partial<RingLinkOptions> = {}): Promise<RingLink> {
  const link = await dialSuccessor(url, { identity: identity(PRED), log, ...o });
  cleanups.push(() => link.close());
  return link;
}

async function tapTo(port: number): Promise<Tap> {
  const t = await startTap(port);
  cleanups.push(() => t.close());
  return t;
}

function rowsFrame(pos: number, nTokens: number, width = H): ActivationsFrame {
  const activations = new Float32Array(nTokens * width);
  for (let i = 0; i < activations.length; i++) activations[i] = Math.sin(pos * 977 + i * 0.37) * 3.25 + i * 1e-3;
  return { type: "activations", requestId: 9, firstTokenPosition: pos, nTokens, cycle: 0, rowWidth: width, dtype: "f32", activations };
}

/** Asserts that none of the ring's secrets is anywhere in these bytes. */
function expectNothingLearned(bytes: Buffer, what: string): void {
  for (const s of SECRETS) expect(bytes.includes(Buffer.from(s)), `${what} holds "${s}"`).toBe(false);
  // Nor a HELLO of any kind (its JSON keys), nor any refusal that explains itself.
  for (const s of ["ringId", "modelFingerprint", "deviceId", "ring \"", "fingerprint"]) {
    expect(bytes.includes(Buffer.from(s)), `${what} holds "${s}"`).toBe(false);
  }
}

/** An intruder's raw WebSocket to `url`: what it does once open, and everything it heard. */
async function intrude(url: string, act: (ws: WebSocket) => void): Promise<{ code: number; reason: string; messages: Buffer[] }> {
  const ws = new WebSocket(url, { perMessageDeflate: false });
  const messages: Buffer[] = [];
  ws.on("message", (d) => messages.push(Buffer.from(d as Buffer)));
  ws.on("error", () => {});
  ws.on("open", () => act(ws));
  return new Promise((resolve) => ws.on("close", (code, reason) => resolve({ code, reason: reason.toString(), messages })));
}

describe("a link's records", () => {
  // Sealed and opened by the addon's AES-GCM (as the lane's); checked here against Node's own, so the
  // record is the documented one: AES-256-GCM, nonce = the sequence number (u64 LE) and four zero
  // bytes, the sequence number and frame header authenticated, the tag last.
  const nonce = (seq: number) => Buffer.concat([Buffer.from(new BigUint64Array([BigInt(seq)]).buffer), Buffer.alloc(4)]);
  const frame = (n: number) => encodeFrame(rowsFrame(n, 2));

  it("are AES-256-GCM as documented: Node's crypto opens what a link seals, and a link opens what Node's seals", () => {
    const ab = randomBytes(32), ba = randomBytes(32);
    const a = LinkCipher.of(ab, ba), b = LinkCipher.of(ba, ab);
    for (let seq = 0; seq < 3; seq++) {
      const f = frame(seq), record = a.seal(f);
      expect(record.readBigUInt64LE(0)).toBe(BigInt(seq));
      const d = createDecipheriv("aes-256-gcm", ab, nonce(seq), { authTagLength: 16 });
      d.setAAD(record.subarray(0, 8 + 32));
      d.setAuthTag(record.subarray(record.length - 16));
      const body = Buffer.concat([d.update(record.subarray(8 + 32, record.length - 16)), d.final()]);
      expect(Buffer.concat([record.subarray(8, 8 + 32), body]).equals(f)).toBe(true);
      expect(b.open(record).equals(f)).toBe(true);
      // The other way: a record Node seals opens on the link.
      const back = frame(seq + 10), c = createCipheriv("aes-256-gcm", ba, nonce(seq), { authTagLength: 16 });
      const head = Buffer.concat([nonce(seq).subarray(0, 8), back.subarray(0, 32)]);
      c.setAAD(head);
      const sealed = Buffer.concat([head, c.update(back.subarray(32)), c.final(), c.getAuthTag()]);
      expect(a.open(sealed).equals(back)).toBe(true);
    }
  });

  it("refuse a flipped bit, a wrong key and a replay by name, and keep counting from the last good one", () => {
    const k = randomBytes(32);
    const tx = LinkCipher.of(k, randomBytes(32)), rx = LinkCipher.of(randomBytes(32), k);
    const r0 = tx.seal(frame(0));
    const flipped = Buffer.from(r0);
    flipped[8 + 32 + 5] ^= 1;
    expect(() => rx.open(flipped)).toThrow(/fails authentication/);
    expect(() => LinkCipher.of(randomBytes(32), randomBytes(32)).open(r0)).toThrow(/fails authentication/);
    expect(rx.open(r0).equals(frame(0))).toBe(true);
    expect(() => rx.open(r0)).toThrow(/replayed \(sequence 0, expected 1\)/);
    expect(rx.open(tx.seal(frame(1))).equals(frame(1))).toBe(true);
    expect(rx.state().rx.seq).toBe(2);
  });
});

describe("keyed ring links", () => {
  it("carry frames both ways, sealed, with the right key", async () => {
    const key = randomBytes(32);
    const listener = await listen({ linkKey: key });
    const accepted = listener.accept();
    const out = await dial(listener.url, { linkKey: key });
    const inLink = await accepted;
    expect([out.encrypted, inLink.encrypted, out.peer.deviceId, inLink.peer.deviceId]).toEqual([true, true, SUCC, PRED]);
    const got: Frame[] = [];
    const back: Frame[] = [];
    inLink.on("frame", (f) => got.push(f));
    out.on("frame", (f) => back.push(f));
    const sent = [rowsFrame(0, 5), rowsFrame(5, 1), rowsFrame(6, 1)];
    for (const f of sent) await out.send(f);
    await inLink.send({ type: "error", requestId: 1, firstTokenPosition: 0, nTokens: 0, cycle: 0, message: "upstream said no" });
    await until(() => got.length === 3 && back.length === 1, "frames both ways");
    got.forEach((f, i) => expect(Array.from((f as ActivationsFrame).activations)).toEqual(Array.from(sent[i].activations)));
    expect(back[0]).toMatchObject({ type: "error", message: "upstream said no" });
  });

  it("a peer on the listener's port without the key learns nothing, and the real predecessor still links", async () => {
    const key = randomBytes(32);
    const listener = await listen({ linkKey: key, handshakeTimeoutMs: 400 });
    const drops: string[] = [];
    listener.on("dropped", (d) => drops.push(d.reason));
    const tap = await tapTo(listener.port);
    const hello = (o: Partial<RingIdentity>) => encodeFrame({ type: "hello", hello: { protocolVersion: 2, ...identity("intruder", o), maxTokensPerFrame: 8, maxPayloadBytes: 8 * H * 4 } });
    const proofStep1 = Buffer.concat([Buffer.from("PRMK\x01\0\0\0", "latin1"), randomBytes(32)]);
    const attacks: Array<[string, (ws: WebSocket) => void]> = [
      ["a HELLO naming another ring (the old way to learn the ring id)", (ws) => ws.send(hello({ ringId: "guess" }))],
      ["a HELLO with the right ring id and fingerprint, guessed", (ws) => ws.send(hello({}))],
      ["the key proof's first step, then garbage", (ws) => {
        ws.send(proofStep1);
        ws.once("message", () => ws.send(randomBytes(200)));
      }],
      ["the key proof's first step, then a forged record", (ws) => {
        ws.send(proofStep1);
        ws.once("message", () => {
          const f = encodeFrame(rowsFrame(0, 1));
          ws.send(Buffer.concat([Buffer.alloc(8), f, randomBytes(16)]));
        });
      }],
      ["a text message", (ws) => ws.send("hello?")],
      ["silence", () => {}],
    ];
    for (const [what, act] of attacks) {
      const heard = await intrude(tap.url, act);
      expect([heard.code, heard.reason], what).toEqual([4001, "refused"]);
      expectNothingLearned(Buffer.concat(heard.messages), what);
    }
    // A device with the wrong key (a stale one) gets no further than the listener's proof.
    await expect(dial(tap.url, { linkKey: randomBytes(32) })).rejects.toThrow(/failed the link key proof/);
    expectNothingLearned(tap.downstream(), "every byte the listener sent to the intruders");
    // Each was dropped; the log names the first and counts the rest (one line per address per interval).
    expect(drops.length).toBeGreaterThanOrEqual(attacks.length);
    const lines = logs.filter((l) => / dropped 127\.0\.0\.1:\d+: /.test(l)).length;
    expect(lines).toBeGreaterThanOrEqual(1);
    expect(lines).toBeLessThan(drops.length);

    const accepted = listener.accept();
    const out = await dial(listener.url, { linkKey: key });
    const inLink = await accepted;
    const got: Frame[] = [];
    inLink.on("frame", (f) => got.push(f));
    await out.send(rowsFrame(0, 1));
    await until(() => got.length === 1, "a frame from the real predecessor");
  });

  it("a dialer whose successor does not prove the key says nothing about itself", async () => {
    const impostor = await listen({ linkKey: randomBytes(32), identity: identity("impostor") });
    const tap = await tapTo(impostor.port);
    await expect(dial(tap.url, { linkKey: randomBytes(32) })).rejects.toThrow(/successor failed the link key proof/);
    expectNothingLearned(tap.upstream(), "every byte the dialer sent");
  });

  it("a keyed side and a plaintext side never link (no downgrade)", async () => {
    const key = randomBytes(32);
    const keyed = await listen({ linkKey: key });
    await expect(dial(keyed.url)).rejects.toThrow(/refused/);
    const plain = await listen();
    await expect(dial(plain.url, { linkKey: key })).rejects.toThrow(/the successor (refused|closed)/);
  });

  it("a tap on the link sees no activation row, no HELLO and no name; on a plaintext link it would", async () => {
    const rows = [rowsFrame(0, 7), rowsFrame(7, 1), rowsFrame(8, 1)];
    const rowBytes = rows.map((f) => new Uint8Array(f.activations.buffer));
    for (const keyed of [true, false]) {
      const key = keyed ? { linkKey: randomBytes(32) } : {};
      const listener = await listen(key);
      const tap = await tapTo(listener.port);
      const accepted = listener.accept();
      const out = await dial(tap.url, key);
      const inLink = await accepted;
      const got: Frame[] = [];
      inLink.on("frame", (f) => got.push(f));
      for (const f of rows) await out.send(f);
      await until(() => got.length === rows.length, "the frames");
      const captured = Buffer.concat([tap.upstream(), tap.downstream()]);
      const leaked = rowBytes.some((b) => holdsAnyRun(captured, b));
      expect(leaked, keyed ? "keyed link" : "plaintext link (the detector works)").toBe(!keyed);
      if (keyed) expectNothingLearned(captured, "the captured link");
    }
  });

  it("a replayed frame is refused and named, and not delivered twice", async () => {
    const key = randomBytes(32);
    const listener = await listen({ linkKey: key });
    const tap = await tapTo(listener.port);
    const accepted = listener.accept();
    const out = await dial(tap.url, { linkKey: key });
    const inLink = await accepted;
    const got: Frame[] = [];
    inLink.on("frame", (f) => got.push(f));
    const before = tap.upstream().length;
    await out.send(rowsFrame(0, 1));
    await until(() => got.length === 1, "the frame");
    const record = tap.upstream().subarray(before);
    tap.inject(record);
    const closed = await inLink.closed;
    expect(closed.error?.message).toMatch(/predecessor "pred-device-bravo" .*sent a frame out of order or replayed \(sequence 1, expected 2\)/);
    expect(got).toHaveLength(1);
  });

  it("a listener for one predecessor refuses a second, even one holding the key", async () => {
    const key = randomBytes(32);
    const listener = await listen({ linkKey: key, singlePeer: true, expectedPeerDeviceId: PRED });
    const accepted = listener.accept();
    await dial(listener.url, { linkKey: key });
    await accepted;
    await expect(dial(listener.url, { linkKey: key })).rejects.toThrow(/already has its predecessor/);
    await expect(dial(listener.url, { linkKey: key, identity: identity("someone-else") })).rejects.toThrow(/expected device "pred-device-bravo"/);
  });

  it("a successor between two assignments (its previous listener still on the port): the dial waits for the new one", async () => {
    const oldKey = randomBytes(32), newKey = randomBytes(32);
    const old = await RingListener.listen({ host: "127.0.0.1", port: 0, identity: identity(SUCC, { ringId: "ring-before" }), log, linkKey: oldKey });
    const port = old.port;
    const newDial = { identity: identity(PRED, { ringId: "ring-after" }), log, linkKey: newKey };
    // One try finds the old listener, which refuses the new ring's key: what failed a rebuilt ring.
    await expect(dialSuccessor(old.url, newDial)).rejects.toMatchObject({ kind: "refused" });
    // Tried again: the successor closes its old listener and opens the new one on the same port.
    const dialled = dialSuccessorWithin(old.url, newDial, 5000);
    await new Promise((r) => setTimeout(r, 300));
    await old.close();
    const next = await listen({ port, identity: identity(SUCC, { ringId: "ring-after" }), linkKey: newKey });
    const accepted = next.accept();
    const link = await dialled;
    cleanups.push(() => link.close());
    expect([link.encrypted, link.peer.deviceId, (await accepted).peer.deviceId]).toEqual([true, SUCC, PRED]);
  });

  it("a port held across assignments (a worker's): never let go, refuses dials between listeners as retryable, and each listener takes its own ring", async () => {
    const port = await RingPort.bind(0, "127.0.0.1", log);
    cleanups.push(() => port.close());
    const url = `ws://127.0.0.1:${port.port}`;
    const ring = (n: number) => ({ identity: identity(SUCC, { ringId: `ring-${n}` }), log, linkKey: keys[n] });
    const dialFor = (n: number) => ({ identity: identity(PRED, { ringId: `ring-${n}` }), log, linkKey: keys[n] });
    const keys = [randomBytes(32), randomBytes(32)];
    // No listener yet: the dial is told "between two assignments", a kind the retrying dial waits out.
    await expect(dialSuccessor(url, dialFor(0))).rejects.toMatchObject({ kind: "unreachable", message: expect.stringMatching(/between two assignments/) });
    const first = RingListener.attach(port, ring(0));
    const link0 = await dial(url, dialFor(0));
    expect((await first.accept()).peer.deviceId).toBe(PRED);
    // The port stays bound while no listener is attached: no other program can take it.
    await first.close();
    await link0.closed; // the listener's close took its links with it
    expect(link0.isOpen).toBe(false);
    const squatter = createServer();
    const bindError = await new Promise<NodeJS.ErrnoException | null>((resolve) => {
      squatter.once("error", resolve);
      squatter.listen(port.port, "127.0.0.1", () => resolve(null));
    });
    squatter.close();
    expect(bindError?.code).toBe("EADDRINUSE");
    // The next assignment's dial starts before its listener attaches, and waits for it.
    const dialled = dialSuccessorWithin(url, dialFor(1), 5000);
    await new Promise((r) => setTimeout(r, 300));
    const second = RingListener.attach(port, ring(1));
    cleanups.push(() => second.close());
    const link1 = await dialled;
    cleanups.push(() => link1.close());
    expect([link1.encrypted, link1.peer.deviceId]).toEqual([true, SUCC]);
    // The first ring's key opens nothing on the second listener.
    await expect(dialSuccessor(url, dialFor(0))).rejects.toMatchObject({ kind: "refused" });
    expect(logs.some((l) => l.includes(`port ${port.port} dropped`) && l.includes("between two assignments"))).toBe(true);
  });

  it("a successor that keeps refusing: the dial gives up after its time with the refusal", async () => {
    const listener = await listen({ linkKey: randomBytes(32) });
    const t0 = Date.now();
    await expect(dialSuccessorWithin(listener.url, { identity: identity(PRED), log, linkKey: randomBytes(32) }, 600)).rejects.toMatchObject({ kind: "refused" });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(600);
    expect(Date.now() - t0).toBeLessThan(5000);
  });
});

describe("keyed links on the native lane", () => {
  const model = LocalModel.open("models/stories260K.gguf", { threads: 1 });
  const nLayers = model.desc.hparams.nLayers;
  afterAll(() => model.close());

  function options(deviceId: string, linkKey: Uint8Array): RingLinkOptions {
    return { identity: { deviceId, modelFingerprint: FP, hiddenSize: model.nEmbd, ringId: RING }, maxTokensPerFrame: 8, log, linkKey };
  }

  function embedded(pos: number, nTokens = 1): ActivationsFrame {
    const tokens = Int32Array.from({ length: nTokens }, (_, i) => pos + i + 1);
    return { type: "activations", requestId: 7, firstTokenPosition: pos, nTokens, cycle: 0, rowWidth: model.nEmbd, dtype: "f32", activations: model.embed(tokens) };
  }

  /** predecessor (the test) -> tap -> device (the lane) -> successor (the test), every link keyed. */
  async function laneDevice() {
    const inKey = randomBytes(32);
    const outKey = randomBytes(32);
    const deviceListener = await RingListener.listen({ port: 0, host: "127.0.0.1", ...options("device", inKey), singlePeer: true });
    const successorListener = await RingListener.listen({ port: 0, host: "127.0.0.1", ...options("successor", outKey) });
    cleanups.push(() => deviceListener.close(), () => successorListener.close());
    const tap = await tapTo(deviceListener.port);
    const accepted = successorListener.accept();
    const out = await dialSuccessor(successorListener.url, options("device", outKey));
    const successor = await accepted;
    const incoming = deviceListener.accept();
    const predecessor = await dialSuccessor(tap.url, options("predecessor", inKey));
    const inLink = await incoming;
    const errors: string[] = [];
    const node = laneNode(model, errors);
    // Frames before the lane takes over move the sequence numbers: the lane must carry on from them.
    await predecessor.send({ type: "error", requestId: 1, firstTokenPosition: 0, nTokens: 0, cycle: 0, message: "before the lane" });
    await until(() => inLink.counters.framesReceived === 1, "the frame before the lane");
    const { lane, received } = startLane({
      model, node, link: resolveLinkOptions(options("device", inKey)), inLink, out, predecessor, successor, errors, cleanups,
    });
    return { lane, predecessor, successor, inLink, errors, received, tap };
  }

  it("runs sealed frames in C with the rows of a JS pass, passes ERROR frames on, and the tap sees no row", async () => {
    const d = await laneDevice();
    const sent = [embedded(0, 3), embedded(3), embedded(4)];
    for (const f of sent) await d.predecessor.send(f);
    await d.predecessor.send({ type: "error", requestId: 7, firstTokenPosition: 5, nTokens: 1, cycle: 0, message: "upstream failed" });
    // The successor first gets the ERROR frame sent before the lane took over (laneDevice).
    await until(() => d.received.length === 5, "five frames at the successor");
    expect(d.received[0]).toMatchObject({ type: "error", message: "before the lane" });
    const reference = model.window(0, nLayers, { ctx: 32 });
    try {
      for (let i = 0; i < sent.length; i++) {
        const want = embedded(sent[i].firstTokenPosition, sent[i].nTokens);
        await reference.forward(want.activations, want.firstTokenPosition, want.nTokens);
        expect(Array.from((d.received[i + 1] as ActivationsFrame).activations)).toEqual(Array.from(want.activations));
      }
    } finally {
      reference.close();
    }
    expect(d.received[4]).toMatchObject({ type: "error", message: "upstream failed" });
    expect(d.errors).toEqual([]);
    const captured = Buffer.concat([d.tap.upstream(), d.tap.downstream()]);
    for (const f of sent) expect(holdsAnyRun(captured, new Uint8Array(f.activations.buffer))).toBe(false);
    expectNothingLearned(captured, "the captured link");
  });

  it("refuses a replayed frame by name and runs it only once", async () => {
    const d = await laneDevice();
    const before = d.tap.upstream().length;
    await d.predecessor.send(embedded(0));
    await until(() => d.received.length === 2, "the frame at the successor");
    d.tap.inject(d.tap.upstream().subarray(before));
    const closed = await d.inLink.closed;
    expect(closed.error?.message).toMatch(/predecessor "predecessor" .*sent a frame out of order or replayed \(sequence 2, expected 3\)/);
    await new Promise((r) => setTimeout(r, 100));
    expect(d.received).toHaveLength(2);
  });

  it("refuses a forged frame (one bit flipped on the way) by name", async () => {
    const d = await laneDevice();
    const before = d.tap.upstream().length;
    await d.predecessor.send(embedded(0));
    await until(() => d.received.length === 2, "the frame at the successor");
    const record = Buffer.from(d.tap.upstream().subarray(before));
    // The WebSocket header (2-4 bytes and a zero mask) leaves the sequence number at a fixed place: make it the next one, flip a payload bit.
    const wsHeader = record.length - 8 - 32 - model.nEmbd * 4 - 16;
    record.writeBigUInt64LE(3n, wsHeader);
    record[record.length - 40] ^= 1;
    d.tap.inject(record);
    const closed = await d.inLink.closed;
    expect(closed.error?.message).toMatch(/sent a frame that fails authentication/);
    expect(d.received).toHaveLength(2);
  });
});
