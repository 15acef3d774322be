// The ring's cost, measured on this machine with real processes on loopback:
//  1. overhead: decode latency of a 3-process ring (2 workers + the head) over one process, same model,
//     and the cost per hop;
//  2. memory-starved workers (a memory cgroup each, smaller than their windows): prefetch on vs off,
//     and k = 1 vs k = 2.
//   node dist/bench/ring.js [model.gguf]
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, rmdirSync, writeFileSync } from "node:fs";
import { coordCli, root, runWhenMain, workerCli } from "./procs.js";

interface Report {
  generated_ids: number[];
  devices_decode?: { device: string; compute_ms: number; wait_ms: number; send_ms: number }[];
  decode_tok_s: number;
  prompt_tok_s: number;
}

interface Proc {
  child: ChildProcess;
  out: string;
  err: string;
  exited: Promise<number | null>;
}

function start(cli: string, args: string[]): Proc {
  const child = spawn(process.execPath, [cli, ...args], { stdio: ["ignore", "pipe", "pipe"] });
  const p: Proc = { child, out: "", err: "", exited: new Promise((r) => child.on("exit", r)) };
  child.stdout!.on("data", (d: Buffer) => (p.out += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (p.err += d.toString()));
  return p;
}

async function waitFor(p: Proc, re: RegExp, timeoutMs = 60_000): Promise<RegExpMatchArray> {
  const t0 = Date.now();
  for (;;) {
    const m = p.err.match(re);
    if (m) return m;
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out waiting for ${re}:\n${p.err}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

// 192 tokens (~6 s) per overhead run: with 64, one stall of the host moved a run's mean by several
// percent. Memory-starved runs take ~0.35 s a token: 32 tokens each.
const DECODE_TOKENS = 192;
const gen = (tokens: number) => ["-p", "Once upon a time", "-n", String(tokens), "--temp", "0", "--ctx", "256"];
const GEN = gen(DECODE_TOKENS);

async function single(model: string): Promise<Report> {
  const p = start(coordCli, ["run", model, "--json", ...GEN]);
  await p.exited;
  return JSON.parse(p.out);
}

/** Runs a ring; `cgroups[i]` (optional) is a memory cgroup for worker i. */
async function ring(model: string, windows: string, k: number, nWorkers: number, extra: string[] = [], cgroups: (string | undefined)[] = [], args = GEN,
  workerArgs: string[] = []): Promise<Report> {
  const coord = start(coordCli, ["run", model, "--json", "--port", "0", "--min-workers", String(nWorkers), "--layer-windows", windows, "-k", String(k), ...args, ...extra]);
  const port = (await waitFor(coord, /listening for workers on port (\d+)/))[1];
  const tokenFile = (await waitFor(coord, /--token-file (\S+)/))[1]; // the join token (trust/)
  const workers: Proc[] = [];
  try {
    for (let i = 0; i < nWorkers; i++) {
      const w = start(workerCli, ["--join", `127.0.0.1:${port}`, "--model", model, "--name", `bench${i + 1}`, "--once", "--token-file", tokenFile, ...workerArgs]);
      const cg = cgroups[i];
      if (cg) writeFileSync(`${cg}/cgroup.procs`, String(w.child.pid));
      workers.push(w);
      await waitFor(coord, new RegExp(`"bench${i + 1}" .*joined`));
    }
    const code = await coord.exited;
    if (code !== 0) throw new Error(`ring run failed:\n${coord.err}`);
    return JSON.parse(coord.out.split("\n").find((l) => l.startsWith("{"))!);
  } finally {
    for (const w of workers) w.child.kill("SIGKILL");
    coord.child.kill("SIGKILL");
  }
}

const MEMCG = "/sys/fs/cgroup/memory";

function makeCgroup(name: string, limitBytes: number): string | undefined {
  if (!existsSync(`${MEMCG}/memory.limit_in_bytes`)) return undefined;
  const dir = `${MEMCG}/${name}`;
  try {
    mkdirSync(dir, { recursive: true });
    writeFileSync(`${dir}/memory.limit_in_bytes`, String(limitBytes));
    return dir;
  } catch {
    return undefined;
  }
}

function dropCaches(): void {
  try {
    writeFileSync("/proc/sys/vm/drop_caches", "1");
  } catch {
    // not root: the first run reads from the page cache
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

export async function main(modelArg?: string, reps = 7): Promise<void> {
  const model = modelArg ?? `${root}.cache/bench-llama-Q4_K_M.gguf`;
  console.log(`\n## ring overhead: 3 processes on loopback vs one (decode, ${DECODE_TOKENS} tokens, ${model.split("/").pop()}, ${reps} rounds)\n`);
  // This machine's speed drifts by 10-40% within minutes: each ring run is next to a one-process run,
  // and a ratio is the median of those runs' ratios. The order of the three setups rotates from one
  // round to the next, so a steady drift does not always count against the same one. The second ring
  // passes its workers' frames through JS (--no-native-lane), for the native lane's share.
  const setups = [
    { name: "1 process", run: () => single(model) },
    { name: "3-process ring, k=1", run: () => ring(model, "8,7,7", 1, 2) },
    { name: "3-process ring, k=1, frames through JS", run: () => ring(model, "8,7,7", 1, 2, [], [], GEN, ["--no-native-lane"]) },
  ];
  const reports: Report[][] = setups.map(() => []);
  for (let i = 0; i < reps; i++) {
    for (let j = 0; j < setups.length; j++) {
      const s = (i + j) % setups.length;
      reports[s]!.push(await setups[s]!.run());
    }
  }
  const ms = (r: Report) => 1000 / r.decode_tok_s;
  const runs = (xs: number[]) => xs.map((x) => x.toFixed(1)).join(", ");
  const one = reports[0]!.map(ms);
  console.log("| setup | decode ms/token, median (runs) | ratio to 1 process, median of rounds (range) (goal <= 1.10) | per-hop cost | hops: token - sum of compute, median | same tokens |");
  console.log("|---|---|---|---|---|---|");
  console.log(`| ${setups[0]!.name} | ${median(one).toFixed(2)} (${runs(one)}) | 1.00 | - | - | - |`);
  for (let s = 1; s < setups.length; s++) {
    const three = reports[s]!.map(ms);
    const ratios = three.map((t, i) => t / one[i]!);
    const range = `${Math.min(...ratios).toFixed(2)}-${Math.max(...ratios).toFixed(2)}`;
    // What the devices' windows took together; the rest of a token is the hops (and the head's sampling).
    const hops = reports[s]!.map((r) => ms(r) - (r.devices_decode ?? []).reduce((a, d) => a + d.compute_ms, 0));
    const same = reports[s]!.every((r, i) => JSON.stringify(r.generated_ids) === JSON.stringify(reports[0]![i]!.generated_ids));
    console.log(`| ${setups[s]!.name} | ${median(three).toFixed(2)} (${runs(three)}) | ${median(ratios).toFixed(3)} (${range}) | ` +
      `${((median(three) - median(one)) / 3).toFixed(3)} ms | ${median(hops).toFixed(2)} ms | ${same ? "yes" : "NO"} |`);
  }

  // The lane ring's run nearest its median, device by device: compute is the layers' own time.
  const laneMs = reports[1]!.map(ms);
  const mid = reports[1]![laneMs.indexOf(median(laneMs))]!;
  if (mid.devices_decode) {
    console.log("\n| ring device (the native-lane ring's median run) | compute ms/token | waiting ms/token | sending ms/token |");
    console.log("|---|---|---|---|");
    for (const d of mid.devices_decode) console.log(`| ${d.device} | ${d.compute_ms.toFixed(2)} | ${d.wait_ms.toFixed(2)} | ${d.send_ms.toFixed(2)} |`);
    const compute = mid.devices_decode.reduce((a, d) => a + d.compute_ms, 0);
    console.log(`\nsum of compute ${compute.toFixed(2)} ms of a ${ms(mid).toFixed(2)} ms token: ${(ms(mid) - compute).toFixed(2)} ms in the three hops`);
  }

  // Where the difference comes from (BENCHMARKS.md, "ring"; bench/history/2026-11-23-ring-overhead.md):
  // the same window after an idle gap.
  await (await import("./idle-gap.js")).main(model);

  // Memory-starved workers: each holds a third of the model per cycle but may keep far less in RAM.
  const limit = 160 * 2 ** 20;
  const cgs = [makeCgroup("prima-bench-w1", limit), makeCgroup("prima-bench-w2", limit)];
  if (!cgs[0] || !cgs[1]) {
    console.log("\n(memory cgroups unavailable: skipping the memory-starved ring)");
    return;
  }
  console.log(`\n## memory-starved workers (memory cgroup of ${limit / 2 ** 20} MiB each, ~210 MiB of weights each)\n`);
  console.log("| cycles | prefetch | decode ms/token |");
  console.log("|---|---|---|");
  try {
    for (const [k, windows] of [[1, "8,7,7"], [2, "4,4,3"]] as const) {
      for (const prefetch of [true, false]) {
        dropCaches();
        const r = await ring(model, windows, k, 2, prefetch ? [] : ["--no-prefetch"], cgs, gen(32));
        console.log(`| k=${k} | ${prefetch ? "on" : "off"} | ${(1000 / r.decode_tok_s).toFixed(1)} |`);
      }
    }
  } finally {
    for (const cg of cgs) {
      try {
        rmdirSync(cg!);
      } catch {
        // still has a process for a moment; harmless
      }
    }
  }
}

runWhenMain(import.meta.url, main);
