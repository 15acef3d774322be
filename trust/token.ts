// The cluster's join token: the SHA-256 of the coordinator's certificate (the pin: a worker talks
// only to the holder of that certificate's key) and a 32-byte secret (a worker proves it holds it with
// an HMAC; the secret itself never travels). `prima1.<pin>.<secret>`, both base64url.
import { createHash, createHmac, timingSafeEqual } from "node:crypto";

export class TrustError extends Error {
  override name = "TrustError";
}

export interface JoinToken {
  /** SHA-256 of the coordinator's certificate (DER). */
  readonly pin: Buffer;
  readonly secret: Buffer;
}

const PREFIX = "prima1";
const B64URL_32 = /^[A-Za-z0-9_-]{43}$/;

export function formatToken(t: JoinToken): string {
  return `${PREFIX}.${t.pin.toString("base64url")}.${t.secret.toString("base64url")}`;
}

/** Parses a token (surrounding white space ignored); throws a TrustError saying what is wrong,
 * never echoing the text (it may be a secret pasted into the wrong place). */
export function parseToken(text: string): JoinToken {
  const parts = text.trim().split(".");
  if (parts.length !== 3 || parts[0] !== PREFIX || !B64URL_32.test(parts[1]) || !B64URL_32.test(parts[2])) {
    throw new TrustError(`not a prima join token (expected ${PREFIX}.<43 characters>.<43 characters>, as \`prima-coord token\` prints it)`);
  }
  return { pin: Buffer.from(parts[1], "base64url"), secret: Buffer.from(parts[2], "base64url") };
}

export function sha256(data: Uint8Array): Buffer {
  return createHash("sha256").update(data).digest();
}

/** The proof in a Join: binds the secret to the coordinator's certificate and a nonce it chose for
 * this session, so a proof seen once is worth nothing elsewhere. */
export function joinProof(t: JoinToken, nonce: Uint8Array): Buffer {
  return createHmac("sha256", t.secret).update("prima join v1\0").update(t.pin).update(nonce).digest();
}

/** The proof on a chunk stream: bound to that TLS connection's exported keying material (RFC 5705),
 * which only its two ends know. */
export function chunkProof(t: JoinToken, exported: Uint8Array): Buffer {
  return createHmac("sha256", t.secret).update("prima chunks v1\0").update(t.pin).update(exported).digest();
}

/** Constant-time comparison of a received proof with the expected one. */
export function proofMatches(received: Uint8Array | undefined, expected: Buffer): boolean {
  return received !== undefined && received.length === expected.length && timingSafeEqual(received, expected);
}

/** What both ends of a chunk stream export from their TLS session for chunkProof. */
export const CHUNK_EXPORTER_LABEL = "EXPORTER-prima-chunks";
/** What both ends of a chunk request's TLS session export as the key of its keyed stream. */
export const CHUNK_STREAM_LABEL = "EXPORTER-prima-chunk-stream";
