// Every read of ws's private state (and of Node's socket handle), in one place. The native lane takes
// a link's connection over from ws by its file descriptor (link.ts socketForLane): that is clean only
// when ws's Receiver holds no bytes of a frame it has not finished. Neither fact has a public API, so
// test/ring/ws-internals.test.ts checks each field's presence and meaning on a real ws connection over
// loopback: a ws release that changes them fails that test, not a ring.
import type { Socket } from "node:net";
import type WebSocket from "ws";

/** The ws versions these reads were checked on: the test ran on `ranOn`, and fails outside `range`
 * (a new major version of ws: check the fields in its lib/receiver.js, rerun the test, widen it). */
export const WS_INTERNALS_CHECKED = { range: { from: "8.23.0", below: "9.0.0" }, ranOn: ["8.23.0"] } as const;

/** What ws's Receiver (lib/receiver.js) holds between the socket's bytes and its next message. */
export interface ReceiverState {
  /** Bytes read from the socket and not yet consumed by a frame (`_bufferedBytes`). */
  bufferedBytes: number;
  /** Where its frame parser is: 0 (GET_INFO) between frames, else inside one (`_state`). */
  state: number;
  /** The opcode of a fragmented message under way, 0 when none (`_fragmented`). */
  fragmented: number;
}

type WsPrivate = { _receiver?: { _bufferedBytes?: unknown; _state?: unknown; _fragmented?: unknown } | null };

/** The Receiver's state, or null when ws has none (closed) or its fields are not numbers (another ws). */
export function receiverState(ws: WebSocket): ReceiverState | null {
  const r = (ws as unknown as WsPrivate)._receiver;
  if (!r) return null;
  const { _bufferedBytes: bufferedBytes, _state: state, _fragmented: fragmented } = r;
  if (typeof bufferedBytes !== "number" || typeof state !== "number" || typeof fragmented !== "number") return null;
  return { bufferedBytes, state, fragmented };
}

/** True when ws has parsed every byte it read into whole messages (no frame or message half done);
 * false when it has not, or when that cannot be told. */
export function receiverIdle(ws: WebSocket): boolean {
  const s = receiverState(ws);
  return s !== null && s.bufferedBytes === 0 && s.state === 0 && s.fragmented === 0;
}

/** The socket's file descriptor (Node's `_handle.fd`), or null when it has none (closed, or not a TCP handle). */
export function socketFd(socket: Socket): number | null {
  const fd = (socket as unknown as { _handle?: { fd?: unknown } | null })._handle?.fd;
  return typeof fd === "number" && fd >= 0 ? fd : null;
}
