// Vocabularies as GGUF tokenizer metadata, for writing model files: copied from a GGUF, or converted
// from a Hugging Face tokenizer.json the way llama.cpp's convert_hf_to_gguf.py does (_set_vocab_gpt2
// and gguf-py's SpecialVocab); SentencePiece ones are in tokenizer-export-spm.ts, the vocabularies
// the project has at hand in tokenizer-bundled.ts.

import type { GgufFile, GgufKV } from "./gguf.js";
import { kv } from "./gguf-writer.js";
import { SUPPORTED_PRE_TOKENIZERS, TokenizerError, TokenType } from "./tokenizer-vocab.js";

/** Every tokenizer.* key of a GGUF file, in file order. */
export function tokenizerMetadataFromGguf(file: GgufFile): GgufKV[] {
  const out: GgufKV[] = [];
  for (const [key, value] of file.metadata) if (key.startsWith("tokenizer.")) out.push(value);
  if (!out.some((m) => m.key === "tokenizer.ggml.model")) {
    throw new TokenizerError(`${file.path}: no tokenizer metadata (tokenizer.ggml.model is missing)`);
  }
  return out;
}

// ---- tokenizer.json ---------------------------------------------------------------------------

export interface HfAddedToken {
  readonly id: number;
  readonly content: string;
  readonly special?: boolean;
  readonly normalized?: boolean;
}

/** The parts of a Hugging Face tokenizer.json that the conversion reads. */
export interface HfTokenizerJson {
  readonly model: {
    readonly type?: string;
    readonly unk_token?: string | null;
    readonly byte_fallback?: boolean;
    readonly vocab: Readonly<Record<string, number>>;
    readonly merges?: readonly (string | readonly [string, string])[];
  };
  readonly added_tokens?: readonly HfAddedToken[];
  readonly pre_tokenizer?: unknown;
  readonly post_processor?: unknown;
}

type HfTokenValue = string | { readonly content?: string } | null | undefined;

/** The parts of tokenizer_config.json that the conversion reads. */
export interface HfTokenizerConfig {
  readonly bos_token?: HfTokenValue;
  readonly eos_token?: HfTokenValue;
  readonly unk_token?: HfTokenValue;
  readonly sep_token?: HfTokenValue;
  readonly pad_token?: HfTokenValue;
  readonly cls_token?: HfTokenValue;
  readonly mask_token?: HfTokenValue;
  readonly add_bos_token?: boolean;
  readonly add_eos_token?: boolean;
  readonly add_sep_token?: boolean;
  readonly chat_template?: unknown;
}

export interface TokenizerJsonOptions {
  /** tokenizer.ggml.pre to write, e.g. "llama-bpe" or "qwen2" (convert_hf_to_gguf finds it by hashing). */
  readonly pre: string;
  /** tokenizer_config.json: special tokens, add_bos/add_eos, chat template. */
  readonly config?: HfTokenizerConfig;
  /** Ids from the model's config.json (bos_token_id ...), used where tokenizer_config names none. */
  readonly modelConfig?: { readonly bos_token_id?: number; readonly eos_token_id?: number; readonly pad_token_id?: number };
  /** The model's vocabulary size (config.json vocab_size); missing ids become unused "[PAD<id>]" tokens. */
  readonly vocabSize?: number;
}

// convert_hf_to_gguf.py's does_token_look_special.
export function looksSpecial(t: string): boolean {
  return ["<pad>", "<mask>", "<2mass>", "[@BOS@]"].includes(t) ||
    (t.startsWith("<|") && t.endsWith("|>")) ||
    (t.startsWith("<｜") && t.endsWith("｜>")) ||
    (t.startsWith("<unused") && t.endsWith(">"));
}

function hasByteLevel(p: unknown): boolean {
  if (!p || typeof p !== "object") return false;
  const o = p as { type?: unknown; pretokenizers?: unknown };
  if (o.type === "ByteLevel") return true;
  return Array.isArray(o.pretokenizers) && o.pretokenizers.some(hasByteLevel);
}

function tokenContent(v: HfTokenValue): string | undefined {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof v.content === "string") return v.content;
  return undefined;
}

/** Converts a byte-level BPE tokenizer.json into GGUF tokenizer metadata, as convert_hf_to_gguf.py. */
export function tokenizerMetadataFromTokenizerJson(json: HfTokenizerJson, options: TokenizerJsonOptions): GgufKV[] {
  const model = json?.model;
  if (!model || typeof model.vocab !== "object" || model.vocab === null) {
    throw new TokenizerError("tokenizer.json: model.vocab is missing");
  }
  if (model.type !== undefined && model.type !== "BPE") {
    throw new TokenizerError(`tokenizer.json: model type ${JSON.stringify(model.type)} is not supported (only byte-level BPE)`);
  }
  if (!hasByteLevel(json.pre_tokenizer)) {
    throw new TokenizerError("tokenizer.json: no ByteLevel pre-tokenizer; only byte-level BPE (GPT-2 style) vocabularies are supported");
  }
  if (!SUPPORTED_PRE_TOKENIZERS.includes(options.pre)) {
    throw new TokenizerError(`pre-tokenizer ${JSON.stringify(options.pre)} is not supported; supported: ${SUPPORTED_PRE_TOKENIZERS.join(", ")}`);
  }

  // tokenizer.get_vocab(): the model's vocabulary plus the added tokens.
  const idToText: (string | undefined)[] = [];
  const vocab = model.vocab;
  for (const text in vocab) {
    const id = vocab[text];
    if (!Number.isInteger(id) || id < 0 || id > 0x7fffffff) throw new TokenizerError(`tokenizer.json: token ${JSON.stringify(text)} has id ${id}`);
    idToText[id] = text;
  }
  const added = new Map<string, HfAddedToken>();
  for (const t of json.added_tokens ?? []) {
    if (!Number.isInteger(t.id) || t.id < 0 || t.id > 0x7fffffff) throw new TokenizerError(`tokenizer.json: added token ${JSON.stringify(t.content)} has id ${t.id}`);
    idToText[t.id] = t.content;
    added.set(t.content, t);
  }
  // len(tokenizer.get_vocab()): distinct texts.
  const distinct = new Set<string>();
  for (const t of idToText) if (t !== undefined) distinct.add(t);
  const vocabSize = options.vocabSize ?? distinct.size;
  if (idToText.length > vocabSize) throw new TokenizerError(`vocabulary size ${vocabSize} is too small for token id ${idToText.length - 1}`);

  const tokens = new Array<string>(vocabSize);
  const types = new Int32Array(vocabSize);
  for (let i = 0; i < vocabSize; i++) {
    const text = idToText[i];
    if (text === undefined) {
      tokens[i] = `[PAD${i}]`;
      types[i] = TokenType.UNUSED;
      continue;
    }
    const a = added.get(text);
    if (a && a.id === i) {
      if (a.special || looksSpecial(text)) {
        tokens[i] = text;
        types[i] = TokenType.CONTROL;
      } else {
        tokens[i] = text.replaceAll("\u2581", " "); // pre-normalized user-defined spaces
        types[i] = TokenType.USER_DEFINED;
      }
    } else {
      tokens[i] = text;
      types[i] = TokenType.NORMAL;
    }
  }

  // Merges: old "a b" strings, or [a, b] pairs with spaces inside encoded as U+0120.
  const merges = (model.merges ?? []).map((m, i) => {
    if (typeof m === "string") return m;
    if (Array.isArray(m) && m.length === 2 && typeof m[0] === "string" && typeof m[1] === "string") {
      return m.map((part) => part.replaceAll(" ", "\u0120")).join(" ");
    }
    throw new TokenizerError(`tokenizer.json: merges[${i}] is neither "a b" nor ["a", "b"]`);
  });
  if (merges.length === 0) throw new TokenizerError("tokenizer.json: model.merges is missing or empty");

  const out: GgufKV[] = [
    kv.str("tokenizer.ggml.model", "gpt2"),
    kv.str("tokenizer.ggml.pre", options.pre),
    kv.strs("tokenizer.ggml.tokens", tokens),
    kv.i32s("tokenizer.ggml.token_type", types),
    kv.strs("tokenizer.ggml.merges", merges),
  ];

  out.push(...specialVocabMetadata(json, options.config ?? {}, options.modelConfig ?? {}, vocabSize));
  return out;
}

/**
 * gguf-py's SpecialVocab: the ids of the special tokens tokenizer_config.json names (first added
 * token with that content; config.json's ids for those still unset), add_bos/add_eos (a
 * TemplateProcessing post-processor that starts with BOS / ends with EOS, then tokenizer_config.json's
 * own flags) and the chat template.
 */
export function specialVocabMetadata(json: HfTokenizerJson, config: HfTokenizerConfig, mc: NonNullable<TokenizerJsonOptions["modelConfig"]>, vocabSize: number): GgufKV[] {
  const out: GgufKV[] = [];
  const addedIdOf = (content: string | undefined) => (json.added_tokens ?? []).find((t) => t.content === content)?.id;
  const specialKeys = [
    ["bos", "tokenizer.ggml.bos_token_id"], ["eos", "tokenizer.ggml.eos_token_id"],
    ["unk", "tokenizer.ggml.unknown_token_id"], ["sep", "tokenizer.ggml.seperator_token_id"],
    ["pad", "tokenizer.ggml.padding_token_id"], ["cls", "tokenizer.ggml.cls_token_id"],
    ["mask", "tokenizer.ggml.mask_token_id"],
  ] as const;
  const ids = new Map<string, number>();
  for (const [typ] of specialKeys) {
    const id = addedIdOf(tokenContent(config[`${typ}_token`]));
    if (id !== undefined && id < vocabSize) ids.set(typ, id);
  }
  for (const [typ, id] of [["bos", mc.bos_token_id], ["eos", mc.eos_token_id], ["pad", mc.pad_token_id]] as const) {
    if (!ids.has(typ) && Number.isInteger(id) && id! >= 0 && id! < vocabSize) ids.set(typ, id!);
  }
  for (const [typ, key] of specialKeys) {
    const id = ids.get(typ);
    if (id !== undefined) out.push(kv.u32(key, id));
  }

  const addFlags = new Map<string, boolean>();
  const tp = findTemplateProcessing(json.post_processor);
  if (tp) {
    const first = tp.length > 1 ? tp[0] : undefined;
    const last = tp.length > 1 ? tp[tp.length - 1] : undefined;
    if (first) addFlags.set("bos", first === tokenContent(config.bos_token));
    if (last) addFlags.set("eos", last === tokenContent(config.eos_token));
  }
  for (const typ of ["bos", "eos", "sep"] as const) {
    const v = config[`add_${typ}_token`];
    if (typeof v === "boolean") addFlags.set(typ, v);
  }
  for (const [typ, v] of addFlags) out.push(kv.bool(`tokenizer.ggml.add_${typ}_token`, v));

  if (typeof config.chat_template === "string") out.push(kv.str("tokenizer.chat_template", config.chat_template));
  return out;
}

/** The special-token ids of a TemplateProcessing "single" template (undefined entries for sequences). */
function findTemplateProcessing(p: unknown): (string | undefined)[] | undefined {
  if (!p || typeof p !== "object") return undefined;
  const o = p as { type?: unknown; single?: unknown; processors?: unknown };
  if (o.type === "TemplateProcessing" && Array.isArray(o.single)) {
    return o.single.map((item: { SpecialToken?: { id?: unknown } }) =>
      typeof item?.SpecialToken?.id === "string" ? item.SpecialToken.id : undefined);
  }
  if (Array.isArray(o.processors)) {
    for (const q of o.processors) {
      const r = findTemplateProcessing(q);
      if (r) return r;
    }
  }
  return undefined;
}
