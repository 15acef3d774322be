// The profiler's scratch files (a stand-in model, a disk probe) carry the writer's PID in their name.
// A process killed while profiling (a worker stopped mid-start) leaves its file behind, up to the size
// of a model's layers: the next profile in the same folder removes those whose writer is gone.
import { readdirSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";

/** Files older than this whose writer is not running are left over (younger ones may belong to a
 * process in another PID namespace that shares the folder). */
const LEFT_OVER_AFTER_MS = 10 * 60_000;

function running(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Removes files in `dir` named `${prefix}<pid>...` whose process is gone; never throws. */
export function removeLeftOverScratch(dir: string, prefix: string): void {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return;
  }
  for (const name of names) {
    if (!name.startsWith(prefix)) continue;
    const pid = Number(/^(\d+)/.exec(name.slice(prefix.length))?.[1]);
    if (!Number.isInteger(pid) || pid <= 0 || pid === process.pid || running(pid)) continue;
    try {
      const path = join(dir, name);
      if (Date.now() - statSync(path).mtimeMs > LEFT_OVER_AFTER_MS) rmSync(path, { force: true });
    } catch {
      // gone meanwhile, or not ours to remove
    }
  }
}
