// The tokenizer of a GGUF model, defined by llama.cpp's llama-vocab.cpp: encode (with its special
// token parsing, BOS/EOS and SentencePiece space prefix), token pieces as token_to_piece renders
// them, llama_detokenize, and a streaming decoder that never splits a UTF-8 character.

import { readGguf, type GgufFile, type GgufKV } from "./gguf.js";
import { BpeEncoder } from "./tokenizer-bpe.js";
import { SpmEncoder, spmByteToken } from "./tokenizer-spm.js";
import { gpt2Bytes, isCSpace, pushUtf8, utf8Bytes } from "./tokenizer-unicode.js";
import { loadVocab, TokenAttr, TokenizerError, type TokenizerModel, type Vocab } from "./tokenizer-vocab.js";

export { TokenAttr, TokenType, TokenizerError, SUPPORTED_PRE_TOKENIZERS } from "./tokenizer-vocab.js";
export type { TokenizerModel } from "./tokenizer-vocab.js";

export interface EncodeOptions {
  /** Add BOS/EOS as the vocabulary asks (tokenizer.ggml.add_bos_token ...). Default false. */
  readonly addSpecial?: boolean;
  /** Turn control-token text such as "<|im_start|>" into its token. Default false. User-defined
   * tokens are always matched, as in llama.cpp. */
  readonly parseSpecial?: boolean;
}

export interface DecodeOptions {
  /** Render control and unknown tokens as their text (llama.cpp's `special`). Default false. */
  readonly special?: boolean;
}

export interface DetokenizeOptions {
  /** Drop a leading BOS / trailing EOS the vocabulary would have added. Default false. */
  readonly removeSpecial?: boolean;
  /** Render control and unknown tokens as their text. Default false. */
  readonly unparseSpecial?: boolean;
}

type Fragment = { readonly token: number } | { readonly start: number; readonly end: number };

const EMPTY = new Uint8Array(0);
const SPM_SPACE = "\u2581";
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

// Loading a large vocabulary takes a while; callers that share a GGUF header share its tokenizer.
const byFile = new WeakMap<GgufFile, Tokenizer>();

export class Tokenizer {
  private readonly vocab: Vocab;
  private readonly spm: SpmEncoder | null;
  private readonly bpe: BpeEncoder | null;
  private readonly pieces: (Uint8Array | undefined)[];
  /** The newline token as llama.cpp finds it (used by some samplers); null when there is none. */
  readonly nl: number | null;

  private constructor(vocab: Vocab) {
    this.vocab = vocab;
    this.spm = vocab.model === "llama" ? new SpmEncoder(vocab) : null;
    this.bpe = vocab.model === "gpt2" ? new BpeEncoder(vocab) : null;
    this.pieces = new Array(vocab.tokens.length);
    this.nl = this.findNewline();
  }

  /** Reads the tokenizer of a GGUF file (a path or an already read header; one per header object). */
  static fromGguf(file: GgufFile | string): Tokenizer {
    const f = typeof file === "string" ? readGguf(file) : file;
    const cached = byFile.get(f);
    if (cached) return cached;
    let tok: Tokenizer;
    try {
      tok = new Tokenizer(loadVocab(f.metadata));
    } catch (e) {
      if (e instanceof TokenizerError) throw new TokenizerError(`${f.path}: ${e.message}`);
      throw e;
    }
    byFile.set(f, tok);
    return tok;
  }

  /** Builds a tokenizer from tokenizer metadata (e.g. a vocabulary about to be written into a GGUF). */
  static fromMetadata(metadata: Iterable<GgufKV> | ReadonlyMap<string, GgufKV>): Tokenizer {
    const map = metadata instanceof Map ? (metadata as ReadonlyMap<string, GgufKV>) : new Map(Array.from(metadata as Iterable<GgufKV>, (kv) => [kv.key, kv] as const));
    return new Tokenizer(loadVocab(map));
  }

  get model(): TokenizerModel { return this.vocab.model; }
  /** tokenizer.ggml.pre ("" when absent). */
  get pre(): string { return this.vocab.pre; }
  get nVocab(): number { return this.vocab.tokens.length; }
  get bos(): number | null { return this.vocab.special.bos; }
  get eos(): number | null { return this.vocab.special.eos; }
  get eot(): number | null { return this.vocab.special.eot; }
  get eom(): number | null { return this.vocab.special.eom; }
  get unk(): number | null { return this.vocab.special.unk; }
  get pad(): number | null { return this.vocab.special.pad; }
  get sep(): number | null { return this.vocab.special.sep; }
  get addBos(): boolean { return this.vocab.addBos; }
  get addEos(): boolean { return this.vocab.addEos; }
  get addSpacePrefix(): boolean { return this.vocab.addSpacePrefix; }
  /** tokenizer.chat_template, if the model has one. */
  get chatTemplate(): string | undefined { return this.vocab.chatTemplate; }
  /** All end-of-generation tokens (EOS, EOT, EOM and the ones llama.cpp recognizes by text). */
  get eogTokens(): readonly number[] { return [...this.vocab.eog].sort((a, b) => a - b); }

  isEog(id: number): boolean {
    return this.vocab.eog.has(id);
  }

  /** llama_token_attr bits of a token (TokenAttr). */
  tokenAttributes(id: number): number {
    return this.vocab.attrs[this.checkId(id)];
  }

  isControl(id: number): boolean {
    return (this.tokenAttributes(id) & TokenAttr.CONTROL) !== 0;
  }

  /** The token's text as stored in the vocabulary (llama_vocab_get_text). */
  tokenText(id: number): string {
    return this.vocab.tokens[this.checkId(id)];
  }

  /** The id of a token with exactly this vocabulary text, if any. */
  tokenId(text: string): number | undefined {
    return this.vocab.tokenToId.get(text);
  }

  // ---- encode ----------------------------------------------------------------------------------

  /** llama_tokenize(text, add_special, parse_special). */
  encode(text: string, options: EncodeOptions = {}): Int32Array {
    if (typeof text !== "string") throw new TokenizerError(`encode: text must be a string, not ${typeof text}`);
    const addSpecial = options.addSpecial ?? false;
    // The text is handled as UTF-8, as llama.cpp receives it: lone surrogates become U+FFFD.
    const raw = text.replace(LONE_SURROGATE, "\uFFFD");
    const fragments = raw.length > 0 ? this.partition(raw, options.parseSpecial ?? false) : [];
    const v = this.vocab;
    const out: number[] = [];
    if (addSpecial && v.addBos) out.push(this.required(v.special.bos, "BOS", "add_bos_token"));
    if (this.spm) {
      let prevSpecial = true; // the first fragment gets the space prefix
      for (const f of fragments) {
        if ("token" in f) {
          out.push(f.token);
          prevSpecial = true;
          continue;
        }
        const piece = (v.addSpacePrefix && prevSpecial ? " " : "") + raw.substring(f.start, f.end);
        this.spm.encode(piece.replaceAll(" ", SPM_SPACE), out);
        prevSpecial = false;
      }
    } else {
      for (const f of fragments) {
        if ("token" in f) out.push(f.token);
        else this.bpe!.encode(raw.substring(f.start, f.end), out);
      }
    }
    if (addSpecial && v.addEos) out.push(this.required(v.special.eos, "EOS", "add_eos_token"));
    return Int32Array.from(out);
  }

  private required(id: number | null, name: string, flag: string): number {
    if (id === null) throw new TokenizerError(`the vocabulary sets ${flag} but has no ${name} token`);
    return id;
  }

  /**
   * llama.cpp's tokenizer_st_partition: cut the text at every occurrence of each special token,
   * longest tokens first. Control and unknown tokens only when parsing special text.
   */
  private partition(raw: string, parseSpecial: boolean): Fragment[] {
    const { tokens, attrs } = this.vocab;
    let frags: Fragment[] = [{ start: 0, end: raw.length }];
    for (const id of this.vocab.specialTokens) {
      const attr = attrs[id];
      if (!parseSpecial && (attr & (TokenAttr.CONTROL | TokenAttr.UNKNOWN)) !== 0) continue;
      const text = tokens[id];
      if (!raw.includes(text)) continue;
      const next: Fragment[] = [];
      for (const f of frags) {
        if ("token" in f) {
          next.push(f);
          continue;
        }
        let start = f.start;
        const end = f.end;
        while (start < end) {
          const at = raw.substring(start, end).indexOf(text);
          if (at < 0) {
            next.push({ start, end });
            break;
          }
          const m = start + at;
          let leftEnd = m;
          if (attr & TokenAttr.LSTRIP) while (leftEnd > start && isCSpace(raw.charCodeAt(leftEnd - 1))) leftEnd--;
          if (leftEnd > start) next.push({ start, end: leftEnd });
          next.push({ token: id });
          start = m + text.length;
          if (attr & TokenAttr.RSTRIP) while (start < end && isCSpace(raw.charCodeAt(start))) start++;
        }
      }
      frags = next;
    }
    return frags;
  }

  private findNewline(): number | null {
    if (this.spm) {
      try {
        return spmByteToken(this.vocab, 0x0a);
      } catch {
        return null; // llama.cpp falls back to the pad token, which is not known yet at that point
      }
    }
    const out: number[] = [];
    this.bpe!.encode("\n", out);
    return out.length > 0 ? out[0] : this.vocab.special.pad;
  }

  // ---- decode ----------------------------------------------------------------------------------

  private checkId(id: number): number {
    if (!Number.isInteger(id) || id < 0 || id >= this.vocab.tokens.length) {
      throw new TokenizerError(`token id ${id} is out of range (the vocabulary has ${this.vocab.tokens.length} tokens)`);
    }
    return id;
  }

  /** llama_token_to_piece(id, lstrip 0, special): the token's bytes (byte tokens may split UTF-8). */
  tokenPiece(id: number, options: DecodeOptions = {}): Uint8Array {
    return this.piece(id, options.special ?? false).slice();
  }

  /** @internal The cached piece itself, for StreamingDecoder: callers must not modify it. */
  pieceView(id: number, special: boolean): Uint8Array {
    return this.piece(id, special);
  }

  private piece(id: number, special: boolean): Uint8Array {
    const attr = this.vocab.attrs[this.checkId(id)];
    if (!special && (attr & (TokenAttr.UNKNOWN | TokenAttr.CONTROL)) !== 0) return EMPTY;
    return (this.pieces[id] ??= this.renderPiece(id, attr));
  }

  private renderPiece(id: number, attr: number): Uint8Array {
    const text = this.vocab.tokens[id];
    if (attr & (TokenAttr.UNKNOWN | TokenAttr.CONTROL | TokenAttr.USER_DEFINED)) return utf8Bytes(text);
    if (attr & TokenAttr.NORMAL) {
      if (this.spm) return utf8Bytes(text.replaceAll(SPM_SPACE, " "));
      return decodeByteLevel(text);
    }
    if (attr & TokenAttr.BYTE) {
      // token_to_byte: strtol of the two characters after "<0x".
      const v = parseInt(text.substring(3, 5), 16);
      return Uint8Array.of(Number.isNaN(v) ? 0 : v & 0xff);
    }
    return EMPTY;
  }

  /** The concatenated pieces as text (what a token stream prints; no space or BOS stripping). */
  decode(ids: ArrayLike<number>, options: DecodeOptions = {}): string {
    const parts: Uint8Array[] = [];
    let total = 0;
    for (let i = 0; i < ids.length; i++) {
      const p = this.piece(ids[i], options.special ?? false);
      parts.push(p);
      total += p.length;
    }
    return utf8Decode(concat(parts, total));
  }

  /** llama_detokenize(ids, remove_special, unparse_special): leading-space removal and clean-up included. */
  detokenize(ids: ArrayLike<number>, options: DetokenizeOptions = {}): string {
    const v = this.vocab;
    let list = Array.from(ids, (id) => this.checkId(id));
    let removeSpace = v.addSpacePrefix;
    if (options.removeSpecial && v.addBos && list.length > 0 && list[0] === v.special.bos) {
      removeSpace = false;
      list = list.slice(1);
    }
    if (options.removeSpecial && v.addEos && list.length > 0 && list[list.length - 1] === v.special.eos) {
      list = list.slice(0, -1);
    }
    const parts: Uint8Array[] = [];
    let total = 0;
    for (const id of list) {
      let p = this.piece(id, options.unparseSpecial ?? false);
      if (removeSpace && p.length > 0 && p[0] === 0x20) p = p.subarray(1);
      removeSpace = false;
      parts.push(p);
      total += p.length;
    }
    const bytes = concat(parts, total);
    return utf8Decode(v.cleanSpaces ? bytes.subarray(0, cleanSpaces(bytes)) : bytes);
  }

  createStreamingDecoder(options: DecodeOptions = {}): StreamingDecoder {
    return new StreamingDecoder(this, options);
  }
}

/**
 * Turns a stream of token ids into text as it becomes complete: a UTF-8 character split across
 * tokens (byte tokens, byte-level BPE) is held back until its last byte arrives. The concatenated
 * output of push() and flush() equals tokenizer.decode() of all ids.
 */
export class StreamingDecoder {
  private readonly decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

  constructor(private readonly tokenizer: Tokenizer, private readonly options: DecodeOptions = {}) {}

  /** Adds one token; returns the text that is now complete (possibly ""). */
  push(id: number): string {
    return this.decoder.decode(this.tokenizer.pieceView(id, this.options.special ?? false), { stream: true });
  }

  /** Ends the stream: returns what is left (an incomplete character becomes U+FFFD). */
  flush(): string {
    return this.decoder.decode();
  }
}

// ---- helpers ---------------------------------------------------------------------------------

/** Always a fresh buffer: callers may modify it, and pieces are cached. */
function concat(parts: readonly Uint8Array[], total: number): Uint8Array {
  const out = new Uint8Array(total);
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

function utf8Decode(bytes: Uint8Array): string {
  return new TextDecoder("utf-8", { fatal: false, ignoreBOM: true }).decode(bytes);
}

/** llama_decode_text: GPT-2 byte characters back to bytes; others as "[UNK_BYTE_0x..<text>]". */
function decodeByteLevel(text: string): Uint8Array {
  const out: number[] = [];
  for (const ch of text) {
    const cpt = ch.codePointAt(0)!;
    const b = gpt2Bytes.charToByte.get(cpt);
    if (b !== undefined) {
      out.push(b);
      continue;
    }
    const utf8: number[] = [];
    pushUtf8(cpt, utf8);
    const marker = "[UNK_BYTE_0x" + utf8.map((x) => x.toString(16).padStart(2, "0")).join("") + text + "]";
    for (const x of utf8Bytes(marker)) out.push(x);
  }
  return Uint8Array.from(out);
}

/** The three clean-up passes of llama_detokenize (clean_up_tokenization_spaces), in place; returns the new length. */
function cleanSpaces(text: Uint8Array): number {
  const SP = 0x20;
  const APOS = 0x27;
  let total = text.length;
  // " ?", " !", " .", " ,"
  const total1 = total;
  total = total ? 1 : 0;
  for (let i = 1; i < total1; i++) {
    const x = text[i];
    if (text[i - 1] === SP && (x === 0x3f || x === 0x21 || x === 0x2e || x === 0x2c)) total--;
    text[total++] = x;
  }
  // " ' " -> "'"
  const total2 = total;
  total = total ? 1 : 0;
  for (let i = 1; i < total2; i++) {
    const x = text[i];
    if (x === APOS && i + 1 < total2 && text[i - 1] === SP && text[i + 1] === SP) {
      total--;
      text[++i] = 0;
    }
    text[total++] = x;
  }
  // " 's", " 'm", " 're", " 've" -> no space
  const total3 = total;
  total = total ? 1 : 0;
  for (let i = 1; i < total3; i++) {
    const x = text[i];
    if (text[i - 1] === SP && x === APOS && i + 1 < total3) {
      const x1 = text[i + 1];
      if (x1 === 0x73 || x1 === 0x6d) total--; // s m
      else if (i + 2 < total3) {
        const x2 = text[i + 2];
        if ((x1 === 0x72 && x2 === 0x65) || (x1 === 0x76 && x2 === 0x65)) total--; // re ve
      }
    }
    text[total++] = x;
  }
  return total;
}
