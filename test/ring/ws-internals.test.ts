// ring/ws-internals.ts reads ws's private Receiver fields and Node's socket handle so the native lane
// can take a link's connection over. These tests hold each read to what it means on a real ws
// connection over loopback, so a ws release that renames or redefines one fails here.
import { fstatSync, writeSync } from "node:fs";
import { createRequire } from "node:module";
import { Socket as NetSocket, type Socket } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import WebSocket, { WebSocketServer } from "ws";
import { WS_INTERNALS_CHECKED, receiverIdle, receiverState, socketFd } from "../../ring/ws-internals.js";
import { until } from "./lane-device.js";

const wsVersion: string = createRequire(import.meta.url)("ws/package.json").version;

/** a.b.c compared as numbers: negative when a < b. */
function compareVersions(a: string, b: string): number {
  const pa = a.split(/[.-]/).slice(0, 3).map(Number);
  const pb = b.split(/[.-]/).slice(0, 3).map(Number);
  for (let i = 0; i < 3; i++) if (pa[i] !== pb[i]) return pa[i] - pb[i];
  return 0;
}

interface Pair {
  server: WebSocket;
  serverSocket: Socket;
  client: WebSocket;
  clientSocket: Socket;
  /** Bytes the server's socket has read (counted after ws has handled them). */
  serverRead: () => number;
  serverMessages: Buffer[];
  clientMessages: Buffer[];
}

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A ws server and client on 127.0.0.1, as the ring's links are made (no extensions, binary). */
async function connectedPair(): Promise<Pair> {
  const wss = new WebSocketServer({ host: "127.0.0.1", port: 0, perMessageDeflate: false });
  cleanups.push(() => new Promise((r) => wss.close(() => r())));
  await new Promise<void>((r) => wss.once("listening", () => r()));
  const port = (wss.address() as { port: number }).port;
  const accepted = new Promise<{ ws: WebSocket; socket: Socket }>((r) => wss.once("connection", (ws, req) => r({ ws, socket: req.socket as Socket })));
  const client = new WebSocket(`ws://127.0.0.1:${port}`, { perMessageDeflate: false });
  cleanups.push(async () => {
    client.terminate();
  });
  let clientSocket: Socket | undefined;
  client.on("upgrade", (res) => (clientSocket = res.socket as Socket));
  await new Promise<void>((resolve, reject) => {
    client.once("open", () => resolve());
    client.once("error", reject);
  });
  const { ws: server, socket: serverSocket } = await accepted;
  cleanups.push(async () => {
    server.terminate();
  });
  let read = 0;
  // Added after ws's own 'data' listener: by the time it runs, ws's Receiver has taken the bytes.
  serverSocket.on("data", (d: Buffer) => (read += d.length));
  const serverMessages: Buffer[] = [];
  const clientMessages: Buffer[] = [];
  server.on("message", (d) => serverMessages.push(d as Buffer));
  client.on("message", (d) => clientMessages.push(d as Buffer));
  return { server, serverSocket, client, clientSocket: clientSocket!, serverRead: () => read, serverMessages, clientMessages };
}

/** Writes raw bytes from the client's side (ws's own sender stays idle meanwhile) and waits until the
 * server's socket has read them all. */
async function clientWrites(p: Pair, bytes: number[]): Promise<void> {
  const before = p.serverRead();
  p.clientSocket.write(Buffer.from(bytes));
  await until(() => p.serverRead() >= before + bytes.length, `the server reading ${bytes.length} bytes`);
}

// A client's frame header: masked, with a zero mask key (payload bytes unchanged), as ring/dial.ts sends.
const ZERO_MASK = [0, 0, 0, 0];

describe("ws internals the native lane relies on", () => {
  it(`the installed ws (${wsVersion}) is in the range the reads were checked on`, () => {
    const { from, below } = WS_INTERNALS_CHECKED.range;
    expect(compareVersions(wsVersion, from), `ws ${wsVersion} is older than ${from}`).toBeGreaterThanOrEqual(0);
    expect(compareVersions(wsVersion, below), `ws ${wsVersion} is not below ${below}: check ring/ws-internals.ts's reads against its lib/receiver.js`).toBeLessThan(0);
  });

  it("socketFd is the connection's own descriptor: bytes written to it reach the peer as a WebSocket frame", async () => {
    const p = await connectedPair();
    const serverFd = socketFd(p.serverSocket);
    const clientFd = socketFd(p.clientSocket);
    expect(serverFd).toEqual(expect.any(Number));
    expect(clientFd).toEqual(expect.any(Number));
    expect(serverFd).not.toBe(clientFd);
    expect(fstatSync(serverFd!).isSocket()).toBe(true);
    // A server's frame is unmasked; a client's masked (zero key).
    writeSync(serverFd!, Buffer.from([0x82, 3, 1, 2, 3]));
    writeSync(clientFd!, Buffer.from([0x82, 0x80 | 3, ...ZERO_MASK, 4, 5, 6]));
    await until(() => p.clientMessages.length === 1 && p.serverMessages.length === 1, "both messages");
    expect([...p.clientMessages[0]]).toEqual([1, 2, 3]);
    expect([...p.serverMessages[0]]).toEqual([4, 5, 6]);
    p.serverSocket.destroy();
    expect(socketFd(p.serverSocket)).toBeNull();
  });

  it("receiverState counts bytes of a header not yet whole (_bufferedBytes)", async () => {
    const p = await connectedPair();
    expect(receiverState(p.server)).toEqual({ bufferedBytes: 0, state: 0, fragmented: 0 });
    expect(receiverIdle(p.server)).toBe(true);
    await clientWrites(p, [0x82]);
    expect(receiverState(p.server)).toEqual({ bufferedBytes: 1, state: 0, fragmented: 0 });
    expect(receiverIdle(p.server)).toBe(false);
    await clientWrites(p, [0x80 | 2, ...ZERO_MASK, 7, 8]);
    expect(p.serverMessages.map((m) => [...m])).toEqual([[7, 8]]);
    expect(receiverIdle(p.server)).toBe(true);
  });

  it("receiverState shows a frame whose header is read and whose payload is not (_state)", async () => {
    const p = await connectedPair();
    await clientWrites(p, [0x82, 0x80 | 3, ...ZERO_MASK]);
    const s = receiverState(p.server)!;
    expect(s.bufferedBytes).toBe(0);
    expect(s.state).not.toBe(0);
    expect(receiverIdle(p.server)).toBe(false);
    await clientWrites(p, [9, 10, 11]);
    expect(p.serverMessages.map((m) => [...m])).toEqual([[9, 10, 11]]);
    expect(receiverState(p.server)).toEqual({ bufferedBytes: 0, state: 0, fragmented: 0 });
  });

  it("receiverState shows a message whose first fragment arrived and whose last did not (_fragmented)", async () => {
    const p = await connectedPair();
    await clientWrites(p, [0x02, 0x80 | 1, ...ZERO_MASK, 1]); // binary, not FIN
    expect(receiverState(p.server)).toEqual({ bufferedBytes: 0, state: 0, fragmented: 2 });
    expect(receiverIdle(p.server)).toBe(false);
    expect(p.serverMessages).toEqual([]);
    await clientWrites(p, [0x80, 0x80 | 1, ...ZERO_MASK, 2]); // continuation, FIN
    expect(p.serverMessages.map((m) => [...m])).toEqual([[1, 2]]);
    expect(receiverIdle(p.server)).toBe(true);
  });

  it("says not idle when the fields are missing (a ws that moved them), and no descriptor for an unconnected socket", () => {
    expect(receiverState({} as WebSocket)).toBeNull();
    expect(receiverIdle({} as WebSocket)).toBe(false);
    expect(receiverIdle({ _receiver: { _state: 0, _fragmented: 0 } } as unknown as WebSocket)).toBe(false);
    expect(socketFd(new NetSocket())).toBeNull();
  });
});
