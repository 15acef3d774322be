// SentencePiece vocabularies (tokenizer.ggml.model "llama") from a Hugging Face tokenizer.json, the
// way llama.cpp's convert_hf_to_gguf.py writes them from the model's tokenizer.model
// (_create_vocab_sentencepiece, then the added tokens of tokenizer_config.json, then SpecialVocab):
// Gemma's vocabularies are of this kind. tokenizer.json holds the same pieces in the same order, but
// not their scores: SentencePiece's BPE trainer scores each piece by its rank (falling with the id),
// so -id keeps the order of merges; byte and special pieces score 0 as in tokenizer.model.

import type { GgufKV } from "./gguf.js";
import { kv } from "./gguf-writer.js";
import { looksSpecial, specialVocabMetadata, type HfAddedToken, type HfTokenizerConfig, type HfTokenizerJson, type TokenizerJsonOptions } from "./tokenizer-export.js";
import { TokenizerError, TokenType } from "./tokenizer-vocab.js";

const SPM_SPACE = "\u2581";
const BYTE_PIECE = /^<0x[0-9A-F]{2}>$/;

export interface SpmTokenizerJsonOptions {
  /** tokenizer_config.json: its added_tokens_decoder, special tokens, add_bos/add_eos, chat template. */
  readonly config?: HfTokenizerConfig & { readonly added_tokens_decoder?: Readonly<Record<string, Omit<HfAddedToken, "id">>> };
  readonly modelConfig?: TokenizerJsonOptions["modelConfig"];
  /** The model's vocab_size (config.json); ids past it are dropped, missing ones become "[PAD<id>]". */
  readonly vocabSize?: number;
}

/** True when the normalizer prepends U+2581 (SentencePiece's add_dummy_prefix). */
function prependsSpace(n: unknown): boolean {
  if (!n || typeof n !== "object") return false;
  const o = n as { type?: unknown; prepend?: unknown; normalizers?: unknown };
  if (o.type === "Prepend" && o.prepend === SPM_SPACE) return true;
  return Array.isArray(o.normalizers) && o.normalizers.some(prependsSpace);
}

/** Converts a SentencePiece-style (BPE with byte fallback) tokenizer.json into GGUF tokenizer metadata. */
export function spmMetadataFromTokenizerJson(json: HfTokenizerJson & { readonly normalizer?: unknown }, options: SpmTokenizerJsonOptions = {}): GgufKV[] {
  const model = json?.model;
  if (!model || typeof model.vocab !== "object" || model.vocab === null) throw new TokenizerError("tokenizer.json: model.vocab is missing");
  if (model.type !== "BPE" || model.byte_fallback !== true) {
    throw new TokenizerError("tokenizer.json: not a SentencePiece-style vocabulary (a BPE model with byte_fallback)");
  }
  const pieces: string[] = [];
  for (const text in model.vocab) {
    const id = model.vocab[text];
    if (!Number.isInteger(id) || id < 0 || id > 0x7fffffff) throw new TokenizerError(`tokenizer.json: token ${JSON.stringify(text)} has id ${id}`);
    pieces[id] = text;
  }
  const vocabSize = options.vocabSize ?? pieces.length;
  if (!Number.isInteger(vocabSize) || vocabSize < 1) throw new TokenizerError(`vocabulary size ${vocabSize} is out of range`);

  const tokens = Array.from({ length: vocabSize }, (_, i) => `[PAD${i}]`);
  const scores = new Float32Array(vocabSize).fill(-10000);
  const types = new Int32Array(vocabSize).fill(TokenType.UNUSED);
  const control = new Set(["<pad>", "<bos>", "<eos>", "<s>", "</s>"]);
  for (let id = 0; id < Math.min(vocabSize, pieces.length); id++) {
    const text = pieces[id];
    if (text === undefined) continue;
    tokens[id] = text;
    if (BYTE_PIECE.test(text)) {
      types[id] = TokenType.BYTE;
      scores[id] = 0;
    } else if (text === model.unk_token) {
      types[id] = TokenType.UNKNOWN;
      scores[id] = 0;
    } else if (control.has(text)) {
      types[id] = TokenType.CONTROL;
      scores[id] = 0;
    } else {
      types[id] = TokenType.NORMAL;
      scores[id] = -id;
    }
  }

  // The added tokens (tokenizer_config.json's added_tokens_decoder, else tokenizer.json's list):
  // special ones become control tokens, the others user-defined with their U+2581 as spaces.
  const decoder = options.config?.added_tokens_decoder;
  const added: HfAddedToken[] = decoder
    ? Object.entries(decoder).map(([id, t]) => ({ ...t, id: Number(id) }))
    : [...(json.added_tokens ?? [])];
  for (const t of added) {
    if (!Number.isInteger(t.id) || t.id < 0) throw new TokenizerError(`added token ${JSON.stringify(t.content)} has id ${t.id}`);
    if (t.id >= vocabSize) continue; // convert_hf_to_gguf ignores it with a warning
    if (t.special || looksSpecial(t.content)) {
      tokens[t.id] = t.content;
      types[t.id] = TokenType.CONTROL;
    } else {
      tokens[t.id] = t.content.replaceAll(SPM_SPACE, " ");
      types[t.id] = TokenType.USER_DEFINED;
    }
    scores[t.id] = -1000;
  }

  return [
    kv.str("tokenizer.ggml.model", "llama"),
    kv.str("tokenizer.ggml.pre", "default"),
    kv.strs("tokenizer.ggml.tokens", tokens),
    kv.f32s("tokenizer.ggml.scores", scores),
    kv.i32s("tokenizer.ggml.token_type", types),
    ...specialVocabMetadata(json, options.config ?? {}, options.modelConfig ?? {}, vocabSize),
    kv.bool("tokenizer.ggml.add_space_prefix", prependsSpace(json.normalizer)),
  ];
}
