// The ring's cost, measured on this machine with real processes on loopback:
//  1. overhead: decode latency of a 3-process ring (2 workers + the head) over one process, same model,
//     and the cost per hop;
//  2. memory-starved workers (a memory cgroup each, smaller than their windows): prefetch on vs off,
//     and k = 1 vs k = 2.
//   node dist/bench/ring.js [model.gguf]
import { existsSync, mkdirSync, rmdirSync, writeFileSync } from "node:fs";
import { priceRingWindows } from "../coordinator/index.js";
import type { DeviceProfile, ModelProfile } from "../halda/index.js";
import { blockDeviceOf } from "../profiler/index.js";
import { coordCli, median, root, runWhenMain, start, waitFor, workerCli, type Proc } from "./procs.js";

interface Report {
  /** The coordinator's log (stderr), for what it chose. */
  log: string;
  /** Halda's plan, where it placed the layers. */
  placement?: { plan: { k: number; latencyMs: number }; per_cycle: number[]; devices: DeviceProfile[]; model: ModelProfile };
  generated_ids: number[];
  devices_decode?: { device: string; compute_ms: number; wait_ms: number; send_ms: number }[];
  decode_tok_s: number;
  prompt_tok_s: number;
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

/** Runs a ring; `cgroups[i]` (optional) are the cgroups (memory, blkio) worker i runs in, `headGroups`
 * the head's. Windows "" and k 0: Halda places the layers. */
async function ring(model: string, windows: string, k: number, nWorkers: number, extra: string[] = [], cgroups: (readonly string[] | undefined)[] = [], args = GEN,
  workerArgs: string[] = [], headGroups: readonly string[] = []): Promise<Report> {
  const placing = [...(windows ? ["--layer-windows", windows] : []), ...(k ? ["-k", String(k)] : [])];
  const coord = start(coordCli, ["run", model, "--json", "--port", "0", "--min-workers", String(nWorkers), ...placing, ...args, ...extra]);
  for (const cg of headGroups) writeFileSync(`${cg}/cgroup.procs`, String(coord.child.pid));
  const port = (await waitFor(coord, /listening for workers on port (\d+)/))[1];
  const tokenFile = (await waitFor(coord, /--token-file (\S+)/))[1]; // the join token (trust/)
  const workers: Proc[] = [];
  try {
    for (let i = 0; i < nWorkers; i++) {
      const w = start(workerCli, ["--join", `127.0.0.1:${port}`, "--model", model, "--name", `bench${i + 1}`, "--once", "--token-file", tokenFile, ...workerArgs]);
      for (const cg of cgroups[i] ?? []) writeFileSync(`${cg}/cgroup.procs`, String(w.child.pid));
      workers.push(w);
      await waitFor(coord, new RegExp(`"bench${i + 1}" .*joined`));
    }
    const code = await coord.exited;
    if (code !== 0) throw new Error(`ring run failed:\n${coord.err}`);
    return { ...JSON.parse(coord.out.split("\n").find((l) => l.startsWith("{"))!), log: coord.err };
  } finally {
    for (const w of workers) w.child.kill("SIGKILL");
    coord.child.kill("SIGKILL");
  }
}

/** What the coordinator said each device chose ("head on, bench1 off, ..."), from its log. */
function prefetchChosen(log: string): string {
  return [...log.matchAll(/prefetch (on|off) on (?:head|w\d+ "(bench\d)")/g)].map((m) => `${m[2] ?? "head"} ${m[1]}`).join(", ");
}

/** A v1 cgroup under `controller` with one setting written, or undefined where that cannot be done. */
function makeCgroup(controller: "memory" | "blkio", name: string, file: string, value: string): string | undefined {
  const dir = `/sys/fs/cgroup/${controller}/${name}`;
  if (!existsSync(`/sys/fs/cgroup/${controller}/${file}`)) return undefined;
  try {
    mkdirSync(dir, { recursive: true });
    writeFileSync(`${dir}/${file}`, value);
    return dir;
  } catch {
    return undefined;
  }
}

function removeCgroups(dirs: readonly (string | undefined)[]): void {
  for (const dir of dirs) {
    try {
      if (dir) rmdirSync(dir);
    } catch {
      // still has a process for a moment; harmless
    }
  }
}

function dropCaches(): void {
  try {
    writeFileSync("/proc/sys/vm/drop_caches", "1");
  } catch {
    // not root: the first run reads from the page cache
  }
}

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

  await starved(model);
}

/** Memory-starved workers: each holds a third of the model per cycle but may keep far less in RAM, on
 * this machine's disk and on one throttled to a slow one's speed (blkio, each worker its own: separate
 * devices' disks). With k = 2 each worker's two windows do not fit together, so it drops one after use
 * and reads it again: prefetch reads the next one while the others compute (the paper's case for
 * k > 1), forced on, forced off, and as the coordinator chooses (coordinator/prefetch-choice.ts: these
 * devices share one machine's CPUs, so it reads ahead only where reading waits on the disk). */
export async function starved(model: string, tokens = 32, slowTokens = 8): Promise<void> {
  const limit = 160 * 2 ** 20, slowBps = 200_000_000;
  const memory = [1, 2].map((i) => makeCgroup("memory", `prima-bench-w${i}`, "memory.limit_in_bytes", String(limit)));
  const dev = blockDeviceOf(model);
  const blkio = dev ? [1, 2].map((i) => makeCgroup("blkio", `prima-bench-w${i}`, "blkio.throttle.read_bps_device", `${dev} ${slowBps}`)) : [];
  try {
    if (!memory[0] || !memory[1]) {
      console.log("\n(memory cgroups unavailable: skipping the memory-starved ring)");
      return;
    }
    const disks = [{ name: "this machine's disk", groups: memory.map((m) => [m!]), tokens }];
    if (blkio[0] && blkio[1]) disks.push({ name: `a disk of ${slowBps / 1e6} MB/s for each worker (blkio)`, groups: memory.map((m, i) => [m!, blkio[i]!]), tokens: slowTokens });
    else console.log(`\n(blkio throttling unavailable for ${dev || "the model's disk"}: no slow-disk rows)`);
    const setups = [
      { name: "k=1 (one window a device: nothing to read ahead)", k: 1, windows: "8,7,7", flags: [] as string[] },
      { name: "k=2, --no-prefetch", k: 2, windows: "4,4,3", flags: ["--no-prefetch"] },
      { name: "k=2, --prefetch", k: 2, windows: "4,4,3", flags: ["--prefetch"] },
      { name: "k=2, automatic", k: 2, windows: "4,4,3", flags: [] },
    ];
    for (const disk of disks) {
      console.log(`\n## memory-starved workers (memory cgroup of ${limit / 2 ** 20} MiB each, ~210 MiB of weights each), ${disk.name}, ${disk.tokens} tokens\n`);
      console.log("| setup | decode ms/token | prefetch on the devices |");
      console.log("|---|---|---|");
      const ms: number[] = [];
      for (const s of setups) {
        dropCaches();
        const r = await ring(model, s.windows, s.k, 2, s.flags, disk.groups, gen(disk.tokens));
        ms.push(1000 / r.decode_tok_s);
        const chosen = prefetchChosen(r.log);
        console.log(`| ${s.name} | ${ms[ms.length - 1].toFixed(1)} | ${s.k === 1 ? "-" : chosen || "?"} |`);
        // why each device chose as it did (its disk's measured CPU share), for a choice that looks wrong
        if (s.flags.length === 0 && s.k > 1) console.error(`${disk.name}, ${s.name}:\n${r.log.split("\n").filter((l) => /prefetch (on|off) on /.test(l)).join("\n")}`);
      }
      const [, off, on, auto] = ms;
      console.log(`\nprefetch on/off: ${(off / on).toFixed(2)}x faster with it; automatic against the faster of the two: ${(Math.min(on, off) / auto).toFixed(2)}x`);
    }
    if (disks.length > 1) await haldaWithPrefetch(model, dev, slowBps, slowTokens);
  } finally {
    removeCgroups([...memory, ...blkio]);
  }
}

/** Halda's own plan where every device (the head too) is short of memory on a slow disk and reads
 * ahead, against plans by hand, each with Halda's price (with the reads of devices that read ahead
 * hidden at k > 1, HALDA.md §4.9) on the automatic run's profiles. */
export async function haldaWithPrefetch(model: string, dev: string, bps: number, tokens: number): Promise<void> {
  const limit = 200 * 2 ** 20;
  const names = ["head", "w1", "w2"];
  const memory = names.map((n) => makeCgroup("memory", `prima-bench-halda-${n}`, "memory.limit_in_bytes", String(limit)));
  const blkio = names.map((n) => makeCgroup("blkio", `prima-bench-halda-${n}`, "blkio.throttle.read_bps_device", `${dev} ${bps}`));
  try {
    if (memory.some((g) => !g) || blkio.some((g) => !g)) return;
    const groups = names.map((_, i) => [memory[i]!, blkio[i]!]);
    console.log(`\n## Halda's plan, every device (the head too) in ${limit / 2 ** 20} MiB on a disk of ${bps / 1e6} MB/s, ${tokens} tokens\n`);
    console.log("| plan (ring order: bench1, bench2, head) | Halda's ms/token | decode ms/token | prefetch on the devices |");
    console.log("|---|---|---|---|");
    const run = async (windows: string, k: number) => {
      dropCaches();
      return ring(model, windows, k, 2, [], groups.slice(1), gen(tokens), [], groups[0]);
    };
    const row = (name: string, r: Report, price: string) => {
      const chosen = prefetchChosen(r.log);
      console.log(`| ${name} | ${price} | ${(1000 / r.decode_tok_s).toFixed(1)} | ${chosen || "- (one window a device)"} |`);
    };
    const auto = await run("", 0);
    const p = auto.placement!;
    row(`Halda's choice: k=${p.plan.k} [${p.per_cycle}]`, auto, p.plan.latencyMs.toFixed(0));
    for (const [windows, k] of [["8,7,7", 1], ["4,4,3", 2]] as const) {
      const perCycle = windows.split(",").map(Number);
      let price: string;
      try {
        price = priceRingWindows(p.devices, p.model, perCycle, k).latencyMs.toFixed(0);
      } catch (e) {
        price = `not priced (${(e as Error).message.slice(0, 80)})`;
      }
      row(`by hand: k=${k} [${windows}]`, await run(windows, k), price);
    }
  } finally {
    removeCgroups([...memory, ...blkio]);
  }
}

runWhenMain(import.meta.url, main);
