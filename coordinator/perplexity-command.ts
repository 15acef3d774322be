// prima-coord perplexity model.gguf -f text.txt: how well the model predicts a text, computed as
// llama-perplexity computes it (engine/perplexity.ts), so the two agree on the same file; with
// --kl-divergence-base / --kl-divergence, how far a model (another quantization, a cache type, an
// approximation) strays from a base model's log-probabilities, in llama-perplexity's own file format.
import { closeSync, openSync, readFileSync, writeSync } from "node:fs";
import { parseArgs } from "node:util";
import {
  KlStats, LocalModel, LocalPipeline, baseRowSlots, decodeBaseHeader, encodeBaseHeader, encodeBaseRow, perplexity,
  scoredPerChunk, summarizeKl, type KlSummary, type PerplexityResult,
} from "../engine/index.js";
import { Tokenizer, kvCacheProblem, printable, type KvCacheTypes } from "../model/index.js";
import { UsageError, intArg, usageExit } from "./args.js";
import { KV_CACHE_HELP, KV_CACHE_OPTIONS, expandKvCacheShortFlags, kvCacheTypesFrom } from "./kv-cache-options.js";

const HELP = `usage: prima-coord perplexity model.gguf -f text.txt [options]

  -f, --file FILE              the text to score
  -c, --ctx N                  tokens per chunk (default 512, as llama-perplexity); the second half of
                               each chunk is scored, and the text needs at least 2 chunks
  -b, --batch N                rows per pass (default: the chunk, at most 512)
  -t, --threads N              compute threads (default: all cores)
${KV_CACHE_HELP}
      --chunks N               score at most N chunks
      --kl-divergence-base F   also write the log-probabilities to F (llama-perplexity's format)
      --kl-divergence          compare with the base file F instead (its tokens and ctx; no -f)
      --json                   print one JSON object at the end`;

interface PerplexityArgs {
  readonly model: string;
  readonly file?: string;
  readonly ctx: number;
  readonly batch?: number;
  readonly threads?: number;
  readonly chunks?: number;
  readonly klBase?: string;
  readonly klCompare: boolean;
  readonly json: boolean;
  readonly kvCacheTypes: KvCacheTypes;
}

export function parsePerplexityArgs(argv: string[]): PerplexityArgs {
  const { values, positionals } = parseArgs({
    args: expandKvCacheShortFlags(argv), allowPositionals: true,
    options: {
      file: { type: "string", short: "f" }, ctx: { type: "string", short: "c" }, batch: { type: "string", short: "b" },
      threads: { type: "string", short: "t" }, chunks: { type: "string" }, "kl-divergence-base": { type: "string" },
      "kl-divergence": { type: "boolean" }, json: { type: "boolean" }, help: { type: "boolean", short: "h" }, ...KV_CACHE_OPTIONS,
    },
  });
  if (values.help) throw new UsageError(HELP);
  if (positionals.length !== 1) throw new UsageError(`perplexity needs exactly one model file\n${HELP}`);
  const klCompare = values["kl-divergence"] ?? false;
  if (klCompare && !values["kl-divergence-base"]) throw new UsageError("--kl-divergence needs --kl-divergence-base FILE (the base's log-probabilities)");
  if (!klCompare && !values.file) throw new UsageError(`perplexity needs a text: -f FILE\n${HELP}`);
  let kvCacheTypes: KvCacheTypes;
  try {
    kvCacheTypes = kvCacheTypesFrom(values);
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  const opt = (k: "batch" | "threads" | "chunks", min: number) => values[k] === undefined ? undefined : intArg(k, values[k], 0, min);
  return {
    model: positionals[0], file: values.file, ctx: intArg("ctx", values.ctx, 512, 4), batch: opt("batch", 1),
    threads: opt("threads", 1), chunks: opt("chunks", 1), klBase: values["kl-divergence-base"], klCompare, json: values.json ?? false,
    kvCacheTypes,
  };
}

export interface PerplexityReport extends Omit<PerplexityResult, "evaluated"> {
  readonly ctx: number;
  readonly seconds: number;
  readonly kl?: KlSummary;
}

export async function perplexityCommand(argv: string[]): Promise<number> {
  let a: PerplexityArgs;
  try {
    a = parsePerplexityArgs(argv);
  } catch (e) {
    return usageExit(e);
  }
  const model = LocalModel.open(a.model, { threads: a.threads });
  const tok = Tokenizer.fromGguf(model.gguf);
  const nVocab = model.nVocab;
  let tokens: Int32Array;
  let ctx = a.ctx;
  let base: { file: Buffer; rowsOffset: number } | undefined;
  if (a.klCompare) {
    const file = readFileSync(a.klBase!);
    const h = decodeBaseHeader(file, printable(a.klBase!));
    if (h.nVocab !== nVocab) throw new Error(`${printable(a.klBase!)} was computed with a vocabulary of ${h.nVocab} tokens, this model has ${nVocab}`);
    tokens = h.tokens;
    ctx = h.nCtx;
    base = { file, rowsOffset: h.rowsOffset };
  } else {
    tokens = tok.encode(readFileSync(a.file!, "utf8"), { addSpecial: true, parseSpecial: false });
    if (tokens.length < 2 * ctx) throw new Error(`${printable(a.file!)} has ${tokens.length} tokens: a context of ${ctx} needs at least ${2 * ctx} (lower --ctx)`);
  }
  if (ctx > model.desc.hparams.nCtxTrain) throw new Error(`--ctx ${ctx} is beyond the model's context of ${model.desc.hparams.nCtxTrain}`);
  const batch = Math.min(a.batch ?? 512, ctx);
  const kvProblem = kvCacheProblem(model.desc.hparams, a.kvCacheTypes);
  if (kvProblem) throw new Error(kvProblem);
  const pipeline = new LocalPipeline(model, ctx, batch, a.kvCacheTypes);
  const slots = baseRowSlots(nVocab);
  const kl = base ? new KlStats() : undefined;
  const scored = scoredPerChunk(ctx);
  const rowBuf = new Uint16Array(slots);
  let out: number | undefined;
  const t0 = performance.now();
  try {
    if (a.klBase && !a.klCompare) {
      out = openSync(a.klBase, "w");
      const nChunks = Math.min(Math.floor(tokens.length / ctx), a.chunks ?? Infinity);
      writeSync(out, encodeBaseHeader({ nCtx: ctx, nVocab, nChunks, tokens: tokens.subarray(0, nChunks * ctx) }));
    }
    const r = await perplexity(model, pipeline, tokens, {
      nCtx: ctx, batch, bos: tok.addBos ? tok.bos : null, nVocab, maxChunks: a.chunks,
      rowLogits: (row) => model.logits(row),
      onScored: (chunk, i, logits, next) => {
        if (kl && base) {
          const at = base.rowsOffset + ((chunk * scored + i) * slots) * 2;
          kl.add(logits, nVocab, new Uint16Array(base.file.buffer.slice(base.file.byteOffset + at, base.file.byteOffset + at + slots * 2)), next);
        } else if (out !== undefined) {
          encodeBaseRow(logits, nVocab, rowBuf);
          writeSync(out, rowBuf);
        }
      },
      onChunk: (c, n, ppl) => { if (!a.json) process.stderr.write(`[${c + 1}/${n}] ${ppl.toFixed(4)}${c + 1 === n ? "\n" : ", "}`); },
    });
    const { evaluated: _evaluated, ...rest } = r;
    const report: PerplexityReport = { ...rest, ctx, seconds: (performance.now() - t0) / 1000, ...(kl ? { kl: summarizeKl(kl) } : {}) };
    if (a.json) console.log(JSON.stringify(report));
    else {
      console.log(`Final estimate: PPL = ${r.ppl.toFixed(4)} +/- ${r.pplError.toFixed(5)} (${r.nChunks} chunks of ${ctx}, ${r.scored} tokens scored, ${report.seconds.toFixed(1)} s)`);
      if (report.kl) console.log(formatKl(report.kl));
      if (out !== undefined) console.log(`log-probabilities written to ${printable(a.klBase!)} (compare with --kl-divergence-base FILE --kl-divergence)`);
    }
    return 0;
  } finally {
    if (out !== undefined) closeSync(out);
    pipeline.close();
    model.close();
  }
}

function formatKl(k: KlSummary): string {
  const pct = (x: number) => `${(100 * x).toFixed(3)}%`;
  return [
    `Mean PPL(Q)                 : ${k.ppl.toFixed(6)}`,
    `Mean PPL(base)              : ${k.pplBase.toFixed(6)}`,
    `Mean ln(PPL(Q)/PPL(base))   : ${k.lnPplRatio.toFixed(6)} +/- ${k.lnPplRatioError.toFixed(6)}`,
    `Mean KLD                    : ${k.meanKld.toFixed(6)} +/- ${k.meanKldError.toFixed(6)}`,
    `Maximum KLD                 : ${k.maxKld.toFixed(6)}`,
    `99.0%   KLD                 : ${k.p99Kld.toFixed(6)}`,
    `Median  KLD                 : ${k.medianKld.toFixed(6)}`,
    `RMS Δp                      : ${pct(k.rmsPDiff)}`,
    `Maximum Δp                  : ${pct(k.maxPDiff)}`,
    `Same top p                  : ${pct(k.sameTop)}`,
  ].join("\n");
}
