// Our engine measured the way llama-bench measures llama.cpp: prompt = one batch of P random tokens
// from position 0 (logits of the last row), decode = D single-token steps from position 0, each with
// its embedding, forward, logits and a greedy pick: our whole per-token loop counts.
import { LocalModel, LocalPipeline, Rng, Sampler } from "../engine/index.js";
import { describeModel, layerReadBytes, modelProfile, readGguf } from "../model/index.js";
import { benchMemRead } from "../native/index.js";
import { runLlamaBench, type DepthOptions, type PeerBuild, type PeerResult } from "./llama-bench.js";

export interface EngineResult {
  readonly promptTokS: number;
  readonly decodeTokS: number;
}

export async function benchEngine(path: string, o: { threads: number; prompt: number; decode: number; reps: number } & DepthOptions): Promise<EngineResult> {
  const model = LocalModel.open(path, { threads: o.threads });
  // At a depth, the cache first holds `depth` tokens (not timed), as llama-bench -d fills it.
  const depth = o.depth ?? 0;
  const pipe = new LocalPipeline(model, depth + Math.max(o.prompt, o.decode) + 1, 512, o.kvCacheTypes);
  const rng = new Rng(42);
  const randomTokens = (n: number) => Int32Array.from({ length: n }, () => Math.floor(rng.next() * model.nVocab));
  const sampler = new Sampler({ temperature: 0 });
  const fill = async () => {
    pipe.truncate(0);
    for (let pos = 0; pos < depth; pos += 512) {
      const n = Math.min(512, depth - pos);
      await pipe.forward(model.embed(randomTokens(n)), pos, n);
    }
  };
  if (depth > 0) await fill();
  const run = async () => {
    pipe.truncate(depth);
    const t0 = performance.now();
    await pipe.forward(model.embed(randomTokens(o.prompt)), depth, o.prompt);
    const pp = (o.prompt / (performance.now() - t0)) * 1000;
    pipe.truncate(depth);
    const row = new Float32Array(model.nEmbd);
    const tok = randomTokens(1);
    const t1 = performance.now();
    for (let i = 0; i < o.decode; i++) {
      const logits = await pipe.forward(model.embed(tok, row), depth + i, 1);
      tok[0] = sampler.sample(logits);
    }
    const tg = (o.decode / (performance.now() - t1)) * 1000;
    return { pp, tg };
  };
  await run(); // warm-up: page in the weights, as llama-bench's own warm-up run does
  let pp = 0, tg = 0;
  for (let r = 0; r < o.reps; r++) {
    const x = await run();
    pp += x.pp;
    tg += x.tg;
  }
  pipe.close();
  model.close();
  return { promptTokS: pp / o.reps, decodeTokS: tg / o.reps };
}

/** prima and llama-bench on one file in alternating rounds (one rep each, `reps` times), averaged: run
 * one after the other, load that came and went during one engine's turn decided single runs (the moe
 * part's 1.9x and 2.7x on a loaded host were 0.92-1.21x quiet). */
export async function versusLlamaBench(path: string, o: { threads: number; prompt: number; decode: number; reps: number; roofline?: boolean; peer?: PeerBuild } & DepthOptions): Promise<{ ours: EngineResult; peer: PeerResult; readBytesPerS: number }> {
  let pp = 0, tg = 0, ppPeer = 0, tgPeer = 0, bw = 0, build = "";
  for (let r = 0; r < o.reps; r++) {
    const ours = await benchEngine(path, { ...o, reps: 1 });
    const peer = runLlamaBench(path, { ...o, reps: 1 });
    // for the roofline, the machine's read bandwidth in the same round: on a shared host it moves by 2x over a day
    if (o.roofline) bw += benchMemRead(READ_PROBE_BYTES, o.threads, 0.3);
    pp += ours.promptTokS;
    tg += ours.decodeTokS;
    ppPeer += peer.promptTokS;
    tgPeer += peer.decodeTokS;
    build = peer.build;
  }
  const n = Math.max(1, o.reps);
  return { ours: { promptTokS: pp / n, decodeTokS: tg / n }, peer: { promptTokS: ppPeer / n, decodeTokS: tgPeer / n, build }, readBytesPerS: bw / n }; // 0 without roofline
}

/** The read-bandwidth probe's buffer: well past the caches (the profiler's is 100 MiB). */
const READ_PROBE_BYTES = 512 * 2 ** 20;

/** Bytes of weights one decode step reads: every layer's (a mixture of experts: its active part), the
 * output layer, and one row of the embedding table. */
export function decodeReadBytes(path: string): number {
  const p = modelProfile(describeModel(readGguf(path)), { nCtx: 512 });
  return p.nLayers * layerReadBytes(p) + p.outputBytes + p.inputBytes / p.nVocab;
}

/** Decode's roofline: the bytes a token reads times tokens/s, as a share of the read bandwidth measured
 * in the same rounds, for both engines. */
export function rooflineLine(label: string, path: string, ours: EngineResult, peer: PeerResult, readBytesPerS: number): string {
  const bytes = decodeReadBytes(path);
  const share = (tokS: number) => `${((bytes * tokS) / 1e9).toFixed(1)} GB/s (${((100 * bytes * tokS) / readBytesPerS).toFixed(0)}%)`;
  return `- ${label}: a decode step reads ${(bytes / 2 ** 20).toFixed(1)} MiB; read bandwidth ${(readBytesPerS / 1e9).toFixed(1)} GB/s ` +
    `(plain reads, same threads, between rounds); decode reads prima ${share(ours.decodeTokS)}, llama.cpp ${share(peer.decodeTokS)}`;
}

/** A table row of prompt and decode speeds with their ratios against the goals. */
export function versusRow(label: string, ours: EngineResult, peer: PeerResult, goals: { pp?: number; tg: number }): string {
  const r = (a: number, b: number) => (a / b).toFixed(2);
  return `| ${label} | ${ours.promptTokS.toFixed(1)} | ${peer.promptTokS.toFixed(1)} | ${r(ours.promptTokS, peer.promptTokS)}x (${goals.pp === undefined ? "no goal" : `${goals.pp}x`}) | ` +
    `${ours.decodeTokS.toFixed(1)} | ${peer.decodeTokS.toFixed(1)} | ${r(ours.decodeTokS, peer.decodeTokS)}x (${goals.tg}x) |`;
}
