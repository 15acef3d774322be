// Small files the transfer keeps beside its data (the verified chunks of a cached model, the cache's
// manifest, the hashes of a served one): written whole or not at all, and not on every change. Never
// through a symbolic link: a link planted under a file's name (or its temporary name) is replaced or
// refused, so the file it points at is never written or read.
import { closeSync, constants, fstatSync, openSync, readSync, renameSync, unlinkSync, writeSync } from "node:fs";

/** O_NOFOLLOW where the system has it (0 elsewhere: Windows has no such flag, and no such links). */
export const NO_FOLLOW = constants.O_NOFOLLOW ?? 0;

/** unlink, where a file that is already gone is no error. */
export function unlinkIfPresent(path: string): void {
  try {
    unlinkSync(path);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
  }
}

/** Writes text through a temporary file renamed over path: a reader (or a restart) never sees half.
 * The temporary file is made afresh (O_EXCL, O_NOFOLLOW: whatever was under its name is removed
 * first, and a link put there meanwhile makes the open fail); the rename replaces path itself, so a
 * link at path is replaced, not followed. */
export function writeFileAtomic(path: string, text: string): void {
  const tmp = `${path}.${process.pid}.tmp`;
  unlinkIfPresent(tmp);
  const fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | NO_FOLLOW, 0o644);
  try {
    const data = Buffer.from(text);
    for (let off = 0; off < data.length; ) off += writeSync(fd, data, off, data.length - off);
  } catch (e) {
    closeSync(fd);
    unlinkIfPresent(tmp);
    throw e;
  }
  closeSync(fd);
  renameSync(tmp, path);
}

/** A regular file's text, read without following a link (which fails: ELOOP), or undefined when
 * there is none; a file over maxBytes is an Error (no peer or stray file makes it read gigabytes). */
export function readFileNoFollow(path: string, maxBytes: number): string | undefined {
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | NO_FOLLOW);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw e;
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw new Error(`${path} is not a regular file`);
    if (st.size > maxBytes) throw new Error(`${path} is ${st.size} bytes, over ${maxBytes}`);
    const buf = Buffer.alloc(st.size);
    let got = 0;
    while (got < buf.length) {
      const n = readSync(fd, buf, got, buf.length - got, got);
      if (n === 0) break;
      got += n;
    }
    return buf.subarray(0, got).toString("utf8");
  } finally {
    closeSync(fd);
  }
}

/** Runs fn once, ms after the first of any number of soon() calls; the timer never keeps Node alive. */
export class Debounced {
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly ms: number, private readonly fn: () => void) {}

  soon(): void {
    if (this.timer) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.fn();
    }, this.ms);
    this.timer.unref();
  }

  /** Forgets a pending run (the caller runs fn itself now). */
  cancel(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}
