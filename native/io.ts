// Typed surface of the file I/O helpers (bind_io.cc).
import { addon } from "./binding.js";

const io = addon.io as { alignGap(view: ArrayBufferView, align: number): number };

/** Bytes from `view`'s first byte to its first address that is a multiple of `align` (a power of
 * two): where a buffer for direct I/O can start inside memory JS allocated. */
export function alignGap(view: ArrayBufferView, align: number): number {
  return io.alignGap(view, align);
}
