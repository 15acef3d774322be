// Shared by the tokenizer tests: llama.cpp's golden test cases and a generator of nasty strings.

import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { GgufKV } from "../../model/gguf.js";
import { goldenTokenizerDir } from "../../model/tokenizer-bundled.js";
import { mulberry32 } from "../helpers/random.js";

/** The string items of an array metadata value. */
export function stringItems(meta: readonly GgufKV[], key: string): string[] {
  const v = meta.find((m) => m.key === key)?.value;
  if (typeof v !== "object" || !Array.isArray(v.items)) throw new Error(`${key} is not an array of strings`);
  return v.items as string[];
}

export const GOLDEN_VOCABS = ["llama-spm", "phi-3", "gpt-2", "llama-bpe", "qwen2"] as const;
export type GoldenVocab = (typeof GOLDEN_VOCABS)[number];

export interface GoldenCase {
  readonly text: string;
  readonly ids: readonly number[];
}

/** Reads X.gguf.inp / X.gguf.out exactly as llama.cpp's test-tokenizer-0 does. */
export function goldenCases(name: GoldenVocab): GoldenCase[] {
  const dir = goldenTokenizerDir();
  const raw = readFileSync(join(dir, `ggml-vocab-${name}.gguf.inp`), "utf8");
  const outLines = readFileSync(join(dir, `ggml-vocab-${name}.gguf.out`), "utf8").split("\n");
  if (outLines[outLines.length - 1] === "") outLines.pop();
  const sep = "\n__ggml_vocab_test__\n";
  const inputs: string[] = [];
  let pos = 0;
  while (pos < raw.length) {
    const next = raw.indexOf(sep, pos);
    if (next < 0) {
      inputs.push(raw.slice(pos));
      break;
    }
    inputs.push(raw.slice(pos, next));
    pos = next + sep.length;
  }
  if (inputs.length !== outLines.length) {
    throw new Error(`${name}: ${inputs.length} inputs but ${outLines.length} expected outputs`);
  }
  return inputs.map((text, i) => {
    const o = outLines[i].trim();
    return { text, ids: o === "" ? [] : o.split(" ").map(Number) };
  });
}

/** Chat turns and the runs of whitespace, tabs and markup that Gemma's vocabulary has tokens for. */
export const CHAT_AND_LAYOUT_STRINGS: readonly string[] = [
  "<start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n",
  "<bos><start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n",
  "<start_of_turn>user\n<start_of_turn><end_of_turn> nested <end_of_turn>",
  "def f(x):\n    return x*2  # double\n\n\n\tpass\n\t\t\tdone",
  "a  b   c    d" + " ".repeat(40) + "e", "\n".repeat(35) + "x", "\t".repeat(33) + "y", " \n \n\n  \t\t ",
  "<table><tr><td>1</td><td>2</td></tr></table>", "<h1>Title</h1><p>para <b>bold</b> <i>it</i></p>",
  "<unused0><unused99>[multimodal]<mask>", "<start_of_image><end_of_image>", "Ünïcödé ñ ß æ ø 日本語 🦙\r\n",
];

/** Deterministic PRNG (mulberry32). */
export const rng = mulberry32;

const PIECES = [
  "Hello", " world", "I'm", " it'S", "'ll", "'RE", "'d", "don't", "DON'T", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n\n",
  " \n ", "\u00a0", "\u3000", "\u2028", "\u0085", "\u200b", "\ufeff", "0", "12", "345", "6789", "3.14", "1,000,000",
  "٣٤٥", "Ⅻ", "½", "²", "🦙", "👩‍👩‍👧", "🇩🇪", "😶‍🌫️", "✅", "éé", "e\u0301", "ǅ", "ß", "Ǆ", "İ", "ﬁ", "中文字符",
  "日本語のテキスト", "한국어", "русский текст", "ελληνικά", "עברית", "العربية", "हिन्दी", "ไทย", "ᏣᎳᎩ",
  "!!", "...", "?!", " ,", " .", " '", " ' ", "''", "```", "---", "===", "$$", "+-", "<>", "^^", "~", "|", "`",
  "(", ")", "[", "]", "{", "}", "@#", "%&*", "\\", "/", "_", "\u0000", "\u0001", "\u001f", "\u007f", "\ud800",
  "\udfff", "\ufffd", "\u{10ffff}", "\u{e000}", "\u0378", "\u088f", "\u{1fadc}", "\u{13460}", "▁", "▁▁hi",
  "<s>", "</s>", "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>",
  "<tool_call>", "<think>", "<|end|>", "<|user|>", "<|im_st", "art|>", "<0x41>", "[PAD151669]",
];

/** Random strings mixing ASCII, scripts, emoji, whitespace runs, digits, special-token text and lone surrogates. */
export function nastyStrings(seed: number, count: number, extraPieces: readonly string[] = []): string[] {
  const r = rng(seed);
  const pieces = [...PIECES, ...extraPieces];
  const out: string[] = [
    " ".repeat(300), "\n".repeat(50), " \t".repeat(40), "9".repeat(257), "a".repeat(1000), "ab".repeat(300),
    "🦙".repeat(40), "'s".repeat(30), "\u00a0 ".repeat(20), "".padEnd(100, "x\u0301"),
  ];
  while (out.length < count) {
    let s = "";
    const n = 1 + Math.floor(r() * 12);
    for (let i = 0; i < n; i++) {
      const k = r();
      if (k < 0.7) s += pieces[Math.floor(r() * pieces.length)];
      else if (k < 0.85) s += String.fromCodePoint(Math.floor(r() * 0x3000));
      else if (k < 0.95) s += String.fromCodePoint(Math.floor(r() * 0x110000)); // any plane, surrogates included
      else s += String.fromCharCode(0xd800 + Math.floor(r() * 0x800)); // lone surrogate
    }
    out.push(s);
  }
  return out;
}
