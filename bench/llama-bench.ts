// The speed peer: llama.cpp's own llama-bench, compiled for this CPU from the source node-llama-cpp
// bundles, cached in .cache/ (ignored by git). Built once (about 6-15 minutes on 2 cores), then reused.
// For the record (issue #35), two more builds on request (`--peer`): the same without its runtime
// repacking of weights (GGML_CPU_REPACK off), and one for AVX2 only (what an AVX2 host's build does;
// set PRIMA_SIMD=avx2 for prima beside it).
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import type { KvCacheTypes } from "../model/index.js";
import { cpuHasFlag } from "./cpu-flags.js";
import { root } from "./procs.js";

export interface PeerResult {
  /** tokens per second, mean over repetitions */
  readonly promptTokS: number;
  readonly decodeTokS: number;
  readonly build: string;
}

const srcDir = join(root, "node_modules/node-llama-cpp/llama/llama.cpp");

/** On CPUs with Intel's AMX tiles, llama.cpp's AMX matmul (what -march=native compiles in on
 * such a CPU) segfaults on its first prompt here (Xeon 6, 2026-11-29: `ldtilecfg` of a tile config the
 * compiler left unset; ggml-org/llama.cpp#20824, fix proposed in #26954), so the native builds leave
 * AMX out (GCC's -mno-amx-* win over -march=native) and keep its repacked AVX-512 kernels. */
const noAmx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16";
const native = cpuHasFlag("amx_int8")
  ? { dir: "-noamx", flags: ["-DGGML_NATIVE=ON", `-DCMAKE_C_FLAGS=${noAmx}`, `-DCMAKE_CXX_FLAGS=${noAmx}`], says: "built for this CPU without AMX (its AMX path crashes here)" }
  : { dir: "", flags: ["-DGGML_NATIVE=ON"], says: "built for this CPU" };

/** The builds of llama-bench: each one's folder under .cache/ and its CMake switches. */
export const PEER_BUILDS = {
  native: { dir: `llama-build${native.dir}`, flags: native.flags, says: native.says },
  norepack: { dir: `llama-build-norepack${native.dir}`, flags: [...native.flags, "-DGGML_CPU_REPACK=OFF"], says: `${native.says}, its weight repacking off` },
  avx2: {
    dir: "llama-build-avx2", says: "built for AVX2 (no AVX-512)",
    flags: ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF"],
  },
} as const;
export type PeerBuild = keyof typeof PEER_BUILDS;

const dirOf = (peer: PeerBuild) => join(root, ".cache", PEER_BUILDS[peer].dir);
const binOf = (peer: PeerBuild) => join(dirOf(peer), "bin/llama-bench");
export const llamaBenchPath = binOf("native");

/** The --peer a bench was given, checked. */
export function peerBuild(name: string): PeerBuild {
  if (!(name in PEER_BUILDS)) throw new Error(`--peer takes ${Object.keys(PEER_BUILDS).join(", ")} (got "${name}")`);
  return name as PeerBuild;
}

/** The peer's llama-bench, built first where it is not yet. */
export function ensureLlamaBench(log: (s: string) => void, peer: PeerBuild = "native"): string {
  const path = binOf(peer);
  if (existsSync(path)) return path;
  const buildDir = dirOf(peer);
  if (!existsSync(join(srcDir, "CMakeLists.txt"))) {
    log("llama-bench: unpacking llama.cpp's source from node-llama-cpp (offline)");
    execFileSync("npx", ["--no-install", "node-llama-cpp", "source", "download", "--skipBuild", "--gpu", "false"], { cwd: root, stdio: "inherit" });
  }
  mkdirSync(buildDir, { recursive: true });
  log(`llama-bench: building into ${buildDir}, ${PEER_BUILDS[peer].says} (once; about 6-15 minutes on 2 cores)`);
  const run = (args: string[]) => {
    const r = spawnSync("cmake", args, { cwd: root, stdio: "inherit" });
    if (r.status !== 0) throw new Error(`cmake ${args.join(" ")} failed (exit ${r.status})`);
  };
  run(["-S", srcDir, "-B", buildDir, ...PEER_BUILDS[peer].flags, "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DCMAKE_BUILD_TYPE=Release"]);
  run(["--build", buildDir, "--target", "llama-bench", "-j2"]);
  return path;
}

interface LlamaBenchRow {
  n_prompt: number;
  n_gen: number;
  avg_ts: number;
  build_commit?: string;
  cpu_info?: string;
}

/** What a run is measured at beyond its batch sizes: tokens already in the cache (llama-bench -d, with
 * flash attention on, as prima's attention is) and the cache's types. */
export interface DepthOptions {
  readonly depth?: number;
  readonly kvCacheTypes?: KvCacheTypes;
}

/** llama-bench's JSON rows for one model and thread count, and its decode (tg) row, which every run here has. */
function llamaBenchRows(peer: PeerBuild, model: string, threads: number, args: readonly string[]): { rows: LlamaBenchRow[]; tg: LlamaBenchRow } {
  const out = execFileSync(binOf(peer), ["-m", model, "-t", String(threads), ...args, "-o", "json"], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], maxBuffer: 1 << 24 });
  const rows = JSON.parse(out) as LlamaBenchRow[];
  const tg = rows.find((r) => r.n_gen > 0 && r.n_prompt === 0);
  if (!tg) throw new Error(`llama-bench printed no tg row: ${out.slice(0, 200)}`);
  return { rows, tg };
}

/** Runs llama-bench for prompt and decode speed on one model with the given threads. */
export function runLlamaBench(model: string, opts: { threads: number; prompt: number; decode: number; reps: number; peer?: PeerBuild } & DepthOptions): PeerResult {
  const deep = opts.depth ? ["-d", String(opts.depth), "-fa", "on"] : [];
  const types = opts.kvCacheTypes ? ["-ctk", opts.kvCacheTypes.k, "-ctv", opts.kvCacheTypes.v, ...(opts.depth ? [] : ["-fa", "on"])] : [];
  const { rows, tg } = llamaBenchRows(opts.peer ?? "native", model, opts.threads,
    ["-p", String(opts.prompt), "-n", String(opts.decode), "-r", String(opts.reps), ...deep, ...types]);
  const pp = rows.find((r) => r.n_prompt > 0 && r.n_gen === 0);
  if (!pp) throw new Error(`llama-bench printed no pp row: ${JSON.stringify(rows).slice(0, 200)}`);
  return { promptTokS: pp.avg_ts, decodeTokS: tg.avg_ts, build: rows[0].build_commit ?? "?" };
}

/** llama.cpp's cost of one pass over a batch of n tokens (llama-bench -p n; for the weights, the
 * arithmetic of n sequences' one token each) against its one-token decode step's, for each n. */
export function llamaBatchCost(model: string, opts: { threads: number; sizes: readonly number[]; reps: number }): Map<number, number> {
  const { rows, tg } = llamaBenchRows("native", model, opts.threads, ["-p", opts.sizes.join(","), "-n", "32", "-r", String(opts.reps)]);
  const cost = new Map<number, number>();
  for (const n of opts.sizes) {
    const pp = rows.find((r) => r.n_prompt === n && r.n_gen === 0);
    if (pp) cost.set(n, (n / pp.avg_ts) / (1 / tg.avg_ts));
  }
  return cost;
}
