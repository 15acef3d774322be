// What sealing the ring's frames costs (ring/seal.ts, native/src/seal.c):
//  1. one token's frame (the benchmark model's 2048 f32 = 8 KiB of rows) sealed and opened by a JS link
//     (ring/seal.ts, through the addon's AES-GCM as the lane's), against the ring's time per token;
//  2. the ring's decode latency, 3 processes on loopback (2 workers on the native lane + the head),
//     with keyed links against plaintext links (PRIMA_BENCH_PLAINTEXT_LINKS=1), in interleaved pairs
//     whose order alternates; the ratio is the median of the pairs' ratios (goal <= 1.03).
//   node dist/bench/crypto.js [model.gguf] [rounds]
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { DialerProof, listenerAnswer } from "../ring/index.js";
import { root } from "./procs.js";

const TOKENS = 64;
const GEN = ["-p", "Once upon a time", "-n", String(TOKENS), "--temp", "0", "--ctx", "256"];

interface Report {
  generated_ids: number[];
  decode_tok_s: number;
}

/** A node CLI of ours, its stderr gathered; resolves with its stdout when it exits. */
function run(cli: string, args: string[], env: NodeJS.ProcessEnv = {}) {
  const child = spawn(process.execPath, [`${root}dist/${cli}`, ...args], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
  let out = "";
  let err = "";
  child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (err += d.toString()));
  const exited = new Promise<number | null>((r) => child.on("exit", r));
  const waitFor = async (re: RegExp): Promise<RegExpMatchArray> => {
    for (const t0 = Date.now(); Date.now() - t0 < 120_000; await new Promise((r) => setTimeout(r, 20))) {
      const m = err.match(re);
      if (m) return m;
    }
    throw new Error(`timed out waiting for ${re}:\n${err}`);
  };
  return { child, exited, waitFor, out: () => out, err: () => err };
}

async function ring(model: string, plaintext: boolean): Promise<Report> {
  const coord = run("coordinator/cli.js", ["run", model, "--json", "--port", "0", "--min-workers", "2", "--layer-windows", "8,8,6", ...GEN],
    plaintext ? { PRIMA_BENCH_PLAINTEXT_LINKS: "1" } : {});
  const workers: ReturnType<typeof run>[] = [];
  try {
    const port = (await coord.waitFor(/listening for workers on port (\d+)/))[1];
    const tokenFile = (await coord.waitFor(/--token-file (\S+)/))[1]; // the join token (trust/)
    for (const name of ["crypto1", "crypto2"]) {
      workers.push(run("worker/cli.js", ["--join", `127.0.0.1:${port}`, "--model", model, "--name", name, "--once", "--token-file", tokenFile]));
      await coord.waitFor(new RegExp(`"${name}" .*joined`));
    }
    const code = await coord.exited;
    if (code !== 0) throw new Error(`ring run failed:\n${coord.err()}`);
    if (plaintext !== /NOT encrypted/.test(coord.err())) throw new Error("the ring's links were not what this run asked for");
    return JSON.parse(coord.out().split("\n").find((l) => l.startsWith("{"))!);
  } finally {
    for (const w of workers) w.child.kill("SIGKILL");
    coord.child.kill("SIGKILL");
  }
}

/** Microseconds to seal and open one frame of `rowBytes` by a JS link's cipher. */
function sealOpenUs(rowBytes: number): number {
  const key = randomBytes(32);
  const dialer = new DialerProof(key);
  const answer = listenerAnswer(key, dialer.first())!;
  const sender = dialer.answer(answer.reply)!;
  const frame = Buffer.concat([Buffer.from("PRMA"), Buffer.alloc(28), randomBytes(rowBytes)]);
  const n = 20_000;
  for (let i = 0; i < 1000; i++) answer.cipher.open(sender.seal(frame)); // warm up
  const t0 = performance.now();
  for (let i = 0; i < n; i++) answer.cipher.open(sender.seal(frame));
  return ((performance.now() - t0) * 1000) / n;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

export async function main(modelArg?: string, rounds = 5): Promise<void> {
  const model = modelArg || `${root}.cache/bench-llama-Q4_K_M.gguf`;
  console.log(`\n## ring links sealed (AES-256-GCM) vs plaintext (decode, ${TOKENS} tokens, ${model.split("/").pop()}, ${rounds} pairs)\n`);
  const us = sealOpenUs(2048 * 4);
  const on: number[] = [];
  const off: number[] = [];
  const ratios: number[] = [];
  let ids: number[] | undefined;
  for (let i = 0; i < rounds; i++) {
    // The machine drifts: each pair runs back to back, and which goes first alternates.
    const order = i % 2 === 0 ? [false, true] : [true, false];
    const ms: Record<string, number> = {};
    for (const plaintext of order) {
      const r = await ring(model, plaintext);
      if (ids && JSON.stringify(ids) !== JSON.stringify(r.generated_ids)) throw new Error("sealed and plaintext rings gave different tokens");
      ids = r.generated_ids;
      ms[String(plaintext)] = 1000 / r.decode_tok_s;
    }
    on.push(ms.false);
    off.push(ms.true);
    ratios.push(ms.false / ms.true);
    console.error(`pair ${i + 1}: sealed ${ms.false.toFixed(2)} ms/token, plaintext ${ms.true.toFixed(2)} ms/token`);
  }
  const r = median(ratios);
  console.log("| links | ms/token (median) | ratio sealed/plaintext (median of pairs) | goal |");
  console.log("|---|---|---|---|");
  console.log(`| plaintext | ${median(off).toFixed(2)} | | |`);
  console.log(`| sealed | ${median(on).toFixed(2)} | ${r.toFixed(3)} (pairs ${ratios.map((x) => x.toFixed(3)).join(", ")}) | <= 1.03 |`);
  console.log(`\none token's frame (8 KiB of f32 rows) sealed and opened by a JS link: ${us.toFixed(1)} us; a token crosses 3 links: ` +
    `${((3 * us) / 1000 / median(off) * 100).toFixed(3)}% of a plaintext token`);
  console.log(`\nnode dist/bench/crypto.js ${modelArg || "[model.gguf]"} ${rounds} (or npm run bench -- --only crypto): 2 workers (native lane) + the head, --layer-windows 8,8,6`);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main(process.argv[2], process.argv[3] ? Number(process.argv[3]) : undefined).catch((e: unknown) => {
    console.error(`bench crypto: ${e instanceof Error ? e.message : String(e)}`);
    process.exitCode = 1;
  });
}
