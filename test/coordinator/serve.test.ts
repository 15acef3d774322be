// `prima-coord serve` as its users meet it: the official `openai` client (only its base URL changed)
// against a real server process, alone and with two loopback workers; greedy answers equal
// `prima-coord run --temp 0` token for token; a chat's second turn reuses the first's KV cache and
// still equals a cold run; a client that goes away frees the ring; a burst of requests queues or gets
// 503; bad requests get OpenAI-style 4xx errors and the server stays up.
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { APIError } from "openai";
import { killAll } from "../ring/cluster.js";
import { PLACEMENT_SHAPE, testModel } from "../profiler/models.js";
import { joinWorker, anonRssBytes, runOnce, startServe, until, type Served } from "./serve-harness.js";

const STORY = "Once upon a time";
const greedy = { temperature: 0 } as const;

afterAll(() => killAll());

describe("serve alone: the OpenAI API", () => {
  let s: Served;
  beforeAll(async () => {
    s = await startServe(["--ctx", "512"]);
  }, 60_000);
  afterAll(() => s.proc.child.kill("SIGKILL"));

  it("lists the model, says it is healthy, and answers completions as run does, streamed or not", async () => {
    const models = await s.client.models.list();
    expect(models.data.map((m) => m.id)).toEqual(["stories260K"]);
    expect((await fetch(`${s.url}/health`)).status).toBe(200);

    const ref = runOnce(["-p", STORY, "-n", "40", "--temp", "0"]);
    const full = await s.client.completions.create({ model: "stories260K", prompt: STORY, max_tokens: 40, ...greedy });
    expect(full.choices[0].text).toBe(ref.text);
    expect(full.usage?.completion_tokens).toBe(ref.generated_ids.length);
    expect(full.usage?.prompt_tokens).toBe(ref.prompt_ids.length);
    expect(full.choices[0].finish_reason).toBe("length");

    const stream = await s.client.completions.create({ prompt: STORY, max_tokens: 40, stream: true, ...greedy });
    let text = "";
    let chunks = 0;
    for await (const c of stream) {
      text += c.choices[0]?.text ?? "";
      chunks++;
    }
    expect(text).toBe(ref.text);
    expect(chunks).toBeGreaterThan(5);
  });

  it("chat, streamed with usage and not streamed, equals run --chat", async () => {
    const messages = [{ role: "system" as const, content: "You tell stories." }, { role: "user" as const, content: "Tell me about a dog." }];
    const ref = runOnce(["--chat", "--chat-template", "chatml", "--system", messages[0].content, "-p", messages[1].content, "-n", "30", "--temp", "0"]);
    const full = await s.client.chat.completions.create({ model: "stories260K", messages, max_tokens: 30, ...greedy });
    expect(full.choices[0].message.content).toBe(ref.text);
    expect(full.usage?.completion_tokens).toBe(ref.generated_ids.length);

    const stream = await s.client.chat.completions.create({ messages, max_completion_tokens: 30, stream: true, stream_options: { include_usage: true }, ...greedy });
    let text = "";
    let finish: string | null = null;
    let usage: { completion_tokens: number; prompt_tokens: number } | undefined;
    const deltas: Record<string, unknown>[] = [];
    for await (const c of stream) {
      if (c.choices[0]?.delta) deltas.push(c.choices[0].delta as Record<string, unknown>);
      text += c.choices[0]?.delta?.content ?? "";
      finish = c.choices[0]?.finish_reason ?? finish;
      if (c.usage) usage = c.usage;
    }
    expect(text).toBe(ref.text);
    // As OpenAI streams it: the role alone first, then content without it.
    expect(deltas[0]).toEqual({ role: "assistant", content: "" });
    expect(deltas.slice(1).some((d) => "role" in d)).toBe(false);
    expect(finish).toBe("length");
    expect(usage?.completion_tokens).toBe(ref.generated_ids.length);
    expect(usage?.prompt_tokens).toBe(ref.prompt_ids.length);
  });

  it("stop strings end the text before them, across token boundaries, with finish_reason stop", async () => {
    const ref = runOnce(["-p", STORY, "-n", "40", "--temp", "0"]);
    // A stop string that starts inside one token and ends in a later one.
    const at = ref.text.indexOf("girl");
    expect(at).toBeGreaterThan(0);
    const stop = ref.text.slice(at + 1, at + 9);
    const r = await s.client.completions.create({ prompt: STORY, max_tokens: 40, stop: [stop, "zzzz"], ...greedy });
    expect(r.choices[0].text).toBe(ref.text.slice(0, at + 1));
    expect(r.choices[0].finish_reason).toBe("stop");
    const streamed = await s.client.completions.create({ prompt: STORY, max_tokens: 40, stop, stream: true, ...greedy });
    let text = "";
    for await (const c of streamed) text += c.choices[0]?.text ?? "";
    expect(text).toBe(ref.text.slice(0, at + 1));
  });

  it("a second chat turn reuses the first turn's cache and gives the same tokens as a cold run", async () => {
    const first = [{ role: "user" as const, content: "Tell me a story about a cat." }];
    const a1 = await s.client.chat.completions.create({ messages: first, max_tokens: 20, ...greedy });
    const second = [...first, { role: "assistant" as const, content: a1.choices[0].message.content ?? "" }, { role: "user" as const, content: "And then?" }];
    const warm = await s.client.chat.completions.create({ messages: second, max_tokens: 20, ...greedy });
    const cachedWarm = (warm.usage as { prompt_tokens_details?: { cached_tokens?: number } }).prompt_tokens_details?.cached_tokens ?? 0;
    expect(cachedWarm).toBeGreaterThan(20);
    // Something else in between: the cache no longer holds this conversation.
    await s.client.completions.create({ prompt: "The sun", max_tokens: 4, ...greedy });
    const cold = await s.client.chat.completions.create({ messages: second, max_tokens: 20, ...greedy });
    const cachedCold = (cold.usage as { prompt_tokens_details?: { cached_tokens?: number } }).prompt_tokens_details?.cached_tokens ?? 0;
    expect(cachedCold).toBeLessThan(3);
    expect(warm.choices[0].message.content).toBe(cold.choices[0].message.content);
  });

  it("answers to any model name (or none), and joins text parts with a newline, as llama-server does", async () => {
    const ref = runOnce(["-p", STORY, "-n", "8", "--temp", "0"]);
    for (const model of ["gpt-3.5-turbo", "llama3.2:latest"]) {
      const r = await s.client.completions.create({ model, prompt: STORY, max_tokens: 8, ...greedy });
      expect(r.choices[0].text).toBe(ref.text);
      expect(r.model).toBe("stories260K");
    }
    const nullModel = await fetch(`${s.url}/v1/completions`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ model: null, prompt: STORY, max_tokens: 8, ...greedy }),
    });
    expect(nullModel.status).toBe(200);
    expect(((await nullModel.json()) as { choices: { text: string }[] }).choices[0].text).toBe(ref.text);
    // Parts ["What is", "the best book"] are the message "What is\nthe best book".
    const parts = await s.client.chat.completions.create({
      messages: [{ role: "user", content: [{ type: "text", text: "What is" }, { type: "text", text: "the best book" }] }], max_tokens: 8, ...greedy,
    });
    const joined = await s.client.chat.completions.create({ messages: [{ role: "user", content: "What is\nthe best book" }], max_tokens: 8, ...greedy });
    expect(parts.usage?.prompt_tokens).toBe(joined.usage?.prompt_tokens);
    expect(parts.choices[0].message.content).toBe(joined.choices[0].message.content);
  });

  it("top_p 0 keeps the most probable token alone (as llama-server and OpenAI take it): the greedy answer at any temperature", async () => {
    const ref = runOnce(["-p", STORY, "-n", "16", "--temp", "0"]);
    for (const seed of [1, 2, 3]) {
      const r = await s.client.completions.create({ prompt: STORY, max_tokens: 16, temperature: 2, top_p: 0, seed });
      expect(r.choices[0].text).toBe(ref.text);
    }
    // The same seeds with top_p 1 draw otherwise at this temperature, so the check above can fail.
    const free = await Promise.all([1, 2, 3].map((seed) => s.client.completions.create({ prompt: STORY, max_tokens: 16, temperature: 2, top_p: 1, top_k: 0, min_p: 0, seed })));
    expect(free.some((r) => r.choices[0].text !== ref.text)).toBe(true);
  });

  it("bad requests get OpenAI-style errors with 4xx codes, and the server stays up", async () => {
    const post = (path: string, body: string, headers: Record<string, string> = {}) =>
      fetch(`${s.url}${path}`, { method: "POST", body, headers: { "Content-Type": "application/json", ...headers } });
    const cases: [string, string, string, number, RegExp][] = [
      ["malformed JSON", "/v1/chat/completions", "{\"messages\": [", 400, /not valid JSON/],
      ["not an object", "/v1/completions", "[1,2]", 400, /JSON object/],
      ["messages of the wrong type", "/v1/chat/completions", JSON.stringify({ messages: "hi" }), 400, /messages/],
      ["a role that does not exist", "/v1/chat/completions", JSON.stringify({ messages: [{ role: "wizard", content: "x" }] }), 400, /role/],
      ["temperature as a string", "/v1/completions", JSON.stringify({ prompt: "x", temperature: "hot" }), 400, /temperature/],
      ["max_tokens negative", "/v1/completions", JSON.stringify({ prompt: "x", max_tokens: -3 }), 400, /max_tokens/],
      // Ranges the sampler refuses are 400s naming the field, never a 503 from the generation.
      ["top_p above 1", "/v1/completions", JSON.stringify({ prompt: "x", top_p: 1.5 }), 400, /^top_p: /],
      ["min_p 1", "/v1/chat/completions", JSON.stringify({ messages: [{ role: "user", content: "x" }], min_p: 1 }), 400, /^min_p: /],
      ["top_k fractional", "/v1/completions", JSON.stringify({ prompt: "x", top_k: 2.5 }), 400, /^top_k: /],
      ["repeat_penalty 0", "/v1/completions", JSON.stringify({ prompt: "x", repeat_penalty: 0 }), 400, /^repeat_penalty: /],
      ["temperature above 2", "/v1/completions", JSON.stringify({ prompt: "x", temperature: 2.5 }), 400, /^temperature: /],
      ["n > 1", "/v1/completions", JSON.stringify({ prompt: "x", n: 3 }), 400, /n: only one/],
      // What would change the answer and is not done yet is refused by name, never ignored.
      ["post_sampling_probs", "/v1/completions", JSON.stringify({ prompt: "x", n_probs: 2, post_sampling_probs: true }), 400, /^post_sampling_probs: /],
      // logit_bias and logprobs are done (logprobs.test.ts): their bad values are 400s naming the field.
      ["logit_bias of a token that is not in the vocabulary", "/v1/completions", JSON.stringify({ prompt: "x", logit_bias: { 99999: 100 } }), 400, /^logit_bias: key "99999": .*out of range/],
      ["top_logprobs without logprobs", "/v1/chat/completions", JSON.stringify({ messages: [{ role: "user", content: "x" }], top_logprobs: 2 }), 400, /^top_logprobs: needs logprobs/],
      ["a top-level grammar", "/v1/completions", JSON.stringify({ prompt: "x", grammar: "root ::= \"a\"" }), 400, /^grammar: .*response_format/],
      ["a top-level json_schema", "/v1/completions", JSON.stringify({ prompt: "x", json_schema: { type: "object" } }), 400, /^json_schema: .*response_format/],
      ["a tool schema the decoder cannot honour", "/v1/chat/completions", JSON.stringify({ messages: [{ role: "user", content: "x" }], tools: [{ type: "function", function: { name: "f", parameters: { not: {} } } }] }), 400, /"not"/],
      ["a prompt longer than the context", "/v1/completions", JSON.stringify({ prompt: "the cat sat on the mat. ".repeat(200) }), 400, /context/],
      ["an oversized body", "/v1/completions", JSON.stringify({ prompt: "x".repeat(5 << 20) }), 413, /limit/],
    ];
    for (const [what, path, body, status, message] of cases) {
      const r = await post(path, body);
      expect(r.status, what).toBe(status);
      expect(r.headers.get("retry-after"), what).toBeNull();
      const j = (await r.json()) as { error: { message: string; type: string } };
      expect(j.error.message, what).toMatch(message);
      expect(typeof j.error.type, what).toBe("string");
    }
    expect((await fetch(`${s.url}/v1/nothing`)).status).toBe(404);
    expect((await fetch(`${s.url}/v1/completions`)).status).toBe(405);
    // The openai client surfaces them as APIError with the status.
    await expect(s.client.completions.create({ prompt: "x", temperature: 9 })).rejects.toBeInstanceOf(APIError);
    // Raw garbage on the socket.
    const { connect } = await import("node:net");
    await new Promise<void>((resolve) => {
      const sock = connect(Number(new URL(s.url).port), "127.0.0.1", () => sock.end("\x00\x01GARBAGE \r\n\r\n"));
      sock.resume(); // read the 400 so the socket can close
      sock.on("close", () => resolve());
      sock.on("error", () => resolve());
    });
    expect((await fetch(`${s.url}/health`)).status).toBe(200);
    expect(s.proc.child.exitCode).toBeNull();
  });

});

describe("serve on a model slow enough to watch (12 layers of 1024, Q8_0)", () => {
  let s: Served;
  let model: string;
  const run = (args: string[]) => runOnce(args, model);
  beforeAll(async () => {
    model = await testModel(PLACEMENT_SHAPE, "Q8_0");
    s = await startServe(["--ctx", "512", "--queue", "8"], { model });
  }, 120_000);
  afterAll(() => s.proc.child.kill("SIGKILL"));

  it("a client that goes away mid-stream frees the ring within a token; the next request runs", async () => {
    const stream = await s.client.completions.create({ prompt: STORY, max_tokens: 400, stream: true, ...greedy });
    let n = 0;
    const stepMs: number[] = [];
    let last = Date.now();
    for await (const _ of stream) {
      stepMs.push(Date.now() - last);
      last = Date.now();
      if (++n === 6) break; // leaving the loop aborts the request
    }
    const left = Date.now();
    const st = await until<{ requests: { active: { generatedTokens: number } | null } }>(`${s.url}/api/state`, (_, b) => b.requests.active === null, 10_000);
    const freedMs = Date.now() - left;
    const tokenMs = Math.max(...stepMs.slice(2));
    console.log(`freed after ${freedMs} ms, tokens take ${tokenMs} ms`);
    expect(st.requests.active).toBeNull();
    // Stopped where the client left, not run on to its 400 tokens (counted in tokens, not in time: a
    // busy machine stretches both; the client read 6, a few more were in flight).
    const cancelled = await s.proc.waitFor(/cancelled by the client after (\d+) tokens/, 10_000);
    expect(Number(cancelled[1])).toBeLessThan(60);
    const next = await s.client.completions.create({ prompt: STORY, max_tokens: 10, ...greedy });
    expect(next.choices[0].text).toBe(run(["-p", STORY, "-n", "10", "--temp", "0", "--ctx", "512"]).text);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/prima_requests_total\{outcome="cancelled"\} 1\n/);
  }, 60_000);

  it("a chat's next turn reuses every token of the last one, the reply as generated", async () => {
    // Random weights write tokens in splits the tokenizer would not make: the reply's text tokenized
    // afresh would lose the cache from the reply on.
    const user = { role: "user" as const, content: "Tell me a story about a dog." };
    const first = await s.client.chat.completions.create({ messages: [user], max_tokens: 12, ...greedy });
    const reply = first.choices[0].message.content ?? "";
    const second = await s.client.chat.completions.create({
      messages: [user, { role: "assistant", content: reply }, { role: "user", content: "And then?" }], max_tokens: 4, ...greedy,
    });
    const u = first.usage!;
    // The last token of a reply cut by max_tokens was sampled but never ran through the layers.
    const ran = u.prompt_tokens + u.completion_tokens - (first.choices[0].finish_reason === "length" ? 1 : 0);
    expect(second.usage!.prompt_tokens_details!.cached_tokens).toBe(ran);
  }, 60_000);

  it("50 concurrent requests: each completes correctly in order or gets 503 past the queue limit; memory stays bounded", async () => {
    const prompts = ["Once upon a time", "The little dog", "One day", "Tim and Sue", "The sun was"];
    const refs = new Map(prompts.map((p) => [p, run(["-p", p, "-n", "8", "--temp", "0", "--ctx", "512"]).text]));
    const rss0 = anonRssBytes(s.proc.child.pid!);
    const logFrom = s.proc.stderr.length;
    const finished: string[] = [];
    // 10 ms apart; the client may still send two of them out of order, so the order they were
    // queued in is the server's own (the number in its log line).
    const results = await Promise.allSettled(Array.from({ length: 50 }, async (_, i) => {
      await new Promise((r) => setTimeout(r, 10 * i));
      const p = prompts[i % prompts.length];
      const r = await s.client.completions.create({ prompt: p, max_tokens: 8, ...greedy });
      finished.push(r.id);
      return { i, p, text: r.choices[0].text };
    }));
    let ok = 0, busy = 0;
    for (const r of results) {
      if (r.status === "fulfilled") {
        ok++;
        expect(r.value.text).toBe(refs.get(r.value.p));
      } else {
        const e = r.reason as APIError;
        expect(e.status, String(e)).toBe(503);
        expect(e.headers?.get("retry-after")).toBeTruthy();
        busy++;
      }
    }
    expect(ok + busy).toBe(50);
    expect(busy, "the queue (8) overflowed").toBeGreaterThan(0);
    expect(ok).toBeGreaterThanOrEqual(9); // the running one plus the queue
    // Requests ran in the order they were queued: the server logs each as it finishes, with its
    // place in the queue, and the client got them back in that order.
    const logged = [...s.proc.stderr.slice(logFrom).matchAll(/request (\d+) \((cmpl-\w+)\): \d+ prompt tokens .* generated \(length\)/g)];
    expect(logged.map((m) => m[2])).toEqual(finished);
    const queued = logged.map((m) => Number(m[1]));
    expect(queued).toEqual([...queued].sort((a, b) => a - b));
    expect(anonRssBytes(s.proc.child.pid!) - rss0).toBeLessThan(64 << 20);
    expect((await fetch(`${s.url}/health`)).status).toBe(200);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toContain(`prima_requests_total{outcome="rejected"} ${busy}\n`);
  }, 120_000);
});

describe("serve --n-predict", () => {
  it("is the default of a request without max_tokens, and the most one may ask for", async () => {
    const s = await startServe(["--n-predict", "5"]);
    try {
      const none = await s.client.completions.create({ prompt: STORY, ...greedy });
      expect(none.usage?.completion_tokens).toBe(5);
      expect(none.choices[0].finish_reason).toBe("length");
      const more = await s.client.completions.create({ prompt: STORY, max_tokens: 50, ...greedy });
      expect(more.usage?.completion_tokens).toBe(5);
      const fewer = await s.client.completions.create({ prompt: STORY, max_tokens: 3, ...greedy });
      expect(fewer.usage?.completion_tokens).toBe(3);
    } finally {
      s.proc.child.kill("SIGKILL");
    }
  });
});

describe("serve with an API key", () => {
  afterEach(() => killAll());
  it("requires Authorization: Bearer on everything but /health", async () => {
    const k = await startServe(["--api-key", "sesame"], { apiKey: "sesame" });
    expect((await fetch(`${k.url}/health`)).status).toBe(200);
    for (const headers of [{}, { Authorization: "Bearer wrong" }, { Authorization: "Basic c2VzYW1l" }]) {
      const r = await fetch(`${k.url}/v1/models`, { headers });
      expect(r.status).toBe(401);
      expect(((await r.json()) as { error: { code: string } }).error.code).toBe("invalid_api_key");
    }
    expect((await fetch(`${k.url}/api/state`)).status).toBe(401);
    expect((await fetch(`${k.url}/metrics`)).status).toBe(401);
    const r = await k.client.completions.create({ prompt: STORY, max_tokens: 5, ...greedy });
    expect(r.choices[0].text.length).toBeGreaterThan(0);
  }, 60_000);
});

describe("serve with two loopback workers", () => {
  afterEach(() => killAll());

  it("workers join at any time; the ring serves greedy answers equal to run, in an order set by names", async () => {
    const s = await startServe(["--min-workers", "2", "--layer-windows", "bravo=2,alpha=2,head=1"], { waitReady: false });
    expect((await fetch(`${s.url}/health`)).status).toBe(503);
    // bravo joins first; the ring order still follows the names: alpha, bravo, head.
    const b = joinWorker(s.clusterPort, "bravo");
    await s.proc.waitFor(/"bravo" .*joined/);
    const a = joinWorker(s.clusterPort, "alpha");
    await s.proc.waitFor(/"alpha" .*joined/);
    await until(`${s.url}/health`, (st) => st === 200);
    const state = await until<{ plan: { ringOrder: string[]; windows: { device: string; firstLayer: number; endLayer: number }[] } | null; devices: { id: string; name: string }[] }>(
      `${s.url}/api/state`, (_, st) => (st.plan?.ringOrder.length ?? 0) === 3);
    const byId = new Map(state.devices.map((d) => [d.id, d.name]));
    expect(state.plan!.ringOrder.map((id) => byId.get(id))).toEqual(["alpha", "bravo", "head (this coordinator)"]);
    const firstOf = (name: string) => state.plan!.windows.find((w) => byId.get(w.device) === name)!;
    expect(firstOf("alpha")).toMatchObject({ firstLayer: 0, endLayer: 2 });
    expect(firstOf("bravo")).toMatchObject({ firstLayer: 2, endLayer: 4 });

    const ref = runOnce(["-p", STORY, "-n", "30", "--temp", "0"]);
    for (const stream of [false, true]) {
      let text = "";
      if (stream) {
        for await (const c of await s.client.completions.create({ prompt: STORY, max_tokens: 30, stream: true, ...greedy })) text += c.choices[0]?.text ?? "";
      } else text = (await s.client.completions.create({ prompt: STORY, max_tokens: 30, ...greedy })).choices[0].text;
      expect(text, `stream: ${stream}`).toBe(ref.text);
    }
    // A chat's second turn on the ring: the workers' caches are reused and the tokens are a cold run's.
    const first = [{ role: "user" as const, content: "Tell me a story." }];
    const a1 = await s.client.chat.completions.create({ messages: first, max_tokens: 12, ...greedy });
    const second = [...first, { role: "assistant" as const, content: a1.choices[0].message.content ?? "" }, { role: "user" as const, content: "More." }];
    const warm = await s.client.chat.completions.create({ messages: second, max_tokens: 12, ...greedy });
    await s.client.completions.create({ prompt: "The sun", max_tokens: 3, ...greedy });
    const cold = await s.client.chat.completions.create({ messages: second, max_tokens: 12, ...greedy });
    expect(warm.choices[0].message.content).toBe(cold.choices[0].message.content);
    expect((warm.usage as { prompt_tokens_details: { cached_tokens: number } }).prompt_tokens_details.cached_tokens).toBeGreaterThan(10);
    // The links and windows stayed up across requests: one placement for all of them.
    expect(s.proc.stderr.match(/device w\d "alpha" .* ready/g)?.length).toBe(1);
    for (const w of [a, b]) expect(w.stderr.match(/assigned layers/g)?.length).toBe(1);
  }, 90_000);

  it("Halda places the layers automatically when workers join (--keep-all keeps them all in)", async () => {
    const s = await startServe(["--keep-all"]);
    joinWorker(s.clusterPort, "alpha");
    joinWorker(s.clusterPort, "bravo");
    const st = await until<{ plan: { ringOrder: string[]; planner: string } | null }>(`${s.url}/api/state`, (_, b) => (b.plan?.ringOrder.length ?? 0) === 3, 60_000);
    expect(st.plan!.planner).toMatch(/Halda/);
    const ref = runOnce(["-p", STORY, "-n", "20", "--temp", "0"]);
    const r = await s.client.completions.create({ prompt: STORY, max_tokens: 20, ...greedy });
    expect(r.choices[0].text).toBe(ref.text);
  }, 90_000);
});

describe("a coordinator that restarts", () => {
  afterEach(() => killAll());

  it("finds its workers again without anyone touching them", async () => {
    const { createServer } = await import("node:net");
    const free = await new Promise<number>((resolve) => {
      const srv = createServer().listen(0, "127.0.0.1", () => {
        const p = (srv.address() as { port: number }).port;
        srv.close(() => resolve(p));
      });
    });
    const args = ["--min-workers", "1", "--layer-windows", "alpha=3,head=2"];
    const first = await startServe([...args, "--cluster-port", String(free)], { waitReady: false });
    const alpha = joinWorker(free, "alpha");
    await until(`${first.url}/health`, (st) => st === 200);
    first.proc.child.kill("SIGKILL");
    await first.proc.exited;
    const again = await startServe([...args, "--cluster-port", String(free)], { waitReady: false });
    await until(`${again.url}/health`, (st) => st === 200, 20_000);
    const ref = runOnce(["-p", STORY, "-n", "16", "--temp", "0"]);
    const r = await again.client.completions.create({ prompt: STORY, max_tokens: 16, ...greedy });
    expect(r.choices[0].text).toBe(ref.text);
    expect(alpha.child.exitCode).toBeNull();
    expect(alpha.stderr).toMatch(/joined .* as w1[\s\S]*joined .* as w1/);
  }, 60_000);
});
