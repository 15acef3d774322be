// Whole numbers within bounds, written as grammar here: XGrammar's own ranges let values past the
// bounds through (3 for a minimum of 5, 125 for a maximum of 120, a bare "-" for a minimum of -5).
// The schema given to the engine holds a placeholder string in their place (integerPlaceholder),
// which withIntegerRanges swaps for the range's rule in the grammar the engine made of the schema.

/** A const the engine writes as a literal, standing for the integers from lo to hi (either may be
 * infinite). */
export function integerPlaceholder(lo: number, hi: number): string {
  const n = (x: number) => (x === -Infinity || x === Infinity ? "inf" : x < 0 ? `n${-x}` : `${x}`);
  return `PRIMA_INT_${n(lo)}_${n(hi)}`;
}

const PLACEHOLDER = /"\\"PRIMA_INT_(n?\d+|inf)_(n?\d+|inf)\\""/g;

/** The grammar with each placeholder literal (as the engine writes a const string) replaced by the
 * rule of its range. */
export function withIntegerRanges(ebnf: string): string {
  const read = (s: string, inf: number) => (s === "inf" ? inf : s.startsWith("n") ? -Number(s.slice(1)) : Number(s));
  return ebnf.replace(PLACEHOLDER, (_, lo: string, hi: string) => integerRule(read(lo, -Infinity), read(hi, Infinity)));
}

/** The JSON integers from lo to hi as an EBNF expression (no leading zeros, no "-0"). */
export function integerRule(lo: number, hi: number): string {
  const parts: string[] = [];
  if (lo < 0) parts.push(`"-" ${positive(Math.max(1, -hi), -lo)}`);
  if (lo <= 0 && hi >= 0) parts.push('"0"');
  if (hi >= 1) parts.push(positive(Math.max(1, lo), hi));
  return `(${parts.join(" | ")})`;
}

/** 1 <= a <= b (b may be Infinity). */
function positive(a: number, b: number): string {
  const parts: string[] = [];
  const from = String(a).length, to = b === Infinity ? from : String(b).length;
  for (let len = from; len <= to; len++) {
    const x = Math.max(a, 10 ** (len - 1)), y = Math.min(b, 10 ** len - 1);
    if (x <= y) parts.push(sameLength(String(x), String(y)));
  }
  if (b === Infinity) parts.push(`[1-9] [0-9]{${from},}`);
  return `(${parts.join(" | ")})`;
}

/** The digit strings of one length from x to y. */
function sameLength(x: string, y: string): string {
  if (x.length === 0) return '""';
  if (x === y) return `"${x}"`;
  const rest = x.length - 1;
  if (x[0] === y[0]) return `"${x[0]}" ${sameLength(x.slice(1), y.slice(1))}`;
  const parts = [`"${x[0]}" ${sameLength(x.slice(1), "9".repeat(rest))}`];
  const lo = Number(x[0]) + 1, hi = Number(y[0]) - 1;
  if (lo <= hi) parts.push(`[${lo}-${hi}]${rest > 0 ? ` [0-9]{${rest}}` : ""}`);
  parts.push(`"${y[0]}" ${sameLength("0".repeat(rest), y.slice(1))}`);
  return `(${parts.join(" | ")})`;
}
