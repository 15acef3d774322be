// Unmounting the small file systems tests make (helpers/temp.ts tmpfsDir); apart from temp.ts, which
// registers a vitest hook on import, so that the run's global teardown can use it too.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";

/** Unmounts; a process killed a moment before may still hold a file there (EBUSY): then lazily, so
 * the mount goes as soon as it lets go and its folder can be removed now. */
export function unmount(dir: string): void {
  try {
    execFileSync("umount", [dir], { stdio: "ignore" });
  } catch {
    execFileSync("umount", ["-l", dir], { stdio: "ignore" });
  }
}

/** Unmounts every file system mounted under `dir` (deepest first): what test files that were killed
 * before their own cleanup left there. */
export function unmountUnder(dir: string): void {
  let mounts: string[];
  try {
    mounts = readFileSync("/proc/self/mounts", "utf8").split("\n").map((l) => l.split(" ")[1] ?? "");
  } catch {
    return; // no /proc: nothing this suite mounted
  }
  // /proc/self/mounts escapes spaces and such as octal (\040)
  const decoded = mounts.map((m) => m.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8))));
  for (const m of decoded.filter((m) => m.startsWith(`${dir}/`)).sort((a, b) => b.length - a.length)) {
    try {
      unmount(m);
    } catch {
      // already gone
    }
  }
}
