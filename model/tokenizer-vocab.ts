// Reads a vocabulary from GGUF tokenizer metadata the way llama.cpp's llama_vocab::impl::load does:
// token texts, scores and types, BPE merges, special token ids with llama.cpp's defaults and its
// detection by text (EOT, EOM, FIM, end-of-generation), add_bos/add_eos, and the per-model quirks
// that change tokenization (Phi-3's right-stripping special tokens).

import { printable } from "../base/index.js";
import { GgufValueType, type GgufKV, type GgufValue, type NumericArray } from "./gguf.js";
import type { SplitterName } from "./tokenizer-pretokenize.js";
import { PairTable, TokenTable } from "./tokenizer-table.js";
import { utf8Bytes } from "./tokenizer-unicode.js";

export class TokenizerError extends Error {
  override name = "TokenizerError";
}

/** llama.cpp's llama_token_attr bits. */
export const TokenAttr = {
  UNDEFINED: 0,
  UNKNOWN: 1 << 0,
  UNUSED: 1 << 1,
  NORMAL: 1 << 2,
  CONTROL: 1 << 3,
  USER_DEFINED: 1 << 4,
  BYTE: 1 << 5,
  NORMALIZED: 1 << 6,
  LSTRIP: 1 << 7,
  RSTRIP: 1 << 8,
  SINGLE_WORD: 1 << 9,
} as const;

/** GGUF tokenizer.ggml.token_type values (llama_token_type). */
export const TokenType = {
  UNDEFINED: 0,
  NORMAL: 1,
  UNKNOWN: 2,
  CONTROL: 3,
  USER_DEFINED: 4,
  UNUSED: 5,
  BYTE: 6,
} as const;

export type TokenizerModel = "llama" | "gpt2";

export interface SpecialTokenIds {
  bos: number | null;
  eos: number | null;
  eot: number | null;
  eom: number | null;
  unk: number | null;
  sep: number | null;
  pad: number | null;
  mask: number | null;
  fimPre: number | null;
  fimSuf: number | null;
  fimMid: number | null;
  fimPad: number | null;
  fimRep: number | null;
  fimSep: number | null;
}

export interface Vocab {
  readonly model: TokenizerModel;
  readonly pre: string;
  /** Pre-tokenizer for BPE; null for SentencePiece. */
  readonly splitter: SplitterName | null;
  readonly tokens: readonly string[];
  readonly scores: Float32Array;
  readonly attrs: Uint16Array;
  readonly tokenToId: TokenTable;
  /** BPE merge (left id, right id) -> rank; the first occurrence wins, as in llama.cpp. */
  readonly mergeRank: PairTable;
  /** The token a merge (by rank) produces. */
  readonly mergeResult: Int32Array;
  readonly special: Readonly<SpecialTokenIds>;
  readonly addBos: boolean;
  readonly addEos: boolean;
  readonly addSpacePrefix: boolean;
  readonly ignoreMerges: boolean;
  readonly cleanSpaces: boolean;
  readonly eog: ReadonlySet<number>;
  /** Control, user-defined and unknown tokens, longest first: the order special text is matched in. */
  readonly specialTokens: Int32Array;
  readonly chatTemplate: string | undefined;
}

interface PreType {
  readonly splitter: SplitterName;
  readonly ignoreMerges?: boolean;
  readonly addBos?: boolean;
  readonly cleanSpaces?: boolean;
}

// tokenizer.ggml.pre names whose pre-tokenizer we implement, with the flags llama.cpp sets for them.
const LLAMA3: PreType = { splitter: "llama3", ignoreMerges: true, addBos: true };
const QWEN2: PreType = { splitter: "qwen2", cleanSpaces: false };
const GPT2: PreType = { splitter: "gpt2" };
const GPT4O: PreType = { splitter: "gpt4o", cleanSpaces: false };
const PRE_TYPES: Readonly<Record<string, PreType>> = {
  default: { splitter: "default" },
  llama3: LLAMA3, "llama-v3": LLAMA3, "llama-bpe": LLAMA3, falcon3: LLAMA3, "falcon-h1": LLAMA3,
  pixtral: LLAMA3, "midm-2.0": LLAMA3, lfm2: LLAMA3,
  dbrx: { splitter: "llama3" }, "smaug-bpe": { splitter: "llama3" },
  qwen2: QWEN2, "deepseek-r1-qwen": QWEN2, kormo: QWEN2, f2llmv2: QWEN2, hunyuan: QWEN2, "solar-open": QWEN2,
  "grok-2": QWEN2, megrez: { splitter: "qwen2" }, stablelm2: { splitter: "qwen2" },
  "gpt-2": GPT2, "phi-2": GPT2, gigachat: GPT2, "a.x-4.0": GPT2, mellum: GPT2, exaone4: GPT2, mpt: GPT2,
  olmo: GPT2, jais: GPT2, trillion: { splitter: "gpt2", cleanSpaces: false },
  "granite-docling": { splitter: "gpt2", cleanSpaces: false },
  // o200k (gpt-oss, Llama 4): llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT4O
  "gpt-4o": GPT4O, llama4: GPT4O, kanana2: GPT4O, talkie: GPT4O,
};

export const SUPPORTED_PRE_TOKENIZERS: readonly string[] = Object.keys(PRE_TYPES);

// Token texts llama.cpp recognizes as special when the file does not say (llama-vocab.cpp), in the
// order we prefer when a vocabulary has several (llama.cpp takes whichever its hash map yields first).
const EOT_TEXTS = ["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
  "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"];
const EOM_TEXTS = ["<|eom_id|>"];
const FIM_PRE_TEXTS = ["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"];
const FIM_SUF_TEXTS = ["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"];
const FIM_MID_TEXTS = ["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"];
const FIM_PAD_TEXTS = ["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS = ["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS = ["<|file_sep|>"];
const EOG_TEXTS = new Set(["<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
  "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
  "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["]);

// ---- typed metadata access with errors that name the key ---------------------------------------

type Meta = ReadonlyMap<string, GgufKV>;

function get(meta: Meta, key: string): GgufValue | undefined {
  return meta.get(key)?.value;
}

function getString(meta: Meta, key: string): string | undefined {
  const v = get(meta, key);
  if (v === undefined) return undefined;
  if (typeof v !== "string") throw new TokenizerError(`metadata ${key} should be a string, not ${describe(v)}`);
  return v;
}

function getBool(meta: Meta, key: string): boolean | undefined {
  const v = get(meta, key);
  if (v === undefined) return undefined;
  if (typeof v === "boolean") return v;
  if (typeof v === "number") return v !== 0;
  throw new TokenizerError(`metadata ${key} should be a bool, not ${describe(v)}`);
}

function getInt(meta: Meta, key: string): number | undefined {
  const v = get(meta, key);
  if (v === undefined) return undefined;
  if (typeof v === "bigint") return Number.MAX_SAFE_INTEGER; // out of any vocabulary's range
  if (typeof v !== "number" || !Number.isInteger(v)) throw new TokenizerError(`metadata ${key} should be an integer, not ${describe(v)}`);
  return v;
}

function getStrings(meta: Meta, key: string): readonly string[] | undefined {
  const v = get(meta, key);
  if (v === undefined) return undefined;
  if (typeof v !== "object" || v.itemType !== GgufValueType.STRING) {
    throw new TokenizerError(`metadata ${key} should be an array of strings, not ${describe(v)}`);
  }
  return v.items as readonly string[];
}

function getNumbers(meta: Meta, key: string, allowed: readonly number[]): NumericArray | undefined {
  const v = get(meta, key);
  if (v === undefined) return undefined;
  if (typeof v !== "object" || !allowed.includes(v.itemType) || !ArrayBuffer.isView(v.items)) {
    throw new TokenizerError(`metadata ${key} should be a numeric array, not ${describe(v)}`);
  }
  return v.items as NumericArray;
}

function describe(v: GgufValue): string {
  if (typeof v === "object") return `an array of type ${v.itemType}`;
  return `a ${typeof v}`;
}

// ---- loading --------------------------------------------------------------------------------------

const VALID_TOKEN_TYPES: ReadonlySet<number> = new Set(Object.values(TokenType));

function typeToAttr(t: number): number {
  switch (t) {
    case TokenType.UNKNOWN: return TokenAttr.UNKNOWN;
    case TokenType.UNUSED: return TokenAttr.UNUSED;
    case TokenType.NORMAL: return TokenAttr.NORMAL;
    case TokenType.CONTROL: return TokenAttr.CONTROL;
    case TokenType.USER_DEFINED: return TokenAttr.USER_DEFINED;
    case TokenType.BYTE: return TokenAttr.BYTE;
    default: return TokenAttr.UNDEFINED;
  }
}

/** Builds a Vocab from GGUF metadata (all keys; only tokenizer.* and general.name are read). */
export function loadVocab(meta: Meta): Vocab {
  const modelName = getString(meta, "tokenizer.ggml.model");
  if (modelName === undefined) {
    throw new TokenizerError("no tokenizer in this GGUF: metadata tokenizer.ggml.model is missing");
  }
  if (modelName === "no_vocab" || modelName === "none") {
    throw new TokenizerError(`this GGUF has no vocabulary (tokenizer.ggml.model = "${printable(modelName, 80)}")`);
  }
  if (modelName !== "llama" && modelName !== "gpt2") {
    throw new TokenizerError(`tokenizer model "${printable(modelName, 80)}" is not supported (supported: "llama" SentencePiece, "gpt2" byte-level BPE)`);
  }
  const model: TokenizerModel = modelName;
  const preName = getString(meta, "tokenizer.ggml.pre") ?? "";

  // Defaults llama.cpp applies before reading the file's own settings.
  const special: SpecialTokenIds = {
    bos: model === "llama" ? 1 : 11, eos: model === "llama" ? 2 : 11, eot: null, eom: null,
    unk: model === "llama" ? 0 : null, sep: null, pad: null, mask: null,
    fimPre: null, fimSuf: null, fimMid: null, fimPad: null, fimRep: null, fimSep: null,
  };
  let splitter: SplitterName | null = null;
  let addBos = false;
  let addEos = false;
  let addSpacePrefix = false;
  let ignoreMerges = false;
  let cleanSpaces = false;
  if (model === "gpt2") {
    const pre = PRE_TYPES[preName === "" ? "default" : preName];
    if (!pre) {
      throw new TokenizerError(`BPE pre-tokenizer "${printable(preName, 80)}" (tokenizer.ggml.pre) is not supported; supported: ${SUPPORTED_PRE_TOKENIZERS.join(", ")}`);
    }
    splitter = pre.splitter;
    ignoreMerges = pre.ignoreMerges ?? false;
    addBos = pre.addBos ?? false;
    cleanSpaces = pre.cleanSpaces ?? true;
  } else {
    addSpacePrefix = true;
    addBos = true;
  }
  addSpacePrefix = getBool(meta, "tokenizer.ggml.add_space_prefix") ?? addSpacePrefix;

  // Tokens, scores, types.
  const tokenList = getStrings(meta, "tokenizer.ggml.tokens");
  if (!tokenList) throw new TokenizerError("metadata tokenizer.ggml.tokens is missing: the GGUF has no vocabulary");
  const n = tokenList.length;
  if (n === 0) throw new TokenizerError("metadata tokenizer.ggml.tokens is empty");
  const rawScores = getNumbers(meta, "tokenizer.ggml.scores", [GgufValueType.FLOAT32, GgufValueType.INT32]);
  if (rawScores && rawScores.length < n) {
    throw new TokenizerError(`tokenizer.ggml.scores has ${rawScores.length} entries for ${n} tokens`);
  }
  const rawTypes = getNumbers(meta, "tokenizer.ggml.token_type", [GgufValueType.INT32]);
  if (rawTypes && rawTypes.length < n) {
    throw new TokenizerError(`tokenizer.ggml.token_type has ${rawTypes.length} entries for ${n} tokens`);
  }
  const tokens = new Array<string>(n);
  const scores = new Float32Array(n);
  const attrs = new Uint16Array(n);
  for (let i = 0; i < n; i++) {
    tokens[i] = tokenList[i] === "" ? `[EMPTY_${i}]` : tokenList[i];
    if (rawScores) scores[i] = Number(rawScores[i]);
    if (rawTypes) {
      const t = Number(rawTypes[i]);
      if (!VALID_TOKEN_TYPES.has(t)) {
        throw new TokenizerError(`tokenizer.ggml.token_type[${i}] is ${t}, not a token type (0 to 6: undefined, normal, unknown, control, user-defined, unused, byte)`);
      }
      attrs[i] = typeToAttr(t);
    } else attrs[i] = TokenAttr.NORMAL;
  }
  const tokenToId = new TokenTable(tokens, (id, earlier) => {
    throw new TokenizerError(`tokenizer.ggml.tokens: token ${id} "${printable(tokens[id], 80)}" duplicates token ${earlier}`);
  });

  // Merges: "left right", split at the first space after the first character. Both parts and the
  // result must be tokens (llama.cpp silently keeps merges it can never use; refusing them catches
  // corrupt files), so merges can be keyed by token ids: (left * n + right) -> rank.
  let mergeRank = new PairTable(0);
  let mergeResult = new Int32Array(0);
  if (model === "gpt2") {
    const merges = getStrings(meta, "tokenizer.ggml.merges");
    if (!merges) throw new TokenizerError("BPE vocabulary without tokenizer.ggml.merges");
    mergeRank = new PairTable(merges.length);
    mergeResult = new Int32Array(merges.length);
    for (let i = 0; i < merges.length; i++) {
      const m = merges[i];
      const pos = m.indexOf(" ", 1);
      const l = pos < 0 ? -1 : tokenToId.getRange(m, 0, pos);
      const r = pos < 0 ? -1 : tokenToId.getRange(m, pos + 1, m.length);
      const result = pos < 0 ? -1 : tokenToId.getConcat(m, 0, pos, pos + 1, m.length);
      if (l < 0 || r < 0 || result < 0) {
        const left = m.slice(0, pos);
        const right = m.slice(pos + 1);
        const why = pos < 0 ? "has no space between two parts"
          : l < 0 ? `"${printable(left, 80)}" is not a token`
          : r < 0 ? `"${printable(right, 80)}" is not a token`
          : `the merged "${printable(left + right, 80)}" is not a token`;
        throw new TokenizerError(`tokenizer.ggml.merges[${i}] "${printable(m, 80)}": ${why}`);
      }
      mergeRank.setIfAbsent(l, r, i);
      mergeResult[i] = result;
    }
  }

  // Special token ids: a default outside the vocabulary is disabled; a value the file gives must be a
  // token (llama.cpp warns and keeps the default; a file that names a token it lacks is corrupt).
  const idKeys: ReadonlyArray<readonly [string, keyof SpecialTokenIds]> = [
    ["bos_token_id", "bos"], ["eos_token_id", "eos"], ["eot_token_id", "eot"], ["eom_token_id", "eom"],
    ["unknown_token_id", "unk"], ["seperator_token_id", "sep"], ["padding_token_id", "pad"], ["mask_token_id", "mask"],
    ["fim_pre_token_id", "fimPre"], ["fim_suf_token_id", "fimSuf"], ["fim_mid_token_id", "fimMid"],
    ["fim_pad_token_id", "fimPad"], ["fim_rep_token_id", "fimRep"], ["fim_sep_token_id", "fimSep"],
    ["prefix_token_id", "fimPre"], ["suffix_token_id", "fimSuf"], ["middle_token_id", "fimMid"],
  ];
  for (const [key, field] of idKeys) {
    const cur = special[field];
    if (cur !== null && cur >= n) special[field] = null;
    const v = getInt(meta, `tokenizer.ggml.${key}`);
    if (v === undefined) continue;
    // -1 (LLAMA_TOKEN_NULL, also written as u32 0xffffffff) says the model has no such token.
    if (v === -1 || v === 0xffffffff) {
      special[field] = null;
      continue;
    }
    if (v < 0 || v >= n) {
      throw new TokenizerError(`tokenizer.ggml.${key} is ${v > Number.MAX_SAFE_INTEGER - 1 ? "too large" : v}, not a token of the vocabulary (0 to ${n - 1})`);
    }
    special[field] = v;
  }
  addBos = getBool(meta, "tokenizer.ggml.add_bos_token") ?? addBos;
  addEos = getBool(meta, "tokenizer.ggml.add_eos_token") ?? addEos;

  // Special tokens recognized by their text; such a token becomes a control token.
  const markControl = (id: number) => {
    attrs[id] |= TokenAttr.CONTROL;
  };
  const detect = (field: keyof SpecialTokenIds, texts: readonly string[]) => {
    if (special[field] !== null) return;
    for (const t of texts) {
      const id = tokenToId.get(t);
      if (id !== undefined) {
        special[field] = id;
        markControl(id);
        return;
      }
    }
  };
  detect("eot", EOT_TEXTS);
  detect("eom", EOM_TEXTS);
  detect("fimPre", FIM_PRE_TEXTS);
  detect("fimSuf", FIM_SUF_TEXTS);
  detect("fimMid", FIM_MID_TEXTS);
  detect("fimPad", FIM_PAD_TEXTS);
  detect("fimRep", FIM_REP_TEXTS);
  detect("fimSep", FIM_SEP_TEXTS);

  // Control tokens named "unused..." are unused.
  for (let i = 0; i < n; i++) {
    if ((attrs[i] & TokenAttr.CONTROL) !== 0 && tokens[i].includes("unused")) attrs[i] |= TokenAttr.UNUSED;
  }

  // End-of-generation tokens.
  const eog = new Set<number>();
  for (const f of ["fimPad", "fimRep", "fimSep"] as const) {
    const id = special[f];
    if (id !== null) eog.add(id);
  }
  for (let i = 0; i < n; i++) {
    if (EOG_TEXTS.has(tokens[i])) {
      eog.add(i);
      markControl(i);
    }
  }
  // gpt-oss: these always render.
  for (const t of ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"]) {
    const id = tokenToId.get(t);
    if (id !== undefined) attrs[id] = TokenAttr.USER_DEFINED;
  }
  for (const f of ["eos", "eot", "eom"] as const) {
    const id = special[f];
    if (id !== null) eog.add(id);
  }
  const eogText = (t: string) => [...eog].some((id) => tokens[id] === t);
  const endId = tokenToId.get("<|end|>");
  if (endId !== undefined && eog.has(endId) &&
      ((eogText("<|return|>") && eogText("<|call|>")) || (eogText("<|calls|>") && eogText("<|flush|>")))) {
    eog.delete(endId);
    attrs[endId] = TokenAttr.USER_DEFINED;
  }
  const sId = tokenToId.get("</s>");
  if (sId !== undefined && eog.has(sId) && eogText("<|tool_response>")) {
    eog.delete(sId);
    attrs[sId] = TokenAttr.NORMAL;
  }

  // Special tokens are matched in text longest first (by UTF-8 length; ties by id, which llama.cpp
  // leaves unspecified).
  const specialIds: number[] = [];
  const byteLen = new Map<number, number>();
  for (let i = 0; i < n; i++) {
    if ((attrs[i] & (TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)) !== 0) {
      specialIds.push(i);
      byteLen.set(i, utf8Bytes(tokens[i]).length);
    }
  }
  specialIds.sort((a, b) => byteLen.get(b)! - byteLen.get(a)! || a - b);

  // Phi-3: special tokens swallow the whitespace after them (llama.cpp keys this on the model name).
  const generalName = (getString(meta, "general.name") ?? "").toLowerCase();
  if (generalName.includes("phi-3") || generalName.includes("phi3")) {
    for (const id of specialIds) attrs[id] |= TokenAttr.RSTRIP;
    const s = tokenToId.get("</s>");
    if (s !== undefined) attrs[s] |= TokenAttr.RSTRIP;
    for (const t of ["<unk>", "<s>", "<|endoftext|>"]) {
      const id = tokenToId.get(t);
      if (id !== undefined) attrs[id] &= ~TokenAttr.RSTRIP;
    }
  }

  return {
    model, pre: preName, splitter, tokens, scores, attrs, tokenToId, mergeRank, mergeResult, special,
    addBos, addEos, addSpacePrefix, ignoreMerges, cleanSpaces, eog,
    specialTokens: Int32Array.from(specialIds),
    chatTemplate: getString(meta, "tokenizer.chat_template"),
  };
}
