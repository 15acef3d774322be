// Test harness: child processes (the compiled CLIs in dist/, scripts) with their output collected,
// a way to wait for a line, and one kill switch for every process a test started.
import { spawn, type ChildProcess } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { ownedDir } from "./temp.js";

/** The package root (tests run the compiled CLIs in dist/, built by `npm test`'s pretest step). */
export const root = fileURLToPath(new URL("../..", import.meta.url));

/** Coordinators started here keep their join tokens (trust/) in this config directory, never in the
 * user's; one per test process. */
export const testConfigDir = ownedDir(join(tmpdir(), `prima-test-config-${process.pid}`));

/** Token files by cluster port, as coordinators started here print them ("--join HOST:PORT
 * --token-file FILE"); the last one for a worker that finds its cluster by mDNS. */
const tokenFiles = new Map<number, string>();
let lastTokenFile: string | undefined;

/** The token file of the coordinator on this cluster port (started by this harness). */
export function tokenFileFor(port: number): string | undefined {
  return tokenFiles.get(port);
}

/** A worker's arguments with the join token of the coordinator it joins, unless they give one:
 * `--join HOST:PORT` names it by port, `--join` alone takes the last coordinator's. */
export function withToken(args: readonly string[]): string[] {
  if (args.some((a) => a === "--token" || a === "--token-file" || a.startsWith("--token="))) return [...args];
  const i = args.indexOf("--join");
  if (i < 0) return [...args];
  const m = /:(\d+)$/.exec(args[i + 1] ?? "");
  const file = m ? tokenFiles.get(Number(m[1])) : lastTokenFile;
  return file ? [...args, "--token-file", file] : [...args];
}

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
  // A worker CLI anywhere in the arguments (also behind a shell that enters a cgroup) gets its token.
  if (args.some((a) => a.endsWith("dist/worker/cli.js")) && !env.PRIMA_TOKEN) args = withToken(args);
  const child = spawn(command, args, { cwd: root, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, XDG_CONFIG_HOME: testConfigDir, ...env } });
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
  const check = (tail = "") => {
    for (const t of tail.matchAll(/--join \S+:(\d+) --token-file (\S+)/g)) {
      if (tokenFiles.get(Number(t[1])) !== t[2]) tokenFiles.set(Number(t[1]), (lastTokenFile = t[2]));
    }
    for (let i = waiters.length - 1; i >= 0; i--) {
      const m = (p.stderr + p.stdout).match(waiters[i].re);
      if (m) waiters.splice(i, 1)[0].resolve(m);
    }
  };
  child.stdout!.on("data", (d: Buffer) => { p.stdout += d.toString(); check(); });
  // Token lines come on stderr (the coordinator's log); a line may span two reads.
  child.stderr!.on("data", (d: Buffer) => { p.stderr += d.toString(); check(p.stderr.slice(-(d.length + 1000))); });
  return p;
}

/** Starts `node args...`. */
export function startNode(args: readonly string[], env: NodeJS.ProcessEnv = {}): Proc {
  return startProcess(process.execPath, args, env);
}
