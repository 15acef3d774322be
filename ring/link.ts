// One established link between ring neighbours, after both HELLOs were accepted (dial.ts makes the
// link to the successor, listener.ts the one from the predecessor). It sends frames in order with
// backpressure, decodes what arrives (any invalid frame drops the link), and watches the peer's
// liveness. Every failure ends in one 'close' carrying the error; nothing escapes as an uncaught
// exception or an unhandled rejection. On a keyed link every frame travels sealed (seal.ts). Sending
// (fragments, order, backpressure) is frame-writer.ts; reading frames as an iterator, link-frames.ts.
import { EventEmitter } from "node:events";
import type { Socket } from "node:net";
import type WebSocket from "ws";
import { FrameError, RingLinkError, type RingLinkErrorKind } from "./errors.js";
import { decodeFrame, encodeFrame, type Frame } from "./frame.js";
import { FrameWriter, handled, type FrameSendStats } from "./frame-writer.js";
import { frameIterator } from "./link-frames.js";
import { LivenessWatch } from "./liveness.js";
import { CloseCode, closeReason, type ResolvedLinkOptions } from "./options.js";
import { RecordError, type LinkCipher, type SealDirection } from "./seal.js";
import { PAYLOAD_DTYPE_BYTES, type Hello } from "./validation.js";
import { receiverIdle, socketFd } from "./ws-internals.js";

export type { FrameSendStats };

/** How a link handed to the native lane is closed (code 0: at once, without a close frame). */
export interface LaneSide {
  close(code: number, reason: string): void;
}

/** What the peer is to this device. */
export type PeerRole = "successor" | "predecessor";

export interface RingLinkClosed {
  /** WebSocket close code (1000 normal, 1006 lost without a close frame, 4001-4003 see CloseCode). */
  code: number;
  reason: string;
  /** Why the link failed; null when it was closed on purpose (by either side, code 1000). */
  error: RingLinkError | null;
}

export interface RingLinkCounters {
  framesSent: number;
  bytesSent: number;
  framesReceived: number;
  bytesReceived: number;
}

interface RingLinkEvents {
  frame: [frame: Frame];
  /** Emitted only when someone listens (an unheard 'error' would throw); 'close' always carries it. */
  error: [error: RingLinkError];
  close: [closed: RingLinkClosed];
}

/** How long a close handshake may take before the connection is ended (the native lane too). */
export const CLOSE_GRACE_MS = 1000;

function toBuffer(data: WebSocket.RawData): Buffer {
  if (Buffer.isBuffer(data)) return data;
  if (Array.isArray(data)) return Buffer.concat(data);
  return Buffer.from(data);
}

export class RingLink extends EventEmitter<RingLinkEvents> {
  /** The peer's HELLO: device id, model, limits. */
  readonly peer: Hello;
  /** ws://host:port for a successor, host:port for a predecessor. */
  readonly peerAddress: string;
  readonly role: PeerRole;
  readonly counters: RingLinkCounters = { framesSent: 0, bytesSent: 0, framesReceived: 0, bytesReceived: 0 };
  /** Resolves (never rejects) when the link is closed, with why. */
  readonly closed: Promise<RingLinkClosed>;

  private readonly ws: WebSocket;
  private readonly options: ResolvedLinkOptions;
  private readonly liveness: LivenessWatch;
  private resolveClosed!: (c: RingLinkClosed) => void;
  private closedInfo: RingLinkClosed | null = null;
  private failure: RingLinkError | null = null;
  private closingOnPurpose = false;
  private terminateTimer: NodeJS.Timeout | null = null;
  private readonly writer: FrameWriter;
  /** Frames that arrived while nobody listened (delivered to the first 'frame' listener or iterator). */
  private backlog: Frame[] = [];
  private backlogFlushScheduled = false;
  private readonly socket: Socket;
  /** Set once the native lane owns the connection (handOverToLane): it closes it, JS no longer does. */
  private lane: LaneSide | null = null;
  /** Seals and opens this link's frames (a keyed link); null: plaintext. */
  private readonly cipher: LinkCipher | null;

  /** @internal Made by dialSuccessor and RingListener once both HELLOs are accepted. */
  constructor(ws: WebSocket, socket: Socket, peer: Hello, role: PeerRole, peerAddress: string, options: ResolvedLinkOptions,
    cipher: LinkCipher | null = null) {
    super();
    this.cipher = cipher;
    this.ws = ws;
    this.socket = socket;
    this.peer = peer;
    this.role = role;
    this.peerAddress = peerAddress;
    this.options = options;
    this.closed = new Promise((r) => (this.resolveClosed = r));
    this.liveness = new LivenessWatch(ws, socket, options.livenessTimeoutMs, (reason) => this.fail("dead", reason, null));
    this.writer = new FrameWriter({
      ws, fragmentBytes: options.fragmentBytes, checkOpen: () => this.checkOpen(), onFlushed: () => this.liveness.noteWriteProgress(),
      writeFailed: (err) => new RingLinkError("closed", this.peerName, `the connection closed before a frame was sent (${err.message})`),
      onSent: (bytes) => {
        this.counters.framesSent++;
        this.counters.bytesSent += bytes;
      },
    });
    ws.on("message", (data, isBinary) => this.onMessage(data, isBinary));
    ws.on("error", (err) => this.onWsError(err));
    ws.on("close", (code, reason) => this.onClose(code, reason.toString()));
    (this as unknown as EventEmitter).on("newListener", (event: string | symbol) => {
      if (event === "frame" && this.backlog.length > 0) this.scheduleBacklogFlush();
    });
    this.liveness.start();
  }

  /** `successor "dev-b" (ws://10.0.0.2:9000)`: how errors and logs name the peer. */
  get peerName(): string {
    return `${this.role} "${this.peer.deviceId}" (${this.peerAddress})`;
  }

  /** Whether frames on this link are encrypted and authenticated (it was made with a link key). */
  get encrypted(): boolean {
    return this.cipher !== null;
  }

  get isOpen(): boolean {
    return this.closedInfo === null && !this.closingOnPurpose && this.failure === null;
  }

  /**
   * Sends one frame. It is checked against the peer's HELLO limits and encoded (copied) before this
   * returns, so the caller may reuse its activations at once. Frames go out in call order; the
   * promise resolves when the whole frame has left this process, with its timing. Rejects with
   * FrameError for a frame the peer would refuse (the link stays up), or RingLinkError when the link
   * is down.
   */
  send(frame: Frame): Promise<FrameSendStats> {
    const calledAt = performance.now();
    let buf: Buffer;
    try {
      this.checkOpen();
      if (this.lane) throw new RingLinkError("closed", this.peerName, "cannot send from JS: the native lane writes this link's frames");
      this.checkPeerLimits(frame);
      buf = encodeFrame(frame);
      if (this.cipher) buf = this.cipher.seal(buf);
    } catch (e) {
      return handled(Promise.reject(e));
    }
    return this.writer.write(buf, calledAt, performance.now());
  }

  /**
   * @internal The connection's file descriptor, for the native lane to take over, or null when it
   * cannot be handed over cleanly now: the link is closing, bytes are waiting to be written, or ws has
   * read bytes it has not made a message of yet.
   */
  socketForLane(): number | null {
    const fd = socketFd(this.socket);
    if (!this.isOpen || this.lane || fd === null) return null;
    if (this.ws.bufferedAmount !== 0 || this.socket.readableLength !== 0) return null;
    if (!receiverIdle(this.ws)) return null;
    return fd;
  }

  /** @internal A keyed link's keys and next sequence numbers (null: plaintext), for the native lane,
   * which seals and opens the frames once it owns the connection. Read it just before handOverToLane. */
  laneCrypto(): { tx: SealDirection; rx: SealDirection } | null {
    return this.cipher?.state() ?? null;
  }

  /**
   * @internal Once the lane holds a dup of socketForLane()'s descriptor (in the same event-loop turn,
   * so ws reads nothing more): JS lets go of the connection, which the lane now reads, pings, answers
   * and closes, and learns what happens to it from lane events.
   */
  handOverToLane(lane: LaneSide): void {
    this.lane = lane;
    this.liveness.stop();
    for (const event of ["message", "close", "error", "ping", "pong"] as const) this.ws.removeAllListeners(event);
    this.ws.on("error", () => {});
    this.ws.terminate(); // closes JS's descriptor only: the lane's copy keeps the connection
  }

  /** @internal The lane ended without reporting this link's end (it was stopped): closed on purpose. */
  laneStopped(): void {
    if (this.closedInfo) return;
    if (!this.failure) this.closingOnPurpose = true;
    this.onClose(1006, "");
  }

  /** @internal What the lane reports about this link. */
  laneEvent(ev: { kind: "frame" | "failed" | "closed"; code: number; failure: string; text: string; data?: Buffer }): void {
    // The lane has opened the record already: what it hands over is the frame.
    if (ev.kind === "frame") this.onFrameBytes(ev.data ?? Buffer.alloc(0));
    else if (ev.kind === "failed") this.fail(ev.failure as RingLinkErrorKind, ev.text, null);
    else this.onClose(ev.code, ev.text);
  }

  /** Frames as they arrive; ends when the link closes cleanly, throws its RingLinkError when it fails. */
  frames(): AsyncIterableIterator<Frame> {
    return frameIterator({
      waiting: this.backlog.splice(0),
      subscribe: (onFrame, onClose) => {
        this.on("frame", onFrame);
        this.on("close", onClose);
        return () => {
          this.off("frame", onFrame);
          this.off("close", onClose);
        };
      },
      closedWith: () => this.closedInfo,
    });
  }

  /** Closes the link (code 1000). Frames not yet handed to the socket fail with "closed". */
  close(reason = "closing"): Promise<RingLinkClosed> {
    if (!this.closedInfo && !this.closingOnPurpose && !this.failure) {
      this.closingOnPurpose = true;
      this.writer.wake();
      this.closeSocket(CloseCode.normal, reason);
    }
    return this.closed;
  }

  private checkOpen(): void {
    if (this.isOpen) return;
    const why = this.failure ? `: ${this.failure.message}` : "";
    throw new RingLinkError("closed", this.peerName, `cannot send, the link is closed${why}`);
  }

  /** Refuse locally, with a clear error, what the peer announced it would refuse (and drop the link for). */
  private checkPeerLimits(frame: Frame): void {
    if (frame.type === "hello") throw new FrameError("frame type", "HELLO is sent by the handshake only");
    if (frame.type !== "activations") return;
    if (frame.rowWidth !== this.peer.hiddenSize) {
      throw new FrameError("row width", `row width ${frame.rowWidth} does not match the model's hidden size ${this.peer.hiddenSize}`);
    }
    if (frame.nTokens > this.peer.maxTokensPerFrame) {
      throw new FrameError("number of tokens",
        `number of tokens ${frame.nTokens} exceeds ${this.peerName}'s limit of ${this.peer.maxTokensPerFrame} per frame`);
    }
    const payloadBytes = frame.nTokens * frame.rowWidth * (PAYLOAD_DTYPE_BYTES[frame.dtype] ?? 4);
    if (payloadBytes > this.peer.maxPayloadBytes) {
      throw new FrameError("payload length",
        `payload of ${payloadBytes} bytes exceeds ${this.peerName}'s limit of ${this.peer.maxPayloadBytes} bytes`);
    }
  }

  private onMessage(data: WebSocket.RawData, isBinary: boolean): void {
    if (!this.isOpen) return;
    if (!isBinary) return this.fail("protocol", "sent a text message; the data plane carries binary frames only", CloseCode.protocol);
    let buf = toBuffer(data);
    if (this.cipher) {
      try {
        buf = this.cipher.open(buf);
      } catch (e) {
        return this.fail("protocol", `sent ${e instanceof RecordError ? e.message : String(e)}`, CloseCode.protocol);
      }
    }
    this.onFrameBytes(buf);
  }

  private onFrameBytes(buf: Buffer): void {
    if (!this.isOpen) return;
    let frame: Frame;
    try {
      frame = decodeFrame(buf, this.options.limits);
    } catch (e) {
      const msg = e instanceof Error ? e.message : String(e);
      return this.fail("protocol", `sent an invalid frame: ${msg}`, CloseCode.protocol);
    }
    if (frame.type === "hello") return this.fail("protocol", "sent a second HELLO", CloseCode.protocol);
    this.counters.framesReceived++;
    this.counters.bytesReceived += buf.length;
    this.deliver(frame);
  }

  private deliver(frame: Frame): void {
    if (this.backlog.length > 0 || this.listenerCount("frame") === 0) {
      this.backlog.push(frame);
      if (this.listenerCount("frame") > 0) this.scheduleBacklogFlush();
      return;
    }
    this.emitFrame(frame);
  }

  private emitFrame(frame: Frame): void {
    this.safeEmit("frame", frame);
  }

  /** A consumer's bug must not surface inside ws's socket handlers as an uncaught exception: log it. */
  private safeEmit<K extends keyof RingLinkEvents>(event: K, ...args: RingLinkEvents[K]): void {
    try {
      (this.emit as (e: K, ...a: RingLinkEvents[K]) => boolean)(event, ...args);
    } catch (e) {
      this.options.log(`prima ring: a '${event}' listener of ${this.peerName} threw: ${e instanceof Error ? e.stack : String(e)}`);
    }
  }

  private scheduleBacklogFlush(): void {
    if (this.backlogFlushScheduled) return;
    this.backlogFlushScheduled = true;
    queueMicrotask(() => {
      this.backlogFlushScheduled = false;
      while (this.backlog.length > 0 && this.listenerCount("frame") > 0) this.emitFrame(this.backlog.shift()!);
    });
  }

  private onWsError(err: Error & { code?: string }): void {
    // ws reports malformed WebSocket traffic (too large, bad opcode, ...) with WS_ERR_* codes, then closes.
    if (err.code?.startsWith("WS_ERR_")) {
      const detail = err.code === "WS_ERR_UNSUPPORTED_MESSAGE_LENGTH"
        ? `sent a message over this link's limit of ${this.options.maxMessageBytes} bytes`
        : `broke the WebSocket protocol (${err.message})`;
      this.fail("protocol", detail, null);
    } else {
      this.fail("closed", `connection error: ${err.message}`, null);
    }
  }

  /** Records the first failure, reports it, and ends the connection (close frame when closeCode is given). */
  private fail(kind: RingLinkErrorKind, reason: string, closeCode: number | null): void {
    if (this.failure || this.closedInfo) return;
    const error = new RingLinkError(kind, this.peerName, reason);
    this.failure = error;
    this.liveness.stop();
    this.writer.wake();
    this.options.log(`prima ring: ${error.message}`);
    if (this.listenerCount("error") > 0) this.safeEmit("error", error);
    if (closeCode === null) this.terminate();
    else this.closeSocket(closeCode, reason);
  }

  private terminate(): void {
    if (this.lane) this.lane.close(0, "");
    else this.ws.terminate();
  }

  private closeSocket(code: number, reason: string): void {
    // The lane answers the close handshake itself, and gives up on a silent peer after the same grace.
    if (this.lane) return this.lane.close(code, closeReason(reason));
    try {
      this.ws.close(code, closeReason(reason));
    } catch {
      this.ws.terminate();
      return;
    }
    // A peer that does not answer the close frame (hung, gone) must not hold the link half-open.
    this.terminateTimer = setTimeout(() => this.ws.terminate(), CLOSE_GRACE_MS);
    this.terminateTimer.unref();
  }

  private onClose(code: number, reason: string): void {
    if (this.closedInfo) return;
    this.liveness.stop();
    if (this.terminateTimer) clearTimeout(this.terminateTimer);
    let error = this.failure;
    if (!error && !this.closingOnPurpose && code !== CloseCode.normal) {
      const how = code === 1006 ? "the connection was lost (no close frame)" : `the peer closed the link (code ${code}${reason ? `: ${reason}` : ""})`;
      error = new RingLinkError("closed", this.peerName, how);
      this.options.log(`prima ring: ${error.message}`);
      if (this.listenerCount("error") > 0) this.safeEmit("error", error);
    }
    this.closedInfo = { code, reason, error };
    this.writer.wake();
    this.resolveClosed(this.closedInfo);
    this.safeEmit("close", this.closedInfo);
  }
}
