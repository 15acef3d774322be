// BPE pre-tokenizers: split text (as codepoints) into words before merging, exactly as llama.cpp's
// hand-written regex emulations in src/unicode.cpp do (they, not the regexes, define its output).
// Each splitter takes segment lengths (in codepoints) and returns finer segment lengths.

import { CATEGORY_MASK, CptFlag, cptFlags } from "./tokenizer-unicode.js";

export type SplitterName = "gpt2" | "llama3" | "qwen2" | "default" | "gpt4o";

const OUT_OF_RANGE = -1;
const CR = 0x0d;
const LF = 0x0a;
const SPACE = 0x20;
const APOSTROPHE = 0x27;

/** ASCII-only lowercase: the only case mappings that can produce the contraction letters. */
function lower(c: number): number {
  return c >= 0x41 && c <= 0x5a ? c + 32 : c;
}

interface Cursor {
  cpt(pos: number): number;
  flags(pos: number): number;
}

function cursor(cpts: Uint32Array, start: number, end: number): Cursor {
  return {
    cpt: (pos) => (pos >= start && pos < end ? cpts[pos] : OUT_OF_RANGE),
    flags: (pos) => (pos >= start && pos < end ? cptFlags(cpts[pos]) : 0),
  };
}

const isLetter = (f: number) => (f & CptFlag.LETTER) !== 0;
const isNumber = (f: number) => (f & CptFlag.NUMBER) !== 0;
const isSpace = (f: number) => (f & CptFlag.WHITESPACE) !== 0;

/** Runs `body` over each segment; `body` returns the end of the next word starting at `pos`. */
function splitEach(
  cpts: Uint32Array,
  segments: readonly number[],
  body: (c: Cursor, pos: number, end: number, emit: (wordEnd: number) => void) => number,
): number[] {
  const out: number[] = [];
  let start = 0;
  for (const len of segments) {
    const end = start + len;
    const c = cursor(cpts, start, end);
    let prevEnd = start;
    const emit = (wordEnd: number) => {
      if (wordEnd > prevEnd) out.push(wordEnd - prevEnd);
      prevEnd = wordEnd;
    };
    let pos = start;
    while (pos < end) pos = body(c, pos, end, emit);
    start = end;
  }
  return out;
}

/** Contractions 's 't 're 've 'm 'll 'd (case-insensitive when `fold`); returns the end or -1. */
function contraction(c: Cursor, pos: number, end: number, fold: boolean): number {
  if (c.cpt(pos) !== APOSTROPHE || pos + 1 >= end) return -1;
  const f = fold ? lower : (x: number) => x;
  const n1 = f(c.cpt(pos + 1));
  if (n1 === 0x73 || n1 === 0x74 || n1 === 0x6d || n1 === 0x64) return pos + 2; // s t m d
  if (pos + 2 < end) {
    const n2 = f(c.cpt(pos + 2));
    if ((n1 === 0x72 && n2 === 0x65) || (n1 === 0x76 && n2 === 0x65) || (n1 === 0x6c && n2 === 0x6c)) return pos + 3; // re ve ll
  }
  return -1;
}

/** Whitespace tail shared by all three: \s+(?!\S) | \s+ | any single codepoint. */
function whitespaceOrOne(c: Cursor, pos: number, emit: (e: number) => void): number {
  let n = 0;
  while (isSpace(c.flags(pos + n))) n++;
  if (n > 1 && c.cpt(pos + n) !== OUT_OF_RANGE) {
    emit(pos + n - 1);
    return pos + n - 1;
  }
  if (n > 0) {
    emit(pos + n);
    return pos + n;
  }
  emit(pos + 1);
  return pos + 1;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
function splitGpt2(cpts: Uint32Array, segments: readonly number[]): number[] {
  return splitEach(cpts, segments, (c, pos, end, emit) => {
    const k = contraction(c, pos, end, false);
    if (k >= 0) {
      emit(k);
      return k;
    }
    const cpt = c.cpt(pos);
    let f2 = cpt === SPACE ? c.flags(pos + 1) : c.flags(pos);
    if (isLetter(f2)) {
      if (cpt === SPACE) pos++;
      while (isLetter(f2)) f2 = c.flags(++pos);
      emit(pos);
      return pos;
    }
    if (isNumber(f2)) {
      if (cpt === SPACE) pos++;
      while (isNumber(f2)) f2 = c.flags(++pos);
      emit(pos);
      return pos;
    }
    const other = (f: number) => (f & (CptFlag.WHITESPACE | CptFlag.LETTER | CptFlag.NUMBER)) === 0 && f !== 0;
    if (other(f2)) {
      if (cpt === SPACE) pos++;
      while (other(f2)) f2 = c.flags(++pos);
      emit(pos);
      return pos;
    }
    return whitespaceOrOne(c, pos, emit);
  });
}

// Llama 3 (maxDigits 3) and Qwen2 (maxDigits 1):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
function splitLlama3Like(cpts: Uint32Array, segments: readonly number[], maxDigits: number): number[] {
  return splitEach(cpts, segments, (c, pos, end, emit) => {
    const k = contraction(c, pos, end, true);
    if (k >= 0) {
      emit(k);
      return k;
    }
    const cpt = c.cpt(pos);
    const flags = c.flags(pos);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!(cpt === CR || cpt === LF || isNumber(flags))) {
      if (isLetter(flags) || isLetter(c.flags(pos + 1))) {
        pos++;
        while (isLetter(c.flags(pos))) pos++;
        emit(pos);
        return pos;
      }
    }
    // \p{N}{1,maxDigits}
    if (isNumber(flags)) {
      let ini = pos;
      while (isNumber(c.flags(pos))) {
        if (++pos - ini >= maxDigits) {
          emit(pos);
          ini = pos;
        }
      }
      emit(pos);
      return pos;
    }
    // <space>?[^\s\p{L}\p{N}]+[\r\n]*  (the first test reads `flags`, as llama.cpp does)
    let f2 = cpt === SPACE ? c.flags(pos + 1) : flags;
    const other = (f: number) => (f & (CptFlag.WHITESPACE | CptFlag.LETTER | CptFlag.NUMBER)) === 0;
    if (other(f2) && flags !== 0) {
      if (cpt === SPACE) pos++;
      while (other(f2) && f2 !== 0) f2 = c.flags(++pos);
      let c2 = c.cpt(pos);
      while (c2 === CR || c2 === LF) c2 = c.cpt(++pos);
      emit(pos);
      return pos;
    }
    // \s*[\r\n]+
    let n = 0;
    let lastNewlineEnd = 0;
    while (isSpace(c.flags(pos + n))) {
      const c2 = c.cpt(pos + n);
      if (c2 === CR || c2 === LF) lastNewlineEnd = pos + n + 1;
      n++;
    }
    if (lastNewlineEnd > 0) {
      emit(lastNewlineEnd);
      return lastNewlineEnd;
    }
    return whitespaceOrOne(c, pos, emit);
  });
}

// ---- llama.cpp's "default" BPE pre-tokenizer ---------------------------------------------------
// Its other three expressions go through std::regex on a "collapsed" text in which every non-ASCII
// codepoint stands for its category; these functions compute the same matches directly.

function collapsedIs(cpt: number, category: number): boolean {
  const f = cptFlags(cpt);
  return (f & CptFlag.WHITESPACE) === 0 && (f & CATEGORY_MASK) === category;
}

// [\p{P}\$\+<=>\^~\|]+ : ASCII punctuation and $+<=>^~| (not `), or non-ASCII punctuation.
function isDefaultPunct(cpt: number): boolean {
  if (cpt < 128) return (cpt >= 0x21 && cpt <= 0x2f) || (cpt >= 0x3a && cpt <= 0x40) || (cpt >= 0x5b && cpt <= 0x5f) || (cpt >= 0x7b && cpt <= 0x7e);
  return collapsedIs(cpt, CptFlag.PUNCTUATION);
}

// \p{N}+ : ASCII digits or non-ASCII numbers.
function isDefaultNumber(cpt: number): boolean {
  if (cpt < 128) return cpt >= 0x30 && cpt <= 0x39;
  return collapsedIs(cpt, CptFlag.NUMBER);
}

/** Splits each segment into maximal runs of `inClass` and the gaps between them. */
function splitRuns(cpts: Uint32Array, segments: readonly number[], inClass: (cpt: number) => boolean): number[] {
  const out: number[] = [];
  let start = 0;
  for (const len of segments) {
    const end = start + len;
    let pos = start;
    while (pos < end) {
      const want = inClass(cpts[pos]);
      let e = pos + 1;
      while (e < end && inClass(cpts[e]) === want) e++;
      out.push(e - pos);
      pos = e;
    }
    start = end;
  }
  return out;
}

/** [0-9][0-9][0-9]: leftmost non-overlapping triples of ASCII digits, the rest as gaps. */
function splitDigitTriples(cpts: Uint32Array, segments: readonly number[]): number[] {
  const out: number[] = [];
  const digit = (c: number) => c >= 0x30 && c <= 0x39;
  let start = 0;
  for (const len of segments) {
    const end = start + len;
    let gapStart = start;
    let pos = start;
    while (pos + 3 <= end) {
      if (digit(cpts[pos]) && digit(cpts[pos + 1]) && digit(cpts[pos + 2])) {
        if (pos > gapStart) out.push(pos - gapStart);
        out.push(3);
        pos += 3;
        gapStart = pos;
      } else {
        pos++;
      }
    }
    if (end > gapStart) out.push(end - gapStart);
    start = end;
  }
  return out;
}

// ---- llama.cpp's std::regex fallback, for "gpt-4o" (o200k: gpt-oss, Llama 4) ---------------------
// llama.cpp has no hand-written splitter for this expression: it replaces every non-ASCII codepoint by
// one byte standing for its category (whitespace by a vertical tab) and each \p{..} of the expression
// by a class of that byte and the category's ASCII members, and runs the result as an ECMAScript
// regex. JavaScript's RegExp is ECMAScript too, so the same collapsed expression on the same collapsed
// text makes the same words. The expression is llama.cpp's (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_GPT4O).

const GPT4O_REGEX = String.raw`[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`;

/** The byte a codepoint collapses to, and the ASCII members of each category (unicode_regex_split). */
const COLLAPSED: readonly { flag: number; byte: number; ascii: string; names: readonly string[] }[] = [
  { flag: CptFlag.NUMBER, byte: 0xd1, ascii: "0-9", names: ["N"] },
  { flag: CptFlag.LETTER, byte: 0xd2, ascii: "A-Za-z", names: ["L", "Lu", "Ll", "Lt", "Lm", "Lo"] },
  { flag: CptFlag.PUNCTUATION, byte: 0xd3, ascii: String.raw`!-#%-*,-/:-;?-@\[-\]_\{\}`, names: ["P"] },
  { flag: CptFlag.MARK, byte: 0xd4, ascii: "", names: ["M"] },
  { flag: CptFlag.SYMBOL, byte: 0xd5, ascii: String.raw`\$\+<->\^\`\|\~`, names: ["S"] },
];

function collapseCpt(cpt: number): number {
  if (cpt < 128) return cpt;
  const f = cptFlags(cpt);
  if (f & CptFlag.WHITESPACE) return 0x0b;
  const c = COLLAPSED.find((x) => x.flag === (f & CATEGORY_MASK));
  return c ? c.byte : 0xd0;
}

/** The expression with each \p{..} replaced by its collapsed class (bracketed unless already inside []). */
function collapseRegex(expr: string): RegExp {
  let out = "", inside = false;
  for (let i = 0; i < expr.length; i++) {
    if (expr[i] === "[" && (i === 0 || expr[i - 1] !== "\\")) { out += "["; inside = true; continue; }
    if (inside && expr[i] === "]" && expr[i - 1] !== "\\") { out += "]"; inside = false; continue; }
    const m = /^\\p\{(\w{1,2})\}/.exec(expr.slice(i));
    const c = m && COLLAPSED.find((x) => x.names.includes(m[1]));
    if (m && c) {
      const cls = String.fromCharCode(c.byte) + c.ascii;
      out += inside ? cls : `[${cls}]`;
      i += m[0].length - 1;
      continue;
    }
    out += expr[i];
  }
  return new RegExp(out, "g");
}

let gpt4o: RegExp | undefined;

function splitCollapsedRegex(cpts: Uint32Array, segments: readonly number[], re: RegExp): number[] {
  const out: number[] = [];
  let start = 0;
  for (const len of segments) {
    const text = String.fromCharCode(...Array.from(cpts.subarray(start, start + len), collapseCpt));
    re.lastIndex = 0;
    let at = 0;
    for (let m = re.exec(text); m; m = re.exec(text)) {
      if (m[0].length === 0) { re.lastIndex++; continue; } // (no alternative matches empty; kept safe)
      if (m.index > at) out.push(m.index - at);
      out.push(m[0].length);
      at = m.index + m[0].length;
    }
    if (at < len) out.push(len - at);
    start += len;
  }
  return out;
}

/** Word lengths (in codepoints) of `cpts` under the named pre-tokenizer. */
export function pretokenize(name: SplitterName, cpts: Uint32Array): number[] {
  const all = cpts.length > 0 ? [cpts.length] : [];
  switch (name) {
    case "gpt2":
      return splitGpt2(cpts, all);
    case "llama3":
      return splitLlama3Like(cpts, all, 3);
    case "qwen2":
      return splitLlama3Like(cpts, all, 1);
    case "gpt4o":
      return splitCollapsedRegex(cpts, all, (gpt4o ??= collapseRegex(GPT4O_REGEX)));
    case "default": {
      let segs = splitRuns(cpts, all, isDefaultPunct);
      segs = splitGpt2(cpts, segs);
      segs = splitRuns(cpts, segs, isDefaultNumber);
      return splitDigitTriples(cpts, segs);
    }
  }
}
