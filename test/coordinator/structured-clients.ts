// Structured output and tool calls as the clients people build with send them (the Vercel AI SDK and
// LangChain), run against any `serve` (the shipped model, a generated one, a ring): every JSON answer
// validates against its schema (ajv), at temperature 0 and 1, streamed and not; every tool call names
// a given tool with arguments that validate; a tool's result goes back to the model in a second turn.
// Also the schemas and tools the tests share (structured.test.ts, structured-clients.test.ts).
import { expect } from "vitest";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateObject, generateText, jsonSchema, stepCountIs, streamObject, streamText, tool, wrapLanguageModel } from "ai";
import { HumanMessage, ToolMessage, type AIMessage, type AIMessageChunk } from "@langchain/core/messages";
import { ChatOpenAI } from "@langchain/openai";
import { z } from "zod";
import { schemaErrors } from "../grammar/validate.js";
import type { Served } from "./serve-harness.js";

export const PERSON = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 40 },
    age: { type: "integer", minimum: 0, maximum: 120 },
    email: { type: "string", format: "email" },
    mood: { enum: ["happy", "sad", null] },
    tags: { type: "array", items: { type: "string", maxLength: 20 }, maxItems: 3 },
    home: { type: "object", properties: { city: { type: "string" }, zip: { type: "string", pattern: "^[0-9]{5}$" } }, required: ["city", "zip"], additionalProperties: false },
  },
  required: ["name", "age", "email", "mood", "tags", "home"],
  additionalProperties: false,
} as const;

export const WEATHER = {
  type: "function" as const,
  function: {
    name: "get_weather",
    description: "The weather in a city now",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 16 }, unit: { enum: ["c", "f"] } }, required: ["city", "unit"], additionalProperties: false },
  },
};
export const ADD = {
  type: "function" as const,
  function: { name: "add", description: "Adds two numbers", parameters: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } }, required: ["a", "b"], additionalProperties: false } },
};
export const TOOLS = [WEATHER, ADD];
/** Every reply's token budget: enough for the schemas here (a constrained reply closes its value
 * in its last quarter, so it ends valid). */
export const MAX = 400;
export const ask = [{ role: "user" as const, content: "Tell me about a girl who found a cat." }];

export function toolSchema(name: string): unknown {
  return TOOLS.find((t) => t.function.name === name)!.function.parameters;
}

/** What the weather tool answers, in the multi-turn exchanges. */
const WEATHER_RESULT = { temperature: 21, sky: "clear" };
/** The one object both clients ask for, so that a server compiles its grammar once for all of them
 * (a compile over a 151k-token vocabulary takes seconds, more for each character a string may hold):
 * a bounded string (a tiny model's strings end), an integer range and an array of an enum. */
const Pet = z.object({ name: z.string().max(16), age: z.number().int().min(0).max(99), kinds: z.array(z.enum(["cat", "dog"])).max(2) });
const PET = z.toJSONSchema(Pet);
/** The same as plain JSON: zod's object also carries its `~standard` (not enumerable), which LangChain
 * takes for a standard schema and parses only when whole; plain, it streams partial objects. */
const PLAIN_PET = JSON.parse(JSON.stringify(PET)) as object;
/** The text reply after a tool's result: unconstrained, so only its budget ends it. */
const TEXT_MAX = 40;

/** The model's name as the server lists it (what a client would put in `model`). */
async function servedModel(s: Served): Promise<string> {
  const list = (await (await fetch(`${s.url}/v1/models`)).json()) as { data: { id: string }[] };
  return list.data[0].id;
}

/** The Vercel AI SDK (`ai` + `@ai-sdk/openai-compatible`): generateObject and streamObject at
 * temperature 0 and 1, tool calls by generateText and streamText, and a tool loop of two steps. */
/** The AI SDK's object at temperature 0, whole and then streamed with `lose` called at its 5th partial
 * object (a failover test kills a worker there): both for the caller to compare. */
export async function aiSdkObjectAcrossLoss(s: Served, lose: () => void): Promise<{ whole: unknown; streamed: unknown }> {
  const provider = createOpenAICompatible({ name: "prima", baseURL: `${s.url}/v1`, apiKey: "unused", supportsStructuredOutputs: true });
  const model = provider.chatModel(await servedModel(s));
  const asked = { model, schema: Pet, prompt: "A girl and her pets", temperature: 0, maxOutputTokens: MAX, maxRetries: 0 };
  const { object: whole } = await generateObject(asked);
  const streamed = streamObject(asked);
  let partials = 0;
  for await (const partial of streamed.partialObjectStream) if (partial && ++partials === 5) lose();
  expect(partials).toBeGreaterThan(5);
  const last = await streamed.object;
  expect(schemaErrors(PET, last), JSON.stringify(last)).toBe("");
  return { whole, streamed: last };
}

export async function checkAiSdk(s: Served): Promise<void> {
  const provider = createOpenAICompatible({ name: "prima", baseURL: `${s.url}/v1`, apiKey: "unused", supportsStructuredOutputs: true });
  const model = provider.chatModel(await servedModel(s));
  for (const temperature of [0, 1]) {
    const { object } = await generateObject({ model, schema: Pet, prompt: "A girl and her pets", temperature, seed: 2, maxOutputTokens: MAX, maxRetries: 0 });
    expect(schemaErrors(PET, object), `t=${temperature}: ${JSON.stringify(object)}`).toBe("");
    // Streamed: the partial objects come as the JSON grows, the last one whole and valid.
    const streamed = streamObject({ model, schema: Pet, prompt: "A boy and his pets", temperature, seed: 3, maxOutputTokens: MAX, maxRetries: 0 });
    let partials = 0;
    for await (const partial of streamed.partialObjectStream) if (partial) partials++;
    expect(partials).toBeGreaterThan(1);
    const last = await streamed.object;
    expect(schemaErrors(PET, last), `streamed t=${temperature}: ${JSON.stringify(last)}`).toBe("");
  }

  // The SDK runs the tool after each call (a single-step request only records its result).
  const weather = {
    get_weather: tool({ description: WEATHER.function.description, inputSchema: jsonSchema<{ city: string; unit: "c" | "f" }>(WEATHER.function.parameters as never), execute: async () => WEATHER_RESULT }),
  };
  const expectWeatherCalls = (calls: readonly { toolName: string; input: unknown }[], what: string) => {
    expect(calls.length, what).toBeGreaterThan(0);
    for (const c of calls) {
      expect(c.toolName, what).toBe("get_weather");
      expect(schemaErrors(WEATHER.function.parameters, c.input), `${what}: ${JSON.stringify(c.input)}`).toBe("");
    }
  };
  const r = await generateText({ model, prompt: "Weather in Rome?", tools: weather, toolChoice: "required", maxOutputTokens: MAX, maxRetries: 0 });
  expect(r.finishReason).toBe("tool-calls");
  expectWeatherCalls(r.toolCalls, "generateText");
  // Streamed: the arguments arrive as deltas, the calls whole at the end.
  const st = streamText({ model, prompt: "Weather in Lima?", tools: weather, toolChoice: "required", temperature: 1, seed: 4, maxOutputTokens: MAX, maxRetries: 0 });
  let deltas = 0;
  for await (const part of st.fullStream) {
    if (part.type === "tool-input-delta") deltas++;
    if (part.type === "error") throw new Error(`streamText: ${String(part.error)}`);
  }
  const streamedCalls = await st.toolCalls;
  expectWeatherCalls(streamedCalls, "streamText");
  expect(deltas).toBeGreaterThan(streamedCalls.length);

  // A tool loop: step 1 must call the tool, which the SDK runs; step 2 answers in text with the result
  // in its prompt (sent back as a `role: "tool"` message with the call's id), on a short budget.
  const brief = wrapLanguageModel({ model, middleware: { specificationVersion: "v3", transformParams: async ({ params }) => ({ ...params, maxOutputTokens: TEXT_MAX }) } });
  const loop = await generateText({
    model, prompt: "What is the weather in Paris?", tools: weather, maxOutputTokens: MAX, maxRetries: 0, temperature: 0,
    stopWhen: stepCountIs(2), prepareStep: ({ stepNumber }) => (stepNumber === 0 ? { toolChoice: "required" } : { toolChoice: "none", model: brief }),
  });
  expect(loop.steps).toHaveLength(2);
  const [first, second] = loop.steps;
  expectWeatherCalls(first.toolCalls, "loop step 1");
  expect(first.toolResults.map((t) => t.output)).toEqual(first.toolCalls.map(() => WEATHER_RESULT));
  const sent = (typeof second.request.body === "string" ? JSON.parse(second.request.body) : second.request.body) as { messages: { role: string; tool_call_id?: string; content?: unknown }[] };
  const results = sent.messages.filter((m) => m.role === "tool");
  expect(results.map((m) => m.tool_call_id)).toEqual(first.toolCalls.map((c) => c.toolCallId));
  expect(JSON.parse(String(results[0].content))).toEqual(WEATHER_RESULT);
  // The call and its result reached the model's prompt: it grew by at least both.
  expect(second.usage.inputTokens!).toBeGreaterThan(first.usage.inputTokens! + 10);
  expect(second.toolCalls).toEqual([]);
  expect(second.finishReason).toMatch(/^(stop|length)$/);
}

/** LangChain (`@langchain/openai`): withStructuredOutput by JSON Schema and by function calling at
 * temperature 0 and 1, streamed and not; bindTools invoked and streamed; a tool result sent back. */
/** LangChain's structured output at temperature 0, whole and then streamed with `lose` called at its 5th
 * partial object: both for the caller to compare. */
export async function langChainObjectAcrossLoss(s: Served, lose: () => void): Promise<{ whole: unknown; streamed: unknown }> {
  const llm = new ChatOpenAI({ model: await servedModel(s), apiKey: "unused", configuration: { baseURL: `${s.url}/v1` }, temperature: 0, maxTokens: MAX, maxRetries: 0 });
  const structured = llm.withStructuredOutput(PLAIN_PET, { method: "jsonSchema" });
  const whole = await structured.invoke("A boy and his pets");
  let parts = 0, last: unknown;
  for await (const part of await structured.stream("A boy and his pets")) {
    last = part;
    if (++parts === 5) lose();
  }
  expect(parts).toBeGreaterThan(5);
  expect(schemaErrors(PET, last), JSON.stringify(last)).toBe("");
  return { whole, streamed: last };
}

export async function checkLangChain(s: Served): Promise<void> {
  const name = await servedModel(s);
  const chat = (temperature: number, maxTokens = MAX) => new ChatOpenAI({ model: name, apiKey: "unused", configuration: { baseURL: `${s.url}/v1` }, temperature, maxTokens, maxRetries: 0 });
  for (const temperature of [0, 1]) {
    const llm = chat(temperature);
    // By response_format (the JSON Schema as text) and by a forced call of a function (zod's).
    const byFormat = await llm.withStructuredOutput(PLAIN_PET, { method: "jsonSchema" }).invoke("A girl and her pets");
    expect(schemaErrors(PET, byFormat), `t=${temperature} jsonSchema: ${JSON.stringify(byFormat)}`).toBe("");
    const byCall = await llm.withStructuredOutput(Pet, { method: "functionCalling" }).invoke("A girl and her pets");
    expect(schemaErrors(PET, byCall), `t=${temperature} functionCalling: ${JSON.stringify(byCall)}`).toBe("");
    // Streamed: partial objects as the JSON grows, the last one whole and valid.
    const parts: unknown[] = [];
    for await (const part of await llm.withStructuredOutput(PLAIN_PET, { method: "jsonSchema" }).stream("A boy and his pets")) parts.push(part);
    expect(parts.length, JSON.stringify(parts)).toBeGreaterThan(1);
    expect(schemaErrors(PET, parts.at(-1)), `streamed t=${temperature}: ${JSON.stringify(parts.at(-1))}`).toBe("");
  }

  const expectWeatherCalls = (msg: AIMessage, what: string) => {
    expect(msg.tool_calls?.length, what).toBeGreaterThan(0);
    for (const c of msg.tool_calls ?? []) {
      expect(c.name, what).toBe("get_weather");
      expect(schemaErrors(WEATHER.function.parameters, c.args), `${what}: ${JSON.stringify(c.args)}`).toBe("");
    }
  };
  const bound = chat(1).bindTools([WEATHER], { tool_choice: "required" });
  const question = new HumanMessage("Weather in Oslo?");
  const called = await bound.invoke([question]);
  expectWeatherCalls(called, "invoke");
  // Streamed: the chunks carry the call in pieces; joined they make the calls.
  let joined: AIMessageChunk | undefined;
  let pieces = 0;
  for await (const chunk of await bound.stream("Weather in Bern?")) {
    pieces += chunk.tool_call_chunks?.length ?? 0;
    joined = joined ? joined.concat(chunk) : chunk;
  }
  expectWeatherCalls(joined!, "stream");
  expect(pieces).toBeGreaterThan(joined!.tool_calls!.length);

  // The tool's result back to the model, then its answer (text or another valid call).
  const results = called.tool_calls!.map((c) => new ToolMessage({ tool_call_id: c.id!, content: JSON.stringify(WEATHER_RESULT) }));
  const reply = await chat(0, TEXT_MAX).bindTools([WEATHER]).invoke([question, called, ...results]);
  expect(reply.usage_metadata!.input_tokens).toBeGreaterThan(called.usage_metadata!.input_tokens + 10);
  expect(reply.invalid_tool_calls ?? [], JSON.stringify(reply.invalid_tool_calls)).toEqual([]);
  if (reply.tool_calls?.length) expectWeatherCalls(reply, "after the result");
  else expect(typeof reply.content).toBe("string");
}
