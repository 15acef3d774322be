// Typed surface of the file and stream I/O helpers (bind_io.cc).
import { addon } from "./binding.js";

/** One direction of a chunk stream's AES-256-GCM records, sealed or opened in place. */
export interface StreamSeal {
  /** Encrypts body in place under the next sequence number, authenticating aad; fills the 16-byte tag. */
  seal(aad: Uint8Array, body: Uint8Array, tag: Uint8Array): void;
  /** Decrypts body in place; false when the record (aad, body, tag, or its place in the stream) is not authentic. */
  open(aad: Uint8Array, body: Uint8Array, tag: Uint8Array): boolean;
  /** Frees the key schedule (wiped). */
  close(): void;
}

const io = addon.io as {
  alignGap(view: ArrayBufferView, align: number): number;
  StreamSeal: new (key: Uint8Array, encrypt: boolean) => StreamSeal;
};

/** Bytes from `view`'s first byte to its first address that is a multiple of `align` (a power of
 * two): where a buffer for direct I/O can start inside memory JS allocated. */
export function alignGap(view: ArrayBufferView, align: number): number {
  return io.alignGap(view, align);
}

/** A stream direction keyed with 32 bytes: `encrypt` seals, otherwise it opens. */
export function streamSeal(key: Uint8Array, encrypt: boolean): StreamSeal {
  return new io.StreamSeal(key, encrypt);
}
