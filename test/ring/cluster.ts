// Test harness: a coordinator and workers as real processes on loopback (the compiled CLIs in dist/,
// built by `npm test`'s pretest step).
import { execFileSync } from "node:child_process";
import { killAll, root, startNode, type Proc } from "../helpers/process.js";

const coordCli = `${root}dist/coordinator/cli.js`;
const workerCli = `${root}dist/worker/cli.js`;

export { killAll, type Proc };

export function startCoordinator(args: string[]): Proc {
  return startNode([coordCli, ...args]);
}

export function startWorker(args: string[]): Proc {
  return startNode([workerCli, ...args]);
}

export interface RingRun {
  coordinator: Proc;
  workers: Proc[];
  code: number | null;
  /** The coordinator's --json report, when it printed one. */
  report?: {
    generated_ids: number[]; prompt_ids: number[]; devices: number; cycles: number;
    devices_decode?: { device: string; compute_ms: number; wait_ms: number; send_ms: number; descheduled_ms: number; major_faults: number }[];
  };
}

/** Runs `prima-coord run` with n workers (dev1..devN, in that ring order), and waits for it to end. */
export async function runRing(model: string, coordArgs: string[], nWorkers: number, workerArgs: string[] = []): Promise<RingRun> {
  const coordinator = startCoordinator(["run", model, "--port", "0", "--min-workers", String(nWorkers), "--json", ...coordArgs]);
  const port = (await coordinator.waitFor(/listening for workers on port (\d+)/))[1];
  // All started at once: the ring orders workers by name, not by who joined first, so nothing waits
  // for one worker's start-up and profile before the next one's begins.
  const workers = Array.from({ length: nWorkers }, (_, i) =>
    startWorker(["--join", `127.0.0.1:${port}`, "--model", model, "--name", `dev${i + 1}`, "--once", "--threads", "1", ...workerArgs]));
  const code = await coordinator.exited;
  await Promise.all(workers.map((w) => Promise.race([w.exited, new Promise((r) => setTimeout(r, 5000))])));
  for (const w of workers) w.child.kill("SIGKILL");
  const line = coordinator.stdout.split("\n").find((l) => l.startsWith("{"));
  return { coordinator, workers, code, report: line ? JSON.parse(line) : undefined };
}

/** What one device generates (`prima-coord run --json`): the ids a ring must match. */
export function singleDevice(path: string, args: string[]): number[] {
  const out = execFileSync(process.execPath, [coordCli, "run", path, "--json", ...args], { encoding: "utf8", cwd: root });
  return JSON.parse(out).generated_ids;
}

/** MiB each worker said its windows take (KV and scratch), in the order the coordinator logged them. */
export function readyMiB(stderr: string): number[] {
  return [...stderr.matchAll(/device \S+ "dev\d+" .*?ready (?:in [\d.]+ s )?\(([\d.]+) MiB for KV and scratch\)/g)].map((m) => Number(m[1]));
}
