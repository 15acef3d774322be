// Test harness: cgroup v1 groups (memory, cpu, blkio) to give processes less memory, CPU or disk, and
// processes started inside them. Each helper says why it cannot run, so a test skips with a reason.
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, rmdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach } from "vitest";
import { blockDeviceOf, memoryGroupState, type CgroupHeld } from "../../profiler/index.js";
import { killAll, root, startProcess, type Proc } from "../helpers/process.js";

export { killAll, root, type Proc };
const base = "/sys/fs/cgroup";

/** Why a v1 controller cannot be used here, or null when it can (we must be able to make a group). */
export function controllerProblem(controller: "memory" | "cpu" | "blkio"): string | null {
  const dir = join(base, controller);
  if (!existsSync(join(dir, "cgroup.procs"))) return `no cgroup v1 ${controller} controller at ${dir}`;
  const probe = join(dir, `prima-probe-${process.pid}`);
  try {
    mkdirSync(probe);
    rmdirSync(probe);
    return null;
  } catch (e) {
    return `cannot create a ${controller} cgroup: ${(e as Error).message}`;
  }
}

/** major:minor of the disk holding path, as blkio wants it (the profiler's reading of it). */
export function diskDeviceOf(path: string): string {
  const dev = blockDeviceOf(path);
  if (!dev) throw new Error(`cannot read the block device of ${path}`);
  return dev;
}

/** Whether blkio read throttling of this device takes effect (it does not on some virtual disks). */
export function blkioProblem(dev: string): string | null {
  const p = controllerProblem("blkio");
  if (p) return p;
  if (!existsSync(join(base, "blkio", "blkio.throttle.read_bps_device"))) return "blkio has no throttle files";
  if (!existsSync(`/sys/dev/block/${dev}`)) return `block device ${dev} is not in /sys/dev/block`;
  return null;
}

export class Cgroup {
  readonly dirs: string[] = [];
  constructor(readonly name: string) {}

  /** Creates the group under a controller and writes settings (file -> value). */
  add(controller: "memory" | "cpu" | "blkio", settings: Record<string, string | number> = {}): this {
    const dir = join(base, controller, this.name);
    mkdirSync(dir, { recursive: true });
    for (const [file, v] of Object.entries(settings)) writeFileSync(join(dir, file), String(v));
    this.dirs.push(dir);
    return this;
  }

  set(controller: "memory" | "cpu" | "blkio", file: string, v: string | number): void {
    writeFileSync(join(base, controller, this.name, file), String(v));
  }

  read(controller: "memory" | "cpu" | "blkio", file: string): string {
    return readFileSync(join(base, controller, this.name, file), "utf8").trim();
  }

  /** What the memory group holds (v1), read as the profiler's room reading reads it. */
  memoryHeld(): CgroupHeld {
    const m = memoryGroupState({ version: 1, dir: join(base, "memory", this.name) });
    if (!m) throw new Error(`cgroup ${this.name}: no memory group to read`);
    return m;
  }

  /** Removes the groups (their processes must have exited; retried briefly). */
  async remove(): Promise<void> {
    for (const dir of this.dirs) {
      for (let i = 0; i < 50; i++) {
        try {
          if (existsSync(dir)) rmdirSync(dir);
          break;
        } catch {
          await new Promise((r) => setTimeout(r, 100));
        }
      }
    }
  }
}

/** For a describe block that starts processes in cgroups: every process is stopped after each test, and
 * the groups and temporary directories it made are removed after the block. */
export function cgroupScope(): { group(name: string): Cgroup; tempDir(prefix: string): string } {
  const groups: Cgroup[] = [];
  const dirs: string[] = [];
  afterEach(killAll);
  afterAll(async () => {
    killAll();
    for (const g of groups) await g.remove();
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });
  return {
    group(name) {
      const g = new Cgroup(name);
      groups.push(g);
      return g;
    },
    tempDir(prefix) {
      const d = mkdtempSync(join(tmpdir(), prefix));
      dirs.push(d);
      return d;
    },
  };
}

/** Starts `node args...` inside the cgroups (the shell joins them before exec, so node starts inside). */
export function startIn(groups: readonly Cgroup[], args: readonly string[], env: NodeJS.ProcessEnv = {}): Proc {
  const dirs = groups.flatMap((g) => g.dirs);
  const join = dirs.map((d) => `echo $$ > '${d}/cgroup.procs'`).join(" && ");
  return startProcess("/bin/sh", ["-c", `${join ? `${join} && ` : ""}exec "$0" "$@"`, process.execPath, ...args], env);
}

/** Runs a script (ES module source, may import dist/) in the cgroups; resolves with its stdout JSON. */
export async function runScriptIn<T>(groups: readonly Cgroup[], source: string, env: NodeJS.ProcessEnv = {}): Promise<T> {
  const p = startIn(groups, ["--input-type=module", "-e", source], env);
  const code = await p.exited;
  if (code !== 0) throw new Error(`script failed (${code}):\n${p.stderr}`);
  return JSON.parse(p.stdout) as T;
}

/** file:// URL of a compiled module in dist/, for child scripts. */
export function distUrl(path: string): string {
  return new URL(`dist/${path}`, `file://${root}`).href;
}
