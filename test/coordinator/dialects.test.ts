// serve's other dialects on the same port as the OpenAI API: Ollama's, through the official `ollama`
// client (only its host changed), and llama-server's own endpoints, with checks ported from llama.cpp's
// tools/server/tests/unit/test_completion.py and test_tokenize.py. Greedy answers must equal the OpenAI
// path's and `prima-coord run`'s token for token; tokens must equal our tokenizer's (checked against
// llama.cpp elsewhere); errors come in each dialect's shape, naming the field.
import { statSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Ollama } from "ollama";
import { Tokenizer } from "../../model/index.js";
import { killAll } from "../ring/cluster.js";
import { MODEL, runOnce, startServe, type Served } from "./serve-harness.js";

afterAll(() => killAll());

const STORY = "Once upon a time";
const CTX = 512;
const tok = Tokenizer.fromGguf(MODEL);

async function post(url: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; body: any }> {
  const r = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json", ...headers }, body: JSON.stringify(body), signal: AbortSignal.timeout(60_000) });
  return { status: r.status, body: await r.json() };
}

/** The `data: {...}` events of a llama-server stream. */
async function events(url: string, body: unknown): Promise<any[]> {
  const r = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal: AbortSignal.timeout(60_000) });
  expect(r.headers.get("content-type")).toMatch(/^text\/event-stream/);
  const text = await r.text();
  return text.split("\n\n").filter((b) => b.trim() !== "").map((b) => {
    expect(b.startsWith("data: ")).toBe(true);
    return JSON.parse(b.slice(6));
  });
}

/** The ollama client's error (its ResponseError, which the package does not export): the server's
 * {error} text and the status. */
interface ResponseError extends Error {
  readonly error: string;
  readonly status_code: number;
}

/** The error of an ollama call that must fail. */
async function refused(call: () => Promise<unknown>): Promise<ResponseError> {
  try {
    await call();
  } catch (e) {
    expect((e as Error).name).toBe("ResponseError");
    return e as ResponseError;
  }
  throw new Error("the request was not refused");
}

describe("serve: Ollama's API and llama-server's beside the OpenAI one", () => {
  let s: Served;
  let ollama: Ollama;
  beforeAll(async () => {
    s = await startServe(["--ctx", String(CTX)]);
    ollama = new Ollama({ host: s.url });
  }, 60_000);
  afterAll(() => s.proc.child.kill("SIGKILL"));

  // ---- Ollama ------------------------------------------------------------------------------------

  it("Ollama: version, tags, ps and show describe the served model", async () => {
    expect((await ollama.version()).version).toMatch(/^\d+\.\d+\.\d+/);
    const list = await ollama.list();
    expect(list.models.map((m) => m.name)).toEqual(["stories260K"]);
    const m = list.models[0];
    expect(m.size).toBe(statSync(MODEL).size);
    expect(m.details.format).toBe("gguf");
    expect(m.details.family).toBe("llama");
    expect(m.details.quantization_level).toBe("F32");
    expect(new Date(m.modified_at).getTime()).not.toBeNaN();
    const ps = await ollama.ps();
    expect(ps.models.map((x) => x.name)).toEqual(["stories260K"]);
    expect((ps.models[0] as unknown as { context_length: number }).context_length).toBe(CTX);
    expect(new Date(ps.models[0].expires_at).getTime()).toBeGreaterThan(Date.now());
    const show = await ollama.show({ model: "whatever:latest" });
    expect(show.details.family).toBe("llama");
    expect((show.model_info as unknown as Record<string, unknown>)["general.architecture"]).toBe("llama");
    expect(show.capabilities).toContain("completion");
  });

  it("Ollama generate (raw): greedy text equals run's, whole and streamed as NDJSON, with Ollama's counts and durations", async () => {
    const ref = runOnce(["-p", STORY, "-n", "24", "--temp", "0"]);
    const full = await ollama.generate({ model: "llama3.2", prompt: STORY, raw: true, options: { temperature: 0, num_predict: 24 } });
    expect(full.response).toBe(ref.text);
    expect(full.done).toBe(true);
    expect(full.done_reason).toBe("length");
    expect(full.eval_count).toBe(ref.generated_ids.length);
    expect(full.prompt_eval_count).toBe(ref.prompt_ids.length);
    expect(full.context).toEqual([...ref.prompt_ids, ...ref.generated_ids]);
    for (const k of ["total_duration", "prompt_eval_duration", "eval_duration"] as const) {
      expect(Number.isInteger(full[k]) && full[k] > 0, k).toBe(true);
    }
    expect(full.total_duration).toBeGreaterThanOrEqual(full.prompt_eval_duration + full.eval_duration);

    const stream = await ollama.generate({ model: "llama3.2", prompt: STORY, raw: true, stream: true, options: { temperature: 0, num_predict: 24 } });
    const parts = [];
    for await (const part of stream) parts.push(part);
    expect(parts.length).toBeGreaterThan(5);
    expect(parts.slice(0, -1).every((p) => p.done === false)).toBe(true);
    expect(parts.map((p) => p.response).join("")).toBe(ref.text);
    const last = parts.at(-1)!;
    expect(last).toMatchObject({ done: true, done_reason: "length", eval_count: ref.generated_ids.length, prompt_eval_count: ref.prompt_ids.length, response: "" });

    // The stream's wire format: one JSON object a line, as application/x-ndjson.
    const r = await fetch(`${s.url}/api/generate`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt: STORY, raw: true, options: { temperature: 0, num_predict: 4 } }) });
    expect(r.headers.get("content-type")).toBe("application/x-ndjson");
    const lines = (await r.text()).split("\n");
    expect(lines.at(-1)).toBe("");
    expect(lines.slice(0, -1).map((l) => JSON.parse(l).done)).toEqual([false, false, false, false, true]);
  });

  it("Ollama chat equals the OpenAI chat for the same messages, streamed and not; generate without raw is a user turn", async () => {
    const messages = [{ role: "system", content: "You tell stories." }, { role: "user", content: "Tell me about a dog." }];
    const ref = await s.client.chat.completions.create({ messages: messages as never, max_tokens: 30, temperature: 0 });
    const text = ref.choices[0].message.content;
    expect(text!.length).toBeGreaterThan(0);
    const full = await ollama.chat({ model: "stories260K", messages, options: { temperature: 0, num_predict: 30 } });
    expect(full.message).toMatchObject({ role: "assistant", content: text });
    expect(full.eval_count).toBe(ref.usage!.completion_tokens);
    expect(full.prompt_eval_count).toBe(ref.usage!.prompt_tokens);
    expect(full.done_reason).toBe(ref.choices[0].finish_reason);

    const stream = await ollama.chat({ model: "stories260K", messages, stream: true, options: { temperature: 0, num_predict: 30 } });
    let streamed = "";
    let last;
    for await (const part of stream) {
      streamed += part.message.content;
      expect(part.message.role).toBe("assistant");
      last = part;
    }
    expect(streamed).toBe(text);
    expect(last).toMatchObject({ done: true, eval_count: ref.usage!.completion_tokens });

    const gen = await ollama.generate({ model: "stories260K", system: messages[0].content, prompt: messages[1].content, options: { temperature: 0, num_predict: 30 } });
    expect(gen.response).toBe(text);
  });

  it("Ollama options: stop ends the text before it (done_reason stop); keep_alive and a smaller num_ctx change nothing", async () => {
    const ref = runOnce(["-p", STORY, "-n", "40", "--temp", "0"]);
    const at = ref.text.indexOf("girl");
    expect(at).toBeGreaterThan(0);
    const stopped = await ollama.generate({ model: "x", prompt: STORY, raw: true, options: { temperature: 0, num_predict: 40, stop: ["girl"] } });
    expect(stopped.response).toBe(ref.text.slice(0, at));
    expect(stopped.done_reason).toBe("stop");
    const same = await ollama.generate({
      model: "x", prompt: STORY, raw: true, keep_alive: "10m", options: { temperature: 0, num_predict: 40, num_ctx: 256, num_thread: 4, use_mmap: true, mirostat: 0 },
    });
    expect(same.response).toBe(ref.text);
    // An empty prompt (or no messages) only loads the model, as Ollama answers it.
    expect(await ollama.generate({ model: "x", prompt: "" })).toMatchObject({ done: true, done_reason: "load", response: "" });
    expect(await ollama.chat({ model: "x", messages: [] })).toMatchObject({ done: true, done_reason: "load" });
  });

  it("Ollama format: \"json\" and a JSON schema give JSON that parses (and fits the schema)", async () => {
    const j = await ollama.chat({ model: "x", messages: [{ role: "user", content: "A cat." }], format: "json", options: { temperature: 0, num_predict: 60 } });
    expect(typeof JSON.parse(j.message.content)).toBe("object");
    const schema = { type: "object", properties: { name: { type: "string", maxLength: 20 }, age: { type: "integer" } }, required: ["name", "age"], additionalProperties: false };
    for (const temperature of [0, 1]) {
      const r = await ollama.generate({ model: "x", prompt: "A dog", format: schema, options: { temperature, seed: 5, num_predict: 60 } });
      const v = JSON.parse(r.response) as { name: unknown; age: unknown };
      expect(Object.keys(v).sort()).toEqual(["age", "name"]);
      expect(typeof v.name).toBe("string");
      expect(Number.isInteger(v.age)).toBe(true);
    }
  });

  it("Ollama chat history with tool calls and results reads as the OpenAI path's", async () => {
    const tools = [{ type: "function", function: { name: "add", description: "Adds", parameters: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } }, required: ["a", "b"] } } }];
    const r = await ollama.chat({
      model: "x", tools, options: { temperature: 0, num_predict: 12 },
      messages: [
        { role: "user", content: "Add 2 and 3." },
        { role: "assistant", content: "", tool_calls: [{ function: { name: "add", arguments: { a: 2, b: 3 } } }] },
        { role: "tool", content: "5", tool_name: "add" },
      ],
    });
    const o = await s.client.chat.completions.create({
      tools: tools as never, tool_choice: "auto", max_tokens: 12, temperature: 0,
      messages: [
        { role: "user", content: "Add 2 and 3." },
        { role: "assistant", content: "", tool_calls: [{ id: "call_1_0", type: "function", function: { name: "add", arguments: JSON.stringify({ a: 2, b: 3 }) } }] },
        { role: "tool", content: "5", tool_call_id: "call_1_0", name: "add" } as never,
      ],
    });
    expect(r.message.content).toBe(o.choices[0].message.content ?? "");
    expect(r.eval_count).toBe(o.usage!.completion_tokens);
    expect(r.prompt_eval_count).toBe(o.usage!.prompt_tokens);
    for (const c of r.message.tool_calls ?? []) {
      expect(c.function.name).toBe("add");
      expect(typeof c.function.arguments).toBe("object");
    }
  });

  it("Ollama errors: {error} with a 4xx naming Ollama's field; the server stays up", async () => {
    const msgs = [{ role: "user", content: "hi" }];
    const cases: [() => Promise<unknown>, number, RegExp][] = [
      [() => ollama.chat({ model: "x", messages: msgs, options: { temperature: 5 } }), 400, /^options\.temperature: /],
      [() => ollama.chat({ model: "x", messages: msgs, options: { num_predict: "ten" as never } }), 400, /^options\.num_predict: /],
      [() => ollama.chat({ model: "x", messages: msgs, options: { num_ctx: CTX * 2 } }), 400, /^options\.num_ctx: .*512/],
      [() => ollama.chat({ model: "x", messages: msgs, options: { mirostat: 2 } }), 400, /^options\.mirostat: not supported/],
      [() => ollama.chat({ model: "x", messages: msgs, options: { typo_option: 1 } as never }), 400, /^options\.typo_option: not supported/],
      [() => ollama.chat({ model: "x", messages: msgs, think: "very" as never }), 400, /^think: /],
      [() => ollama.chat({ model: "x", messages: [{ role: "user", content: "hi", images: ["aGk="] }] }), 400, /^messages\[0\]\.images: /],
      [() => ollama.chat({ model: "x", messages: [{ role: "robot", content: "hi" }] }), 400, /^messages\[0\]\.role: /],
      [() => ollama.chat({ model: "x", messages: msgs, format: "yaml" }), 400, /^format: /],
      [() => ollama.chat({ model: "x", messages: msgs, format: { type: "object", properties: { a: { type: "string", pattern: "(?<=a)b" } } } }), 400, /^format: /],
      [() => ollama.generate({ model: "x", prompt: "hi", suffix: "end" }), 400, /^suffix: /],
      [() => ollama.generate({ model: "x", prompt: "hi", context: [1, 2] }), 400, /^context: /],
      [() => ollama.generate({ model: "x", prompt: "hi", unknown_field: 1 } as never), 400, /^unknown_field: not supported/],
    ];
    for (const [p, status, message] of cases) {
      const e = await refused(p);
      expect(e.status_code, e.message).toBe(status);
      expect(e.message).toMatch(message);
    }
    // Not JSON from a web page (its Origin), a wrong method: the same {error: "..."} shape.
    const plain = await fetch(`${s.url}/api/chat`, { method: "POST", headers: { "Content-Type": "text/plain", Origin: s.url }, body: "{}" });
    expect(plain.status).toBe(415);
    expect(typeof ((await plain.json()) as { error: unknown }).error).toBe("string");
    const get = await fetch(`${s.url}/api/generate`);
    expect(get.status).toBe(405);
    expect(typeof ((await get.json()) as { error: unknown }).error).toBe("string");
    // Model management: refused by name, in Ollama's shape (embeddings: embeddings.test.ts).
    const pull = await refused(() => ollama.pull({ model: "llama3.2" }));
    expect(pull.status_code).toBe(501);
    expect(pull.message).toMatch(/^\/api\/pull: not supported: .*one model/);
    expect((await refused(() => ollama.embed({ model: "x", input: "hi", dimensions: 3 }))).message).toMatch(/^dimensions: /);
    expect((await ollama.list()).models).toHaveLength(1);
  });

  // ---- llama-server ------------------------------------------------------------------------------

  it("/tokenize and /detokenize round-trip as our tokenizer (test_tokenize.py)", async () => {
    for (const content of ["What is the capital of France ?", STORY, "This is a test string with unicode 媽 and emoji 🤗", " two  spaces\nand a line"]) {
      const plain = await post(`${s.url}/tokenize`, { content });
      expect(plain.status).toBe(200);
      expect(plain.body.tokens).toEqual([...tok.encode(content, { addSpecial: false, parseSpecial: true })]);
      const back = await post(`${s.url}/detokenize`, { tokens: plain.body.tokens });
      expect(back.body.content).toBe(tok.decode(plain.body.tokens, { special: true }));
      const bos = await post(`${s.url}/tokenize`, { content, add_special: true });
      expect(bos.body.tokens).toEqual([tok.bos, ...plain.body.tokens]);
      const pieces = await post(`${s.url}/tokenize`, { content, with_pieces: true });
      expect(pieces.body.tokens.map((t: { id: number }) => t.id)).toEqual(plain.body.tokens);
      // Each piece is its text, or its bytes when not whole UTF-8; together they are the text's bytes.
      const bytes = pieces.body.tokens.flatMap((t: { id: number; piece: string | number[] }) => {
        expect(t.id).toBeGreaterThan(0);
        expect(t.piece.length).toBeGreaterThan(0);
        return typeof t.piece === "string" ? [...Buffer.from(t.piece, "utf8")] : t.piece;
      });
      expect(Buffer.from(bytes).toString("utf8")).toBe(tok.decode(plain.body.tokens));
    }
    // As test_tokenize_detokenize: the text comes back (the tokenizer's leading space aside).
    const t = await post(`${s.url}/tokenize`, { content: "What is the capital of France ?" });
    expect((await post(`${s.url}/detokenize`, { tokens: t.body.tokens })).body.content.trim()).toBe("What is the capital of France ?");
    expect((await post(`${s.url}/detokenize`, { tokens: [1, tok.nVocab] })).status).toBe(400);
    expect((await post(`${s.url}/tokenize`, { content: 7 })).status).toBe(400);
  });

  it("/completion: greedy text equals /v1/completions', with llama-server's fields (test_completion.py)", async () => {
    const n = 16;
    const oai = await s.client.completions.create({ prompt: STORY, max_tokens: n, temperature: 0 });
    const r = await post(`${s.url}/completion`, { prompt: STORY, n_predict: n, temperature: 0, return_tokens: true });
    expect(r.status).toBe(200);
    const b = r.body;
    expect(b.content).toBe(oai.choices[0].text);
    expect(b.tokens_predicted).toBe(oai.usage!.completion_tokens);
    expect(b.tokens_evaluated).toBe(oai.usage!.prompt_tokens);
    expect(b.timings.predicted_n).toBe(n);
    expect(b.timings.prompt_n + b.timings.cache_n).toBe(b.tokens_evaluated);
    expect(b.tokens).toHaveLength(n);
    expect(tok.decode(b.tokens)).toBe(b.content);
    expect(b).toMatchObject({ stop: true, stop_type: "limit", truncated: false, stopping_word: "", id_slot: 0, model: "stories260K", prompt: `<s> ${STORY}` });
    expect(typeof b.has_new_line).toBe("boolean");
    expect(b.generation_settings).toMatchObject({ n_predict: n, temperature: 0 });
    // Without return_tokens the list is empty, as llama-server's.
    expect((await post(`${s.url}/completion`, { prompt: STORY, n_predict: 2, temperature: 0 })).body.tokens).toEqual([]);

    // Streamed: every event but the last has stop false and its tokens; the last has the fields and no text.
    const ev = await events(`${s.url}/completion`, { prompt: STORY, n_predict: n, temperature: 0, stream: true });
    const last = ev.at(-1);
    expect(ev.slice(0, -1).every((e) => e.stop === false && e.tokens.length > 0)).toBe(true);
    expect(ev.map((e) => e.content).join("")).toBe(b.content);
    expect(ev.slice(0, -1).flatMap((e) => e.tokens)).toEqual(b.tokens);
    expect(last).toMatchObject({ stop: true, stop_type: "limit", content: "", tokens_predicted: n });
    expect(last.timings.predicted_n).toBe(n);
    expect(last.generation_settings.n_predict).toBe(n);
  });

  it("/completion n_probs: completion_probabilities equal the OpenAI path's log probabilities, streamed and not", async () => {
    const n = 10;
    const oai = (await post(`${s.url}/v1/completions`, { prompt: STORY, max_tokens: n, temperature: 0, logprobs: 5 })).body.choices[0];
    const r = await post(`${s.url}/completion`, { prompt: STORY, n_predict: n, temperature: 0, n_probs: 5, return_tokens: true });
    expect(r.status).toBe(200);
    const b = r.body;
    expect(b.content).toBe(oai.text);
    expect(b.generation_settings).toMatchObject({ n_probs: 5, post_sampling_probs: false });
    const probs: any[] = b.completion_probabilities;
    expect(probs).toHaveLength(n);
    const piece = (id: number) => Array.from(tok.tokenPiece(id, { special: false }));
    probs.forEach((p, i) => {
      // llama-server's shape: the token's id, text, bytes, logprob, and its n_probs alternatives alike.
      expect(Object.keys(p).sort()).toEqual(["bytes", "id", "logprob", "token", "top_logprobs"]);
      expect(p.id).toBe(b.tokens[i]);
      expect(p.bytes).toEqual(piece(p.id));
      expect(p.token).toBe(oai.logprobs.tokens[i]);
      expect(p.logprob).toBeCloseTo(oai.logprobs.token_logprobs[i], 5);
      expect(p.top_logprobs).toHaveLength(5);
      // Greedy: the chosen token is the most likely one.
      expect(p.top_logprobs[0]).toMatchObject({ id: p.id, token: p.token, bytes: p.bytes });
      expect(p.top_logprobs[0].logprob).toBeCloseTo(p.logprob, 5);
      for (const t of p.top_logprobs) {
        expect(Object.keys(t).sort()).toEqual(["bytes", "id", "logprob", "token"]);
        expect(t.bytes).toEqual(piece(t.id));
      }
      // The legacy format's {text: logprob}, most likely first: the same values.
      const top = Object.values(oai.logprobs.top_logprobs[i]) as number[];
      expect(top).toHaveLength(5);
      top.forEach((v, j) => expect(p.top_logprobs[j].logprob).toBeCloseTo(v, 5));
    });

    // Streamed: each event carries its tokens' entries; together they are the whole reply's.
    const ev = await events(`${s.url}/completion`, { prompt: STORY, n_predict: n, temperature: 0, n_probs: 5, stream: true });
    const streamed = ev.flatMap((e) => e.completion_probabilities ?? []);
    expect(ev.at(-1).completion_probabilities).toBeUndefined();
    expect(streamed.map((p) => p.id)).toEqual(probs.map((p) => p.id));
    streamed.forEach((p, i) => {
      expect(p.logprob).toBeCloseTo(probs[i].logprob, 5);
      expect(p.top_logprobs.map((t: any) => t.id)).toEqual(probs[i].top_logprobs.map((t: any) => t.id));
    });
    for (const e of ev.slice(0, -1)) expect(e.completion_probabilities.map((p: any) => p.id)).toEqual(e.tokens);

    // More alternatives than the completions' 5, up to 20 (logprobs is n_probs' other name); none without.
    const wide = (await post(`${s.url}/completion`, { prompt: STORY, n_predict: 2, temperature: 0, logprobs: 12 })).body;
    expect(wide.completion_probabilities[0].top_logprobs).toHaveLength(12);
    expect(wide.completion_probabilities[0].logprob).toBeCloseTo(probs[0].logprob, 5);
    expect((await post(`${s.url}/completion`, { prompt: STORY, n_predict: 2, temperature: 0, n_probs: 0 })).body.completion_probabilities).toBeUndefined();
    // A stop string: the tokens it cut off are not listed, as the OpenAI path leaves them out.
    const at = b.content.indexOf("girl");
    expect(at).toBeGreaterThan(0);
    const w = (await post(`${s.url}/completion`, { prompt: STORY, n_predict: n, temperature: 0, n_probs: 1, stop: ["girl"] })).body;
    const ow = (await post(`${s.url}/v1/completions`, { prompt: STORY, max_tokens: n, temperature: 0, logprobs: 1, stop: ["girl"] })).body.choices[0];
    expect(w.content).toBe(ow.text);
    expect(w.completion_probabilities.map((p: any) => p.token)).toEqual(ow.logprobs.tokens);
  });

  it("/completion logit_bias: banning the greedy token gives the runner-up, in each of llama-server's forms", async () => {
    const first = (await post(`${s.url}/completion`, { prompt: STORY, n_predict: 1, temperature: 0, n_probs: 2 })).body.completion_probabilities[0];
    const [greedy, runnerUp] = first.top_logprobs;
    expect(greedy.id).toBe(first.id);
    const forms: unknown[] = [[[greedy.id, false]], [[greedy.id, -1000]], { [greedy.id]: false }, { [greedy.id]: -100 }];
    for (const logit_bias of forms) {
      const r = await post(`${s.url}/completion`, { prompt: STORY, n_predict: 1, temperature: 0, n_probs: 2, logit_bias, return_tokens: true });
      expect(r.status, JSON.stringify(logit_bias)).toBe(200);
      expect(r.body.tokens).toEqual([runnerUp.id]);
      // The log probabilities are the model's, before the bias.
      expect(r.body.completion_probabilities[0].logprob).toBeCloseTo(runnerUp.logprob, 5);
      expect(r.body.completion_probabilities[0].top_logprobs[0].id).toBe(greedy.id);
    }
    // A text names its tokens (without special ones), as the OpenAI path's ids of that text.
    const word = " girl";
    const ids = [...tok.encode(word, { addSpecial: false })];
    const byText = await post(`${s.url}/completion`, { prompt: STORY, n_predict: 12, temperature: 0, logit_bias: [[word, false]] });
    const byIds = await post(`${s.url}/v1/completions`, { prompt: STORY, max_tokens: 12, temperature: 0, logit_bias: Object.fromEntries(ids.map((id) => [id, -100])) });
    expect(byText.body.content).toBe(byIds.body.choices[0].text);
    expect(byText.body.content).not.toContain("girl");
    expect(byText.body.generation_settings.logit_bias).toEqual(ids.map((token) => ({ bias: null, token })));
    // A bias given twice adds up: +5 and -5 leave the greedy answer.
    const plain = (await post(`${s.url}/completion`, { prompt: STORY, n_predict: 6, temperature: 0 })).body.content;
    expect((await post(`${s.url}/completion`, { prompt: STORY, n_predict: 6, temperature: 0, logit_bias: [[greedy.id, 5], [greedy.id, -5]] })).body.content).toBe(plain);
  });

  it("Ollama logprobs and top_logprobs equal the OpenAI path's, streamed and not", async () => {
    const messages = [{ role: "user", content: "Tell me about a dog." }];
    const ref = await s.client.chat.completions.create({ messages: messages as never, max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 3 });
    const content = ref.choices[0].logprobs!.content!;
    const full = await ollama.chat({ model: "x", messages, logprobs: true, top_logprobs: 3, options: { temperature: 0, num_predict: 12 } });
    expect(full.message.content).toBe(ref.choices[0].message.content);
    expect(full.logprobs).toHaveLength(content.length);
    full.logprobs!.forEach((e, i) => {
      expect(e.token).toBe(content[i].token);
      expect(e.logprob).toBeCloseTo(content[i].logprob, 5);
      expect(e.top_logprobs!.map((t) => t.token)).toEqual(content[i].top_logprobs.map((t) => t.token));
      e.top_logprobs!.forEach((t, j) => expect(t.logprob).toBeCloseTo(content[i].top_logprobs[j].logprob, 5));
    });
    const stream = await ollama.chat({ model: "x", messages, stream: true, logprobs: true, top_logprobs: 3, options: { temperature: 0, num_predict: 12 } });
    const streamed = [];
    for await (const part of stream) {
      if (part.message.content) expect(part.logprobs?.length).toBeGreaterThan(0);
      streamed.push(...(part.logprobs ?? []));
    }
    expect(streamed.map((e) => e.token)).toEqual(content.map((e) => e.token));
    // logprobs alone: the tokens' own, no alternatives; generate (raw) as /v1/completions.
    const oai = (await post(`${s.url}/v1/completions`, { prompt: STORY, max_tokens: 8, temperature: 0, logprobs: 0 })).body.choices[0];
    const gen = await ollama.generate({ model: "x", prompt: STORY, raw: true, logprobs: true, options: { temperature: 0, num_predict: 8 } });
    expect(gen.logprobs!.map((e) => e.token)).toEqual(oai.logprobs.tokens);
    gen.logprobs!.forEach((e, i) => {
      expect(e.logprob).toBeCloseTo(oai.logprobs.token_logprobs[i], 5);
      expect(e.top_logprobs).toBeUndefined();
    });
    expect((await ollama.generate({ model: "x", prompt: STORY, raw: true, options: { num_predict: 2 } })).logprobs).toBeUndefined();
    expect((await refused(() => ollama.chat({ model: "x", messages, top_logprobs: 2 }))).error).toMatch(/^top_logprobs: needs logprobs/);
    expect((await refused(() => ollama.chat({ model: "x", messages, logprobs: true, top_logprobs: 21 }))).error).toMatch(/^top_logprobs: /);
  });

  it("/completion: a prompt as token ids (or mixed) equals the text prompt; stop words; one prompt per request", async () => {
    const text = (await post(`${s.url}/completion`, { prompt: STORY, n_predict: 12, temperature: 0 })).body.content;
    const ids = (await post(`${s.url}/tokenize`, { content: STORY, add_special: true })).body.tokens;
    expect((await post(`${s.url}/completion`, { prompt: ids, n_predict: 12, temperature: 0 })).body.content).toBe(text);
    expect((await post(`${s.url}/completion`, { prompt: [ids], n_predict: 12, temperature: 0 })).body.content).toBe(text);
    // Mixed: token ids then text (llama.cpp's tokenize_mixed: only a first string gets the BOS).
    const [first, ...rest] = ids;
    const mixed = await post(`${s.url}/completion`, { prompt: [first, tok.decode(rest).slice(1)], n_predict: 12, temperature: 0 });
    expect(mixed.body.tokens_evaluated).toBe(ids.length);
    expect(mixed.body.content).toBe(text);

    const at = text.indexOf("girl");
    expect(at).toBeGreaterThan(0);
    const w = await post(`${s.url}/completion`, { prompt: STORY, n_predict: 12, temperature: 0, stop: ["girl"] });
    expect(w.body).toMatchObject({ content: text.slice(0, at), stop_type: "word", stopping_word: "girl", stopped_word: true });

    const two = await post(`${s.url}/completion`, { prompt: [STORY, STORY] });
    expect(two.status).toBe(400);
    expect(two.body.error).toMatchObject({ code: 400, type: "invalid_request_error" });
    expect(two.body.error.message).toMatch(/^prompt: /);
  });

  it("/completion refuses what it does not do by name, in llama-server's error shape; json_schema constrains", async () => {
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ n_probs: 21 }, /^n_probs: /],
      [{ logprobs: -1 }, /^logprobs: /],
      [{ n_probs: 2, post_sampling_probs: true }, /^post_sampling_probs: /],
      [{ logit_bias: [[1]] }, /^logit_bias: \[0\] must be a \[token, bias\] pair/],
      [{ logit_bias: [[99999, 1]] }, /^logit_bias: \[0\]: the token must be an id/],
      [{ logit_bias: { 1: "x" } }, /^logit_bias: key "1": the bias must be a number/],
      [{ logit_bias: [[1, true]] }, /^logit_bias: \[0\]: the bias must be a number, or false/],
      [{ logit_bias: 5 }, /^logit_bias: must be/],
      [{ grammar: "root ::= \"a\"" }, /^grammar: /],
      [{ mirostat: 2 }, /^mirostat: not supported/],
      [{ n_predict: "many" }, /^n_predict: /],
      [{ temperature: -1 }, /^temperature: /],
      [{ id_slot: 3 }, /^id_slot: /],
      [{ prompt: [1, -4] }, /^prompt\[1\]: /],
    ];
    for (const [extra, message] of cases) {
      const r = await post(`${s.url}/completion`, { prompt: STORY, ...extra });
      expect(r.status, JSON.stringify(extra)).toBe(400);
      expect(r.body.error.code).toBe(400);
      expect(r.body.error.message).toMatch(message);
    }
    const schema = { type: "object", properties: { n: { type: "integer" } }, required: ["n"], additionalProperties: false };
    const j = await post(`${s.url}/completion`, { prompt: STORY, n_predict: 40, temperature: 0, json_schema: schema, cache_prompt: true, id_slot: -1 });
    expect(j.status).toBe(200);
    expect(Object.keys(JSON.parse(j.body.content))).toEqual(["n"]);
  });

  it("/props, /slots and /health describe the one slot", async () => {
    const props = (await (await fetch(`${s.url}/props`)).json()) as any;
    expect(props).toMatchObject({ total_slots: 1, model_alias: "stories260K", bos_token: "<s>", eos_token: "</s>" });
    expect(props.default_generation_settings.n_ctx).toBe(CTX);
    const slots = (await (await fetch(`${s.url}/slots`)).json()) as any[];
    expect(slots).toHaveLength(1);
    expect(slots[0]).toMatchObject({ id: 0, n_ctx: CTX, is_processing: false });
    expect((await fetch(`${s.url}/health`)).status).toBe(200);
    // Read-only: no slot actions.
    expect((await fetch(`${s.url}/slots`, { method: "POST" })).status).toBe(405);
  });
});

describe("serve with --api-key and --n-predict: the dialects share the guard, the limits, the prompt cache and the metrics", () => {
  let s: Served;
  const key = (k: string) => ({ Authorization: `Bearer ${k}` });
  beforeAll(async () => {
    s = await startServe(["--ctx", "256", "--api-key", "secret-1", "--api-key", "secret-2", "--n-predict", "6"]);
  }, 60_000);
  afterAll(() => s.proc.child.kill("SIGKILL"));

  it("without the key Ollama's client and /completion get 401 in their shapes; with it they are served", async () => {
    const e = await refused(() => new Ollama({ host: s.url }).generate({ model: "x", prompt: STORY, raw: true, options: { num_predict: 2 } }));
    expect(e.status_code).toBe(401);
    expect(e.message).toMatch(/API key/);
    const keyed = new Ollama({ host: s.url, headers: key("secret-1") });
    expect((await keyed.generate({ model: "x", prompt: STORY, raw: true, options: { num_predict: 2 } })).eval_count).toBe(2);
    expect((await keyed.list()).models).toHaveLength(1);

    const no = await post(`${s.url}/completion`, { prompt: STORY, n_predict: 2 });
    expect(no.status).toBe(401);
    expect(no.body.error.code).toBe(401);
    expect((await post(`${s.url}/tokenize`, { content: STORY })).status).toBe(401);
    const yes = await post(`${s.url}/completion`, { prompt: STORY, n_predict: 2 }, key("secret-1"));
    expect(yes.body.tokens_predicted).toBe(2);
    // A page of another site reaches nothing (the Origin check comes before any route).
    const cross = await fetch(`${s.url}/api/tags`, { headers: { Origin: "http://evil.example", Authorization: "Bearer secret-1" } });
    expect(cross.status).toBe(403);
  });

  it("--n-predict caps what Ollama's num_predict and /completion's n_predict ask for", async () => {
    const keyed = new Ollama({ host: s.url, headers: key("secret-1") });
    const g = await keyed.generate({ model: "x", prompt: STORY, raw: true, options: { temperature: 0, num_predict: 20 } });
    expect(g.eval_count).toBe(6);
    expect(g.done_reason).toBe("length");
    const c = await post(`${s.url}/completion`, { prompt: STORY, n_predict: 20, temperature: 0 }, key("secret-1"));
    expect(c.body.tokens_predicted).toBe(6);
    expect(c.body.generation_settings.n_predict).toBe(6);
    expect(c.body.content).toBe(g.response);
  });

  it("the prompt cache is the API key's whatever the dialect; /metrics counts every dialect's requests", async () => {
    const prompt = "The little dog ran to the park and";
    const keyed = new Ollama({ host: s.url, headers: key("secret-1") });
    await keyed.generate({ model: "x", prompt, raw: true, options: { temperature: 0, num_predict: 2 } });
    const again = await post(`${s.url}/completion`, { prompt, n_predict: 2, temperature: 0 }, key("secret-1"));
    expect(again.body.timings.cache_n).toBeGreaterThan(5);
    const other = await post(`${s.url}/completion`, { prompt, n_predict: 2, temperature: 0 }, key("secret-2"));
    expect(other.body.timings.cache_n).toBe(0);
    expect(other.body.content).toBe(again.body.content);

    const count = async (outcome: string) => {
      const m = await (await fetch(`${s.url}/metrics`, { headers: key("secret-1") })).text();
      return Number(new RegExp(`prima_requests_total\\{outcome="${outcome}"\\} (\\d+)`).exec(m)![1]);
    };
    const [ok0, invalid0] = [await count("ok"), await count("invalid")];
    await keyed.chat({ model: "x", messages: [{ role: "user", content: "hi" }], options: { num_predict: 1 } });
    await post(`${s.url}/completion`, { prompt, n_predict: 1 }, key("secret-2"));
    await refused(() => keyed.chat({ model: "x", messages: [{ role: "user", content: "hi" }], options: { top_p: 7 } }));
    expect((await post(`${s.url}/completion`, { prompt, n_probs: 99 }, key("secret-2"))).status).toBe(400);
    expect(await count("ok")).toBe(ok0 + 2);
    expect(await count("invalid")).toBe(invalid0 + 2);
  });
});
