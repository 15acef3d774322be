// One established link between ring neighbours, after both HELLOs were accepted (dial.ts makes the
// link to the successor, listener.ts the one from the predecessor). It sends frames in order with
// backpressure, decodes what arrives (any invalid frame drops the link), and watches the peer's
// liveness. Every failure ends in one 'close' carrying the error; nothing escapes as an uncaught
// exception or an unhandled rejection. On a keyed link every frame travels sealed (seal.ts).
import { EventEmitter } from "node:events";
import type { Socket } from "node:net";
import type WebSocket from "ws";
import { FrameError, RingLinkError, type RingLinkErrorKind } from "./errors.js";
import { decodeFrame, encodeFrame, type Frame } from "./frame.js";
import { LivenessWatch } from "./liveness.js";
import { CloseCode, closeReason, type ResolvedLinkOptions } from "./options.js";
import { RecordError, type LinkCipher, type SealDirection } from "./seal.js";
import { PAYLOAD_DTYPE_BYTES, type Hello } from "./validation.js";
import { receiverIdle, socketFd } from "./ws-internals.js";

/** How a link handed to the native lane is closed (code 0: at once, without a close frame). */
export interface LaneSide {
  close(code: number, reason: string): void;
}

/** What the peer is to this device. */
export type PeerRole = "successor" | "predecessor";

/** Timing and size of one sent frame (for per-hop timings). */
export interface FrameSendStats {
  /** Frame bytes (header + payload; WebSocket framing excluded). */
  bytes: number;
  /** Checks and encoding (the copy, or the f16 conversion). */
  encodeMs: number;
  /** Waiting for earlier frames on this link to be handed to the socket. */
  queuedMs: number;
  /** From the first fragment's write until the last one left this process (to the kernel), backpressure included. */
  writeMs: number;
  /** From send() until the last fragment left this process. */
  totalMs: number;
}

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

const FRAGMENTS_IN_FLIGHT = 2;
/** How long a close handshake may take before the connection is ended (the native lane too). */
export const CLOSE_GRACE_MS = 1000;

/** Returns p, marked as handled: its caller still sees the rejection, but one that nobody awaits
 * (an ignored send, a fragment after an earlier failure) is not an unhandled rejection. */
function handled<T>(p: Promise<T>): Promise<T> {
  p.catch(() => {});
  return p;
}

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
  /** Resolves when the previous frame's fragments are all handed to ws (frames never interleave). */
  private sendTurn: Promise<void> = Promise.resolve();
  /** Frames waiting for their turn or still handing fragments to ws (a new frame may skip the queue only when 0). */
  private framesQueued = 0;
  private fragmentsInFlight = 0;
  private slotWaiters: Array<() => void> = [];
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
    const encodedAt = performance.now();
    // Nothing queued and the frame fits one fragment with a slot free: hand it to the socket now
    // rather than a few microtasks later, after whatever else this event-loop turn still runs (a
    // one-token frame of the ring's decode waited ~70 us that way on every hop).
    if (this.framesQueued === 0 && this.fragmentsInFlight < FRAGMENTS_IN_FLIGHT && buf.length <= this.options.fragmentBytes) {
      return handled(this.finishFrame(buf, [handled(this.writeFragment(buf, true))], calledAt, encodedAt, encodedAt));
    }
    const turn = this.sendTurn;
    let releaseTurn!: () => void;
    this.framesQueued++;
    this.sendTurn = new Promise<void>((r) => (releaseTurn = r));
    return handled(turn.then(() => this.writeFrame(buf, calledAt, encodedAt, releaseTurn)));
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
    const queue: Frame[] = this.backlog.splice(0);
    let waiter: { resolve: (r: IteratorResult<Frame>) => void; reject: (e: unknown) => void } | null = null;
    let finished = false;
    let errorThrown = false;
    const onFrame = (f: Frame) => {
      if (waiter) {
        const w = waiter;
        waiter = null;
        w.resolve({ value: f, done: false });
      } else queue.push(f);
    };
    const onClose = () => {
      if (!waiter) return;
      const w = waiter;
      waiter = null;
      settleEnd(w.resolve, w.reject);
    };
    const cleanup = () => {
      finished = true;
      this.off("frame", onFrame);
      this.off("close", onClose);
    };
    const settleEnd = (resolve: (r: IteratorResult<Frame>) => void, reject: (e: unknown) => void) => {
      const error = this.closedInfo?.error ?? null;
      cleanup();
      if (error && !errorThrown) {
        errorThrown = true;
        reject(error);
      } else resolve({ value: undefined, done: true });
    };
    this.on("frame", onFrame);
    this.on("close", onClose);
    const iterator: AsyncIterableIterator<Frame> = {
      next: () =>
        new Promise<IteratorResult<Frame>>((resolve, reject) => {
          if (queue.length > 0) return resolve({ value: queue.shift()!, done: false });
          if (finished) return resolve({ value: undefined, done: true });
          if (this.closedInfo) return settleEnd(resolve, reject);
          waiter = { resolve, reject };
        }),
      return: () => {
        cleanup();
        if (waiter) waiter.resolve({ value: undefined, done: true });
        waiter = null;
        return Promise.resolve({ value: undefined, done: true });
      },
      [Symbol.asyncIterator]() {
        return iterator;
      },
    };
    return iterator;
  }

  /** Closes the link (code 1000). Frames not yet handed to the socket fail with "closed". */
  close(reason = "closing"): Promise<RingLinkClosed> {
    if (!this.closedInfo && !this.closingOnPurpose && !this.failure) {
      this.closingOnPurpose = true;
      this.wakeSlotWaiters();
      this.closeSocket(CloseCode.normal, reason);
    }
    return this.closed;
  }

  private async writeFrame(buf: Buffer, calledAt: number, encodedAt: number, releaseTurn: () => void): Promise<FrameSendStats> {
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      this.framesQueued--;
      releaseTurn();
    };
    try {
      const turnAt = performance.now();
      const flushed: Promise<void>[] = [];
      for (let offset = 0; offset < buf.length; offset += this.options.fragmentBytes) {
        await this.fragmentSlot();
        const end = Math.min(buf.length, offset + this.options.fragmentBytes);
        flushed.push(handled(this.writeFragment(buf.subarray(offset, end), end === buf.length)));
      }
      release();
      return await this.finishFrame(buf, flushed, calledAt, encodedAt, turnAt);
    } finally {
      release(); // lets the next frame go even when this one failed
    }
  }

  /** Waits until the frame's fragments have left this process; counts it and times it. */
  private async finishFrame(buf: Buffer, flushed: Promise<void>[], calledAt: number, encodedAt: number, turnAt: number): Promise<FrameSendStats> {
    await Promise.all(flushed);
    const doneAt = performance.now();
    this.counters.framesSent++;
    this.counters.bytesSent += buf.length;
    return {
      bytes: buf.length, encodeMs: encodedAt - calledAt, queuedMs: turnAt - encodedAt, writeMs: doneAt - turnAt,
      totalMs: doneAt - calledAt,
    };
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

  /** Waits until fewer than FRAGMENTS_IN_FLIGHT fragments are unflushed: this is the backpressure. */
  private async fragmentSlot(): Promise<void> {
    while (this.fragmentsInFlight >= FRAGMENTS_IN_FLIGHT) {
      this.checkOpen();
      await new Promise<void>((r) => this.slotWaiters.push(r));
    }
    this.checkOpen();
  }

  private wakeSlotWaiters(): void {
    const waiters = this.slotWaiters;
    this.slotWaiters = [];
    for (const w of waiters) w();
  }

  private writeFragment(bytes: Buffer, last: boolean): Promise<void> {
    this.fragmentsInFlight++;
    return new Promise<void>((resolve, reject) => {
      this.ws.send(bytes, { binary: true, fin: last, compress: false }, (err) => {
        this.fragmentsInFlight--;
        this.liveness.noteWriteProgress();
        this.wakeSlotWaiters();
        if (err) reject(new RingLinkError("closed", this.peerName, `the connection closed before a frame was sent (${err.message})`));
        else resolve();
      });
    });
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
    this.wakeSlotWaiters();
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
    this.wakeSlotWaiters();
    this.resolveClosed(this.closedInfo);
    this.safeEmit("close", this.closedInfo);
  }
}
