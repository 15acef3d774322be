// Live comparison with llama.cpp (node-llama-cpp loads each vocabulary as a vocab-only model):
// the same ids for golden and random nasty strings, with and without special-token parsing, the
// same detokenized text, and the same special token ids.

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { getLlama, LlamaLogLevel, type Llama, type LlamaModel, type Token } from "node-llama-cpp";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { readGguf, type GgufKV } from "../../model/gguf.js";
import { kv, writeGguf } from "../../model/gguf-writer.js";
import { Tokenizer } from "../../model/tokenizer.js";
import { bundledVocab, goldenTokenizerDir } from "../../model/tokenizer-bundled.js";
import { CHAT_AND_LAYOUT_STRINGS, goldenCases, nastyStrings, rng, stringItems, type GoldenVocab } from "./tokenizer-fixtures.js";

/** The vocabularies compared, with the golden strings they have. */
/** Merges that join what gpt-4o's split keeps apart (camelCase halves) or together (a contraction and
 * its word): appended last, so they only ever act across such a boundary. */
function crossWordMerges(meta: readonly GgufKV[]): GgufKV[] {
  const pairs = [["Hello", "World"], ["Ġdon", "'t"], ["ĠTHE", "'S"], ["Ġcamel", "Case"], ["ĠI", "'M"], ["ĠDON", "'T"]];
  const tokens = [...stringItems(meta, "tokenizer.ggml.tokens")];
  const types = Array.from((meta.find((m) => m.key === "tokenizer.ggml.token_type")!.value as { items: ArrayLike<number> }).items);
  const merges = [...stringItems(meta, "tokenizer.ggml.merges")];
  for (const [a, b] of pairs) {
    tokens.push(a + b);
    types.push(1);
    merges.push(`${a} ${b}`);
  }
  const replaced = new Set(["tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"]);
  return [...meta.filter((m) => !replaced.has(m.key)), kv.strs("tokenizer.ggml.tokens", tokens), kv.i32s("tokenizer.ggml.token_type", types), kv.strs("tokenizer.ggml.merges", merges)];
}

const VOCABS: readonly (readonly [label: string, golden: GoldenVocab | null, metadata: () => readonly GgufKV[], texts?: readonly string[]])[] = [
  ["llama-spm", "llama-spm", () => bundledVocab("llama-spm").metadata],
  ["phi-3", "phi-3", () => bundledVocab("phi-3").metadata],
  ["gpt-2", "gpt-2", () => bundledVocab("gpt-2").metadata],
  // llama.cpp's "default" BPE pre-tokenizer (std::regex on category-collapsed text).
  ["gpt-2 with pre-tokenizer default", "gpt-2", () => [...bundledVocab("gpt-2").metadata.filter((m) => m.key !== "tokenizer.ggml.pre"), kv.str("tokenizer.ggml.pre", "default")]],
  ["llama-bpe", "llama-bpe", () => bundledVocab("llama-bpe").metadata],
  // llama.cpp's "gpt-4o" pre-tokenizer (o200k's: gpt-oss), std::regex on category-collapsed text too,
  // with merges across the words it and llama3's split disagree on, so that the ids show the split.
  ["llama-bpe with pre-tokenizer gpt-4o", "llama-bpe", () => crossWordMerges([...bundledVocab("llama-bpe").metadata.filter((m) => m.key !== "tokenizer.ggml.pre"), kv.str("tokenizer.ggml.pre", "gpt-4o")]),
    ["HelloWorld don't THE'S camelCaseX", "XMLHttpRequest's getHTTPResponse I'M DON'T", "ÉcoleNormale naïveCafé don'T"]],
  // Padded to Qwen2.5's vocab_size with unused tokens, as a generated model has it.
  ["qwen2 (151936 tokens)", "qwen2", () => bundledVocab("qwen2", { vocabSize: 151936 }).metadata],
  ["stories260K", null, () => bundledVocab("stories260K").metadata],
  // Gemma 2/3's SentencePiece vocabulary (no space prefix, byte fallback, user-defined runs of
  // newlines, spaces and tabs and HTML tags), converted from Gemma 3's tokenizer.json; llama-spm's
  // golden strings as text.
  ["gemma3", "llama-spm", () => bundledVocab("gemma3").metadata],
];

/** node-llama-cpp's native model object: llama.cpp's own answers without the JS layer's filtering. */
interface AddonModel {
  getTokenAttributes(id: number): number;
  isEogToken(id: number): boolean;
  shouldPrependBosToken(): boolean;
  shouldAppendEosToken(): boolean;
}
function addonOf(model: LlamaModel): AddonModel {
  return (model as unknown as { _model: AddonModel })._model;
}

let llama: Llama;
let dir: string;

beforeAll(async () => {
  llama = await getLlama({ gpu: false, build: "never", skipDownload: true, logLevel: LlamaLogLevel.disabled });
  dir = mkdtempSync(join(tmpdir(), "prima-vocab-"));
});
afterAll(async () => {
  await llama?.dispose();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** A vocab-only GGUF llama.cpp can load: llama hyper-parameters (from llama-spm's file) plus the vocabulary. */
function vocabGguf(name: string, tokenizerMeta: readonly GgufKV[]): { path: string; metadata: GgufKV[] } {
  const base = readGguf(join(goldenTokenizerDir(), "ggml-vocab-llama-spm.gguf"));
  const nVocab = stringItems(tokenizerMeta, "tokenizer.ggml.tokens").length;
  const meta: GgufKV[] = [];
  for (const [key, value] of base.metadata) {
    if (key.startsWith("tokenizer.")) continue;
    if (key === "general.name") meta.push(kv.str(key, name === "phi-3" ? "Phi3" : name));
    else if (key === "llama.vocab_size") meta.push(kv.u32(key, nVocab));
    else meta.push(value);
  }
  const path = join(dir, `${name.replace(/\W+/g, "_")}.gguf`);
  const metadata = [...meta, ...tokenizerMeta];
  writeGguf(path, metadata, []);
  return { path, metadata };
}

describe.each(VOCABS)("%s against llama.cpp", (name, golden, tokenizerMetadata, extraTexts) => {
  let ours: Tokenizer;
  let theirs: LlamaModel;
  let texts: string[];

  beforeAll(async () => {
    const { path, metadata } = vocabGguf(name, tokenizerMetadata());
    // All of the file's metadata, as llama.cpp reads it: general.name matters (Phi-3's special
    // tokens strip the spaces after them).
    ours = Tokenizer.fromMetadata(metadata);
    theirs = await llama.loadModel({ modelPath: path, vocabOnly: true });
    const specialTexts = [...Array(ours.nVocab).keys()]
      .filter((id) => ours.tokenAttributes(id) & 0b11001) // control, user-defined, unknown
      .map((id) => ours.tokenText(id));
    const r = rng(7);
    const picked = Array.from({ length: 40 }, () => specialTexts[Math.floor(r() * specialTexts.length)]);
    texts = [...(golden ? goldenCases(golden).map((c) => c.text) : []), ...CHAT_AND_LAYOUT_STRINGS, ...nastyStrings(1234, 250, picked), ...(extraTexts ?? [])];
  }, 60_000);
  afterAll(async () => {
    await theirs?.dispose();
  });

  test("special token ids, add_bos/add_eos", () => {
    // node-llama-cpp reports BOS/EOS only when they are control tokens.
    const control = (id: number | null) => (id !== null && ours.isControl(id) ? id : null);
    expect({ bos: control(ours.bos), eos: control(ours.eos), eot: ours.eot, nl: ours.nl }).toEqual({
      bos: theirs.tokens.bos, eos: theirs.tokens.eos, eot: theirs.tokens.eot, nl: theirs.tokens.nl,
    });
    const addon = addonOf(theirs);
    expect({ addBos: ours.addBos, addEos: ours.addEos }).toEqual({
      addBos: addon.shouldPrependBosToken(), addEos: addon.shouldAppendEosToken(),
    });
  });

  test("every token's attributes and end-of-generation flag", () => {
    const addon = addonOf(theirs);
    const mismatches: string[] = [];
    for (let id = 0; id < ours.nVocab; id++) {
      const want = { attr: addon.getTokenAttributes(id), eog: addon.isEogToken(id) };
      const got = { attr: ours.tokenAttributes(id), eog: ours.isEog(id) };
      if (got.attr !== want.attr || got.eog !== want.eog) {
        mismatches.push(`${id} ${JSON.stringify(ours.tokenText(id))}: ours ${JSON.stringify(got)} llama.cpp ${JSON.stringify(want)}`);
      }
    }
    expect(mismatches.slice(0, 5)).toEqual([]);
  });

  test.each([false, true])("encode, parseSpecial=%s", (parseSpecial) => {
    const mismatches: string[] = [];
    for (const text of texts) {
      const want = Array.from(theirs.tokenize(text, parseSpecial));
      const got = Array.from(ours.encode(text, { parseSpecial }));
      if (JSON.stringify(got) !== JSON.stringify(want)) mismatches.push(`${JSON.stringify(text)}: ours ${got} llama.cpp ${want}`);
    }
    expect(mismatches.slice(0, 5)).toEqual([]);
  });

  test.each([false, true])("detokenize, special=%s", (special) => {
    const mismatches: string[] = [];
    const r = rng(99);
    const idLists = texts.map((t) => Array.from(ours.encode(t, { parseSpecial: true })));
    // Plus random id sequences, which split UTF-8 characters and mix in every kind of token.
    for (let i = 0; i < 200; i++) idLists.push(Array.from({ length: 1 + Math.floor(r() * 12) }, () => Math.floor(r() * ours.nVocab)));
    for (const ids of idLists) {
      const want = theirs.detokenize(ids as Token[], special);
      const got = ours.detokenize(ids, { unparseSpecial: special });
      if (got !== want) mismatches.push(`${ids}: ours ${JSON.stringify(got)} llama.cpp ${JSON.stringify(want)}`);
    }
    expect(mismatches.slice(0, 5)).toEqual([]);
  });
});
