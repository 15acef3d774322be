// npm run bench [-- --only engine,memory,ring,halda,kernels,standin,passnoise,handoff,capped,crypto,serve,transfer,chaos,structured,moe,families,context,depth] [--threads N] [--reps N] [--chaos-seconds S] [--chaos-hogs N] [--caps 256,200,4x200] [--depths 512,2048,8192] [--peer native|norepack|avx2]
// Every part measures us and a peer in the same run and prints ratios (absolute numbers on a shared
// machine mean little). The latest results and their commands go in BENCHMARKS.md, earlier ones in
// bench/history/.
import { existsSync } from "node:fs";
import { parseArgs } from "node:util";
import { simdLevel } from "../native/index.js";
import { rooflineLine, versusLlamaBench, versusRow } from "./engine.js";
import { ensureLlamaBench, peerBuild, PEER_BUILDS } from "./llama-bench.js";
import { root, useTemporaryHome } from "./procs.js";


const { values } = parseArgs({
  options: {
    only: { type: "string" },
    threads: { type: "string", default: "2" },
    reps: { type: "string", default: "3" },
    "chaos-seconds": { type: "string", default: "180" },
    // chaos: busy processes beside the cluster (a build on the same machine); 0 for a quiet run
    "chaos-hogs": { type: "string", default: "2" },
    // capped: one setup per entry, three devices of that many MiB each, or NxMiB
    caps: { type: "string", default: "256,200,4x200" },
    // engine: which build of llama-bench to measure against (bench/llama-bench.ts PEER_BUILDS)
    peer: { type: "string", default: "native" },
    depths: { type: "string", default: "512,2048,8192" },
  },
});
const parts = new Set((values.only ?? "engine,memory,ring,halda,kernels,standin,passnoise,handoff,capped,crypto,serve,transfer,chaos,structured,moe,families,context,depth").split(","));
const threads = Number(values.threads);
const reps = Number(values.reps);
const log = (s: string) => console.error(s);

/** The generated benchmark model (tinyllama-1.1b shape, Q4_K_M, llama-spm vocabulary). */
async function benchmarkModel(): Promise<string> {
  const path = `${root}.cache/bench-llama-Q4_K_M.gguf`;
  if (existsSync(path)) return path;
  log(`generating the benchmark model at ${path} (once)`);
  const { generateModel } = await import("../modelgen/index.js");
  await generateModel({ shape: "tinyllama-1.1b", type: "Q4_K_M", out: path, vocab: "llama-spm", seed: 1 });
  return path;
}

async function engineBench(): Promise<void> {
  const peer = peerBuild(values.peer);
  ensureLlamaBench(log, peer);
  const models = [
    { name: "stories260K (F32)", path: `${root}models/stories260K.gguf`, prompt: 128, decode: 256, goals: { pp: undefined, tg: 0.5 } },
    { name: "tinyllama-1.1b Q4_K_M", path: await benchmarkModel(), prompt: 128, decode: 64, goals: { pp: 0.8 as number | undefined, tg: 1.0 }, roofline: true },
  ];
  console.log(`\n## engine vs llama-bench (${threads} threads, ${reps} reps)\n`);
  console.log("| model | prima prompt tok/s | llama.cpp prompt tok/s | ratio (goal) | prima decode tok/s | llama.cpp decode tok/s | ratio (goal) |");
  console.log("|---|---|---|---|---|---|---|");
  const roofline: string[] = [];
  for (const m of models) {
    const r = await versusLlamaBench(m.path, { threads, prompt: m.prompt, decode: m.decode, reps, roofline: "roofline" in m, peer });
    console.log(versusRow(m.name, r.ours, r.peer, m.goals));
    // stories260K's megabyte stays in the caches: no roofline to speak of
    if ("roofline" in m) roofline.push(rooflineLine(m.name, m.path, r.ours, r.peer, r.readBytesPerS));
  }
  console.log(`\nllama-bench (${PEER_BUILDS[peer].says}): -p P -n D -t ${threads} -r 1, ${reps} rounds alternating with prima's; prima (SIMD ${simdLevel()}): the same batch and steps through engine/ (bench/engine.ts)`);
  console.log(`\ndecode against the machine's read bandwidth:\n${roofline.join("\n")}`);
}

async function main(): Promise<void> {
  useTemporaryHome();
  console.log(`# npm run bench -- --only ${[...parts].join(",")} --threads ${threads} --reps ${reps}${parts.has("capped") ? ` --caps ${values.caps}` : ""}${values.peer !== "native" ? ` --peer ${values.peer}` : ""}`);
  if (parts.has("engine")) await engineBench();
  if (parts.has("moe")) await (await import("./moe.js")).main(threads, reps, log);
  if (parts.has("families")) await (await import("./families.js")).main(threads, reps, log);
  if (parts.has("context")) await (await import("./context.js")).main(threads, log);
  if (parts.has("depth")) await (await import("./context-depth.js")).depthSpeed(threads, reps, values.depths.split(",").map(Number), log);
  const model = ["memory", "ring", "serve", "transfer", "chaos", "standin", "passnoise", "handoff", "capped", "crypto", "structured"].some((p) => parts.has(p)) ? await benchmarkModel() : "";
  // Each part prints its own table; they live in dist/bench/ and also run alone.
  if (parts.has("memory")) await (await import("./memory.js")).main();
  if (parts.has("ring")) await (await import("./ring.js")).main(model, Math.max(reps, 7));
  if (parts.has("halda")) await (await import("./halda.js")).main();
  if (parts.has("kernels")) await import("./kernels.js"); // runs on import
  if (parts.has("standin")) await (await import("./stand-in.js")).main(model);
  if (parts.has("passnoise")) await (await import("./pass-noise.js")).main(model);
  if (parts.has("handoff")) await (await import("./hand-off.js")).main(model);
  if (parts.has("capped")) await (await import("./capped.js")).main(model, reps, values.caps.split(","));
  if (parts.has("crypto")) await (await import("./crypto.js")).main(model);
  if (parts.has("serve")) await (await import("./serve.js")).main(model, Math.max(reps, 5));
  // A round takes a fraction of a second and the plain copy swings from round to round: 9 at least.
  if (parts.has("transfer")) await (await import("./transfer.js")).main(model, Math.max(reps, 9));
  if (parts.has("structured")) await (await import("./structured.js")).main(model, threads, Math.max(reps, 5));
  if (parts.has("chaos")) await (await import("./chaos.js")).main(model, Number(values["chaos-seconds"]), Number(values["chaos-hogs"]));
}

main().catch((e: unknown) => {
  console.error(`bench: ${e instanceof Error ? e.message : String(e)}`);
  process.exitCode = 1;
});
