// prima-coord make-model: writes a random-weight GGUF of a named or custom shape and any type mix
// (modelgen/). Tests and benchmarks use it to make models no one can download here.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { generateModel, ModelGenError, resolveShape } from "../modelgen/index.js";
import {
  BUNDLED_VOCAB_NAMES, FILE_TYPE_NAMES, familyOf, modelShapeByName, modelShapes, printable, supportedArchitectures,
  type Architecture, type BundledVocabName, type ModelShape,
} from "../model/index.js";

const HELP = `usage: prima-coord make-model --shape NAME --type TYPE --out FILE [options]
       prima-coord make-model --dims N --layers N --heads N --ffn N --type TYPE --out FILE [options]

  --shape NAME      ${modelShapes.map((s) => s.name).join(", ")}
  --type TYPE       ${FILE_TYPE_NAMES.join(", ")} (Q3_K/Q4_K/Q5_K mean the _M mixes)
  --pure            every quantized weight of the type's base type (llama-quantize --pure)
  --out FILE        the GGUF to write
  --vocab NAME      ${BUNDLED_VOCAB_NAMES.join(", ")} (default: the shape's)
  --seed N          random seed (default 1)
  --chat-template FILE  a Jinja chat template the file carries (tokenizer.chat_template)
  --weight-std X    standard deviation of the weights (default 0.02; 0.05 makes greedy text vary
                    instead of repeating one token, as the oracle tests use)
  custom shape (starting from --shape, or from tiny-llama):
  --arch A          ${supportedArchitectures.join(", ")}
  --dims N      --layers N     --heads N
  --kv-heads N      --ffn N             --vocab-size N                --ctx N
  --experts N       --experts-used K    --expert-ffn N    a mixture of experts (llama: Mixtral-style;
                                                          qwen3moe; gpt-oss); --experts 0 makes a llama dense
  gpt-oss-20b's shape at MXFP4_MOE (its release type: MXFP4 experts, the rest Q8_0) is about 12 GB;
  its experts are written as random MXFP4 blocks directly`;

class UsageError extends Error {
  override name = "UsageError";
}

function intArg(name: string, v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (v.trim() === "" || !Number.isInteger(n) || n <= 0) throw new UsageError(`--${name} must be a positive whole number (got "${v}")`);
  return n;
}

export interface MakeModelArgs {
  readonly shape: ModelShape;
  readonly type: string;
  readonly pure: boolean;
  readonly out: string;
  readonly vocab?: BundledVocabName;
  readonly seed: number;
  readonly weightStd?: number;
  /** The chat template file's path (read when the model is written). */
  readonly chatTemplate?: string;
}

export function parseMakeModelArgs(argv: string[]): MakeModelArgs | "help" {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        shape: { type: "string" }, type: { type: "string" }, out: { type: "string" }, pure: { type: "boolean" },
        vocab: { type: "string" }, "chat-template": { type: "string" }, seed: { type: "string" }, "weight-std": { type: "string" }, arch: { type: "string" }, dims: { type: "string" },
        layers: { type: "string" }, heads: { type: "string" }, "kv-heads": { type: "string" }, ffn: { type: "string" },
        "vocab-size": { type: "string" }, ctx: { type: "string" }, experts: { type: "string" }, "experts-used": { type: "string" },
        "expert-ffn": { type: "string" }, help: { type: "boolean", short: "h" },
      },
    }));
  } catch (e) {
    throw new UsageError(e instanceof Error ? e.message : String(e));
  }
  if (values.help) return "help";
  if (!values.type) throw new UsageError("--type is required");
  if (!values.out) throw new UsageError("--out is required");
  const custom = values.dims ?? values.layers ?? values.heads ?? values["kv-heads"] ?? values.ffn ?? values["vocab-size"] ?? values.ctx ?? values.arch ??
    values.experts ?? values["experts-used"] ?? values["expert-ffn"];
  if (!values.shape && custom === undefined) throw new UsageError("--shape (or a custom --dims/--layers/... shape) is required");
  let base = modelShapeByName(values.shape ?? "tiny-llama");
  if (!base) throw new UsageError(`unknown shape "${values.shape}" (known: ${modelShapes.map((s) => s.name).join(", ")})`);
  if (values.arch !== undefined && !familyOf(values.arch)) {
    throw new UsageError(`--arch must be one of ${supportedArchitectures.join(", ")} (got "${values.arch}")`);
  }
  if (custom !== undefined) {
    const arch = (values.arch as Architecture | undefined) ?? base.arch;
    const heads = intArg("heads", values.heads) ?? base.nHead;
    base = {
      ...base,
      name: "custom",
      arch,
      nEmbd: intArg("dims", values.dims) ?? base.nEmbd,
      nLayers: intArg("layers", values.layers) ?? base.nLayers,
      nHead: heads,
      nHeadKv: intArg("kv-heads", values["kv-heads"]) ?? (values.heads ? heads : base.nHeadKv),
      nFf: intArg("ffn", values.ffn) ?? base.nFf,
      nVocab: intArg("vocab-size", values["vocab-size"]) ?? base.nVocab,
      contextLength: intArg("ctx", values.ctx) ?? base.contextLength,
      tiedEmbeddings: arch === "qwen2" ? base.tiedEmbeddings || base.arch !== "qwen2" : arch === base.arch && base.tiedEmbeddings,
      qkvBias: arch === "qwen2" || arch === "gpt-oss",
      // a head size of its own only while the heads and width are the named shape's
      headDim: values.dims || values.heads ? undefined : base.headDim,
    };
    if (values.experts !== undefined || values["experts-used"] !== undefined || values["expert-ffn"] !== undefined) {
      const experts = values.experts === "0" ? 0 : intArg("experts", values.experts) ?? base.nExpert ?? 8;
      base = experts === 0
        ? { ...base, nExpert: undefined, nExpertUsed: undefined, nFfExp: undefined }
        : {
          ...base, nExpert: experts, nExpertUsed: intArg("experts-used", values["experts-used"]) ?? base.nExpertUsed ?? 2,
          nFfExp: intArg("expert-ffn", values["expert-ffn"]) ?? base.nFfExp,
        };
    }
  }
  if (base.arch === "gpt-oss") {
    // gpt-oss's own parts a custom shape keeps from tiny-gpt-oss unless its base had them: the window,
    // YaRN, and experts (a gpt-oss layer has no dense feed-forward)
    const g = modelShapeByName("tiny-gpt-oss")!;
    if (base.nExpert === undefined && (values.experts === "0")) throw new UsageError("gpt-oss has no dense feed-forward: --experts must be at least 1");
    base = {
      ...base, slidingWindow: base.slidingWindow ?? g.slidingWindow, ropeYarnFactor: base.ropeYarnFactor ?? g.ropeYarnFactor,
      ropeOrigContext: base.ropeOrigContext ?? g.ropeOrigContext, nExpert: base.nExpert ?? g.nExpert, nExpertUsed: base.nExpertUsed ?? g.nExpertUsed,
      nFfExp: base.nFfExp ?? base.nFf,
    };
  }
  let vocab: BundledVocabName | undefined;
  if (values.vocab !== undefined) {
    if (!(BUNDLED_VOCAB_NAMES as readonly string[]).includes(values.vocab)) {
      throw new UsageError(`unknown vocabulary "${values.vocab}" (known: ${BUNDLED_VOCAB_NAMES.join(", ")})`);
    }
    vocab = values.vocab as BundledVocabName;
  }
  const seed = values.seed === undefined ? 1 : Number(values.seed);
  if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) throw new UsageError(`--seed must be a whole number 0..4294967295 (got "${values.seed}")`);
  let weightStd: number | undefined;
  if (values["weight-std"] !== undefined) {
    weightStd = Number(values["weight-std"]);
    if (values["weight-std"].trim() === "" || !(weightStd > 0 && weightStd < 1e3)) {
      throw new UsageError(`--weight-std must be a positive number (got "${values["weight-std"]}")`);
    }
  }
  return { shape: base, type: values.type, pure: values.pure ?? false, out: values.out, vocab, seed, weightStd, chatTemplate: values["chat-template"] };
}

export async function makeModelCommand(argv: string[]): Promise<number> {
  let args;
  try {
    args = parseMakeModelArgs(argv);
    if (args === "help") {
      console.log(HELP);
      return 0;
    }
    resolveShape(args.shape);
  } catch (e) {
    if (e instanceof UsageError || e instanceof ModelGenError) {
      console.error(`prima-coord make-model: ${e.message}\n\n${HELP}`);
      return 2;
    }
    throw e;
  }
  let chatTemplate: string | undefined;
  if (args.chatTemplate !== undefined) {
    try {
      chatTemplate = readFileSync(args.chatTemplate, "utf8");
    } catch (e) {
      console.error(`prima-coord make-model: cannot read the chat template ${printable(args.chatTemplate, 200)}: ${printable((e as Error).message, 200)}`);
      return 2;
    }
  }
  const t0 = Date.now();
  try {
    const r = await generateModel({
      shape: args.shape, type: args.type, pure: args.pure, out: args.out, vocab: args.vocab, seed: args.seed, weightStd: args.weightStd, chatTemplate,
    });
    const counts = new Map<number, number>();
    for (const t of r.tensors) counts.set(t.type, (counts.get(t.type) ?? 0) + 1);
    console.log(`wrote ${r.path}: ${r.shape.name} (${r.shape.arch}, ${r.shape.nLayers} layers, dim ${r.shape.nEmbd}), ${r.fileType}` +
      `${args.pure ? " pure" : ""}, ${(r.fileBytes / 2 ** 20).toFixed(1)} MiB in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
    return 0;
  } catch (e) {
    if (e instanceof ModelGenError) {
      console.error(`prima-coord make-model: ${e.message}`);
      return 2;
    }
    throw e;
  }
}
