// What sealing the ring's frames costs (ring/seal.ts, native/src/seal.c):
//  1. one token's frame (the benchmark model's 2048 f32 = 8 KiB of rows) sealed and opened by a JS link
//     (ring/seal.ts, through the addon's AES-GCM as the lane's), against the ring's time per token;
//  2. the ring's decode latency, 3 processes on loopback (2 devices on the native lane + the head, built
//     from ring/'s API by crypto-ring.ts), with keyed links against plaintext links, in interleaved
//     pairs whose order alternates; the ratio is the median of the pairs' ratios (goal <= 1.03).
//   node dist/bench/crypto.js [model.gguf] [rounds]
import { randomBytes } from "node:crypto";
import { LocalModel } from "../engine/index.js";
import { DialerProof, RING_COMPUTE_OPTIONS, listenerAnswer } from "../ring/index.js";
import { ringRun } from "./crypto-ring.js";
import { root } from "./procs.js";

const TOKENS = 64;
const PROMPT = "Once upon a time";
const CTX = 256;
/** Layers per device, the head's last (as --layer-windows 8,8,6). */
const WINDOWS = [8, 8, 6];

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
  const head = LocalModel.open(model, RING_COMPUTE_OPTIONS);
  try {
    if (WINDOWS.reduce((a, b) => a + b, 0) !== head.nLayers) throw new Error(`the model has ${head.nLayers} layers; this bench splits ${WINDOWS.join(",")}`);
    for (let i = 0; i < rounds; i++) {
      // The machine drifts: each pair runs back to back, and which goes first alternates.
      const order = i % 2 === 0 ? [false, true] : [true, false];
      const ms: Record<string, number> = {};
      for (const plaintext of order) {
        const r = await ringRun({ model: head, path: model, windows: WINDOWS, keyed: !plaintext, prompt: PROMPT, tokens: TOKENS, ctx: CTX });
        if (ids && JSON.stringify(ids) !== JSON.stringify(r.ids)) throw new Error("sealed and plaintext rings gave different tokens");
        ids = r.ids;
        ms[String(plaintext)] = r.msPerToken;
      }
      on.push(ms.false);
      off.push(ms.true);
      ratios.push(ms.false / ms.true);
      console.error(`pair ${i + 1}: sealed ${ms.false.toFixed(2)} ms/token, plaintext ${ms.true.toFixed(2)} ms/token`);
    }
  } finally {
    head.close();
  }
  const r = median(ratios);
  console.log("| links | ms/token (median) | ratio sealed/plaintext (median of pairs) | goal |");
  console.log("|---|---|---|---|");
  console.log(`| plaintext | ${median(off).toFixed(2)} | | |`);
  console.log(`| sealed | ${median(on).toFixed(2)} | ${r.toFixed(3)} (pairs ${ratios.map((x) => x.toFixed(3)).join(", ")}) | <= 1.03 |`);
  console.log(`\none token's frame (8 KiB of f32 rows) sealed and opened by a JS link: ${us.toFixed(1)} us; a token crosses 3 links: ` +
    `${((3 * us) / 1000 / median(off) * 100).toFixed(3)}% of a plaintext token`);
  console.log(`\nnode dist/bench/crypto.js ${modelArg || "[model.gguf]"} ${rounds} (or npm run bench -- --only crypto): 2 devices (native lane) + the head, layers ${WINDOWS.join(",")}`);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main(process.argv[2], process.argv[3] ? Number(process.argv[3]) : undefined).catch((e: unknown) => {
    console.error(`bench crypto: ${e instanceof Error ? e.message : String(e)}`);
    process.exitCode = 1;
  });
}
