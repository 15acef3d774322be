// node dist/bench/expert-prefetch.js [capMiB] [tokens] [model.gguf] (root: it makes a memory cgroup and drops the
// page cache). Expert prefetch on a memory-capped device (issue #29): the MoE benchmark model
// (bench/moe.ts) as one window over every layer, in a cgroup v1 memory group of capMiB (default 200,
// about half its weights), streamed past its room as a ring device's only window is; greedy one-token
// decode passes with the expert prefetch off, ahead (before each layer's attention) and early (a
// layer before), each with the expert tensors read with read-around and without it (MADV_RANDOM, `+random`),
// twice in turn. Per mode: decode tokens/s, MiB read from
// the file a token (/proc/self/io), and the prefetch's counters (experts predicted, routed; bytes
// advised, used, wasted). The page cache is dropped before each mode and the group removed after.
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { ExpertPrefetchCounters, ExpertPrefetchMode } from "../native/index.js";
import { median, root, useTemporaryHome } from "./procs.js";

const cgBase = "/sys/fs/cgroup/memory";
const MiB = 2 ** 20;
/** Prefetch modes, each with read-around on the expert tensors and without it (MADV_RANDOM). */
const VARIANTS = ["off", "off+random", "ahead", "ahead+random", "early", "early+random"];
const MODEL = process.argv[process.argv[2] === "--child" ? 5 : 4] ?? `${root}.cache/bench-qwen3moe-Q4_K_M.gguf`;
const PROMPT = [1, 9038, 2501, 263, 931, 29892, 727, 471]; // any ids: the generated model's routing, not its text, matters

interface Result { mode: string; tokS: number; readMiBPerToken: number; msPerToken: number; counters: ExpertPrefetchCounters }

/** In the capped child: the prompt, then `tokens` greedy one-token passes, streamed as ring/node.ts does. */
async function child(variant: string, tokens: number): Promise<void> {
  const mode = variant.replace(/\+random$/, "") as ExpertPrefetchMode;
  const { LocalModel } = await import("../engine/index.js");
  const { layerRoomBytes, readMemory } = await import("../profiler/index.js");
  const readBytes = () => Number(/read_bytes: (\d+)/.exec(readFileSync("/proc/self/io", "utf8"))![1]);
  const m = LocalModel.open(MODEL, { threads: 2 });
  const w = m.window(0, m.nLayers, { ctx: 256, maxBatch: 32 });
  w.expertPrefetch(mode);
  w.expertsRandom(variant.endsWith("+random"));
  const logits = new Float32Array(m.nVocab);
  const stream = () => w.streamBeyond(Math.min(layerRoomBytes(readMemory(), w.residency().residentBytes), 2 ** 52));
  await w.forward(m.embed(Int32Array.from(PROMPT)), 0, PROMPT.length, logits);
  stream();
  const ms: number[] = [];
  const read0 = readBytes(), t0 = performance.now();
  for (let i = 0; i < tokens; i++) {
    const next = logits.indexOf(Math.max(...logits));
    const t = performance.now();
    await w.forward(m.embed(Int32Array.of(next)), PROMPT.length + i, 1, logits);
    ms.push(performance.now() - t);
    stream();
  }
  const wall = performance.now() - t0;
  const r: Result = {
    mode: variant, tokS: (tokens * 1000) / wall, readMiBPerToken: (readBytes() - read0) / MiB / tokens, msPerToken: median(ms),
    counters: w.info().expertPrefetch!,
  };
  w.close();
  m.close();
  console.log(JSON.stringify(r));
}

async function capped(mode: string, capMiB: number, tokens: number): Promise<Result> {
  const group = `prima-xp-${process.pid}`;
  const dir = join(cgBase, group);
  if (!existsSync(dir)) mkdirSync(dir);
  try {
    writeFileSync(join(dir, "memory.limit_in_bytes"), String(capMiB * MiB));
    await new Promise((r) => spawn("sync").on("exit", r));
    writeFileSync("/proc/sys/vm/drop_caches", "3");
    const p = spawn("/bin/sh", ["-c", `echo $$ > '${join(dir, "cgroup.procs")}' && exec "$0" "$@"`, process.execPath,
      fileURLToPath(import.meta.url), "--child", mode, String(tokens), MODEL], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    p.stdout!.on("data", (d: Buffer) => { out += d.toString(); });
    const timer = setTimeout(() => p.kill("SIGKILL"), 180_000); // a limit on every wait
    const code = await new Promise<number | null>((r) => p.on("exit", r));
    clearTimeout(timer);
    if (code !== 0) throw new Error(`the ${mode} run exited with ${code}`);
    return JSON.parse(out) as Result;
  } finally {
    for (let i = 0; i < 50 && existsSync(dir); i++) {
      try { rmdirSync(dir); } catch { await new Promise((r) => setTimeout(r, 100)); }
    }
  }
}

async function main(capMiB: number, tokens: number): Promise<void> {
  if (!existsSync(MODEL)) throw new Error(`${MODEL} is missing: npm run bench -- --only moe makes it`);
  console.log(`## expert prefetch: ${MODEL} (12 layers, 32 experts, 4 used) in ${capMiB} MiB, ${tokens} greedy tokens\n`);
  console.log("| expert prefetch | decode tok/s | ms a token (median) | MiB read a token | predicted | routed of them | MiB advised | used | wasted |");
  console.log("|---|---|---|---|---|---|---|---|---|");
  for (const mode of [...VARIANTS, ...VARIANTS]) {
    const r = await capped(mode, capMiB, tokens);
    const c = r.counters;
    console.log(`| ${mode} | ${r.tokS.toFixed(2)} | ${r.msPerToken.toFixed(1)} | ${r.readMiBPerToken.toFixed(1)} | ${c.predicted} | ${c.hits} (${c.predicted ? ((100 * c.hits) / c.predicted).toFixed(0) : 0}%) | ` +
      `${(c.advisedBytes / MiB).toFixed(0)} | ${(c.usedBytes / MiB).toFixed(0)} | ${(c.wastedBytes / MiB).toFixed(0)} |`);
  }
}

if (process.argv[2] === "--child") void child(process.argv[3], Number(process.argv[4]));
else {
  // Profiles and caches go to a temporary home (its child inherits it), never the user's ~/.cache/prima.
  useTemporaryHome();
  void main(Number(process.argv[2] ?? 200), Number(process.argv[3] ?? 32));
}
