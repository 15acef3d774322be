// Kernel micro-benchmark: our fused dot per weight type against ggml's own CPU vec_dot (and, for Q4_K,
// llama.cpp's repacked 8x4 gemm, its prompt path on AVX2), on the same bytes, one core, in one run.
//
//   npm run build && node dist/bench/kernels.js [--types Q4_K,Q6_K] [--seconds 0.3] [--cold-mb 256] [--n 2048]
//
// hot: 64 weight rows (L2-resident), ns per block; cold: a matrix larger than the caches, GB/s of
// weights streamed (the decode regime), on one core and on two (rows split between the threads).
// Ratios are ggml time / our time (> 1: we are faster).
import { GgmlTypeId, MAX_NC, WEIGHT_TYPES, benchDot, quantizeAct, quantizeRef, simdLevel, typeInfo, type GgmlTypeName }
  from "../native/index.js";
import { ggmlBenchGemmQ4K, ggmlBenchVecDot, oracleUnavailable } from "./ggml-oracle.js";

interface Options { types: GgmlTypeName[]; seconds: number; coldMb: number; n: number }

function parseArgs(argv: string[]): Options {
  const o: Options = { types: [...WEIGHT_TYPES], seconds: 0.3, coldMb: 256, n: 2048 };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i + 1];
    switch (argv[i]) {
      case "--types": o.types = v.split(",") as GgmlTypeName[]; i++; break;
      case "--seconds": o.seconds = Number(v); i++; break;
      case "--cold-mb": o.coldMb = Number(v); i++; break;
      case "--n": o.n = Number(v); i++; break;
      default: throw new Error(`unknown argument ${argv[i]} (--types, --seconds, --cold-mb, --n)`);
    }
  }
  for (const t of o.types) if (!(t in GgmlTypeId) || !typeInfo(t)) throw new Error(`no kernels for type ${t}`);
  return o;
}

function normals(n: number, seed: number, std: number): Float32Array {
  let s = seed >>> 0;
  const r = () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) + 0.5) / 4294967296;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = std * Math.sqrt(-2 * Math.log(r())) * Math.cos(2 * Math.PI * r());
  return out;
}

/** `rows` weight rows: 64 distinct quantized rows, tiled. */
function weightMatrix(t: GgmlTypeName, n: number, rows: number): Uint8Array {
  const distinct = Math.min(rows, 64);
  const rowLen = quantizeRef(t, new Float32Array(n)).length;
  const m = new Uint8Array(rowLen * rows);
  for (let r = 0; r < distinct; r++) m.set(quantizeRef(t, normals(n, r + 1, 0.02)), r * rowLen);
  for (let r = distinct; r < rows; r *= 2) m.copyWithin(r * rowLen, 0, Math.min(r, rows - r) * rowLen);
  return m;
}

function acts(t: GgmlTypeName, n: number, nc: number): { bytes: Uint8Array; stride: number } {
  const info = typeInfo(t)!;
  const rows = Array.from({ length: nc }, (_, c) => quantizeAct(info.actType, normals(n, 1000 + c, 1)));
  const stride = rows[0].length;
  const bytes = new Uint8Array(stride * nc);
  rows.forEach((r, c) => bytes.set(r, c * stride));
  return { bytes, stride };
}

const fmt = (x: number, d = 2) => x.toFixed(d).padStart(8);

interface Timing { calls: number; seconds: number; bestPassSeconds: number }

/** Alternates the two engines `rounds` times; each run makes many passes over its rows and we keep the
 * fastest pass of all: on a shared machine it is the one least disturbed by other work. Returns seconds
 * per row (one dot call of nc rows). */
function bestOf(rounds: number, rows: number, ours: () => Timing, theirs: () => Timing): { ours: number; theirs: number } {
  let o = Infinity, t = Infinity;
  for (let r = 0; r < rounds; r++) {
    o = Math.min(o, ours().bestPassSeconds / rows);
    t = Math.min(t, theirs().bestPassSeconds / rows);
  }
  return { ours: o, theirs: t };
}

function main(): void {
  const o = parseArgs(process.argv.slice(2));
  const why = oracleUnavailable();
  if (why) {
    console.log(`bench/kernels: cannot run the ggml peer: ${why}`);
    process.exitCode = 1;
    return;
  }
  console.log(`prima kernels (${simdLevel()}) vs ggml CPU (haswell build), one core, n=${o.n}, ${o.seconds}s per point`);
  console.log(`reproduce: npm run build && node dist/bench/kernels.js ${process.argv.slice(2).join(" ")}`);
  console.log("ratio = ggml time / prima time (> 1 means prima is faster)\n");
  console.log(`type  | hot nc=1: ns/block prima ggml ratio | hot nc=${MAX_NC} (per row): prima ggml ratio | cold nc=1: GB/s prima ggml ratio | cold nc=1 2 threads: GB/s prima ggml ratio`);
  for (const t of o.types) {
    const info = typeInfo(t)!;
    const id = GgmlTypeId[t];
    const n = o.n;
    const blocksPerRow = n / info.blockElems;
    const hotRows = 64;
    const hot = weightMatrix(t, n, hotRows);
    const a1 = acts(t, n, 1), a4 = acts(t, n, MAX_NC);

    const slice = o.seconds / 3;
    const hot1 = bestOf(3, hotRows, () => benchDot(t, n, hot, a1.bytes, a1.stride, 1, hotRows, slice),
      () => ggmlBenchVecDot(id, n, hot, a1.bytes, hotRows, 1, slice));
    const nsOurs1 = (hot1.ours * 1e9) / blocksPerRow, nsTheirs1 = (hot1.theirs * 1e9) / blocksPerRow;

    // per activation row and block (ggml's vec_dot takes one activation row per call)
    const hot4 = bestOf(3, hotRows, () => benchDot(t, n, hot, a4.bytes, a4.stride, MAX_NC, hotRows, slice),
      () => ggmlBenchVecDot(id, n, hot, a4.bytes, hotRows, MAX_NC, slice));
    const nsOurs4 = (hot4.ours * 1e9) / (blocksPerRow * MAX_NC), nsTheirs4 = (hot4.theirs * 1e9) / (blocksPerRow * MAX_NC);

    const coldRows = Math.max(64, Math.floor((o.coldMb * 2 ** 20) / hot.length * hotRows));
    const cold = weightMatrix(t, n, coldRows);
    const rowBytesCold = cold.length / coldRows;
    const c1 = bestOf(3, coldRows, () => benchDot(t, n, cold, a1.bytes, a1.stride, 1, coldRows, slice),
      () => ggmlBenchVecDot(id, n, cold, a1.bytes, coldRows, 1, slice));
    const gbOurs = rowBytesCold / c1.ours / 1e9, gbTheirs = rowBytesCold / c1.theirs / 1e9;
    // decode with 2 threads: each pass streams the whole matrix, half the rows per thread
    const c2 = bestOf(3, coldRows, () => benchDot(t, n, cold, a1.bytes, a1.stride, 1, coldRows, slice, undefined, 2),
      () => ggmlBenchVecDot(id, n, cold, a1.bytes, coldRows, 1, slice, 2));
    const gb2Ours = rowBytesCold / c2.ours / 1e9, gb2Theirs = rowBytesCold / c2.theirs / 1e9;

    console.log(
      `${t.padEnd(5)} | ${fmt(nsOurs1)} ${fmt(nsTheirs1)} ${fmt(nsTheirs1 / nsOurs1)}  | ` +
      `${fmt(nsOurs4)} ${fmt(nsTheirs4)} ${fmt(nsTheirs4 / nsOurs4)}  | ${fmt(gbOurs)} ${fmt(gbTheirs)} ${fmt(gbOurs / gbTheirs)}  | ` +
      `${fmt(gb2Ours)} ${fmt(gb2Theirs)} ${fmt(gb2Ours / gb2Theirs)}`,
    );

    if (t === "Q4_K") {
      // llama.cpp's prompt path: Q4_K repacked 8 rows x 4 activation rows per gemm tile
      let nsGemm = Infinity;
      for (let r = 0; r < 3; r++) {
        nsGemm = Math.min(nsGemm, (ggmlBenchGemmQ4K(n, hotRows, slice).bestPassSeconds / hotRows * 1e9) / (blocksPerRow * 4));
      }
      console.log(`      | Q4_K prompt path: prima nc=${MAX_NC} ${fmt(nsOurs4)} ns/block/row, ggml repacked gemm 8x4 ` +
        `${fmt(nsGemm)} ns/block/row, ratio ${fmt(nsGemm / nsOurs4)}`);
    }
  }
}

main();
