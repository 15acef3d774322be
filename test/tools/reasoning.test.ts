// The reasoning split and gpt-oss's harmony calls, on the exact replies llama.cpp's own parser tests
// use (tests/test-chat.cpp: the gpt-oss, Qwen3.5, QwQ and DeepSeek R1 cases), with the contents,
// reasoning and calls those tests expect. Each reply is also fed in pieces of every small size: the
// streamed events must add up to the same content, reasoning and arguments. Whether a template opens
// the <think> block itself is read off llama.cpp's copies of the real templates, rendered here.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { ChatTemplate } from "../../dist/model/index.js";
import { FORMATS, detectFormat, detectReasoning, openedThink, replyParser, type ReplyEvent, type ReplyParserOptions } from "../../dist/tools/index.js";
import { LLAMA_CPP_SOURCE } from "../global-setup.js";

const template = (name: string) => readFileSync(join(LLAMA_CPP_SOURCE, "models", "templates", name), "utf8");
const GPT_OSS = template("openai-gpt-oss-120b.jinja");

interface Parsed {
  content: string | null;
  reasoning: string | null;
  calls: [string, string][];
}

/** The reply fed whole and in pieces of 1 to 7 characters: the same result, and events that add up to it. */
function parse(o: ReplyParserOptions, text: string): Parsed {
  let whole: Parsed | undefined;
  for (const size of [text.length || 1, 1, 2, 3, 5, 7]) {
    const p = replyParser(o)!;
    const events: ReplyEvent[] = [];
    for (let i = 0; i < text.length; i += size) events.push(...p.push(text.slice(i, i + size)));
    const end = p.finish();
    events.push(...end.events);
    const r: Parsed = { content: end.content, reasoning: end.reasoning, calls: p.calls.map((c) => [c.name, c.arguments]) };
    const joined = (kind: string) => events.filter((e) => e.kind === kind).map((e) => (e as { text: string }).text).join("");
    // beside calls the content is trimmed as a whole (a stream has sent its whitespace already)
    expect(r.calls.length > 0 ? joined("content").trim() : joined("content"), `size ${size}`).toBe(r.content ?? "");
    expect(joined("reasoning"), `size ${size}`).toBe(r.reasoning ?? "");
    for (const [i, c] of p.calls.entries()) {
      expect(events.filter((e) => e.kind === "call" && e.index === i)).toHaveLength(1);
      expect(events.filter((e) => e.kind === "arguments" && e.index === i).map((e) => (e as { text: string }).text).join("")).toBe(c.arguments);
    }
    if (whole) expect(r, `size ${size}`).toEqual(whole);
    whole ??= r;
  }
  return whole!;
}

// llama.cpp's messages (test-chat.cpp): message_assist, message_assist_thoughts, message_assist_call.
const HELLO = "Hello, world!\nWhat's up?";
const THINKING = "I'm\nthinking";
const CALL: [string, string] = ["special_function", "{\"arg1\": 1}"];

describe("gpt-oss's harmony replies, as llama.cpp's gpt-oss tests read them", () => {
  const plain: ReplyParserOptions = { reasoning: detectReasoning(GPT_OSS), names: [], split: true };
  const tools: ReplyParserOptions = { ...plain, format: detectFormat(GPT_OSS), names: ["special_function", "edit"] };

  it("finds the format in the template", () => {
    expect(detectReasoning(GPT_OSS)).toBe("harmony");
    expect(detectFormat(GPT_OSS)).toBe(FORMATS.harmony);
  });

  it("the final and commentary channels are the content; analysis is the reasoning", () => {
    expect(parse(plain, `<|channel|>final<|message|>${HELLO}`)).toEqual({ content: HELLO, reasoning: null, calls: [] });
    expect(parse(plain, `<|channel|>commentary<|message|>${HELLO}`)).toEqual({ content: HELLO, reasoning: null, calls: [] });
    const both = `<|channel|>analysis<|message|>${THINKING}<|end|><|start|>assistant<|channel|>final<|message|>${HELLO}`;
    expect(parse(plain, both)).toEqual({ content: HELLO, reasoning: THINKING, calls: [] });
    // --reasoning-format none: the analysis stays in the content with its markup, as llama.cpp keeps it
    expect(parse({ ...plain, split: false }, both)).toEqual({ content: `<|channel|>analysis<|message|>${THINKING}<|end|>${HELLO}`, reasoning: null, calls: [] });
    // cut off while reasoning
    expect(parse(plain, `<|channel|>analysis<|message|>${THINKING}`)).toEqual({ content: "", reasoning: THINKING, calls: [] });
  });

  it("a stray \"<|channel|>commentary to=assistant\" before a channel changes nothing", () => {
    for (const text of [
      `<|channel|>commentary to=assistant<|channel|>analysis<|message|>${THINKING}<|end|><|start|>assistant<|channel|>final<|message|>${HELLO}`,
      `<|channel|>analysis<|message|>${THINKING}<|end|><|start|>assistant<|channel|>commentary to=assistant<|channel|>final<|message|>${HELLO}`,
    ]) expect(parse(plain, text)).toEqual({ content: HELLO, reasoning: THINKING, calls: [] });
  });

  it("calls with the recipient in the role header or the channel header, with or without a constraint", () => {
    for (const text of [
      " to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}",
      "<|channel|>analysis to=functions.special_function<|message|>{\"arg1\": 1}",
      " to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{\"arg1\": 1}",
      "<|channel|>commentary to=functions.special_function<|message|>{\"arg1\": 1}",
      // the format's own, as the grammar writes it
      `${FORMATS.harmony.begin("special_function")}{"arg1": 1}`,
    ]) expect(parse(tools, text), text).toEqual({ content: null, reasoning: null, calls: [CALL] });
    expect(parse(tools, `<|channel|>analysis<|message|>${THINKING}<|end|><|start|>assistant to=functions.special_function<|channel|>analysis<|message|>{"arg1": 1}`))
      .toEqual({ content: null, reasoning: THINKING, calls: [CALL] });
    const args = "{\"oldString\": \"if (part < railCount - 1) {\", \"newString\": \"if (part < 4) {\", \"replaceAll\": false}";
    expect(parse(tools, `<|channel|>analysis<|message|>Thinking about edit...<|end|><|start|>assistant<|channel|>commentary to=functions.edit <|constrain|>json<|message|>${args}`))
      .toEqual({ content: null, reasoning: "Thinking about edit...", calls: [["edit", args]] });
  });

  it("structured output on the final channel; calls to the model's built-in tools are dropped", () => {
    const json = "{\"amount\": 123.45, \"date\": \"2025-12-03\"}";
    expect(parse(plain, `<|channel|>analysis<|message|>I need to output the invoice details in JSON<|end|><|start|>assistant<|channel|>final <|constrain|>json<|message|>${json}`))
      .toEqual({ content: json, reasoning: "I need to output the invoice details in JSON", calls: [] });
    const said = "I will execute python to say hello";
    for (const text of [
      `<|channel|>analysis<|message|>${said}<|end|><|start|>assistant to=container.exec<|channel|>commentary<|message|>python3 -c 'print("hello")'`,
      `<|channel|>analysis<|message|>${said}<|end|><|start|>assistant<|channel|>commentary to=python <|constrain|>code<|message|>print("hello")`,
    ]) {
      expect(parse(plain, text)).toEqual({ content: "", reasoning: said, calls: [] });
      expect(parse(tools, text)).toEqual({ content: "", reasoning: said, calls: [] });
    }
    // a call to a function that is not given (or with tool_choice none) is dropped the same way
    expect(parse(plain, "<|channel|>commentary to=functions.special_function<|message|>{\"arg1\": 1}")).toEqual({ content: "", reasoning: null, calls: [] });
  });

  it("output with no harmony header (JSON forced from the first token, a tiny model's words) is content as it is", () => {
    for (const text of ["{\"a\": 1}", "Once upon a time <|end|> there", "a <|chan", ""]) expect(parse(tools, text)).toEqual({ content: text, reasoning: null, calls: [] });
    // a call after free text (the grammar's trigger, with tool_choice auto)
    expect(parse(tools, `Once upon a time ${FORMATS.harmony.begin("special_function")}{"arg1": 1}`)).toEqual({ content: "Once upon a time", reasoning: null, calls: [CALL] });
  });

  it("a call's arguments end where their JSON closes: an end marker inside a string is text", () => {
    const args = "{\"s\": \"a<|end|>b \\\"<|call|>\"}";
    expect(parse(tools, `<|channel|>commentary to=functions.edit <|constrain|>json<|message|>${args}<|call|>`)).toEqual({ content: null, reasoning: null, calls: [["edit", args]] });
    expect(parse(tools, `<|channel|>commentary to=functions.edit<|message|>${args} <|end|><|start|>assistant<|channel|>final<|message|>ok`)).toEqual({ content: "ok", reasoning: null, calls: [["edit", args]] });
  });
});

describe("<think> blocks, as llama.cpp's reasoning tests read them", () => {
  const render = (name: string) => new ChatTemplate(template(name), "<s>", "</s>", false, false).render([{ role: "user", content: "hello" }]);

  it("a template that opens the block leaves the model inside it (Qwen3.5, QwQ, DeepSeek R1's distills); Qwen3 does not", () => {
    expect(openedThink(render("Qwen3.5-4B.jinja"))).toBe("<think>\n");
    expect(openedThink(render("Qwen-QwQ-32B.jinja"))).toBe("<think>\n");
    expect(openedThink(render("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"))).toBe("<think>\n");
    expect(openedThink(render("Qwen-Qwen3-0.6B.jinja"))).toBeUndefined();
    for (const name of ["Qwen3.5-4B.jinja", "Qwen-QwQ-32B.jinja", "Qwen-Qwen3-0.6B.jinja", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"]) {
      expect(detectReasoning(template(name)), name).toBe("think");
    }
    expect(detectReasoning(template("meta-llama-Llama-3.1-8B-Instruct.jinja"))).toBeUndefined();
  });

  const opened: ReplyParserOptions = { reasoning: "think", names: [], split: true, promptText: "<|im_start|>assistant\n<think>\n" };
  const closed: ReplyParserOptions = { ...opened, promptText: "<|im_start|>assistant\n" };

  it("reasoning and content trimmed at the block's edges", () => {
    expect(parse(opened, `${THINKING}\n</think>\n\n${HELLO}`)).toEqual({ content: HELLO, reasoning: THINKING, calls: [] });
    expect(parse(opened, "Let me think about this...\n</think>\nThe answer is 42.")).toEqual({ content: "The answer is 42.", reasoning: "Let me think about this...", calls: [] });
    expect(parse(opened, `${THINKING}</think>${HELLO}`)).toEqual({ content: HELLO, reasoning: THINKING, calls: [] });
    expect(parse(opened, "</think>Hello, world!")).toEqual({ content: "Hello, world!", reasoning: null, calls: [] });
    // the model opens the block itself
    expect(parse(closed, `<think>\n${THINKING}\n</think>\n\n${HELLO}`)).toEqual({ content: HELLO, reasoning: THINKING, calls: [] });
    expect(parse(closed, HELLO)).toEqual({ content: HELLO, reasoning: null, calls: [] });
    expect(parse(closed, " <thinking is fun")).toEqual({ content: " <thinking is fun", reasoning: null, calls: [] });
    // cut off while reasoning
    expect(parse(opened, THINKING)).toEqual({ content: "", reasoning: THINKING, calls: [] });
  });

  it("--reasoning-format none: all content, starting with the opening the prompt had, as llama.cpp's", () => {
    expect(parse({ ...opened, split: false }, `${THINKING}\n</think>\n\n${HELLO}`)).toEqual({ content: `<think>\n${THINKING}\n</think>\n\n${HELLO}`, reasoning: null, calls: [] });
    expect(parse({ ...closed, split: false }, `<think>${THINKING}</think>${HELLO}`)).toEqual({ content: `<think>${THINKING}</think>${HELLO}`, reasoning: null, calls: [] });
  });

  it("calls after the block (Hermes/Qwen <tool_call>)", () => {
    const call = "<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}\n</tool_call>";
    const tools: ReplyParserOptions = { ...opened, format: FORMATS.hermes, names: ["special_function"] };
    expect(parse(tools, `${THINKING}\n</think>\n\n${call}`)).toEqual({ content: null, reasoning: THINKING, calls: [CALL] });
    expect(parse({ ...tools, promptText: "<think>\n\n</think>\n\n" }, call)).toEqual({ content: null, reasoning: null, calls: [CALL] });
  });
});
