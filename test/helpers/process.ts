// Test harness: child processes (the compiled CLIs in dist/, scripts) with their output collected,
// a way to wait for a line, and one kill switch for every process a test started.
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";

/** The package root (tests run the compiled CLIs in dist/, built by `npm test`'s pretest step). */
export const root = fileURLToPath(new URL("../..", import.meta.url));

export interface Proc {
  readonly child: ChildProcess;
  stdout: string;
  stderr: string;
  readonly exited: Promise<number | null>;
  /** Resolves when stderr or stdout matches; rejects after timeoutMs. */
  waitFor(re: RegExp, timeoutMs?: number): Promise<RegExpMatchArray>;
}

const running = new Set<ChildProcess>();

/** Kills every process the harness started (afterEach: a failed test must not leave processes behind). */
export function killAll(): void {
  for (const c of running) c.kill("SIGKILL");
  running.clear();
}

/** Starts `command args...` in the package root. */
export function startProcess(command: string, args: readonly string[], env: NodeJS.ProcessEnv = {}): Proc {
  const child = spawn(command, args, { cwd: root, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
  running.add(child);
  child.on("exit", () => running.delete(child));
  const waiters: { re: RegExp; resolve: (m: RegExpMatchArray) => void }[] = [];
  const p: Proc = {
    child,
    stdout: "",
    stderr: "",
    exited: new Promise((resolve) => child.on("exit", (code) => resolve(code))),
    waitFor(re, timeoutMs = 30_000) {
      const m = (p.stderr + p.stdout).match(re);
      if (m) return Promise.resolve(m);
      return new Promise((resolve, reject) => {
        waiters.push({ re, resolve });
        setTimeout(() => reject(new Error(`timed out waiting for ${re}; stderr:\n${p.stderr}`)), timeoutMs).unref();
      });
    },
  };
  const check = () => {
    for (let i = waiters.length - 1; i >= 0; i--) {
      const m = (p.stderr + p.stdout).match(waiters[i].re);
      if (m) waiters.splice(i, 1)[0].resolve(m);
    }
  };
  child.stdout!.on("data", (d: Buffer) => { p.stdout += d.toString(); check(); });
  child.stderr!.on("data", (d: Buffer) => { p.stderr += d.toString(); check(); });
  return p;
}

/** Starts `node args...`. */
export function startNode(args: readonly string[], env: NodeJS.ProcessEnv = {}): Proc {
  return startProcess(process.execPath, args, env);
}
