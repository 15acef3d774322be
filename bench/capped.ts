// npm run bench -- --only capped (root: it makes memory cgroups and drops the page cache)
// Issue #14: the benchmark model on three loopback devices (two workers and the head), each in its own
// memory cgroup (v1), at 3 x 256 MiB (the model fits in the sum) and 3 x 200 MiB (it does not), and
// with --caps 232 at 3 x 232 MiB (a layer or two short: a small overflow). For
// each cap: the automatic plan, a sweep of hand-made --layer-windows plans, prima alone in one such
// cgroup and llama.cpp's llama-bench alone in one; predicted against measured ms per token per device.
// Then what a streaming device does to its neighbours' compute on one host (streamingNeighbour), and
// one window larger than its memory, streamed or left to the kernel.
// The page cache is dropped before each run, the head starts first and each device of a setup reads its
// own copy of the model (as three machines would), so each device pays for the pages it reads (a page
// is charged to the cgroup that first reads it).
import { spawn, type ChildProcess } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { DeviceProfile, ModelProfile } from "../halda/index.js";
import { haldaIndexAt, priceRingWindows } from "../coordinator/index.js";
import { llamaBenchPath } from "./llama-bench.js";
import { coordCli, median, root, useTemporaryHome, workerCli } from "./procs.js";

const cgBase = "/sys/fs/cgroup/memory";
const MiB = 2 ** 20;
const N_PREDICT = 48, CTX = 256;
/** A run's context: CTX, or the next power of two that holds the prompt and nPredict tokens (a run never
 * shifts its context). */
const ctxFor = (nPredict: number) => Math.max(CTX, 2 ** Math.ceil(Math.log2(nPredict + 32)));
const gen = (nPredict: number) => ["-p", "Once upon a time", "-n", String(nPredict), "--temp", "0", "--ctx", String(ctxFor(nPredict))];

interface Proc { child: ChildProcess; out: string; err: string; exited: Promise<number | null>; signal: () => NodeJS.Signals | null }

function start(group: string | null, args: readonly string[], cmd = process.execPath, env?: NodeJS.ProcessEnv): Proc {
  const enter = group ? `echo $$ > '${join(cgBase, group, "cgroup.procs")}' && ` : "";
  const child = spawn("/bin/sh", ["-c", `${enter}exec "$0" "$@"`, cmd, ...args], { cwd: root, stdio: ["ignore", "pipe", "pipe"], env: env ?? process.env });
  const p: Proc = {
    child, out: "", err: "",
    exited: new Promise((r) => child.on("exit", (code) => r(code))),
    signal: () => child.signalCode,
  };
  child.stdout!.on("data", (d: Buffer) => { p.out += d.toString(); });
  child.stderr!.on("data", (d: Buffer) => { p.err += d.toString(); });
  return p;
}

async function waitFor(p: Proc, re: RegExp, ms: number): Promise<RegExpMatchArray> {
  const t0 = Date.now();
  for (;;) {
    const m = p.err.match(re);
    if (m) return m;
    if (Date.now() - t0 > ms || p.child.exitCode !== null) throw new Error(`timed out waiting for ${re}:\n${p.err.slice(-2000)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function makeGroup(name: string, capMiB: number): string {
  const dir = join(cgBase, name);
  if (!existsSync(dir)) mkdirSync(dir);
  writeFileSync(join(dir, "memory.limit_in_bytes"), String(capMiB * MiB));
  return name;
}

async function removeGroup(name: string): Promise<void> {
  for (let i = 0; i < 50; i++) {
    try {
      if (existsSync(join(cgBase, name))) rmdirSync(join(cgBase, name));
      return;
    } catch {
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

function dropCaches(): void {
  spawn("sync").on("exit", () => undefined);
  writeFileSync("/proc/sys/vm/drop_caches", "3");
}

interface Prediction {
  rows: { label: string; windowLayers: number; predicted: { totalMs: number; diskMs: number; computeMs: number }; predictedMs: number; measured: { computeMs: number; sendMs: number; descheduledMs: number }; measuredMs: number }[];
  predictedTokenMs: number; measuredTokenMs: number; predictedHopsMs: number; measuredRestMs: number;
}
interface RunJson {
  decode_tok_s: number;
  layer_windows: number[];
  devices_decode: { device: string; compute_ms: number; send_ms: number; wait_ms: number; descheduled_ms: number; major_faults: number; read_bytes?: number }[];
  placement?: { plan: { latencyMs: number; devices: { name: string; set: string; windowLayers: number; ramLayerCapacityBytes: number; reloadBytesPerToken: number }[] }; per_cycle: number[]; devices: DeviceProfile[]; model: ModelProfile; prediction: Prediction };
}

/** The workers' names in ring order (dev-a, dev-b, ...): a setup of n devices has n - 1 of them. */
const workerNames = (nWorkers: number) => Array.from({ length: nWorkers }, (_, i) => `dev-${String.fromCharCode(97 + i)}`);

/** Each device's own copy of a model (head, dev-a, dev-b, ...), as machines each have their own disk:
 * one file shared by three processes on one host puts a page on the bill of the cgroup that read it
 * first (a worker's profile pass reads layers another device will run), and one device's reclaim then
 * evicts another's pages. The head gets a copy too, made with the others: this VM's disk reads a file
 * written moments ago faster than one written hours ago (the host's own cache, which dropping ours
 * does not touch): a head streaming ~197 MiB a token from the model file itself worked 7-20% longer
 * than from a fresh copy (`--pairs`, windowPairs). The copies are removed after `body`. */
async function withDeviceFiles<T>(model: string, nDevices: number, body: (files: readonly string[]) => Promise<T>): Promise<T> {
  const dir = mkdtempSync(join(tmpdir(), "prima-capped-"));
  try {
    const copies = ["head", ...workerNames(nDevices - 1)].map((n) => join(dir, `${n}-${basename(model)}`));
    for (const c of copies) copyFileSync(model, c);
    return await body(copies);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Flags the coordinator takes and a worker does not (the others go to every process). */
const HEAD_ONLY_FLAGS = new Set(["--measure-routing", "--uniform-routing"]);

/** One ring run: the head then a worker for each further file (dev-a, dev-b, ...), each in a fresh
 * cgroup of capMiB (or of its own cap, head first), each reading its file of `files` (in that order).
 * `env`: for every process (a setup's own profile cache, its XDG_CACHE_HOME: cappedSetup). */
async function ringRun(files: readonly string[], capMiB: number | readonly number[], windows: readonly number[] | null, tag: string, flags: readonly string[] = [], env?: NodeJS.ProcessEnv, nPredict = N_PREDICT): Promise<RunJson> {
  const names = workerNames(files.length - 1);
  const caps = typeof capMiB === "number" ? files.map(() => capMiB) : capMiB;
  const groups = ["head", ...names].map((n, i) => makeGroup(`prima-capped-${process.pid}-${tag}-${n}`, caps[i]));
  const procs: Proc[] = [];
  try {
    dropCaches();
    await new Promise((r) => setTimeout(r, 500));
    const head = start(groups[0], [coordCli, "run", files[0], "--json", ...gen(nPredict), "--port", "0", "--min-workers", String(names.length), ...(windows ? ["--layer-windows", windows.join(",")] : []), ...flags], process.execPath, env);
    procs.push(head);
    const port = (await waitFor(head, /listening for workers on port (\d+)/, 120_000))[1];
    const tokenFile = (await waitFor(head, /--token-file (\S+)/, 5000))[1]; // the join token (trust/)
    for (const [i, name] of names.entries()) {
      procs.push(start(groups[i + 1], [workerCli, "--join", `127.0.0.1:${port}`, "--model", files[i + 1], "--name", name, "--once", "--token-file", tokenFile, ...flags.filter((f) => !HEAD_ONLY_FLAGS.has(f))], process.execPath, env));
      await waitFor(head, new RegExp(`"${name}" .*joined`), 120_000);
    }
    // unref'd: a pending limit must not keep the bench alive after its last run
    const code = await Promise.race([head.exited, new Promise((r) => setTimeout(() => r("timeout"), 600_000).unref())]);
    if (code !== 0) throw new Error(`head ${code === "timeout" ? "timed out" : `exited with ${code}`}:\n${head.err.slice(-3000)}`);
    const line = head.out.split("\n").find((l) => l.startsWith("{"));
    if (!line) throw new Error(`head printed no JSON:\n${head.err.slice(-3000)}`);
    if (!windows) {
      console.error(head.err.split("\n").filter((l) => /for layers|^\S.* M\d |plan:|token latency|reread|MoE-3|routing:/.test(l)).join("\n"));
      // Each worker's pass as it timed it for the plan (the last such lines): a device whose timing fell
      // in a slow moment shows here, with the median of its recent timings if that was used.
      for (const w of procs.slice(1)) console.error(w.err.split("\n").filter((l) => /profile: forward pass/.test(l)).slice(-2).join("\n"));
    }
    return JSON.parse(line) as RunJson;
  } finally {
    for (const p of procs) if (p.child.exitCode === null && p.child.signalCode === null) p.child.kill("SIGKILL");
    await Promise.all(procs.map((p) => Promise.race([p.exited, new Promise((r) => setTimeout(r, 3000).unref())])));
    for (const g of groups) await removeGroup(g);
  }
}

/** A process run alone in a capped cgroup may thrash for as long as it likes (llama-bench in 256 MiB
 * once ran 20 minutes where it is usually killed by the OOM killer): it gets this long. */
const ALONE_LIMIT_MS = 240_000;

/** The exit code, or "timeout" after ALONE_LIMIT_MS (the process is then killed). */
async function exitWithin(p: Proc): Promise<number | null | "timeout"> {
  let timer: NodeJS.Timeout | undefined;
  const limit = new Promise<"timeout">((r) => { timer = setTimeout(() => r("timeout"), ALONE_LIMIT_MS); });
  const code = await Promise.race([p.exited, limit]);
  clearTimeout(timer);
  if (code === "timeout") {
    p.child.kill("SIGKILL");
    await p.exited;
  }
  return code;
}

const thrashed = `did not finish within ${ALONE_LIMIT_MS / 1000} s (thrashing)`;

/** prima alone in one capped cgroup. */
async function aloneRun(model: string, capMiB: number, nPredict = N_PREDICT): Promise<number | string> {
  const g = makeGroup(`prima-capped-${process.pid}-alone`, capMiB);
  try {
    dropCaches();
    const p = start(g, [coordCli, "run", model, "--json", ...gen(nPredict)]);
    const code = await exitWithin(p);
    if (code === "timeout") return thrashed;
    if (code !== 0) return p.signal() === "SIGKILL" ? "killed (OOM)" : `failed (${code})`;
    return (JSON.parse(p.out.split("\n").find((l) => l.startsWith("{"))!) as RunJson).decode_tok_s;
  } finally {
    await removeGroup(g);
  }
}

/** llama-bench alone in one capped cgroup: decode tok/s, or how it ended. */
async function llamaRun(model: string, capMiB: number): Promise<number | string> {
  if (!existsSync(llamaBenchPath)) return "not built (npm run bench -- --only engine builds it)";
  const g = makeGroup(`prima-capped-${process.pid}-llama`, capMiB);
  try {
    dropCaches();
    const p = start(g, ["-m", model, "-t", "2", "-p", "0", "-n", "32", "-r", "1", "-o", "json"], llamaBenchPath);
    const code = await exitWithin(p);
    if (code === "timeout") return thrashed;
    const ooms = Number(/oom_kill (\d+)/.exec(readFileSync(join(cgBase, g, "memory.oom_control"), "utf8"))?.[1] ?? 0);
    if (code !== 0) return ooms > 0 || p.signal() === "SIGKILL" ? "killed by the OOM killer" : `failed (${code ?? p.signal()})`;
    const rows = JSON.parse(p.out) as { n_gen: number; avg_ts: number }[];
    return rows.find((r) => r.n_gen > 0)?.avg_ts ?? "no result";
  } finally {
    await removeGroup(g);
  }
}

const fmt = (v: number | string) => (typeof v === "number" ? v.toFixed(2) : v);

/** The run of median decode speed among the successful ones (undefined: none succeeded). */
function medianRun(runs: readonly RunJson[]): RunJson | undefined {
  const sorted = [...runs].sort((a, b) => a.decode_tok_s - b.decode_tok_s);
  return sorted[Math.floor((sorted.length - 1) / 2)];
}

/** Why capped setups cannot run here, or undefined. */
export function cappedUnavailable(): string | undefined {
  return existsSync(join(cgBase, "cgroup.procs")) ? undefined : `no cgroup v1 memory controller at ${cgBase}`;
}

/** The benchmark model's hand-made plans per setup, in ring order (the workers, then the head, which
 * also holds the output layer). */
const SWEEPS: Record<string, number[][]> = {
  "3x256": [[8, 8, 6], [9, 8, 5], [8, 9, 5], [7, 8, 7], [9, 9, 4]],
  "3x200": [[6, 12, 4], [12, 6, 4], [6, 6, 10], [7, 7, 8], [8, 8, 6]],
  // the three rooms a little short of the model: some device must stream a layer or two
  "3x232": [[8, 8, 6], [9, 8, 5], [8, 9, 5], [10, 8, 4], [9, 9, 4]],
  // four devices with room to spare together (800 MiB for 637): how the layers are shared decides
  "4x200": [[6, 6, 6, 4], [6, 6, 5, 5], [5, 6, 6, 5], [7, 6, 5, 4], [6, 5, 6, 5]],
};

/** One `--caps` entry on the benchmark model: a cap in MiB for three devices ("256"), or devices x cap
 * ("4x200"). Returns its summary line. */
async function benchmarkSetup(model: string, entry: string, reps: number): Promise<string> {
  const key = entry.includes("x") ? entry : `3x${entry}`;
  if (!SWEEPS[key]) throw new Error(`capped: no sweep of hand-made plans for ${entry} (--caps takes ${Object.keys(SWEEPS).map((k) => k.replace(/^3x/, "")).join(", ")})`);
  const [devices, cap] = key.split("x").map(Number);
  return cappedSetup(model, { name: "benchmark model", cap, devices, sweep: SWEEPS[key], reps, aloneGoal: key === "3x256" });
}

/** `--caps` entries: see benchmarkSetup. */
export async function main(model: string, reps = 3, caps: readonly string[] = ["256", "200", "4x200"]): Promise<void> {
  const why = cappedUnavailable();
  if (why) {
    console.log(`\n## capped devices: skipped (${why})`);
    return;
  }
  const summary: string[] = [];
  for (const entry of caps) summary.push(await benchmarkSetup(model, entry, reps));
  summary.push(await streamingNeighbour(model, reps));
  summary.push(...(await overflowingWindows(model)));
  console.log(`\n${summary.join("\n")}\nreproduce: npm run build && sudo node dist/bench/index.js --only capped`);
}

/** One capped setup: `devices` loopback devices (3 unless said) in memory cgroups of `cap` MiB each; the
 * automatic plan and a sweep of hand-made ones, `reps` rounds of each, the automatic plan once more
 * before them with every device's profile cache empty (a household's first run); prima and llama-bench
 * alone in one such cgroup; Halda's predictions against the measured ms per token. Issue #29's goals
 * for the automatic plan: >= 0.95x the best hand-made in every round, the same plan in every round.
 * `flags` go to every process (--expert-prefetch);
 * `autoVariants`: further automatic plans run beside the first each round, each with its flags too (what a
 * switch changes, e.g. MoE's expert prefetch). Returns the summary line. */
export async function cappedSetup(model: string, o: { name: string; cap: number; devices?: number; sweep: readonly number[][]; reps: number; aloneGoal: boolean; moe?: boolean; flags?: readonly string[]; autoVariants?: readonly { name: string; flags: readonly string[] }[]; nPredict?: number }): Promise<string> {
  const { cap, sweep, reps, flags = [], autoVariants = [], devices = 3, nPredict = N_PREDICT } = o;
  const bad = sweep.find((w) => w.length !== devices);
  if (bad) throw new Error(`capped: the hand-made plan [${bad}] does not have ${devices} windows`);
  console.log(`\n## capped devices: ${devices} x ${cap} MiB (memory cgroups), ${o.name}, decode ${nPredict} tokens, ctx ${ctxFor(nPredict)}, median of ${reps} rounds\n`);
  // Rounds: the automatic plan and every hand-made one once each per round, so that a slow spell of
  // this shared machine falls on all of them; each setup's median over the rounds counts.
  const autoRuns: RunJson[] = [], variantRuns = autoVariants.map(() => [] as RunJson[]);
  // by round: a hand-made plan's run in round r (undefined where it failed)
  const handRounds = sweep.map(() => [] as (RunJson | undefined)[]);
  const failures = sweep.map(() => "");
  // One household: its first run with every device's profile cache empty (and so no plan in force),
  // then the rounds with what that run and the later ones left there (profiles, rereads seen, the plan
  // in force), as a household's later runs have it. (With the first run's cache thrown away, round 1
  // planned afresh too, and two plans Halda priced equal could differ between the two.)
  const household = mkdtempSync(join(tmpdir(), "prima-capped-cache-"));
  const env = { ...process.env, XDG_CACHE_HOME: household };
  const { first: firstRun, alone, llama } = await withDeviceFiles(model, devices, async (files) => {
    const run = (windows: readonly number[] | null, tag: string, runFlags = flags) => ringRun(files, cap, windows, `${tag}${cap}`, runFlags, env, nPredict);
    const first = await run(null, "first");
    // Each round runs every plan once; every other round in the reverse order (ABBA), so that a drift
    // of the host over a round, or what one run leaves to the next, does not fall on one plan each time.
    const jobs: ((round: number) => Promise<void>)[] = [];
    jobs.push(async (round) => {
      const auto = await run(null, "auto");
      autoRuns.push(auto);
      // Every round's per-device counters (the table shows the median round's): ms per decode step.
      console.error(`automatic round ${round + 1}: ${(1000 / auto.decode_tok_s).toFixed(2)} ms a token; ` +
        auto.devices_decode.map((d) => `${d.device}: compute ${d.compute_ms.toFixed(2)}, send ${d.send_ms.toFixed(2)}, wait ${d.wait_ms.toFixed(2)}, preempted ${d.descheduled_ms.toFixed(2)}`).join("; "));
    });
    for (const [v, variant] of autoVariants.entries()) jobs.push(async () => void variantRuns[v].push(await run(null, "var", [...flags, ...variant.flags])));
    for (const [i, w] of sweep.entries()) {
      jobs.push(async (round) => {
        try {
          handRounds[i][round] = await run(w, "hand");
        } catch (e) {
          failures[i] = `failed: ${(e as Error).message.split("\n")[0]}`;
        }
      });
    }
    for (let r = 0; r < reps; r++) for (const job of r % 2 === 0 ? jobs : [...jobs].reverse()) await job(r);
    // alone: on the head's copy, as the head's machine would run the model by itself
    return { first, alone: await aloneRun(files[0], cap, nPredict), llama: await llamaRun(files[0], cap) };
  }).finally(() => rmSync(household, { recursive: true, force: true }));
  const auto = medianRun(autoRuns)!;
  const handRuns = handRounds.map((rs) => rs.filter((x): x is RunJson => x !== undefined));
  const handMedians = handRuns.map(medianRun);
  const best: { w: number[]; tokS: number; i: number } = { w: [], tokS: 0, i: -1 };
  const hand: string[] = [];
  for (const [i, w] of sweep.entries()) {
    const tokS: number | string = handMedians[i]?.decode_tok_s ?? failures[i];
    hand.push(`${w.join(",")}: ${fmt(tokS)} (${handRuns[i].map((x) => x.decode_tok_s.toFixed(1)).join(", ")})`);
    if (typeof tokS === "number" && tokS > best.tokS) Object.assign(best, { w, tokS, i });
  }
  const pl = auto.placement!;
  console.log("| setup | decode tok/s | ratio |");
  console.log("|---|---|---|");
  console.log(`| automatic (Halda) [${auto.layer_windows.join(",")}] (median of ${autoRuns.map((x) => `${x.decode_tok_s.toFixed(1)} [${x.layer_windows}]`).join(", ")}) | ${auto.decode_tok_s.toFixed(2)} | ${(auto.decode_tok_s / best.tokS).toFixed(2)}x the best hand-made (goal >= 0.95) |`);
  for (const [v, { name }] of autoVariants.entries()) {
    const variant = medianRun(variantRuns[v]);
    if (!variant) continue;
    const pr = variant.placement?.prediction;
    const predicted = pr ? `; predicted ${pr.predictedTokenMs.toFixed(1)} ms a token, measured ${pr.measuredTokenMs.toFixed(1)}` : "";
    console.log(`| automatic, ${name} [${variant.layer_windows.join(",")}] (median of ${variantRuns[v].map((x) => `${x.decode_tok_s.toFixed(1)} [${x.layer_windows}]`).join(", ")}) | ${variant.decode_tok_s.toFixed(2)} | ${(variant.decode_tok_s / auto.decode_tok_s).toFixed(2)}x without${predicted} |`);
  }
  console.log(`| best hand-made [${best.w.join(",")}] (of ${hand.join("; ")}) | ${best.tokS.toFixed(2)} | 1.00 |`);
  const priced = handPrices(auto, sweep, handMedians);
  // A round's automatic run against the best hand-made plan's run in that round (a round runs every
  // plan once, back to back, so that a slow spell of this shared machine falls on all of them); the
  // first run, before the rounds, against that plan's median. Beside it, each against the median.
  const rounds = [{ label: "first run (empty profile caches)", run: firstRun, peer: best.tokS },
    ...autoRuns.map((run, r) => ({ label: `round ${r + 1}`, run, peer: handRounds[best.i]?.[r]?.decode_tok_s ?? best.tokS }))];
  const plans = new Set(rounds.map((x) => x.run.layer_windows.join(",")));
  const worst = Math.min(...rounds.map((x) => x.run.decode_tok_s / x.peer));
  const stability = `automatic by round, against the best hand-made plan's run in the same round (the first run: its median): ${rounds.map((x) => `${x.label} [${x.run.layer_windows}] ${(x.run.decode_tok_s / x.peer).toFixed(2)}x`).join(", ")}; ` +
    `against its median: ${rounds.map((x) => `${(x.run.decode_tok_s / best.tokS).toFixed(2)}x`).join(", ")}; ` +
    `the same plan in every round: ${plans.size === 1 ? "yes" : `no (${plans.size} plans)`}; worst round ${worst.toFixed(2)}x the best hand-made (goal >= 0.95 in every round)`;
  console.log(`| prima alone in ${cap} MiB | ${fmt(alone)} | ${typeof alone === "number" ? `ring ${(auto.decode_tok_s / alone).toFixed(2)}x alone${o.aloneGoal ? " (goal >= 5)" : ""}` : "-"} |`);
  console.log(`| llama-bench alone in ${cap} MiB (-n 32 -t 2) | ${fmt(llama)} | - |`);
  console.log(`\n${stability}`);
  // Halda's choice apart from the runs' noise: the automatic plan's windows run by hand in the same
  // rounds (identical windows, two samples: on this shared host they differ by up to ~10% a run).
  const twin = sweep.findIndex((w) => w.join(",") === auto.layer_windows.join(","));
  const twinTokS = handMedians[twin]?.decode_tok_s;
  const choice = twinTokS === undefined ? `the automatic plan [${auto.layer_windows}] is not among the hand-made ones`
    : `the automatic plan's windows [${auto.layer_windows}] run by hand: ${twinTokS.toFixed(2)} tok/s, ${(twinTokS / best.tokS).toFixed(2)}x the best hand-made (Halda's choice); its automatic runs ${(auto.decode_tok_s / twinTokS).toFixed(2)}x its runs by hand (the same windows)`;
  console.log(`\n${choice}`);
  if (priced) console.log(`\n${priced}`);
  // Each device's own work, as Halda prices it (compute, memory, disk) and as measured (compute and
  // send, less the time another device's threads had its CPU: these three share one machine's 2
  // vCPUs); the hops, Halda's comm terms, beside what no device's counters hold (coordinator/placement.ts).
  console.log("\n| device (automatic plan) | set | window | predicted ms/token: own work (disk) | measured ms/token (compute+send-preempted) | error | major faults in decode | MiB read a token |");
  console.log("|---|---|---|---|---|---|---|---|");
  const pr = pl.prediction;
  const rel = (measured: number, predicted: number) => (measured - predicted) / predicted;
  const signed = (e: number | undefined) => (e === undefined ? "-" : `${e >= 0 ? "+" : ""}${(100 * e).toFixed(0)}%`);
  const pct = (measured: number, predicted: number) => signed(rel(measured, predicted));
  for (const row of pr.rows) {
    const mm = row.measured, m = row.measuredMs;
    const d = pl.plan.devices.find((x) => row.label.includes(x.name) || (row.label.startsWith("head") && x.name === "head"));
    const dd = auto.devices_decode.find((x) => x.device === row.label);
    const readMiB = dd?.read_bytes === undefined ? "-" : (dd.read_bytes / MiB).toFixed(1);
    console.log(`| ${row.label} | ${d?.set ?? "-"} | ${row.windowLayers} | ${row.predictedMs.toFixed(2)} (${row.predicted.diskMs.toFixed(2)}) | ${m.toFixed(2)} (${mm.computeMs.toFixed(2)}+${mm.sendMs.toFixed(2)}-${mm.descheduledMs.toFixed(2)}) | ${pct(m, row.predictedMs)} | ${dd?.major_faults ?? "-"} | ${readMiB} |`);
  }
  console.log(`| hops (measured: the token less every device's own work) | | | ${pr.predictedHopsMs.toFixed(2)} | ${pr.measuredRestMs.toFixed(2)} | ${pct(pr.measuredRestMs, pr.predictedHopsMs)} | | |`);
  console.log(`| token | | | ${pr.predictedTokenMs.toFixed(2)} | ${pr.measuredTokenMs.toFixed(2)} | ${pct(pr.measuredTokenMs, pr.predictedTokenMs)} | | |`);
  // Every round planned and timed its devices anew: each round's errors, and each row's median of them.
  const roundErrors = autoRuns.map((run) => run.placement!.prediction).map((p) => new Map([
    ...p.rows.map((r) => [r.label, rel(r.measuredMs, r.predictedMs)] as const), ["token", rel(p.measuredTokenMs, p.predictedTokenMs)] as const]));
  const labels = [...pr.rows.map((r) => r.label), "token"];
  const short = (label: string) => label.split(" (")[0];
  console.log(`\nerror by round (${labels.map(short).join(", ")}): ${roundErrors.map((es, r) => `round ${r + 1} ${labels.map((l) => signed(es.get(l))).join(", ")}`).join("; ")}; ` +
    `each row's median over the rounds: ${labels.map((l) => `${short(l)} ${signed(median(roundErrors.flatMap((es) => es.get(l) ?? [])))}`).join(", ")}`);
  // The disk-bound limit: what no plan can avoid rereading (the weights beyond every device's room
  // together), at the measured disk speed, on top of the predicted compute.
  const summary = `${o.name}, ${devices} x ${cap} MiB: automatic ${auto.decode_tok_s.toFixed(2)} tok/s, best hand-made ${best.tokS.toFixed(2)} [${best.w}], alone ${fmt(alone)}, llama-bench ${fmt(llama)}; ` +
    `plans ${plans.size === 1 ? "the same" : `${plans.size} different`} in ${rounds.length} runs, worst ${worst.toFixed(2)}x; ${choice}`;
  // (dense: every byte past the rooms comes back each token; a MoE token rereads only routed experts)
  if (o.moe) return summary;
  const planReread = pl.plan.devices.reduce((s, d) => s + d.reloadBytesPerToken, 0);
  const diskBps = pl.devices[0].diskSeqReadBytesPerS ?? 1e9;
  const computeMs = pr.rows.reduce((s, r) => s + r.predicted.computeMs, 0);
  const need = await modelWeightBytes(model);
  const room = pl.plan.devices.reduce((s, d) => s + Math.max(0, d.ramLayerCapacityBytes), 0);
  const minReread = Math.max(0, need.layers - room * (need.layerBytes / need.layerBytesWithKv));
  const limitMs = computeMs + (1000 * minReread) / diskBps;
  console.log(`\nreread per token: plan ${(planReread / MiB).toFixed(1)} MiB (predicted); the least any plan must reread ${(minReread / MiB).toFixed(1)} MiB ` +
    `(${(need.layers / MiB).toFixed(1)} MiB of layers, room for ${(room / MiB).toFixed(1)} MiB of layers with their KV); disk ${(diskBps / 1e6).toFixed(0)} MB/s; ` +
    `disk-bound limit ${limitMs.toFixed(1)} ms/token (${(1000 / limitMs).toFixed(2)} tok/s): measured ${pr.measuredTokenMs.toFixed(1)} ms, ${(pr.measuredTokenMs / limitMs).toFixed(2)}x the limit`);
  return summary;
}

/** What Halda thinks of each hand-made plan: priced on the profiles the automatic median run was
 * planned with (as it would have priced them then), beside its median measured ms a token, and where
 * each device's share goes (compute+disk+comm), so a plan it ranks wrongly shows which term misled it. */
function handPrices(auto: RunJson, sweep: readonly number[][], handMedians: readonly (RunJson | undefined)[]): string | undefined {
  const pl = auto.placement;
  if (!pl?.devices || !pl.model) return undefined;
  const n = pl.devices.length - 1;
  const rows = sweep.map((w, i) => {
    let plan;
    try {
      plan = priceRingWindows(pl.devices, pl.model, w);
    } catch (e) {
      return `[${w}] not priced (${(e as Error).message})`;
    }
    const m = handMedians[i];
    const byPos = w.map((_, pos) => plan.devices.find((d) => d.index === haldaIndexAt(pos, n)));
    const parts = byPos.map((d) => (d ? `${d.latency.computeMs.toFixed(1)}+${d.latency.diskMs.toFixed(1)}+${d.latency.commMs.toFixed(1)}` : "-")).join(" | ");
    // the median run's own work per device in ring order (compute + send - preempted) and its major
    // faults in the decode: beside the price, which device ran over it
    const mine = m && w.map((_, pos) => m.devices_decode.find((d) => d.device.startsWith(pos < n ? `w${pos + 1} ` : "head")));
    const ownWork = mine?.every((d) => d) ? ` (${mine.map((d) => (d!.compute_ms + d!.send_ms - d!.descheduled_ms).toFixed(1)).join(" | ")}; major faults ${mine.map((d) => d!.major_faults).join("/")})` : "";
    return `[${w}] ${plan.latencyMs.toFixed(1)} ms (${parts})${plan.problems.length ? ` problems: ${plan.problems.join("; ")}` : ""}, measured ${m ? (1000 / m.decode_tok_s).toFixed(1) : "-"} ms${ownWork}`;
  });
  const own = `[${auto.layer_windows}] (the automatic plan) ${pl.plan.latencyMs.toFixed(1)} ms`;
  return `Halda's price of each plan, ms a token (per device in ring order: compute+disk+comm), on the automatic median run's profiles: ${own}; ${rows.join("; ")}`;
}

/** The plan [6,12,4] with the head in 1024 MiB and w1 in 200, w2 in 200 MiB (it streams most of its
 * 12 layers) or in 1024 (it holds them), alternating for `reps` rounds: what a streaming device does to
 * the others' own work when they share one host's CPUs, which no preemption counter of theirs holds
 * (on separate devices there is nothing to share). Their median compute ms a token either way. */
async function streamingNeighbour(model: string, reps: number): Promise<string> {
  const plan = [6, 12, 4];
  const runs: Record<"streams" | "holds", RunJson[]> = { streams: [], holds: [] };
  // A run that fails (a device in 200 MiB can stall past its heartbeat limit and be dropped) is counted
  // and said, not fatal: the other runs and the bench's other parts still report.
  const failed: string[] = [];
  const tryRun = async (caps: number[], into: RunJson[]) => {
    try {
      into.push(await ringRun([model, model, model], caps, plan, "nbr"));
    } catch (e) {
      failed.push(`[${caps}] ${(e as Error).message.split("\n").find((l) => /lost|failed|timed out/.test(l)) ?? (e as Error).message.split("\n")[0]}`);
    }
  };
  for (let r = 0; r < reps; r++) {
    await tryRun([1024, 200, 200], runs.streams);
    await tryRun([1024, 200, 1024], runs.holds);
  }
  const failures = failed.length ? ` (${failed.length} run(s) failed: ${failed.join("; ")})` : "";
  if (runs.streams.length === 0 || runs.holds.length === 0) {
    console.log(`\n## a streaming device's neighbours on one host: [${plan}]: no comparison${failures}`);
    return `a streaming w2 beside its neighbours: not measured${failures}`;
  }
  if (failures) console.error(`a streaming device's neighbours:${failures}`);
  const devices = runs.holds[0].devices_decode.map((d) => d.device);
  // By device name, not position: every run lists its devices in its own order.
  const cost = (rs: RunJson[], i: number, f: (d: RunJson["devices_decode"][number]) => number) =>
    median(rs.map((x) => f(x.devices_decode.find((d) => d.device === devices[i])!)));
  const at = (name: string) => devices.findIndex((d) => d.startsWith(name));
  console.log(`\n## a streaming device's neighbours on one host: [${plan}], head 1024 MiB, w1 200 MiB, w2 200 MiB (streams) or 1024 MiB (holds its window), median of ${reps} rounds${failures}\n`);
  console.log("| w2 | decode tok/s | w2 MiB read a token | " + devices.map((d) => `${d.split(" (")[0]} compute ms a token (preempted)`).join(" | ") + " |");
  console.log("|---|---|---|" + devices.map(() => "---|").join(""));
  for (const k of ["streams", "holds"] as const) {
    const rs = runs[k];
    console.log(`| ${k} | ${median(rs.map((x) => x.decode_tok_s)).toFixed(2)} | ${(cost(rs, at("w2"), (d) => d.read_bytes ?? 0) / MiB).toFixed(0)} | ` +
      devices.map((_, i) => `${cost(rs, i, (d) => d.compute_ms).toFixed(2)} (${cost(rs, i, (d) => d.descheduled_ms).toFixed(2)})`).join(" | ") + " |");
  }
  const ratio = (i: number) => (cost(runs.streams, i, (d) => d.compute_ms) / cost(runs.holds, i, (d) => d.compute_ms)).toFixed(2);
  // Part of it is the idle gap before their passes, longer beside a device that streams (the token is
  // longer): the same window in one process, uncapped, after the profile's 10 ms gap and after 45 ms.
  const { LocalModel } = await import("../engine/index.js");
  const { RING_COMPUTE_OPTIONS } = await import("../ring/index.js");
  const { medianForwardMs } = await import("./idle-gap.js");
  const lm = LocalModel.open(model, { threads: 2, ...RING_COMPUTE_OPTIONS });
  let gaps: number[];
  try {
    gaps = [await medianForwardMs(lm, 10), await medianForwardMs(lm, 45)];
  } finally {
    lm.close();
  }
  console.log(`\none process, the first 7 layers: ${gaps[0].toFixed(2)} ms a pass after a 10 ms idle gap, ${gaps[1].toFixed(2)} after 45 ms (${(gaps[1] / gaps[0]).toFixed(2)}x)`);
  return `a streaming w2 beside its neighbours: head compute ${ratio(at("head"))}x, w1 ${ratio(at("w1"))}x what they take beside a w2 holding its window; ` +
    `a pass after a 45 ms idle gap ${(gaps[1] / gaps[0]).toFixed(2)}x one after 10 ms`;
}

/** Layer bytes of the model (all layers), b and b' at CTX: from the model's own profile. */
async function modelWeightBytes(path: string): Promise<{ layers: number; layerBytes: number; layerBytesWithKv: number }> {
  const { describeModel, kvBytesPerLayer, modelProfile, readGguf } = await import("../model/index.js");
  const mp = modelProfile(describeModel(readGguf(path)), { nCtx: CTX });
  return { layers: mp.layerBytes * mp.nLayers, layerBytes: mp.layerBytes, layerBytesWithKv: mp.layerBytes + kvBytesPerLayer(mp) };
}

// ---- one window larger than its memory -----------------------------------------------------------

interface WindowSetup { readonly first: number; readonly end: number; readonly capMiB: number }
/** 12 layers (300 MiB) in 200 MiB: a long streamed tail; 10 layers (248 MiB) in 256 MiB: a short one,
 * where keeping part of a layer (native streamBeyond) saves most; the same in 268 MiB: ~20 MiB short,
 * where the kernel alone rereads the whole window each pass (cyclic access under LRU) and streaming
 * rereads the excess, a layer and the margin (what Halda prices, however small the excess). */
const WINDOWS: readonly WindowSetup[] = [{ first: 6, end: 18, capMiB: 200 }, { first: 0, end: 10, capMiB: 256 }, { first: 0, end: 10, capMiB: 268 }];
const WINDOW_PASSES = 20;

/** In this process (started in a capped cgroup): one-token passes over one window, the layers past
 * its room streamed or left to the kernel; per pass, ms and MiB read from the file (/proc/self/io).
 * Prints JSON. */
async function windowPasses(model: string, win: WindowSetup, streamed: boolean): Promise<void> {
  const { LocalModel } = await import("../engine/index.js");
  const { layerRoomBytes, readMemory } = await import("../profiler/index.js");
  const readBytes = () => Number(/read_bytes: (\d+)/.exec(readFileSync("/proc/self/io", "utf8"))![1]);
  const m = LocalModel.open(model, { threads: 2 });
  const w = m.window(win.first, win.end, { ctx: CTX, maxBatch: 128 });
  const acts = new Float32Array(m.nEmbd).fill(0.01);
  const passes: { ms: number; readMiB: number }[] = [];
  for (let p = 0; p < WINDOW_PASSES; p++) {
    const read0 = readBytes(), t0 = performance.now();
    await w.forward(acts.slice(), p, 1);
    passes.push({ ms: performance.now() - t0, readMiB: (readBytes() - read0) / MiB });
    // what ring/node.ts does after each pass of a device's only window
    const room = layerRoomBytes(readMemory(), w.residency().residentBytes);
    if (streamed) w.streamBeyond(Math.min(room, 2 ** 52));
  }
  w.close();
  m.close();
  console.log(JSON.stringify(passes));
}

/** The same window in a capped cgroup, left to the kernel and streamed: the medians of the last half
 * of the passes. */
async function overflowingWindow(model: string, win: WindowSetup): Promise<string> {
  const rows: { label: string; readMiB: number; ms: number }[] = [];
  for (const streamed of [false, true]) {
    const g = makeGroup(`prima-capped-${process.pid}-window`, win.capMiB);
    try {
      dropCaches();
      const p = start(g, [fileURLToPath(import.meta.url), "--window-passes", model, streamed ? "streamed" : "kernel", JSON.stringify(win)]);
      const code = await exitWithin(p);
      if (code !== 0) throw new Error(`window passes ${code === "timeout" ? "timed out" : `exited with ${code}`}:\n${p.err.slice(-2000)}`);
      const late = (JSON.parse(p.out) as { ms: number; readMiB: number }[]).slice(WINDOW_PASSES / 2);
      rows.push({ label: streamed ? "streamed" : "left to the kernel", readMiB: median(late.map((x) => x.readMiB)), ms: median(late.map((x) => x.ms)) });
    } finally {
      await removeGroup(g);
    }
  }
  console.log(`\n## one window larger than its memory: layers ${win.first}-${win.end - 1} of the benchmark model in ${win.capMiB} MiB, one-token passes, medians of the last ${WINDOW_PASSES / 2} of ${WINDOW_PASSES}\n`);
  console.log("| pages | MiB read a pass | ms a pass |");
  console.log("|---|---|---|");
  for (const r of rows) console.log(`| ${r.label} | ${r.readMiB.toFixed(0)} | ${r.ms.toFixed(0)} |`);
  return `layers ${win.first}-${win.end - 1} in ${win.capMiB} MiB: ${rows.map((r) => `${r.label} ${r.readMiB.toFixed(0)} MiB read, ${r.ms.toFixed(0)} ms a pass`).join("; ")}`;
}

/** Every window of WINDOWS in turn: their summary lines. */
async function overflowingWindows(model: string): Promise<string[]> {
  const lines: string[] = [];
  for (const win of WINDOWS) lines.push(await overflowingWindow(model, win));
  return lines;
}

/** One setup's same windows three ways, `reps` rounds in ABBA order: the automatic plan, the windows by
 * hand, and by hand with the head on the model file itself instead of a fresh copy. What separates two
 * runs of identical windows (automatic or not), and what an old file costs a streaming head on a VM
 * whose host caches what was just written (BENCHMARKS.md, capped). */
async function windowPairs(model: string, cap: number, windows: readonly number[], reps: number): Promise<void> {
  const household = mkdtempSync(join(tmpdir(), "prima-capped-cache-"));
  const env = { ...process.env, XDG_CACHE_HOME: household };
  console.log(`\n## the same windows three ways: ${windows.length} x ${cap} MiB, [${windows}], ${reps} rounds (ABBA)\n`);
  console.log("| round | run | plan | ms a token | head's own ms a token | head's MiB read a token |");
  console.log("|---|---|---|---|---|---|");
  const ms = new Map<string, number[]>();
  await withDeviceFiles(model, windows.length, async (files) => {
    const kinds = [
      { name: "automatic", files, w: null },
      { name: "by hand", files, w: windows },
      { name: "by hand, head on the model file itself", files: [model, ...files.slice(1)], w: windows },
    ];
    for (let r = 0; r < reps; r++) {
      for (const k of r % 2 === 0 ? kinds : [...kinds].reverse()) {
        const run = await ringRun(k.files, cap, k.w, "pair", [], env);
        const head = run.devices_decode.find((d) => d.device.startsWith("head"))!;
        const tokenMs = 1000 / run.decode_tok_s;
        ms.set(k.name, [...(ms.get(k.name) ?? []), tokenMs]);
        console.log(`| ${r + 1} | ${k.name} | [${run.layer_windows}] | ${tokenMs.toFixed(1)} | ${(head.compute_ms + head.send_ms - head.descheduled_ms).toFixed(1)} | ${((head.read_bytes ?? 0) / MiB).toFixed(1)} |`);
      }
    }
  }).finally(() => rmSync(household, { recursive: true, force: true }));
  console.log(`\nmedian ms a token: ${[...ms].map(([k, v]) => `${k} ${median(v).toFixed(1)}`).join(", ")}`);
}

// node dist/bench/capped.js --window model.gguf: only the overflowing windows (root); --neighbour
// model.gguf [reps]: only a streaming device's neighbours (root); --setup model.gguf 4x200 [reps]: only
// that setup (root); --pairs model.gguf 200 6,6,10 [reps]: those windows three ways (windowPairs, root);
// --window-passes: the child --window starts in the capped cgroup.
// (each with its profiles in a temporary home, as the whole bench keeps them)
if (["--window", "--neighbour", "--setup", "--pairs"].includes(process.argv[2])) useTemporaryHome();
if (process.argv[2] === "--window-passes") void windowPasses(process.argv[3], JSON.parse(process.argv[5]) as WindowSetup, process.argv[4] === "streamed");
else if (process.argv[2] === "--window") void overflowingWindows(process.argv[3]).then((lines) => console.log(`\n${lines.join("\n")}`));
else if (process.argv[2] === "--setup") void benchmarkSetup(process.argv[3], process.argv[4], Number(process.argv[5] ?? 3)).then((line) => console.log(`\n${line}`));
else if (process.argv[2] === "--pairs") void windowPairs(process.argv[3], Number(process.argv[4]), process.argv[5].split(",").map(Number), Number(process.argv[6] ?? 3));
else if (process.argv[2] === "--neighbour") void streamingNeighbour(process.argv[3], Number(process.argv[4] ?? 3)).then((line) => console.log(`\n${line}`));
