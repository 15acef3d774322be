// gpt-oss's harmony format and <think> reasoning through `serve`, as the `openai` and `ollama` packages
// use them. A generated tiny-gpt-oss carries llama.cpp's copy of gpt-oss's template: its random weights
// call no tool by themselves, so calls are forced (tool_choice required or named, the grammar from the
// first token) and must come back as message.tool_calls / delta.tool_calls naming a tool, with
// arguments that validate (ajv); a follow-up turn with the call and its result renders through the
// model's own template, token for token. The reasoning split end to end: the shipped model under QwQ's
// template (which opens the <think> block itself) writes nothing but reasoning, which must come back
// as reasoning_content / thinking, equal to the raw text that reasoning_format none returns.
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Ollama } from "ollama";
import type OpenAI from "openai";
import { Tokenizer, renderChat } from "../../dist/model/index.js";
import { generateModel } from "../../dist/modelgen/index.js";
import { HARMONY_FINAL_JSON } from "../../dist/tools/index.js";
import { LLAMA_CPP_SOURCE } from "../global-setup.js";
import { schemaErrors } from "../grammar/validate.js";
import { root } from "../helpers/process.js";
import { tempDir } from "../helpers/temp.js";
import { killAll } from "../ring/cluster.js";
import { startServe, type Served } from "./serve-harness.js";

afterAll(() => killAll());

const templateFile = (name: string) => join(LLAMA_CPP_SOURCE, "models", "templates", name);
const WEATHER = {
  type: "function" as const,
  function: {
    name: "get_weather", description: "The weather in a city now",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 30 }, unit: { enum: ["c", "f"] } }, required: ["city", "unit"], additionalProperties: false },
  },
};
const ADD = {
  type: "function" as const,
  function: { name: "add", description: "Adds two numbers", parameters: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } }, required: ["a", "b"], additionalProperties: false } },
};
const TOOLS = [WEATHER, ADD];
const MAX = 300;
const schemaOf = (name: string) => TOOLS.find((t) => t.function.name === name)!.function.parameters;

/** A streamed chat: its calls put together from delta.tool_calls, its content, reasoning and finish. */
async function streamed(client: OpenAI, body: OpenAI.Chat.ChatCompletionCreateParamsNonStreaming) {
  const calls: { id?: string; name?: string; args: string; starts: number }[] = [];
  let content = "", reasoning = "", finish: string | null = null;
  for await (const c of await client.chat.completions.create({ ...body, stream: true })) {
    const d = c.choices[0]?.delta as (OpenAI.Chat.ChatCompletionChunk.Choice.Delta & { reasoning_content?: string }) | undefined;
    content += d?.content ?? "";
    reasoning += d?.reasoning_content ?? "";
    for (const t of d?.tool_calls ?? []) {
      const call = (calls[t.index] ??= { args: "", starts: 0 });
      if (t.id !== undefined) {
        call.starts++;
        call.id = t.id;
        call.name = t.function?.name;
      }
      call.args += t.function?.arguments ?? "";
    }
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  return { calls, content, reasoning, finish };
}

describe("serve: gpt-oss's tool calls (harmony)", () => {
  let s: Served;
  let model: string;
  beforeAll(async () => {
    model = join(tempDir("prima-harmony-"), "tiny-gpt-oss.gguf");
    await generateModel({ shape: "tiny-gpt-oss", type: "Q8_0", out: model, seed: 5, chatTemplate: readFileSync(templateFile("openai-gpt-oss-120b.jinja"), "utf8") });
    s = await startServe([], { model });
  }, 120_000);
  afterAll(() => s?.proc.child.kill("SIGKILL"));

  it("required and named calls at temperature 0 and 1, streamed and not: one call naming a tool, its arguments valid", async () => {
    for (const tool_choice of ["required", { type: "function", function: { name: "add" } }] as const) {
      for (const temperature of [0, 1]) {
        const body = { messages: [{ role: "user" as const, content: "What is the weather in Paris?" }], tools: TOOLS, tool_choice, temperature, seed: 7, max_tokens: MAX };
        const r = await s.client.chat.completions.create(body);
        const m = r.choices[0].message;
        const what = `${JSON.stringify(tool_choice)} t=${temperature}: ${JSON.stringify(m)}`;
        expect(r.choices[0].finish_reason, what).toBe("tool_calls");
        expect(m.content, what).toBeNull();
        expect(m.tool_calls, what).toHaveLength(1); // harmony: one call per reply
        const call = m.tool_calls![0];
        if (call.type !== "function") throw new Error(what);
        expect(call.id, what).toMatch(/^call_[A-Za-z0-9]{24}$/);
        if (typeof tool_choice === "object") expect(call.function.name).toBe("add");
        expect(schemaErrors(schemaOf(call.function.name), JSON.parse(call.function.arguments)), what).toBe("");

        const st = await streamed(s.client, body);
        const swhat = `streamed ${what}: ${JSON.stringify(st)}`;
        expect(st.finish, swhat).toBe("tool_calls");
        expect(st.content, swhat).toBe("");
        expect(st.calls, swhat).toHaveLength(1);
        // the id and the name once, then the arguments in pieces; the same call as unstreamed at temperature 0
        expect(st.calls[0].starts, swhat).toBe(1);
        expect(st.calls[0].id, swhat).toMatch(/^call_/);
        expect(schemaErrors(schemaOf(st.calls[0].name!), JSON.parse(st.calls[0].args)), swhat).toBe("");
        if (temperature === 0) expect([st.calls[0].name, st.calls[0].args], swhat).toEqual([call.function.name, call.function.arguments]);
      }
    }
  });

  it("tool_choice auto: any call the model makes names a tool with valid arguments; none: no calls", async () => {
    for (const seed of [1, 2]) {
      const r = await s.client.chat.completions.create({ messages: [{ role: "user", content: "Add 2 and 3." }], tools: TOOLS, temperature: 1, seed, max_tokens: 60 });
      const c = r.choices[0];
      if ((c.message.tool_calls?.length ?? 0) > 0) expect(c.finish_reason).toBe("tool_calls");
      else expect(["stop", "length"]).toContain(c.finish_reason);
      for (const call of c.message.tool_calls ?? []) if (call.type === "function") expect(schemaErrors(schemaOf(call.function.name), JSON.parse(call.function.arguments))).toBe("");
    }
    const none = await s.client.chat.completions.create({ messages: [{ role: "user", content: "x" }], tools: TOOLS, tool_choice: "none", max_tokens: 20 });
    expect(none.choices[0].message.tool_calls ?? []).toEqual([]);
  });

  it("response_format json_schema: the answer is gpt-oss's final JSON message, its content valid (ajv), streamed and not", async () => {
    const schema = { type: "object", properties: { name: { type: "string", maxLength: 20 }, age: { type: "integer", minimum: 0, maximum: 120 } }, required: ["name", "age"], additionalProperties: false };
    for (const temperature of [0, 1]) {
      const body = { messages: [{ role: "user" as const, content: "Who are you?" }], temperature, seed: 4, max_tokens: MAX, response_format: { type: "json_schema" as const, json_schema: { name: "who", schema, strict: true } } };
      const r = await s.client.chat.completions.create(body);
      const text = r.choices[0].message.content!;
      expect(r.choices[0].finish_reason, text).toBe("stop");
      expect(text.startsWith("{"), text).toBe(true); // the harmony header is markup, not content
      expect(schemaErrors(schema, JSON.parse(text)), text).toBe("");
      const st = await streamed(s.client, body);
      expect(schemaErrors(schema, JSON.parse(st.content)), st.content).toBe("");
      if (temperature === 0) expect(st.content).toBe(text);
    }
    // what the model wrote, token by token (log probabilities list every generated token): the final
    // message's header, then the JSON that is the content
    const r = await s.client.chat.completions.create({ messages: [{ role: "user", content: "x" }], temperature: 0, max_tokens: MAX, logprobs: true, response_format: { type: "json_schema", json_schema: { name: "who", schema } } });
    const written = Buffer.from(r.choices[0].logprobs!.content!.flatMap((t) => t.bytes!)).toString("utf8");
    expect(written).toBe(`${HARMONY_FINAL_JSON}${r.choices[0].message.content}`);
  });

  it("a follow-up turn with the call (and its reasoning) and the tool's result renders through gpt-oss's own template", async () => {
    const ask = { role: "user" as const, content: "What is the weather in Paris?" };
    const first = await s.client.chat.completions.create({ messages: [ask], tools: [WEATHER], tool_choice: "required", temperature: 0, max_tokens: MAX });
    const call = first.choices[0].message.tool_calls![0];
    if (call.type !== "function") throw new Error("not a function call");
    const result = JSON.stringify({ temperature: 21, sky: "clear" });
    const messages = [
      ask,
      { role: "assistant" as const, content: null, reasoning_content: "I should look it up.", tool_calls: [call] },
      { role: "tool" as const, tool_call_id: call.id, content: result },
    ];
    const second = await s.client.chat.completions.create({ messages: messages as OpenAI.Chat.ChatCompletionMessageParam[], tools: [WEATHER], temperature: 0, max_tokens: 40 });
    // The prompt the server read is the template's rendering of these turns, token for token: the
    // reasoning kept beside the call, the call in the role header, the result from functions.NAME.
    const args = JSON.parse(call.function.arguments) as unknown;
    const text = renderChat(model, [
      ask,
      { role: "assistant", content: "", thinking: "I should look it up.", tool_calls: [{ id: call.id, type: "function", function: { name: call.function.name, arguments: args } }] },
      { role: "tool", content: result, tool_call_id: call.id },
    ], { tools: [{ type: "function", function: { name: WEATHER.function.name, description: WEATHER.function.description, parameters: WEATHER.function.parameters } }] });
    expect(text).toContain("<|start|>assistant<|channel|>analysis<|message|>I should look it up.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{");
    expect(text).toContain(`}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>${JSON.stringify(result)}<|end|><|start|>assistant`);
    expect(second.usage!.prompt_tokens).toBe(Tokenizer.fromGguf(model).encode(text, { addSpecial: true, parseSpecial: true }).length);
    const m = second.choices[0].message;
    for (const c of m.tool_calls ?? []) if (c.type === "function") expect(schemaErrors(schemaOf(c.function.name), JSON.parse(c.function.arguments))).toBe("");
    expect(m.content !== null || (m.tool_calls?.length ?? 0) > 0).toBe(true);
  });

  it("reasoning_effort and chat_template_kwargs reach the template (its prompt, token for token); bad values are refused by name", async () => {
    const tok = Tokenizer.fromGguf(model);
    const messages = [{ role: "user" as const, content: "hi" }];
    const cases: [Record<string, unknown>, Record<string, unknown>][] = [
      [{ reasoning_effort: "low" }, { reasoning_effort: "low" }],
      [{ chat_template_kwargs: { reasoning_effort: "as long as it takes, and then some more" } }, { reasoning_effort: "as long as it takes, and then some more" }],
    ];
    for (const [field, vars] of cases) {
      const r = await s.client.chat.completions.create({ messages, max_tokens: 1, ...field } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
      const text = renderChat(model, messages, { extra: vars });
      expect(text).toContain(`Reasoning: ${vars.reasoning_effort as string}\n`);
      expect(r.usage!.prompt_tokens).toBe(tok.encode(text, { addSpecial: true, parseSpecial: true }).length);
    }
    for (const [field, param] of [
      [{ reasoning_format: "deepseek-legacy" }, "reasoning_format"], [{ reasoning_effort: "max" }, "reasoning_effort"],
      [{ chat_template_kwargs: [1] }, "chat_template_kwargs"], [{ chat_template_kwargs: { enable_thinking: "no" } }, "chat_template_kwargs.enable_thinking"],
    ] as const) {
      const e = await s.client.chat.completions.create({ messages, max_tokens: 1, ...field } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming).then(() => undefined, (x: unknown) => x as { status: number; message: string });
      expect(e?.status, JSON.stringify(field)).toBe(400);
      expect(e?.message).toContain(`${param}: `);
    }
    // serve's flag: a value it does not know is a usage error naming it
    const bad = spawnSync(process.execPath, [`${root}dist/coordinator/cli.js`, "serve", model, "--reasoning-format", "legacy"], { encoding: "utf8", timeout: 30_000 });
    expect(bad.status).toBe(2);
    expect(bad.stderr).toMatch(/--reasoning-format takes auto, deepseek, none, not "legacy"/);
  });
});

describe("serve: the reasoning split (a template that opens <think>)", () => {
  let s: Served;
  let ollama: Ollama;
  beforeAll(async () => {
    // --reasoning-format none is the server's default here; requests ask for the split by name.
    s = await startServe(["--chat-template", templateFile("Qwen-QwQ-32B.jinja"), "--reasoning-format", "none"]);
    ollama = new Ollama({ host: s.url });
  }, 120_000);
  afterAll(() => s?.proc.child.kill("SIGKILL"));

  const body = { messages: [{ role: "user" as const, content: "Tell me about a girl who found a cat." }], temperature: 0, max_tokens: 24 };

  it("the reply inside the block is reasoning_content (streamed: delta.reasoning_content), equal to the raw text; none keeps it in the content", async () => {
    const raw = await s.client.chat.completions.create(body);
    const rawText = raw.choices[0].message.content!;
    expect(rawText.startsWith("<think>\n"), rawText).toBe(true);
    const thought = rawText.slice("<think>\n".length).trim();
    expect(thought.length).toBeGreaterThan(0);
    expect((raw.choices[0].message as { reasoning_content?: string }).reasoning_content).toBeUndefined();

    const split = await s.client.chat.completions.create({ ...body, reasoning_format: "auto" } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    const m = split.choices[0].message as OpenAI.Chat.ChatCompletionMessage & { reasoning_content?: string };
    expect(m.reasoning_content).toBe(thought);
    expect(m.content).toBe("");
    expect(split.usage!.completion_tokens).toBe(raw.usage!.completion_tokens);

    const st = await streamed(s.client, { ...body, reasoning_format: "auto" } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    expect(st.reasoning).toBe(thought);
    expect(st.content).toBe("");
    expect(st.finish).toBe("length");
  });

  it("Ollama's /api/chat: think (true or a level) gives message.thinking, streamed and not; unset keeps serve's default", async () => {
    const raw = await s.client.chat.completions.create(body);
    const rawText = raw.choices[0].message.content!;
    const thought = rawText.slice("<think>\n".length).trim();
    const ask = { model: "x", messages: body.messages, options: { temperature: 0, num_predict: 24 } };
    for (const think of [true, "high"] as const) {
      const r = await ollama.chat({ ...ask, think, stream: false });
      expect(r.message.thinking).toBe(thought);
      expect(r.message.content).toBe("");
      let thinking = "", content = "";
      for await (const part of await ollama.chat({ ...ask, think, stream: true })) {
        thinking += part.message.thinking ?? "";
        content += part.message.content;
      }
      expect(thinking).toBe(thought);
      expect(content).toBe("");
    }
    const plain = await ollama.chat({ ...ask, stream: false });
    expect(plain.message.thinking).toBeUndefined();
    expect(plain.message.content).toBe(rawText);
    // /api/generate renders the prompt as a user turn: its thinking comes as `thinking`
    const g = await ollama.generate({ model: "x", prompt: body.messages[0].content, think: true, stream: false, options: ask.options });
    expect(g.thinking).toBe(thought);
    expect(g.response).toBe("");
  });

  it("a call forced from the first token is no reasoning, though the template opened the block", async () => {
    const r = await s.client.chat.completions.create({ ...body, tools: TOOLS, tool_choice: "required", max_tokens: MAX, reasoning_format: "auto" } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    const m = r.choices[0].message as OpenAI.Chat.ChatCompletionMessage & { reasoning_content?: string };
    expect(r.choices[0].finish_reason).toBe("tool_calls");
    expect(m.reasoning_content).toBeUndefined();
    expect(m.tool_calls?.length).toBeGreaterThan(0);
    for (const c of m.tool_calls ?? []) if (c.type === "function") expect(schemaErrors(schemaOf(c.function.name), JSON.parse(c.function.arguments))).toBe("");
  });
});
