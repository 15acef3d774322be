// Processes for benchmarks: the compiled CLIs started with their output collected, a wait for a
// line with a limit, and a stop by PID.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

export const root = fileURLToPath(new URL("../..", import.meta.url));
export const coordCli = `${root}dist/coordinator/cli.js`;
export const workerCli = `${root}dist/worker/cli.js`;

/** What a benchmark writes under the user's cache and config folders (device profiles, the model
 * cache, chunk hashes, join tokens) goes to a temporary folder removed at exit, for this process and
 * every process it starts: a benchmark must not leave its profiles in, or take them from, the user's
 * ~/.cache/prima. A folder the user names (XDG_CACHE_HOME, XDG_CONFIG_HOME, PRIMA_PROFILE_DIR) stands. */
export function useTemporaryHome(): void {
  if (process.env.XDG_CACHE_HOME && process.env.XDG_CONFIG_HOME) return;
  const dir = mkdtempSync(join(tmpdir(), "prima-bench-home-"));
  process.env.XDG_CACHE_HOME ||= join(dir, "cache");
  process.env.XDG_CONFIG_HOME ||= join(dir, "config");
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    process.once(signal, () => {
      rmSync(dir, { recursive: true, force: true });
      process.kill(process.pid, signal);
    });
  }
}

export interface Proc {
  child: ChildProcess;
  out: string;
  err: string;
  exited: Promise<number | null>;
}

export function start(cli: string, args: string[], env: NodeJS.ProcessEnv = {}): Proc {
  const child = spawn(process.execPath, [cli, ...args], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
  const p: Proc = { child, out: "", err: "", exited: new Promise((r) => child.on("exit", r)) };
  child.stdout!.on("data", (d: Buffer) => (p.out += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (p.err += d.toString()));
  return p;
}

export async function waitFor(p: Proc, re: RegExp, timeoutMs = 60_000): Promise<RegExpMatchArray> {
  const t0 = Date.now();
  for (;;) {
    const m = p.err.match(re) ?? p.out.match(re);
    if (m) return m;
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out waiting for ${re}:\n${p.err.slice(-3000)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Stops a process by its PID (SIGTERM, then SIGKILL after a grace) and waits for it. */
export async function stop(p: Proc, graceMs = 3000): Promise<void> {
  if (p.child.exitCode !== null || p.child.signalCode !== null) return;
  p.child.kill("SIGTERM");
  const t = setTimeout(() => p.child.kill("SIGKILL"), graceMs);
  await p.exited;
  clearTimeout(t);
}

export { median } from "../profiler/index.js";

/** Reads an SSE response of the OpenAI API, calling onData with each `data:` object (not [DONE]). */
export async function readSse(r: Response, onData: (data: Record<string, unknown>) => void): Promise<void> {
  if (!r.ok || !r.body) throw new Error(`HTTP ${r.status}: ${(await r.text()).slice(0, 300)}`);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (ev.startsWith("data: ") && ev !== "data: [DONE]") onData(JSON.parse(ev.slice(6)) as Record<string, unknown>);
    }
  }
}

/** Runs a benchmark file on its own: `node dist/bench/NAME.js model.gguf [n]`. */
export function runAlone(meta: ImportMeta, name: string, usage: string, main: (model: string, n: number) => Promise<void>, dflt: number): void {
  if (meta.url !== `file://${process.argv[1]}`) return;
  useTemporaryHome();
  const model = process.argv[2];
  if (!model) {
    console.error(`usage: node dist/bench/${name}.js model.gguf ${usage}`);
    process.exit(2);
  }
  main(model, Number(process.argv[3] ?? dflt)).catch((e: unknown) => {
    console.error(`bench ${name}: ${e instanceof Error ? e.message : String(e)}`);
    process.exitCode = 1;
  });
}

/** Runs a bench part's `main(model?)` when its file is the program itself (`node dist/bench/x.js
 * [model.gguf]`), and reports a failure by message and exit code 1. */
export function runWhenMain(moduleUrl: string, main: (model?: string) => Promise<void>): void {
  if (!process.argv[1] || fileURLToPath(moduleUrl) !== process.argv[1]) return;
  useTemporaryHome();
  main(process.argv[2]).catch((e: unknown) => {
    console.error(e instanceof Error ? e.message : String(e));
    process.exitCode = 1;
  });
}
