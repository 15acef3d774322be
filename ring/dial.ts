// Dialing the successor: connect to ws://host:port, say HELLO, check its HELLO, and hand back a
// RingLink. Every way this can fail (nothing listening, a hang, a refusal, garbage) rejects with a
// RingLinkError naming the address; the socket is always cleaned up.
import type { Socket } from "node:net";
import WebSocket from "ws";
import { FrameError, RingLinkError, type RingLinkErrorKind } from "./errors.js";
import { encodeFrame } from "./frame.js";
import { decodeHandshakeMessage, refuse } from "./handshake.js";
import { helloMismatch } from "./hello.js";
import { RingLink } from "./link.js";
import { CloseCode, resolveLinkOptions, type RingLinkOptions } from "./options.js";
import { DialerProof, RecordError, type LinkCipher } from "./seal.js";

function toBuffer(data: WebSocket.RawData): Buffer {
  if (Buffer.isBuffer(data)) return data;
  if (Array.isArray(data)) return Buffer.concat(data);
  return Buffer.from(data);
}

/** Client frames are masked unless the mask is zero; masking guards browsers' proxies, not a LAN ring,
 * and would cost a pass over every payload. */
function zeroMask(mask: Buffer): void {
  mask.fill(0);
}

function describeConnectError(err: Error & { code?: string }): { kind: RingLinkErrorKind; text: string } {
  switch (err.code) {
    case "ECONNREFUSED":
      return { kind: "unreachable", text: "nothing is listening there (connection refused)" };
    case "ENOTFOUND":
    case "EAI_AGAIN":
      return { kind: "unreachable", text: `unknown host (${err.code})` };
    case "EHOSTUNREACH":
    case "ENETUNREACH":
      return { kind: "unreachable", text: `no route to the host (${err.code})` };
    case "ECONNRESET":
      return { kind: "closed", text: "the connection was reset" };
  }
  // A device's port between two of its listeners (RingPort): not listening for this ring yet.
  if (/Unexpected server response: 503\b/.test(err.message)) {
    return { kind: "unreachable", text: "the device is between two assignments (its port has no listener yet)" };
  }
  if (/Unexpected server response/.test(err.message)) {
    return { kind: "protocol", text: `not a prima ring listener (${err.message})` };
  }
  return { kind: "unreachable", text: err.message };
}

/**
 * Connects to the successor's RingListener at `url` (ws://host:port) and exchanges HELLOs. Resolves
 * with the link once the successor accepted this device and was accepted; rejects with a
 * RingLinkError (unreachable, timeout, refused, protocol, closed) otherwise.
 */
export function dialSuccessor(url: string, options: RingLinkOptions): Promise<RingLink> {
  const opts = resolveLinkOptions(options);
  return new Promise<RingLink>((resolve, reject) => {
    let ws: WebSocket;
    try {
      ws = new WebSocket(url, {
        perMessageDeflate: false,
        maxPayload: opts.maxMessageBytes,
        generateMask: zeroMask,
        followRedirects: false,
      });
    } catch (e) {
      reject(new RingLinkError("unreachable", url, `bad successor address: ${(e as Error).message}`));
      return;
    }
    let socket: Socket | null = null;
    let settled = false;
    let opened = false;
    // Keyed link: the successor must prove it holds the key before this device says anything about itself.
    const proof = opts.linkKey ? new DialerProof(opts.linkKey) : null;
    let cipher: LinkCipher | null = null;

    const fail = (kind: RingLinkErrorKind, text: string) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      ws.removeAllListeners("message");
      ws.terminate();
      reject(new RingLinkError(kind, `successor ${url}`, text));
    };

    const timer = setTimeout(() => {
      fail("timeout", opened
        ? `no HELLO from the successor within ${opts.handshakeTimeoutMs} ms`
        : `could not connect within ${opts.handshakeTimeoutMs} ms`);
    }, opts.handshakeTimeoutMs);
    timer.unref();

    // Always listening: ws emits 'error' after a terminate too, and an unheard 'error' would throw.
    ws.on("error", (err: Error & { code?: string }) => {
      const { kind, text } = describeConnectError(err);
      fail(kind, text);
    });
    ws.on("upgrade", (res) => {
      socket = res.socket as Socket;
    });
    ws.on("open", () => {
      opened = true;
      try {
        ws.send(proof ? proof.first() : encodeFrame({ type: "hello", hello: opts.hello }));
      } catch (e) {
        fail("protocol", `could not send HELLO: ${(e as Error).message}`);
      }
    });
    ws.on("close", (code, reason) => {
      const text = reason.toString();
      if (code === CloseCode.refused) fail("refused", `the successor refused this device: ${text}`);
      else fail("closed", `the successor closed the connection during the handshake (code ${code}${text ? `: ${text}` : ""})`);
    });
    ws.on("message", (data, isBinary) => {
      if (settled) return;
      if (proof && !cipher) {
        cipher = isBinary ? proof.answer(toBuffer(data)) : null;
        if (!cipher) {
          fail("refused", "the successor failed the link key proof: it does not hold this link's key (not this ring's device, or a stale one)");
          return;
        }
        try {
          ws.send(cipher.seal(encodeFrame({ type: "hello", hello: opts.hello })));
        } catch (e) {
          fail("protocol", `could not send HELLO: ${(e as Error).message}`);
        }
        return;
      }
      let frame;
      try {
        frame = decodeHandshakeMessage(cipher && isBinary ? cipher.open(toBuffer(data)) : data, isBinary, opts.limits);
      } catch (e) {
        fail("protocol", `the successor answered with ${e instanceof FrameError || e instanceof RecordError ? e.message : String(e)}`);
        return;
      }
      if (frame.type === "error") {
        fail("refused", `the successor refused this device: ${frame.message}`);
        return;
      }
      const mismatch = helloMismatch(opts.hello, frame.hello, opts.expectedPeerDeviceId);
      if (mismatch) {
        settled = true;
        clearTimeout(timer);
        ws.removeAllListeners("message");
        refuse(ws, mismatch, 1000, cipher);
        reject(new RingLinkError("refused", `successor ${url}`, `refused the successor: ${mismatch}`));
        return;
      }
      if (!socket) {
        fail("protocol", "no socket after the WebSocket upgrade");
        return;
      }
      settled = true;
      clearTimeout(timer);
      ws.removeAllListeners("message");
      ws.removeAllListeners("close");
      ws.removeAllListeners("open");
      ws.removeAllListeners("upgrade");
      // The handshake's 'error' listener stays: the link adds its own, and the old one is a no-op now.
      resolve(new RingLink(ws, socket, frame.hello, "successor", url, opts, cipher));
    });
  });
}

/** The kinds of dial failure that a successor between two assignments gives: its port with no
 * listener yet (a 503, or a refused connection where the port is not held), or its previous
 * assignment's listener still open, which takes the connection and then refuses the new ring's key or
 * id, or resets it as it closes. */
const BETWEEN_ASSIGNMENTS: ReadonlySet<RingLinkErrorKind> = new Set(["unreachable", "refused", "closed"]);

/** dialSuccessor, tried again every 100 ms for `withinMs` while the successor may be between two
 * assignments (each device takes its assignment in its own time); the last failure otherwise. */
export async function dialSuccessorWithin(url: string, options: RingLinkOptions, withinMs: number): Promise<RingLink> {
  const deadline = Date.now() + withinMs;
  for (;;) {
    try {
      return await dialSuccessor(url, options);
    } catch (e) {
      if (!(e instanceof RingLinkError) || !BETWEEN_ASSIGNMENTS.has(e.kind) || Date.now() > deadline) throw e;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}
