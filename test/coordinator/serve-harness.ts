// Test harness for `prima-coord serve`: a server (and workers) as real processes on loopback, the
// official `openai` client pointed at it, and a one-shot `prima-coord run` for the reference tokens.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import OpenAI from "openai";
import { root, startNode } from "../helpers/process.js";
import { startCoordinator, startWorker, type Proc } from "../ring/cluster.js";

export const MODEL = "models/stories260K.gguf";
const coordCli = `${root}dist/coordinator/cli.js`;
const workerCli = `${root}dist/worker/cli.js`;

export interface Served {
  readonly proc: Proc;
  readonly url: string;
  readonly clusterPort: number;
  readonly client: OpenAI;
}

/**
 * Starts serve (any free ports; no discovery unless `discovery`, with `env` to keep its multicast on
 * loopback) and waits until it says it is ready.
 */
export async function startServe(args: string[] = [], opts: { apiKey?: string; model?: string; waitReady?: boolean; discovery?: boolean; env?: NodeJS.ProcessEnv } = {}): Promise<Served> {
  const serveArgs = ["serve", opts.model ?? MODEL, ...(opts.discovery ? [] : ["--no-discovery"]), "--port", "0", "--cluster-port", "0", "--threads", "1", ...args];
  const proc = opts.env ? startNode([coordCli, ...serveArgs], opts.env) : startCoordinator(serveArgs);
  const port = Number((await proc.waitFor(/listening on http:\/\/127\.0\.0\.1:(\d+)/))[1]);
  const clusterPort = Number((await proc.waitFor(/listening for workers on port (\d+)/))[1]);
  if (opts.waitReady !== false) await proc.waitFor(/ready: /);
  const url = `http://127.0.0.1:${port}`;
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: opts.apiKey ?? "unused", maxRetries: 0, timeout: 60_000 });
  return { proc, url, clusterPort, client };
}

export function joinWorker(clusterPort: number, name: string, model = MODEL, extra: string[] = []): Proc {
  return startWorker(["--join", `127.0.0.1:${clusterPort}`, "--model", model, "--name", name, "--threads", "1", ...extra]);
}

/** A worker that finds the cluster by itself: `--join` with no address (mDNS settings from `env`). */
export function discoverWorker(name: string, env: NodeJS.ProcessEnv, model = MODEL, extra: string[] = []): Proc {
  return startNode([workerCli, "--join", "--model", model, "--name", name, "--threads", "1", ...extra], env);
}

/** Polls GET path until check(json) holds; rejects after timeoutMs with the last answer. */
export async function until<T>(url: string, check: (status: number, body: T) => boolean, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last = "";
  for (;;) {
    try {
      const r = await fetch(url, { signal: AbortSignal.timeout(5000) });
      const body = (await r.json()) as T;
      if (check(r.status, body)) return body;
      last = `${r.status} ${JSON.stringify(body).slice(0, 500)}`;
    } catch (e) {
      last = (e as Error).message;
    }
    if (Date.now() > deadline) throw new Error(`${url}: condition not met within ${timeoutMs} ms; last answer: ${last}`);
    await new Promise((r) => setTimeout(r, 150));
  }
}

export interface RunJson {
  text: string;
  generated_ids: number[];
  prompt_ids: number[];
}

/** `prima-coord run --json` on one device: the reference a served request must equal. */
export function runOnce(args: string[], model = MODEL): RunJson {
  const out = execFileSync(process.execPath, [coordCli, "run", model, "--json", "--threads", "1", ...args], { cwd: root, encoding: "utf8" });
  return JSON.parse(out.split("\n").find((l) => l.startsWith("{"))!) as RunJson;
}

/** Resident memory of a process, from /proc. */
/** The process's anonymous resident memory: what a leak grows. (VmRSS also counts the model's mapped
 * pages, which come and go with the page cache: a loaded machine's reclaim moved it by 145 MB.) */
export function anonRssBytes(pid: number): number {
  const m = /RssAnon:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) * 1024 : 0;
}
