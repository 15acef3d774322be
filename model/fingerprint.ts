// A model's identity for the ring: devices must map the same file (each from its own disk), so they
// compare a hash of the GGUF header (metadata and tensor table) and the file size. Cheap: no weights read.
import { createHash } from "node:crypto";
import { closeSync, openSync, readSync } from "node:fs";
import type { GgufFile } from "./gguf.js";

export function modelFingerprint(f: GgufFile): string {
  const h = createHash("sha256");
  const fd = openSync(f.path, "r");
  try {
    const buf = Buffer.alloc(1 << 20);
    for (let off = 0; off < f.dataOffset; ) {
      const n = readSync(fd, buf, 0, Math.min(buf.length, f.dataOffset - off), off);
      if (n <= 0) break;
      h.update(buf.subarray(0, n));
      off += n;
    }
  } finally {
    closeSync(fd);
  }
  h.update(`size:${f.fileBytes}`);
  return h.digest("hex");
}
