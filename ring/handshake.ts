// The HELLO exchange, as both ends see it. The dialer (predecessor) speaks first; the listener
// (successor) checks that HELLO and answers with its own, or with an ERROR frame saying why it
// refuses and a close (code 4001). The dialer checks the answer the same way. Only then does either
// side make a RingLink; until then nothing but HELLO or ERROR is a valid first message. On a keyed
// link (seal.ts) the key proof comes first and the HELLOs and ERRORs travel sealed; a peer that has
// not proved the key hears nothing but a close saying "refused".
import { FrameError } from "./errors.js";
import { decodeFrame, encodeFrame, type ErrorFrame, type HelloFrame } from "./frame.js";
import type WebSocket from "ws";
import type { FrameLimits } from "./validation.js";
import { CloseCode, closeReason } from "./options.js";
import type { LinkCipher } from "./seal.js";

/** All a peer that has not proved the link key is told, whatever went wrong. */
export const GENERIC_REFUSAL = "refused";

/** Closes a connection whose peer has not proved the link key: code 4001, "refused", nothing else. */
export function refuseUnproved(ws: WebSocket, terminateAfterMs: number): void {
  try {
    ws.close(CloseCode.refused, GENERIC_REFUSAL);
  } catch {
    ws.terminate();
    return;
  }
  setTimeout(() => ws.terminate(), terminateAfterMs).unref();
}

/** The first message of a connection: a binary HELLO or ERROR frame. Throws FrameError otherwise. */
export function decodeHandshakeMessage(data: WebSocket.RawData, isBinary: boolean, limits: FrameLimits): HelloFrame | ErrorFrame {
  if (!isBinary) throw new FrameError("message", "sent a text message where a HELLO frame belongs");
  const buf = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
  const frame = decodeFrame(buf, limits);
  if (frame.type !== "hello" && frame.type !== "error") throw new FrameError("frame type", `sent ${frame.type === "kvShift" ? "a kv shift" : `a ${frame.type}`} frame before HELLO`);
  return frame;
}

/** Tells the peer why it is refused (ERROR frame, full text), then closes with code 4001. On a keyed
 * link the ERROR frame is sealed and the close frame (which travels in clear) says only "refused". */
export function refuse(ws: WebSocket, reason: string, terminateAfterMs: number, cipher: LinkCipher | null = null): void {
  try {
    const frame = encodeFrame({ type: "error", requestId: 0, firstTokenPosition: 0, nTokens: 0, cycle: 0, message: reason });
    ws.send(cipher ? cipher.seal(frame) : frame);
    ws.close(CloseCode.refused, cipher ? GENERIC_REFUSAL : closeReason(reason));
  } catch {
    ws.terminate();
    return;
  }
  setTimeout(() => ws.terminate(), terminateAfterMs).unref();
}
