// Options shared by both ends of a link (dialing the successor, listening for the predecessor),
// their defaults, and their checks. Bad options are the caller's bug: RangeError, at once.
import { FrameError } from "./errors.js";
import { makeHello, type RingIdentity } from "./hello.js";
import { DEFAULT_LIVENESS_TIMEOUT_MS } from "./liveness.js";
import { RECORD_OVERHEAD_BYTES, checkLinkKey } from "./seal.js";
import {
  CONTROL_PAYLOAD_MAX_BYTES, FRAME_HEADER_BYTES, validateHello, validateLimits, type FrameLimits, type Hello,
} from "./validation.js";

export interface RingLinkOptions {
  /** This device as its peers see it (HELLO). */
  identity: RingIdentity;
  /** Most tokens in one received ACTIVATIONS frame. Default 512. */
  maxTokensPerFrame?: number;
  /** Most payload bytes in one received ACTIVATIONS frame. Default maxTokensPerFrame x hiddenSize x 4 (f32). */
  maxPayloadBytes?: number;
  /** A peer silent (no pong, no byte) or not reading for this long is reported dead. Default 2000. */
  livenessTimeoutMs?: number;
  /** Connecting and exchanging HELLOs must finish within this. Default 5000. */
  handshakeTimeoutMs?: number;
  /**
   * Frames are written as WebSocket fragments of at most this many bytes, at most two in flight, so
   * pings overtake a long frame and write progress stays visible to the liveness check. Default 256 KiB.
   */
  fragmentBytes?: number;
  /** Refuse a peer whose HELLO names another device. */
  expectedPeerDeviceId?: string;
  /**
   * This link's secret (32 random bytes the coordinator hands both ends over the control plane; see
   * seal.ts). With it, a peer must prove it holds the key before anything about this device is sent,
   * and every frame is encrypted and authenticated. Without it the link is plaintext, for the link
   * probe and benchmarks only: a keyed side and a plaintext side never link.
   */
  linkKey?: Uint8Array;
  /** Where dropped peers and link failures are reported. Default: console.warn. */
  log?: (message: string) => void;
}

export interface ResolvedLinkOptions {
  hello: Hello;
  limits: FrameLimits;
  /** ws maxPayload: the largest message this side reads (header + largest payload). */
  maxMessageBytes: number;
  livenessTimeoutMs: number;
  handshakeTimeoutMs: number;
  fragmentBytes: number;
  expectedPeerDeviceId?: string;
  /** null: a plaintext link. */
  linkKey: Buffer | null;
  log: (message: string) => void;
}

export const DEFAULT_MAX_TOKENS_PER_FRAME = 512;
export const DEFAULT_HANDSHAKE_TIMEOUT_MS = 5000;
export const DEFAULT_FRAGMENT_BYTES = 256 * 1024;

function positiveInteger(name: string, value: number | undefined, fallback: number, min = 1): number {
  const v = value ?? fallback;
  if (!Number.isInteger(v) || v < min) throw new RangeError(`ring: ${name} ${v} must be an integer >= ${min}`);
  return v;
}

export function resolveLinkOptions(o: RingLinkOptions): ResolvedLinkOptions {
  const hiddenSize = o.identity?.hiddenSize;
  const maxTokensPerFrame = o.maxTokensPerFrame ?? DEFAULT_MAX_TOKENS_PER_FRAME;
  const limits = validateLimits({
    hiddenSize,
    maxTokensPerFrame,
    maxPayloadBytes: o.maxPayloadBytes ?? maxTokensPerFrame * hiddenSize * 4,
  });
  let hello: Hello;
  try {
    hello = validateHello(makeHello(o.identity, limits));
  } catch (e) {
    throw new RangeError(`ring: bad identity: ${e instanceof FrameError ? e.message.replace(/^frame: /, "") : String(e)}`);
  }
  const linkKey = o.linkKey === undefined ? null : checkLinkKey(o.linkKey);
  return {
    hello,
    limits,
    maxMessageBytes: FRAME_HEADER_BYTES + Math.max(limits.maxPayloadBytes, CONTROL_PAYLOAD_MAX_BYTES) + (linkKey ? RECORD_OVERHEAD_BYTES : 0),
    // Under ~100 ms the ping tick would be a few ms: too tight for any real network.
    livenessTimeoutMs: positiveInteger("liveness timeout (ms)", o.livenessTimeoutMs, DEFAULT_LIVENESS_TIMEOUT_MS, 100),
    handshakeTimeoutMs: positiveInteger("handshake timeout (ms)", o.handshakeTimeoutMs, DEFAULT_HANDSHAKE_TIMEOUT_MS),
    fragmentBytes: positiveInteger("fragment size (bytes)", o.fragmentBytes, DEFAULT_FRAGMENT_BYTES, 1024),
    expectedPeerDeviceId: o.expectedPeerDeviceId,
    linkKey,
    log: o.log ?? ((m: string) => console.warn(m)),
  };
}

/** A WebSocket close reason must fit 123 bytes of UTF-8. */
export function closeReason(text: string): string {
  let s = text.slice(0, 123);
  while (Buffer.byteLength(s) > 123) s = s.slice(0, -1);
  return s;
}

/** Application close codes (4000-4999 are free for applications). */
export const CloseCode = {
  normal: 1000,
  /** The HELLO was refused (mismatch); the reason says why. */
  refused: 4001,
  /** The peer sent something that is not a valid frame. */
  protocol: 4002,
  /** No HELLO in time. */
  handshakeTimeout: 4003,
} as const;
