// Unicode facts the tokenizers need, with llama.cpp's semantics (src/unicode.cpp):
// codepoint category flags, whitespace, and GPT-2's byte <-> character map.

/** Category flags, the same bits as llama.cpp's unicode_cpt_flags. */
export const CptFlag = {
  UNDEFINED: 0x0001,
  NUMBER: 0x0002,
  LETTER: 0x0004,
  SEPARATOR: 0x0008,
  MARK: 0x0010,
  PUNCTUATION: 0x0020,
  SYMBOL: 0x0040,
  CONTROL: 0x0080,
  WHITESPACE: 0x0100,
} as const;

export const CATEGORY_MASK = 0x00ff;
const COMPUTED = 0x8000;
const MAX_CODEPOINTS = 0x110000;

// llama.cpp's category table was generated from Unicode 15.1. V8 may know a newer Unicode, in which
// these codepoints (assigned in Unicode 16.0 and 17.0) have categories; llama.cpp sees them as
// unassigned, and so must we. A test compares every codepoint with llama.cpp's own table, so a
// Node with an even newer Unicode shows up there.
const ASSIGNED_AFTER_15_1 =
  "88f,897,c5c,cdc,1acf-1add,1ae0-1aeb,1b4e-1b4f,1b7f,1c89-1c8a,20c1,2427-2429,2b96,31e4-31e5," +
  "a7cb-a7cf,a7d2,a7d4,a7da-a7dc,a7f1,fbc3-fbd2,fd90-fd91,fdc8-fdce,105c0-105f3,10940-10959," +
  "10d40-10d65,10d69-10d85,10d8e-10d8f,10ec2-10ec7,10ed0-10ed8,10efa-10efc,11380-11389,1138b,1138e," +
  "11390-113b5,113b7-113c0,113c2,113c5,113c7-113ca,113cc-113d5,113d7-113d8,113e1-113e2,116d0-116e3," +
  "11b60-11b67,11bc0-11be1,11bf0-11bf9,11db0-11ddb,11de0-11de9,11f5a,13460-143fa,16100-16139," +
  "16d40-16d79,16ea0-16eb8,16ebb-16ed3,16ff2-16ff6,187f8-187ff,18cff,18d09-18d1e,18d80-18df2," +
  "1cc00-1ccfc,1cd00-1ceb3,1ceba-1ced0,1cee0-1cef0,1e5d0-1e5fa,1e5ff,1e6c0-1e6de,1e6e0-1e6f5," +
  "1e6fe-1e6ff,1f6d8,1f777-1f77a,1f8b2-1f8bb,1f8c0-1f8c1,1f8d0-1f8d8,1fa54-1fa57,1fa89-1fa8a," +
  "1fa8e-1fa8f,1fabe,1fac6,1fac8,1facd,1fadc,1fadf,1fae9-1faea,1faef,1fbcb-1fbef,1fbfa,2b73a-2b73f," +
  "2cea2-2cead,323b0-33479";

const newerRanges: ReadonlyArray<readonly [number, number]> = ASSIGNED_AFTER_15_1.split(",").map((r) => {
  const [a, b] = r.split("-");
  return [parseInt(a, 16), parseInt(b ?? a, 16)] as const;
});

function assignedAfter151(cpt: number): boolean {
  let lo = 0;
  let hi = newerRanges.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    const [a, b] = newerRanges[mid];
    if (cpt < a) hi = mid - 1;
    else if (cpt > b) lo = mid + 1;
    else return true;
  }
  return false;
}

// Unicode general categories grouped as llama.cpp's gen-unicode-data.py groups them.
const CATEGORY_TESTS: ReadonlyArray<readonly [RegExp, number]> = [
  [/^\p{L}$/u, CptFlag.LETTER],
  [/^\p{N}$/u, CptFlag.NUMBER],
  [/^\p{P}$/u, CptFlag.PUNCTUATION],
  [/^\p{S}$/u, CptFlag.SYMBOL],
  [/^\p{M}$/u, CptFlag.MARK],
  [/^\p{Z}$/u, CptFlag.SEPARATOR],
  [/^[\p{Cc}\p{Cf}\p{Co}\p{Cs}]$/u, CptFlag.CONTROL],
];
const WHITESPACE = /^\p{White_Space}$/u;

let flagCache: Uint16Array | undefined;

function computeFlags(cpt: number): number {
  let flags: number = CptFlag.UNDEFINED;
  if (!assignedAfter151(cpt)) {
    const s = String.fromCodePoint(cpt);
    for (const [re, flag] of CATEGORY_TESTS) {
      if (re.test(s)) {
        flags = flag;
        break;
      }
    }
    if (WHITESPACE.test(s)) flags |= CptFlag.WHITESPACE;
  }
  return flags;
}

/** llama.cpp's unicode_cpt_flags_from_cpt: one category bit plus WHITESPACE; out of range is UNDEFINED. */
export function cptFlags(cpt: number): number {
  if (cpt < 0 || cpt >= MAX_CODEPOINTS) return CptFlag.UNDEFINED;
  // Surrogates cannot be built into a string on their own; they are category Cs.
  if (cpt >= 0xd800 && cpt <= 0xdfff) return CptFlag.CONTROL;
  const cache = (flagCache ??= new Uint16Array(MAX_CODEPOINTS));
  let f = cache[cpt];
  if (f === 0) {
    f = computeFlags(cpt) | COMPUTED;
    cache[cpt] = f;
  }
  return f & ~COMPUTED;
}

/** Codepoints of a well-formed JS string (lone surrogates must already be replaced). */
export function codepointsOf(text: string): Uint32Array {
  const out = new Uint32Array(text.length);
  let n = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < text.length) {
      const d = text.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        out[n++] = ((c - 0xd800) << 10) + (d - 0xdc00) + 0x10000;
        i++;
        continue;
      }
    }
    out[n++] = c;
  }
  return out.subarray(0, n);
}

/** Appends the UTF-8 bytes of `cpt` (as llama.cpp's unicode_cpt_to_utf8) to `out`. */
export function pushUtf8(cpt: number, out: number[]): void {
  if (cpt <= 0x7f) out.push(cpt);
  else if (cpt <= 0x7ff) out.push(0xc0 | (cpt >> 6), 0x80 | (cpt & 0x3f));
  else if (cpt <= 0xffff) out.push(0xe0 | (cpt >> 12), 0x80 | ((cpt >> 6) & 0x3f), 0x80 | (cpt & 0x3f));
  else out.push(0xf0 | (cpt >> 18), 0x80 | ((cpt >> 12) & 0x3f), 0x80 | ((cpt >> 6) & 0x3f), 0x80 | (cpt & 0x3f));
}

const utf8Encoder = new TextEncoder();
export function utf8Bytes(text: string): Uint8Array {
  return utf8Encoder.encode(text);
}

/** C's isspace() in the "C" locale, which llama.cpp uses to strip around special tokens. */
export function isCSpace(code: number): boolean {
  return code === 0x20 || (code >= 0x09 && code <= 0x0d);
}

// ---- GPT-2 byte-level encoding -----------------------------------------------------------------
// Every byte maps to a printable character: printable Latin-1 bytes map to themselves, the other 68
// bytes to U+0100.. in byte order (OpenAI's bytes_to_unicode, as llama.cpp's unicode_byte_to_utf8_map).

function buildByteMaps(): { byteToChar: string[]; charToByte: Map<number, number> } {
  const byteToChar = new Array<string>(256);
  const charToByte = new Map<number, number>();
  const printable = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const cpt = printable(b) ? b : 256 + n++;
    byteToChar[b] = String.fromCharCode(cpt);
    charToByte.set(cpt, b);
  }
  return { byteToChar, charToByte };
}

export const gpt2Bytes = buildByteMaps();
