// A JSON Schema "pattern" as the engine must be given it. The engine turns a pattern into the
// characters of the JSON string as they are, unescaped: "." or "[^a]" would let a raw quote (which
// ends the string early), a lone backslash or a control character into the output, all invalid JSON.
// So every class and escape is narrowed to characters a JSON string holds as they are (no quote, no
// backslash, nothing below U+0020), and a quote or backslash the pattern spells out is written as
// its JSON escape. The result matches a subset of what the pattern matches.
import { SchemaError } from "./schema-check.js";

/** The characters excluded from every class and wildcard. */
const UNSAFE = '"\\\\\\x00-\\x1f';
/** "\s" narrowed to a space (the others are control characters or rare). */
const SPACE = " ";
/** "\S": printable ASCII but the space (and quote and backslash). The engine's matcher lets a
 * character a class excludes through when it comes as byte tokens, so a class that excludes
 * anything beyond ASCII ("\S" excludes U+00A0 and more) is written as the ASCII it allows. */
const NOT_SPACE = "[!#-\\[\\]-~]";

/** The pattern rewritten for the engine; throws SchemaError where it cannot be. */
export function enginePattern(pattern: string, at: string, keyword = "pattern"): string {
  const refuse = (why: string): never => {
    throw new SchemaError(keyword, at, `the pattern ${JSON.stringify(pattern.slice(0, 80))} ${why}`);
  };
  let out = "";
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i];
    if (c === "\\") {
      const e = pattern[++i];
      if (e === undefined) refuse("ends with a backslash");
      out += escapeOutside(e, refuse);
    } else if (c === "[") {
      const end = classEnd(pattern, i);
      if (end < 0) refuse("has an unclosed character class");
      out += safeClass(pattern.slice(i + 1, end), refuse);
      i = end;
    } else if (c === "(" && pattern[i + 1] === "?") {
      refuse("uses a group the constrained decoder does not support (lookaround, named or non-capturing)");
    } else if (c === ".") out += `[^${UNSAFE}]`;
    else if (c === '"') out += '\\\\"';
    else if (c.charCodeAt(0) < 0x20) refuse("contains a control character");
    else out += c;
  }
  return out;
}

/** An escape outside a class: those that may match a quote, backslash or control character narrowed. */
function escapeOutside(e: string, refuse: (why: string) => never): string {
  switch (e) {
    case "\\": return "\\\\\\\\";
    case '"': return '\\\\"';
    case "s": return SPACE;
    case "S": return NOT_SPACE;
    case "W": return `[^A-Za-z0-9_${UNSAFE}]`;
    case "D": return `[^0-9${UNSAFE}]`;
    case "d": case "w": return `\\${e}`;
    default:
      // Control-character escapes, code points and back-references are refused; the rest (\. \/ \-)
      // stand for themselves.
      if (/[A-Za-z0-9]/.test(e)) refuse(`uses "\\${e}", which the constrained decoder does not support`);
      return `\\${e}`;
  }
}

/** Index of the "]" closing the class opened at `start`, or -1. */
function classEnd(p: string, start: number): number {
  let i = start + 1;
  if (p[i] === "^") i++;
  if (p[i] === "]") i++; // a literal "]" first in the class
  for (; i < p.length; i++) {
    if (p[i] === "\\") i++;
    else if (p[i] === "]") return i;
  }
  return -1;
}

/** A class's body narrowed to safe characters: a negated class excludes the unsafe ones too; a
 * positive one loses them from its ranges (a quote or backslash it names becomes an alternative
 * spelling the JSON escape). */
function safeClass(body: string, refuse: (why: string) => never): string {
  const negated = body.startsWith("^");
  const items = negated ? body.slice(1) : body;
  // The class's members: single code points and ranges, or the escapes \d \w.
  const ranges: [number, number][] = [];
  let escapes = "";
  const chars = [...items];
  const point = (k: number): [number, number] => {
    const c = chars[k];
    if (c !== "\\") return [c.codePointAt(0)!, k + 1];
    const e = chars[k + 1];
    if (e === undefined) refuse("ends a class with a backslash");
    if (/[A-Za-z0-9]/.test(e)) return [-1, k + 2]; // a class escape: handled by the caller
    return [e.codePointAt(0)!, k + 2];
  };
  for (let k = 0; k < chars.length; ) {
    const [lo, next] = point(k);
    if (lo < 0) {
      const e = chars[k + 1];
      if (e === "d" || e === "w") escapes += `\\${e}`;
      else if (e === "s" && !negated) escapes += SPACE;
      else if (e === "s" && negated) ranges.push([0x20, 0x20], [0x80, 0x10ffff]); // as above
      else refuse(`uses "\\${e}" in a class, which the constrained decoder does not support`);
      k = next;
      continue;
    }
    if (chars[next] === "-" && next + 1 < chars.length) {
      const [hi, after] = point(next + 1);
      if (hi < 0 || hi < lo) refuse("has a class range the constrained decoder cannot read");
      ranges.push([lo, hi]);
      k = after;
    } else {
      ranges.push([lo, lo]);
      k = next;
    }
  }
  if (negated && ranges.every(([, hi]) => hi < 0x80)) return `[^${escapes}${ranges.map(rangeText).join("")}${UNSAFE}]`;
  if (negated) {
    // Excluding beyond ASCII: the printable ASCII it allows instead (see NOT_SPACE).
    if (escapes) refuse("uses \\d or \\w in a negated class with characters beyond ASCII, which the constrained decoder does not support");
    const allowed: [number, number][] = [];
    for (let c = 0x20; c <= 0x7e; c++) {
      if (c === 0x22 || c === 0x5c || ranges.some(([lo, hi]) => lo <= c && c <= hi)) continue;
      const last = allowed[allowed.length - 1];
      if (last && last[1] === c - 1) last[1] = c;
      else allowed.push([c, c]);
    }
    if (allowed.length === 0) refuse("has a class with no character a JSON string can hold as it is");
    return `[${allowed.map(rangeText).join("")}]`;
  }
  // Positive: the ranges without the unsafe characters; a quote or backslash named becomes its escape.
  const safe: [number, number][] = [];
  let quote = false, backslash = false;
  for (const [lo, hi] of ranges) {
    if (lo <= 0x22 && 0x22 <= hi) quote = true;
    if (lo <= 0x5c && 0x5c <= hi) backslash = true;
    for (const [a, b] of [[0x20, 0x21], [0x23, 0x5b], [0x5d, 0x10ffff]] as const) {
      const l = Math.max(lo, a), h = Math.min(hi, b);
      if (l <= h) safe.push([l, h]);
    }
  }
  const alternatives: string[] = [];
  if (safe.length > 0 || escapes) alternatives.push(`[${escapes}${safe.map(rangeText).join("")}]`);
  if (quote) alternatives.push('\\\\"');
  if (backslash) alternatives.push("\\\\\\\\");
  if (alternatives.length === 0) refuse("has a class with no character a JSON string can hold as it is");
  return alternatives.length === 1 ? alternatives[0] : `(${alternatives.join("|")})`;
}

function rangeText([lo, hi]: [number, number]): string {
  const one = (c: number) => (/[\]\\^\-[]/.test(String.fromCodePoint(c)) ? `\\${String.fromCodePoint(c)}` : String.fromCodePoint(c));
  return lo === hi ? one(lo) : `${one(lo)}-${one(hi)}`;
}
