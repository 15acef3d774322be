// Scratch directories for tests, removed after the test file that made them (whether its tests passed
// or not): /tmp had hundreds of prima-test-* directories from runs that made one and never removed it.
// vitest evaluates this module once per test file, so the hook below is that file's; its worker
// processes are stopped by a signal at the end, so an exit handler would not run.
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll } from "vitest";
import { unmount } from "./mounts.js";

const made: string[] = [];
const mounted: string[] = [];
afterAll(() => {
  for (const d of mounted.splice(0)) unmount(d);
  for (const d of made.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** Whether this process may mount a small file system (tmpfsDir). */
export const canMount = process.getuid?.() === 0;

/** A new temporary folder with a tmpfs of `size` (mount's notation: "8m") on it: a small disk. It is
 * unmounted and removed after this test file. Root only (canMount). It lies in the run's temporary
 * HOME (vitest.config.ts), whose teardown unmounts what a crashed test file left mounted. */
export function tmpfsDir(prefix: string, size: string): string {
  const d = tempDir(prefix, process.env.PRIMA_TEST_HOME);
  execFileSync("mount", ["-t", "tmpfs", "-o", `size=${size},mode=0700`, "tmpfs", d]);
  mounted.push(d);
  return d;
}

/** A new directory under `parent` (default: the system's temporary directory), named
 * `${prefix}XXXXXX`, removed after this test file. */
export function tempDir(prefix: string, parent = tmpdir()): string {
  const d = mkdtempSync(join(parent, prefix));
  made.push(d);
  return d;
}

/** `dir` made (0700) if missing, and removed after this test file. */
export function ownedDir(dir: string): string {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  made.push(dir);
  return dir;
}
