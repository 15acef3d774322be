// Listening for the predecessor: a WebSocket server whose only job is to accept the device before
// this one in the ring. Anything else that connects (a port scanner, a stale device of another
// ring, a broken peer) is dropped with a logged reason, and the listener stays up for the real
// predecessor. With a link key (seal.ts), a peer that does not prove it holds the key is told only
// "refused": no HELLO, no ring id, no fingerprint, no name.
import { EventEmitter } from "node:events";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import WebSocket, { WebSocketServer } from "ws";
import { DropLog } from "./drop-log.js";
import { FrameError, RingLinkError } from "./errors.js";
import { encodeFrame } from "./frame.js";
import { decodeHandshakeMessage, refuse, refuseUnproved } from "./handshake.js";
import { helloMismatch } from "./hello.js";
import { RingLink } from "./link.js";
import { CloseCode, closeReason, resolveLinkOptions, type ResolvedLinkOptions, type RingLinkOptions } from "./options.js";
import { RecordError, listenerAnswer, type LinkCipher } from "./seal.js";

function toBuffer(data: WebSocket.RawData): Buffer {
  if (Buffer.isBuffer(data)) return data;
  if (Array.isArray(data)) return Buffer.concat(data);
  return Buffer.from(data);
}

export interface RingListenerOptions extends RingLinkOptions {
  /** Interface to listen on. Default "0.0.0.0" (the ring's devices are other machines). */
  host?: string;
  /** TCP port; 0 picks a free one (read it back from `port`). */
  port: number;
  /** Accept one predecessor in this listener's life (the one the plan names); refuse every later one. */
  singlePeer?: boolean;
}

/** A connection the listener refused, and why. */
export interface DroppedPeer {
  /** host:port of the remote end. */
  remoteAddress: string;
  reason: string;
}

interface RingListenerEvents {
  /** A predecessor passed the handshake (also queued for accept()). */
  link: [link: RingLink];
  dropped: [dropped: DroppedPeer];
}

function remoteOf(socket: Socket): string {
  return `${socket.remoteAddress ?? "?"}:${socket.remotePort ?? "?"}`;
}

/** Refuses connections while no listener is attached: a dialer reads it as "between assignments" and
 * retries (ring/dial.ts). */
const NO_LISTENER_STATUS = 503;

/**
 * A data-plane port held for a device's whole life (a worker's): each assignment's RingListener
 * attaches to it and detaches when it closes. The port is never let go between assignments, where
 * another program's connection could take it (a full test run once failed so), and no listener of an
 * earlier assignment can take a connection meant for the next one: between two listeners the port
 * answers every upgrade with 503, which dialers retry.
 */
export class RingPort {
  private current: RingListener | null = null;
  private closing: Promise<void> | null = null;
  private readonly drops: DropLog;

  private constructor(private readonly server: Server, readonly host: string, readonly port: number, private readonly log: (line: string) => void) {
    this.drops = new DropLog(log, `prima ring: port ${port}`);
    server.on("error", (err) => log(`prima ring: port ${host}:${port}: ${err.message}`));
    // Plain HTTP and non-HTTP bytes never reach ws: answer or cut them here, with a log line.
    server.on("request", (req: IncomingMessage, res) => {
      this.dropped(remoteOf(req.socket), `sent a plain HTTP ${req.method} request, not a WebSocket upgrade`);
      res.writeHead(426, { "content-type": "text/plain", connection: "close" });
      res.end("prima ring data plane: WebSocket connections only\n");
    });
    server.on("clientError", (err: Error & { code?: string }, socket) => {
      this.dropped(remoteOf(socket as Socket), `sent bytes that are not HTTP (${err.code ?? err.message})`);
      socket.destroy();
    });
    server.on("upgrade", (req: IncomingMessage, socket: Socket, head: Buffer) => {
      const l = this.current;
      if (l && !this.closing) return l.upgrade(req, socket, head);
      this.dropped(remoteOf(socket), "connected between two assignments (no listener on the port)");
      socket.on("error", () => {});
      socket.end(`HTTP/1.1 ${NO_LISTENER_STATUS} Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`);
      setTimeout(() => socket.destroy(), 1000).unref();
    });
  }

  /** Binds host:port (0: any free port); rejects with the system's error (its `code` says why). */
  static bind(port: number, host: string, log: (line: string) => void = () => {}): Promise<RingPort> {
    const server = createServer();
    return new Promise<RingPort>((resolve, reject) => {
      server.once("error", (err) => {
        server.close();
        reject(err);
      });
      server.listen(port, host, () => {
        server.removeAllListeners("error");
        resolve(new RingPort(server, host, (server.address() as AddressInfo).port, log));
      });
    });
  }

  /** @internal RingListener.attach: the port's listener from now on. One still attached (a reset that
   * has not reached it yet) keeps its links but gets no more connections. */
  attach(l: RingListener): void {
    if (this.closing) throw new Error(`ring: port ${this.port} is closed`);
    this.current = l;
  }

  /** @internal The listener closed. */
  detach(l: RingListener): void {
    if (this.current === l) this.current = null;
  }

  /** Stops listening at once, and cuts every connection still open on the port (a listener's links
   * included) once `grace` has settled; resolves when they are gone. */
  close(grace: Promise<unknown> = Promise.resolve()): Promise<void> {
    this.closing ??= (async () => {
      this.drops.close();
      const stopped = new Promise<void>((resolve) => this.server.close(() => resolve()));
      await grace.catch(() => {});
      this.server.closeAllConnections();
      await stopped;
    })();
    return this.closing;
  }

  private dropped(remoteAddress: string, reason: string): void {
    if (this.current) this.current.dropped(remoteAddress, reason);
    else this.drops.note(remoteAddress, reason);
  }
}

export class RingListener extends EventEmitter<RingListenerEvents> {
  readonly host: string;
  /** The bound TCP port. */
  readonly port: number;
  private readonly wss: WebSocketServer;
  private readonly options: ResolvedLinkOptions;
  private readonly singlePeer: boolean;
  private linksMade = 0;
  /** Links that passed the handshake and no accept() has taken yet. */
  private readonly unclaimed: RingLink[] = [];
  private readonly acceptWaiters: Array<{ resolve: (l: RingLink) => void; reject: (e: RingLinkError) => void }> = [];
  private readonly links = new Set<RingLink>();
  private readonly handshaking = new Set<WebSocket>();
  private closing: Promise<void> | null = null;
  private readonly drops: DropLog;

  /** Starts listening on a port of its own, given up when it closes; rejects with a clear Error when
   * the address cannot be bound. */
  static async listen(options: RingListenerOptions): Promise<RingListener> {
    const host = options.host ?? "0.0.0.0";
    const opts = resolveLinkOptions(options);
    let port: RingPort;
    try {
      port = await RingPort.bind(options.port, host, opts.log);
    } catch (err) {
      throw new Error(`ring: cannot listen on ${host}:${options.port}: ${(err as Error).message}`);
    }
    return new RingListener(port, true, opts, options.singlePeer ?? false);
  }

  /** Listens on a port held elsewhere (a worker's, for its life), in place of any listener it had:
   * detached again when it closes. Throws when the port is closed. */
  static attach(port: RingPort, options: Omit<RingListenerOptions, "port" | "host">): RingListener {
    return new RingListener(port, false, resolveLinkOptions(options), options.singlePeer ?? false);
  }

  private constructor(private readonly ringPort: RingPort, private readonly ownsPort: boolean, options: ResolvedLinkOptions, singlePeer: boolean) {
    super();
    this.singlePeer = singlePeer;
    this.host = ringPort.host;
    this.port = ringPort.port;
    this.options = options;
    this.drops = new DropLog(options.log, `prima ring: listener on port ${this.port}`);
    this.wss = new WebSocketServer({
      noServer: true,
      maxPayload: options.maxMessageBytes,
      perMessageDeflate: false,
      clientTracking: false,
    });
    this.wss.on("error", (err) => options.log(`prima ring: listener on ${this.host}:${this.port}: ${err.message}`));
    this.wss.on("wsClientError", (err, socket, req) => {
      this.dropped(remoteOf(req.socket), `sent an invalid WebSocket upgrade (${err.message})`);
      socket.destroy();
    });
    this.wss.on("connection", (ws, req) => this.handshake(ws, req.socket));
    ringPort.attach(this);
  }

  /** @internal RingPort: a WebSocket upgrade on the port. */
  upgrade(req: IncomingMessage, socket: Socket, head: Buffer): void {
    this.wss.handleUpgrade(req, socket, head, (ws) => this.wss.emit("connection", ws, req));
  }

  /** ws://host:port to give the predecessor (with the wildcard host replaced by loopback). */
  get url(): string {
    const host = this.host === "0.0.0.0" || this.host === "::" ? "127.0.0.1" : this.host;
    return `ws://${host.includes(":") ? `[${host}]` : host}:${this.port}`;
  }

  /**
   * The next predecessor that passed the handshake (one that connected earlier and is still open
   * counts). Rejects with a RingLinkError on timeout or when the listener closes.
   */
  accept(options: { timeoutMs?: number } = {}): Promise<RingLink> {
    const ready = this.unclaimed.shift();
    if (ready) return Promise.resolve(ready);
    if (this.closing) return Promise.reject(new RingLinkError("closed", "predecessor", `listener on port ${this.port} is closed`));
    const accepted = new Promise<RingLink>((resolve, reject) => {
      const waiter = { resolve, reject };
      this.acceptWaiters.push(waiter);
      if (options.timeoutMs !== undefined) {
        const timer = setTimeout(() => {
          const i = this.acceptWaiters.indexOf(waiter);
          if (i < 0) return;
          this.acceptWaiters.splice(i, 1);
          reject(new RingLinkError("timeout", "predecessor", `no predecessor connected to port ${this.port} within ${options.timeoutMs} ms`));
        }, options.timeoutMs);
        timer.unref();
        waiter.resolve = (l) => {
          clearTimeout(timer);
          resolve(l);
        };
      }
    });
    // The caller gets the rejection; this only keeps a forgotten accept() from being an unhandled rejection.
    accepted.catch(() => {});
    return accepted;
  }

  /** Stops listening and closes every link it made. */
  close(): Promise<void> {
    if (this.closing) return this.closing;
    this.drops.close();
    for (const w of this.acceptWaiters.splice(0)) {
      w.reject(new RingLinkError("closed", "predecessor", `listener on port ${this.port} closed`));
    }
    for (const ws of this.handshaking) ws.terminate();
    // The port is let go first (or left to the next listener): a link's close handshake with a dead
    // peer can take its grace, and the next assignment may want to listen on the port meanwhile.
    this.ringPort.detach(this);
    const linksClosed = Promise.all([...this.links].map((l) => l.close("listener closing")))
      .then(() => new Promise<void>((resolve) => this.wss.close(() => resolve())));
    this.closing = this.ownsPort ? this.ringPort.close(linksClosed) : linksClosed;
    return this.closing;
  }

  /** @internal Also the port's, for what it refuses while this listener is attached. */
  dropped(remoteAddress: string, reason: string): void {
    this.drops.note(remoteAddress, reason);
    this.safeEmit("dropped", { remoteAddress, reason });
  }

  /** A listener's bug must not surface inside ws's socket handlers as an uncaught exception: log it. */
  private safeEmit<K extends keyof RingListenerEvents>(event: K, ...args: RingListenerEvents[K]): void {
    try {
      (this.emit as (e: K, ...a: RingListenerEvents[K]) => boolean)(event, ...args);
    } catch (e) {
      this.options.log(`prima ring: a '${event}' listener threw: ${e instanceof Error ? e.stack : String(e)}`);
    }
  }

  private handshake(ws: WebSocket, socket: Socket): void {
    const remote = remoteOf(socket);
    if (this.closing) {
      ws.terminate();
      return;
    }
    this.handshaking.add(ws);
    const linkKey = this.options.linkKey;
    /** Set once the peer answered the key proof's first step (keyed links only). */
    let cipher: LinkCipher | null = null;
    /** Keyed: whether the peer has proved the key (its first record opened). Until then every refusal is generic. */
    let proved = !linkKey;
    let done = false;
    const finish = () => {
      done = true;
      clearTimeout(timer);
      this.handshaking.delete(ws);
      ws.removeAllListeners("message");
      ws.removeAllListeners("close");
    };
    const drop = (reason: string, closeCode: number | null) => {
      if (done) return;
      finish();
      this.dropped(remote, reason);
      if (closeCode === null) ws.terminate();
      else if (!proved) refuseUnproved(ws, 1000);
      else {
        try {
          ws.close(closeCode, closeReason(reason));
        } catch {
          ws.terminate();
        }
        setTimeout(() => ws.terminate(), 1000).unref();
      }
    };
    const timer = setTimeout(() => drop(`no HELLO within ${this.options.handshakeTimeoutMs} ms`, CloseCode.handshakeTimeout),
      this.options.handshakeTimeoutMs);
    timer.unref();

    ws.on("error", (err: Error & { code?: string }) => {
      drop(err.code === "WS_ERR_UNSUPPORTED_MESSAGE_LENGTH"
        ? `sent a message over the limit of ${this.options.maxMessageBytes} bytes`
        : `broke the WebSocket protocol (${err.message})`, null);
    });
    ws.on("close", (code) => drop(`closed the connection before its HELLO (code ${code})`, null));
    ws.on("message", (data, isBinary) => {
      if (done) return;
      if (linkKey && !cipher) {
        const answer = isBinary ? listenerAnswer(linkKey, toBuffer(data)) : null;
        if (!answer) return drop("refused: did not start the link key proof (not a keyed ring device)", CloseCode.refused);
        cipher = answer.cipher;
        try {
          ws.send(answer.reply);
        } catch {
          drop("could not answer the key proof", null);
        }
        return;
      }
      let frame;
      try {
        frame = decodeHandshakeMessage(cipher && isBinary ? cipher.open(toBuffer(data)) : data, isBinary, this.options.limits);
      } catch (e) {
        if (e instanceof RecordError && !proved) return drop("refused: failed the link key proof (it does not hold this link's key)", CloseCode.refused);
        drop(e instanceof FrameError ? `sent garbage: ${e.message}` : String(e), CloseCode.protocol);
        return;
      }
      proved = true;
      if (frame.type === "error") {
        drop(`sent an ERROR frame instead of HELLO: ${frame.message}`, CloseCode.protocol);
        return;
      }
      const mismatch = helloMismatch(this.options.hello, frame.hello, this.options.expectedPeerDeviceId) ??
        (this.singlePeer && this.linksMade > 0 ? "this device already has its predecessor" : null);
      if (mismatch) {
        finish();
        this.dropped(remote, `refused: ${mismatch}`);
        refuse(ws, mismatch, 1000, cipher);
        return;
      }
      finish();
      try {
        const hello = encodeFrame({ type: "hello", hello: this.options.hello });
        ws.send(cipher ? cipher.seal(hello) : hello);
      } catch (e) {
        this.dropped(remote, `could not answer HELLO: ${(e as Error).message}`);
        ws.terminate();
        return;
      }
      this.linksMade++;
      const link = new RingLink(ws, socket, frame.hello, "predecessor", remote, this.options, cipher);
      this.links.add(link);
      void link.closed.then(() => {
        this.links.delete(link);
        const i = this.unclaimed.indexOf(link);
        if (i >= 0) this.unclaimed.splice(i, 1);
      });
      const waiter = this.acceptWaiters.shift();
      if (waiter) waiter.resolve(link);
      else this.unclaimed.push(link);
      this.safeEmit("link", link);
    });
  }
}
