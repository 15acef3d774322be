// The handshake's content: what this device says in its HELLO, and whether the peer's HELLO is
// acceptable. Both sides run the same check, so either one refuses a mismatched peer with the
// same reason.
import { PROTOCOL_VERSION, type FrameLimits, type Hello } from "./validation.js";

/** Who this device is on the data plane. */
export interface RingIdentity {
  /** Stable, unique in the ring (appears in every error a peer reports about this device). */
  deviceId: string;
  /** Identifies the model (e.g. a hash of the GGUF's tensor table); both ends of a link must agree. */
  modelFingerprint: string;
  /** The model's hidden size: the width of every activation row. */
  hiddenSize: number;
  /** The ring session; links across sessions (an old plan, another ring) are refused. */
  ringId: string;
}

export function makeHello(identity: RingIdentity, limits: FrameLimits): Hello {
  return {
    protocolVersion: PROTOCOL_VERSION,
    deviceId: identity.deviceId,
    modelFingerprint: identity.modelFingerprint,
    hiddenSize: identity.hiddenSize,
    ringId: identity.ringId,
    maxTokensPerFrame: limits.maxTokensPerFrame,
    maxPayloadBytes: limits.maxPayloadBytes,
  };
}

/** Why `remote` may not be linked with `local`, or null when it may. */
export function helloMismatch(local: Hello, remote: Hello, expectedPeerDeviceId?: string): string | null {
  const peer = `peer "${remote.deviceId}"`;
  const self = `this device ("${local.deviceId}")`;
  if (remote.protocolVersion !== local.protocolVersion) {
    return `${peer} speaks ring protocol ${remote.protocolVersion}, ${self} speaks ${local.protocolVersion}`;
  }
  if (expectedPeerDeviceId !== undefined && remote.deviceId !== expectedPeerDeviceId) {
    return `expected device "${expectedPeerDeviceId}" but ${peer} answered`;
  }
  if (remote.ringId !== local.ringId) return `${peer} is in ring "${remote.ringId}", ${self} in ring "${local.ringId}"`;
  if (remote.modelFingerprint !== local.modelFingerprint) {
    return `model fingerprint differs: ${peer} has "${remote.modelFingerprint}", ${self} has "${local.modelFingerprint}"`;
  }
  if (remote.hiddenSize !== local.hiddenSize) {
    return `hidden size differs: ${peer} has ${remote.hiddenSize}, ${self} has ${local.hiddenSize}`;
  }
  return null;
}
