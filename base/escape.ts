// Strings that come from a file or the network (GGUF keys and names, mDNS TXT records, peers' names)
// go to terminals and logs: control characters (ANSI escape sequences, carriage returns), C1
// controls, bidirectional overrides and lone surrogates are shown as visible escapes, and the length
// is bounded.

// C0, DEL, C1, Arabic letter mark, LRM/RLM, line/paragraph separators, bidi embeddings and isolates,
// lone surrogates (with the u flag only unpaired ones match).
const UNPRINTABLE = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]/gu;

/** `s` safe to print: unprintable characters as \xNN or \u{NNNN}, at most `maxChars` characters. */
export function printable(s: string, maxChars = 120): string {
  const chars = Array.from(s);
  const cut = chars.length > maxChars ? `${chars.slice(0, maxChars).join("")}…` : s;
  return cut.replace(UNPRINTABLE, (c) => {
    const code = c.codePointAt(0)!;
    return code < 0x100 ? `\\x${code.toString(16).padStart(2, "0")}` : `\\u{${code.toString(16)}}`;
  });
}
