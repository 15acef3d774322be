// The HELLO exchange, as both ends see it. The dialer (predecessor) speaks first; the listener
// (successor) checks that HELLO and answers with its own, or with an ERROR frame saying why it
// refuses and a close (code 4001). The dialer checks the answer the same way. Only then does either
// side make a RingLink; until then nothing but HELLO or ERROR is a valid first message.
import { FrameError } from "./errors.js";
import { decodeFrame, encodeFrame, type ErrorFrame, type HelloFrame } from "./frame.js";
import type WebSocket from "ws";
import type { FrameLimits } from "./validation.js";
import { CloseCode, closeReason } from "./options.js";

/** The first message of a connection: a binary HELLO or ERROR frame. Throws FrameError otherwise. */
export function decodeHandshakeMessage(data: WebSocket.RawData, isBinary: boolean, limits: FrameLimits): HelloFrame | ErrorFrame {
  if (!isBinary) throw new FrameError("message", "sent a text message where a HELLO frame belongs");
  const buf = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
  const frame = decodeFrame(buf, limits);
  if (frame.type === "activations") throw new FrameError("frame type", "sent an activations frame before HELLO");
  return frame;
}

/** Tells the peer why it is refused (ERROR frame, full text), then closes with code 4001. */
export function refuse(ws: WebSocket, reason: string, terminateAfterMs: number): void {
  try {
    ws.send(encodeFrame({ type: "error", requestId: 0, firstTokenPosition: 0, nTokens: 0, cycle: 0, message: reason }));
    ws.close(CloseCode.refused, closeReason(reason));
  } catch {
    ws.terminate();
    return;
  }
  setTimeout(() => ws.terminate(), terminateAfterMs).unref();
}
