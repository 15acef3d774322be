// Scratch directories for tests, removed after the test file that made them (whether its tests passed
// or not): /tmp had hundreds of prima-test-* directories from runs that made one and never removed it.
// vitest evaluates this module once per test file, so the hook below is that file's; its worker
// processes are stopped by a signal at the end, so an exit handler would not run.
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll } from "vitest";

const made: string[] = [];
afterAll(() => {
  for (const d of made.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** A new directory under the system's temporary directory, named `${prefix}XXXXXX`, removed after
 * this test file. */
export function tempDir(prefix: string): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  made.push(d);
  return d;
}

/** `dir` made (0700) if missing, and removed after this test file. */
export function ownedDir(dir: string): string {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  made.push(dir);
  return dir;
}
