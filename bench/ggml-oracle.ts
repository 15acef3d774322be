// llama.cpp's ggml as an oracle for the kernel tests and bench/kernels.ts: compiles the small C harness
// test/native/ggml_oracle.c with gcc (once, cached in the temp dir by content hash) and runs it on
// node-llama-cpp's prebuilt ggml libraries. Linux x64 only; elsewhere `oracleUnavailable()` says why.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readFileSync, mkdirSync, renameSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { packageRoot } from "../base/index.js";
import { cpuHasFlag } from "./cpu-flags.js";

const root = packageRoot();
const libDir = join(root, "node_modules", "@node-llama-cpp", "linux-x64", "bins", "linux-x64");
const source = join(root, "test", "native", "ggml_oracle.c");

/** The ggml CPU library variant matching this CPU's SIMD level (what llama.cpp would pick, minus AVX-512). */
function cpuVariant(): string {
  return cpuHasFlag("avx2") && cpuHasFlag("fma") && cpuHasFlag("f16c") ? "haswell" : "x64";
}

let built: string | null = null;
let failure: string | null = null;

/** Why the oracle cannot run here, or null when it can. */
export function oracleUnavailable(): string | null {
  if (built) return null;
  if (failure) return failure;
  if (process.platform !== "linux" || process.arch !== "x64") {
    return (failure = `ggml oracle needs linux-x64 prebuilt ggml libraries (this is ${process.platform}-${process.arch})`);
  }
  if (!existsSync(join(libDir, "libggml-base.so"))) return (failure = `ggml libraries not found in ${libDir}`);
  const src = readFileSync(source);
  const hash = createHash("sha256").update(src).digest("hex").slice(0, 16);
  const dir = join(tmpdir(), "prima-ggml-oracle");
  const exe = join(dir, `ggml_oracle-${hash}`);
  if (!existsSync(exe)) {
    mkdirSync(dir, { recursive: true });
    const tmp = `${exe}.${process.pid}.tmp`;
    const cc = spawnSync("gcc", ["-O2", "-std=gnu11", "-o", tmp, source, "-ldl", "-lpthread"], { encoding: "utf8" });
    if (cc.error || cc.status !== 0) {
      return (failure = `gcc could not build the ggml oracle: ${cc.error?.message ?? cc.stderr}`);
    }
    renameSync(tmp, exe);
  }
  built = exe;
  return null;
}

/** Runs one oracle op (see ggml_oracle.c) with input on stdin; returns stdout. Throws on any failure. */
export function runOracle(op: string, args: (number | string)[], input: Uint8Array): Buffer {
  const why = oracleUnavailable();
  if (why) throw new Error(why);
  const r = spawnSync(built!, [libDir, cpuVariant(), op, ...args.map(String)], {
    input,
    maxBuffer: 1 << 30,
    env: { ...process.env, LD_LIBRARY_PATH: libDir },
  });
  if (r.error || r.status !== 0) {
    throw new Error(`ggml oracle ${op} ${args.join(" ")} failed: ${r.error?.message ?? r.stderr.toString()}`);
  }
  return r.stdout;
}

function bytesOf(a: Float32Array | Uint8Array): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

/** llama.cpp's quantize_row_<type>_ref (F16/BF16: its row converters; IQ4_NL: quantize_iq4_nl, what llama-quantize writes). */
export function ggmlQuantizeRef(type: number, x: Float32Array): Uint8Array {
  return new Uint8Array(runOracle("quantize_ref", [type, x.length], bytesOf(x)));
}

/** llama.cpp's dequantize_row_<type>. */
export function ggmlDequantize(type: number, bytes: Uint8Array, n: number): Float32Array {
  const out = runOracle("dequantize", [type, n], bytes);
  return new Float32Array(out.buffer.slice(out.byteOffset, out.byteOffset + out.byteLength));
}

/** The activation quantizer ggml's CPU backend uses for a vec_dot_type (type traits from_float). */
export function ggmlFromFloat(type: number, x: Float32Array): Uint8Array {
  return new Uint8Array(runOracle("from_float", [type, x.length], bytesOf(x)));
}

/** ggml's CPU vec_dot of one weight row against nc activation rows (contiguous, vec_dot_type format). */
export function ggmlVecDot(type: number, n: number, w: Uint8Array, acts: Uint8Array, nc: number): Float32Array {
  const input = new Uint8Array(w.length + acts.length);
  input.set(w, 0);
  input.set(acts, w.length);
  const out = runOracle("vec_dot", [type, n, nc], input);
  return new Float32Array(out.buffer.slice(out.byteOffset, out.byteOffset + out.byteLength));
}

/** Totals over all passes, and the fastest single pass over the rows. */
export interface OracleTiming { calls: number; seconds: number; bestPassSeconds: number }

function parseTiming(out: Buffer): OracleTiming {
  const [calls, seconds, bestPassSeconds] = out.toString().trim().split(/\s+/).map(Number);
  return { calls, seconds, bestPassSeconds };
}

/** Times ggml's vec_dot over `rows` weight rows, each against nc activation rows (nc calls per row);
 * with threads > 1 each pass splits the rows between that many threads. */
export function ggmlBenchVecDot(type: number, n: number, w: Uint8Array, acts: Uint8Array, rows: number, nc: number,
  minSeconds: number, threads = 1): OracleTiming {
  const input = new Uint8Array(w.length + acts.length);
  input.set(w, 0);
  input.set(acts, w.length);
  return parseTiming(runOracle("bench_vec_dot", [type, n, rows, nc, minSeconds, threads], input));
}

/** Times llama.cpp's repacked Q4_K gemm (8 weight rows x 4 activation rows per tile) over `rows` rows. */
export function ggmlBenchGemmQ4K(n: number, rows: number, minSeconds: number): OracleTiming {
  return parseTiming(runOracle("bench_gemm", [12, n, rows, minSeconds], new Uint8Array(0)));
}
