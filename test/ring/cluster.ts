// Test harness: a coordinator and workers as real processes on loopback (the compiled CLIs in dist/,
// built by `npm test`'s pretest step).
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../..", import.meta.url));
const coordCli = `${root}dist/coordinator/cli.js`;
const workerCli = `${root}dist/worker/cli.js`;

export interface Proc {
  readonly child: ChildProcess;
  stdout: string;
  stderr: string;
  readonly exited: Promise<number | null>;
  /** Resolves when stderr (or stdout) matches; rejects after timeoutMs. */
  waitFor(re: RegExp, timeoutMs?: number): Promise<RegExpMatchArray>;
}

const running = new Set<ChildProcess>();

/** Kills every process the harness started (afterEach: a failed test must not leave a ring behind). */
export function killAll(): void {
  for (const c of running) c.kill("SIGKILL");
  running.clear();
}

function start(cli: string, args: string[]): Proc {
  const child = spawn(process.execPath, [cli, ...args], { cwd: root, stdio: ["ignore", "pipe", "pipe"] });
  running.add(child);
  child.on("exit", () => running.delete(child));
  const waiters: { re: RegExp; resolve: (m: RegExpMatchArray) => void }[] = [];
  const p: Proc = {
    child,
    stdout: "",
    stderr: "",
    exited: new Promise((resolve) => child.on("exit", (code) => resolve(code))),
    waitFor(re, timeoutMs = 20_000) {
      const m = (p.stderr + p.stdout).match(re);
      if (m) return Promise.resolve(m);
      return new Promise((resolve, reject) => {
        const w = { re, resolve };
        waiters.push(w);
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

export function startCoordinator(args: string[]): Proc {
  return start(coordCli, args);
}

export function startWorker(args: string[]): Proc {
  return start(workerCli, args);
}

export interface RingRun {
  coordinator: Proc;
  workers: Proc[];
  code: number | null;
  /** The coordinator's --json report, when it printed one. */
  report?: { generated_ids: number[]; prompt_ids: number[]; devices: number; cycles: number };
}

/** Runs `prima-coord run` with n workers joined in order, and waits for it to end. */
export async function runRing(model: string, coordArgs: string[], nWorkers: number, workerArgs: string[] = []): Promise<RingRun> {
  const coordinator = startCoordinator(["run", model, "--port", "0", "--min-workers", String(nWorkers), "--json", ...coordArgs]);
  const port = (await coordinator.waitFor(/listening for workers on port (\d+)/))[1];
  const workers: Proc[] = [];
  for (let i = 0; i < nWorkers; i++) {
    const w = startWorker(["--join", `127.0.0.1:${port}`, "--model", model, "--name", `dev${i + 1}`, "--once", "--threads", "1", ...workerArgs]);
    workers.push(w);
    await coordinator.waitFor(new RegExp(`"dev${i + 1}" .*joined`));
  }
  const code = await coordinator.exited;
  await Promise.all(workers.map((w) => Promise.race([w.exited, new Promise((r) => setTimeout(r, 5000))])));
  for (const w of workers) w.child.kill("SIGKILL");
  const line = coordinator.stdout.split("\n").find((l) => l.startsWith("{"));
  return { coordinator, workers, code, report: line ? JSON.parse(line) : undefined };
}
