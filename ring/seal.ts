// Keyed links: the key proof that opens a connection and the records every frame travels in after
// it (wire.ts has the layout). The coordinator hands each link a fresh random 32-byte key over the
// control plane; only the two devices of that link hold it.
//
//   dialer -> listener   PRMK, step 1, nonce_d                 (says nothing about the ring)
//   listener -> dialer   PRMK, step 2, nonce_l, MAC(proof key)  (the listener proves it holds the key)
//   dialer -> listener   record 0: its HELLO                    (opening it proves the dialer holds it)
//   listener -> dialer   record 0: its HELLO, or an ERROR and a close
//
// Both nonces salt HKDF, so each connection has keys of its own: records start at sequence 0 on every
// connection without ever reusing a GCM nonce, and a record captured on one connection means nothing
// on another. A record's nonce is its sequence number; each side accepts exactly the next one, so a
// replayed, dropped or reordered record ends the link.
import { createHmac, hkdfSync, randomBytes, timingSafeEqual } from "node:crypto";
import { streamSeal, type StreamSeal } from "../native/index.js";
import {
  FRAME_HEADER_BYTES, LINK_KEY_BYTES, PROOF_MAC_BYTES, PROOF_MAGIC, PROOF_NONCE_BYTES, RECORD_SEQ_BYTES, RECORD_TAG_BYTES,
} from "./wire.js";

/** Bytes a record adds to its frame. */
export const RECORD_OVERHEAD_BYTES = RECORD_SEQ_BYTES + RECORD_TAG_BYTES;
const AAD_BYTES = RECORD_SEQ_BYTES + FRAME_HEADER_BYTES;
const PROOF_HEAD_BYTES = 8; // magic, step, 3 zero bytes
const STEP1_BYTES = PROOF_HEAD_BYTES + PROOF_NONCE_BYTES;
const STEP2_BYTES = PROOF_HEAD_BYTES + PROOF_NONCE_BYTES + PROOF_MAC_BYTES;
const PROOF_MAGIC_BYTES = Buffer.from(PROOF_MAGIC, "latin1");
const LISTENER_PROOF = Buffer.from("prima ring link: the listener holds the key");

/** A record this side refuses; the message says why (the link names the peer). */
export class RecordError extends Error {
  override name = "RecordError";
  constructor(readonly reason: "replay" | "authentication" | "length", message: string) {
    super(message);
  }
}

/** A link key from the control plane, checked: 32 bytes, or a RangeError (the caller's bug). */
export function checkLinkKey(key: Uint8Array): Buffer {
  if (!(key instanceof Uint8Array) || key.length !== LINK_KEY_BYTES) {
    throw new RangeError(`ring: a link key must be ${LINK_KEY_BYTES} bytes, got ${key instanceof Uint8Array ? key.length : typeof key}`);
  }
  return Buffer.from(key);
}

/** One direction's AES-256-GCM key and its next sequence number. */
export interface SealDirection {
  key: Buffer;
  seq: number;
}

/** A connection's two directions after the key proof: seals what it sends, opens what it receives. */
export class LinkCipher {
  // The addon's AES-256-GCM, one context per direction holding its key schedule, as the native lane's
  // (native/src/seal.c: the same records, nonce = the direction's sequence number, which it counts in
  // step with tx.seq and rx.seq). With Node's createCipheriv, a context made and keyed per record, the
  // head's hand-off after a pass took 0.39 ms; with these, 0.33 (`npm run bench -- --only handoff`).
  private readonly sealer: StreamSeal;
  private readonly opener: StreamSeal;

  private constructor(private readonly tx: SealDirection, private readonly rx: SealDirection) {
    this.sealer = streamSeal(tx.key, true);
    this.opener = streamSeal(rx.key, false);
  }

  /** @internal Made by KeyProof once the nonces are exchanged. */
  static of(txKey: Buffer, rxKey: Buffer): LinkCipher {
    return new LinkCipher({ key: txKey, seq: 0 }, { key: rxKey, seq: 0 });
  }

  /** A record for an encoded frame (header + payload): the next sequence number is used up. */
  seal(frame: Uint8Array): Buffer {
    const record = Buffer.allocUnsafe(RECORD_SEQ_BYTES + frame.length + RECORD_TAG_BYTES);
    record.writeBigUInt64LE(BigInt(this.tx.seq), 0);
    record.set(frame, RECORD_SEQ_BYTES);
    const end = RECORD_SEQ_BYTES + frame.length;
    this.sealer.seal(record.subarray(0, AAD_BYTES), record.subarray(AAD_BYTES, end), record.subarray(end));
    this.tx.seq++;
    return record;
  }

  /** The frame inside a record (a new buffer, so its payload is aligned), or RecordError. */
  open(record: Uint8Array): Buffer {
    if (record.length < AAD_BYTES + RECORD_TAG_BYTES) {
      throw new RecordError("length", `a ${record.length}-byte message, shorter than any sealed frame (${AAD_BYTES + RECORD_TAG_BYTES} bytes)`);
    }
    const view = Buffer.from(record.buffer, record.byteOffset, record.length);
    const seq = view.readBigUInt64LE(0);
    if (seq !== BigInt(this.rx.seq)) {
      throw new RecordError("replay", `a frame out of order or replayed (sequence ${seq}, expected ${this.rx.seq})`);
    }
    // Header and ciphertext into the frame's own buffer, opened there: the record stays as it came.
    const frame = Buffer.allocUnsafeSlow(view.length - RECORD_OVERHEAD_BYTES);
    view.copy(frame, 0, RECORD_SEQ_BYTES, view.length - RECORD_TAG_BYTES);
    if (!this.opener.open(view.subarray(0, AAD_BYTES), frame.subarray(FRAME_HEADER_BYTES), view.subarray(view.length - RECORD_TAG_BYTES))) {
      throw new RecordError("authentication", "a frame that fails authentication (altered, or not sealed with this link's key)");
    }
    this.rx.seq++;
    return frame;
  }

  /** @internal Both directions' keys and next sequence numbers, for the native lane to carry on. */
  state(): { tx: SealDirection; rx: SealDirection } {
    return { tx: { ...this.tx }, rx: { ...this.rx } };
  }
}

interface Secrets {
  proof: Buffer;
  dialerToListener: Buffer;
  listenerToDialer: Buffer;
}

function derive(linkKey: Buffer, dialerNonce: Buffer, listenerNonce: Buffer): Secrets {
  const salt = Buffer.concat([dialerNonce, listenerNonce]);
  const key = (label: string) => Buffer.from(hkdfSync("sha256", linkKey, salt, `prima ring link v2: ${label}`, 32));
  return { proof: key("proof"), dialerToListener: key("dialer to listener"), listenerToDialer: key("listener to dialer") };
}

function proofHead(step: number, bytes: number): Buffer {
  const b = Buffer.alloc(bytes);
  PROOF_MAGIC_BYTES.copy(b, 0);
  b[4] = step;
  return b;
}

/** A step message of the key proof, or null for anything else (the caller refuses it, saying nothing). */
function readStep(data: Buffer, step: number, bytes: number): Buffer | null {
  if (data.length !== bytes || !data.subarray(0, 4).equals(PROOF_MAGIC_BYTES) || data[4] !== step) return null;
  if (data[5] !== 0 || data[6] !== 0 || data[7] !== 0) return null;
  return data;
}

/** The dialer's side of the key proof. */
export class DialerProof {
  private readonly nonce = randomBytes(PROOF_NONCE_BYTES);
  constructor(private readonly linkKey: Buffer) {}

  /** Step 1: a nonce and nothing else. */
  first(): Buffer {
    const b = proofHead(1, STEP1_BYTES);
    this.nonce.copy(b, PROOF_HEAD_BYTES);
    return b;
  }

  /** Checks step 2; the link's cipher when the listener proved it holds the key, else null. */
  answer(data: Buffer): LinkCipher | null {
    const m = readStep(data, 2, STEP2_BYTES);
    if (!m) return null;
    const listenerNonce = Buffer.from(m.subarray(PROOF_HEAD_BYTES, PROOF_HEAD_BYTES + PROOF_NONCE_BYTES));
    const s = derive(this.linkKey, this.nonce, listenerNonce);
    const want = createHmac("sha256", s.proof).update(LISTENER_PROOF).digest();
    if (!timingSafeEqual(want, m.subarray(PROOF_HEAD_BYTES + PROOF_NONCE_BYTES))) return null;
    return LinkCipher.of(s.dialerToListener, s.listenerToDialer);
  }
}

/** The listener's side: answers a step 1 with step 2 and the cipher; the dialer's first record
 * (its HELLO) opening under it is the dialer's proof. */
export function listenerAnswer(linkKey: Buffer, data: Buffer): { reply: Buffer; cipher: LinkCipher } | null {
  const m = readStep(data, 1, STEP1_BYTES);
  if (!m) return null;
  const nonce = randomBytes(PROOF_NONCE_BYTES);
  const s = derive(linkKey, Buffer.from(m.subarray(PROOF_HEAD_BYTES)), nonce);
  const reply = proofHead(2, STEP2_BYTES);
  nonce.copy(reply, PROOF_HEAD_BYTES);
  createHmac("sha256", s.proof).update(LISTENER_PROOF).digest().copy(reply, PROOF_HEAD_BYTES + PROOF_NONCE_BYTES);
  return { reply, cipher: LinkCipher.of(s.listenerToDialer, s.dialerToListener) };
}
