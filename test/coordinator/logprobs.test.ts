// Log probabilities and logit_bias through `serve`, as OpenAI clients use them (the `openai` package
// against a real server process): the shapes OpenAI returns (chat's logprobs.content, the completions'
// legacy format), streamed equal to not streamed, and the values against llama.cpp: every generated
// token's logprob and its top alternatives are log-softmax of llama.cpp's logits at that position
// (node-llama-cpp, the oracle tests' tolerance). logit_bias moves the greedy choice to the runner-up,
// forces a token in the greedy and the sampling paths, yields to a grammar's mask, and bad maps are
// 400s naming the key. On a ring the head computes them from the logits the ring returns: the same.
import type { Llama } from "node-llama-cpp";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { APIError } from "openai";
import { Tokenizer } from "../../model/index.js";
import { TOL_FLOOR, compare, loadOracle, oracleLogits } from "../engine/oracle-harness.js";
import { killAll } from "../ring/cluster.js";
import { MODEL, joinWorker, runOnce, startServe, until, type Served } from "./serve-harness.js";

const STORY = "Once upon a time";
const N = 8;
const greedy = { temperature: 0 } as const;
const CHAT = [{ role: "user" as const, content: "Tell me about a dog." }];
const CHAT_RUN = ["--chat", "--chat-template", "chatml", "-p", CHAT[0].content];

afterAll(() => killAll());

interface ChatEntry { token: string; logprob: number; bytes: number[]; top_logprobs: { token: string; logprob: number; bytes: number[] }[] }
interface Legacy { tokens: string[]; token_logprobs: number[]; top_logprobs: Record<string, number>[]; text_offset: number[] }

/** log-softmax of a row, in float64. */
function logSoftmax(row: Float32Array): Float64Array {
  let max = -Infinity;
  for (const v of row) max = Math.max(max, v);
  let sum = 0;
  for (const v of row) sum += Math.exp(v - max);
  const lse = max + Math.log(sum);
  return Float64Array.from(row, (v) => v - lse);
}

/** Ids by descending value (ties: lower id first). */
function ranked(lp: Float64Array): number[] {
  return Array.from(lp.keys()).sort((a, b) => lp[b] - lp[a] || a - b);
}

describe("logprobs and logit_bias through serve", () => {
  let s: Served;
  let llama: Llama;
  const tok = Tokenizer.fromGguf(MODEL);
  const text = (id: number) => new TextDecoder().decode(tok.tokenPiece(id, { special: true }));
  const post = (path: string, body: unknown) =>
    fetch(`${s.url}${path}`, { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" } });

  beforeAll(async () => {
    [s, llama] = await Promise.all([startServe(["--ctx", "256"]), loadOracle()]);
  }, 120_000);
  afterAll(() => s.proc.child.kill("SIGKILL"));

  /** llama.cpp's log-softmax at every generated token's step (the prompt, then each token fed back),
   * and the tolerance there: twice llama.cpp's own flash-attention noise, at least TOL_FLOOR, of the
   * row's logit spread (a logprob is a logit less log-sum-exp: its error is at most twice the logits'). */
  async function oracle(promptIds: number[], generated: number[]) {
    const seq = [...promptIds, ...generated.slice(0, -1)];
    const ref = await oracleLogits(llama, MODEL, seq, false);
    const noise = compare(await oracleLogits(llama, MODEL, seq, true), ref, 0).maxRelErr;
    const tol = Math.max(2 * noise, TOL_FLOOR);
    return ref.slice(promptIds.length - 1).map((row) => {
      let min = Infinity, max = -Infinity;
      for (const v of row) {
        min = Math.min(min, v);
        max = Math.max(max, v);
      }
      return { lp: logSoftmax(row), within: 2 * tol * (max - min) };
    });
  }

  it("chat: logprobs.content as OpenAI's, streamed equal to not, equal to llama.cpp's log-softmax", async () => {
    const ref = runOnce([...CHAT_RUN, "-n", String(N), "--temp", "0"]);
    const full = await s.client.chat.completions.create({ messages: CHAT, max_tokens: N, logprobs: true, top_logprobs: 5, ...greedy });
    expect(full.choices[0].message.content).toBe(ref.text);
    const content = full.choices[0].logprobs!.content as unknown as ChatEntry[];
    expect(content.length).toBe(ref.generated_ids.length);
    content.forEach((e, i) => {
      expect(Object.keys(e).sort()).toEqual(["bytes", "logprob", "token", "top_logprobs"]);
      expect(e.bytes).toEqual(Array.from(tok.tokenPiece(ref.generated_ids[i], { special: true })));
      expect(e.token).toBe(text(ref.generated_ids[i]));
      expect(e.top_logprobs.length).toBe(5);
      for (let k = 1; k < 5; k++) expect(e.top_logprobs[k].logprob).toBeLessThanOrEqual(e.top_logprobs[k - 1].logprob);
      // Greedy: the token taken is the most likely one, its logprob the max of the alternatives.
      expect(e.top_logprobs[0]).toEqual({ token: e.token, logprob: e.logprob, bytes: e.bytes });
      expect(e.logprob).toBeLessThanOrEqual(0);
    });
    expect(Buffer.from(content.flatMap((e) => e.bytes)).toString()).toBe(ref.text);

    const stream = await s.client.chat.completions.create({ messages: CHAT, max_tokens: N, logprobs: true, top_logprobs: 5, stream: true, ...greedy });
    const streamed: ChatEntry[] = [];
    let streamedText = "";
    for await (const c of stream) {
      streamedText += c.choices[0]?.delta?.content ?? "";
      streamed.push(...((c.choices[0]?.logprobs?.content ?? []) as unknown as ChatEntry[]));
    }
    expect(streamedText).toBe(ref.text);
    expect(streamed).toEqual(content);

    // The values: llama.cpp's distribution at each step, the top 5 in its order.
    const steps = await oracle(ref.prompt_ids, ref.generated_ids);
    content.forEach((e, i) => {
      const { lp, within } = steps[i];
      expect(Math.abs(e.logprob - lp[ref.generated_ids[i]]), `token ${i}`).toBeLessThanOrEqual(within);
      const top = ranked(lp).slice(0, 5);
      e.top_logprobs.forEach((t, k) => {
        expect(Math.abs(t.logprob - lp[top[k]]), `token ${i}, alternative ${k}`).toBeLessThanOrEqual(within);
      });
      expect(e.top_logprobs[1].bytes).toEqual(Array.from(tok.tokenPiece(top[1], { special: true })));
    });
    // Without top_logprobs: the token's own, no alternatives; without logprobs: null.
    const bare = await s.client.chat.completions.create({ messages: CHAT, max_tokens: 2, logprobs: true, ...greedy });
    expect(bare.choices[0].logprobs!.content!.map((e) => e.top_logprobs)).toEqual([[], []]);
    const none = await s.client.chat.completions.create({ messages: CHAT, max_tokens: 2, ...greedy });
    expect(none.choices[0].logprobs).toBeNull();
  });

  it("completions: the legacy format, streamed equal to not, equal to llama.cpp's log-softmax", async () => {
    const ref = runOnce(["-p", STORY, "-n", String(N), "--temp", "0"]);
    const full = await s.client.completions.create({ prompt: STORY, max_tokens: N, logprobs: 3, ...greedy });
    expect(full.choices[0].text).toBe(ref.text);
    const lp = full.choices[0].logprobs as unknown as Legacy;
    expect(Object.keys(lp).sort()).toEqual(["text_offset", "token_logprobs", "tokens", "top_logprobs"]);
    expect(lp.tokens).toEqual(ref.generated_ids.map(text));
    expect(lp.tokens.join("")).toBe(ref.text);
    let at = 0;
    lp.tokens.forEach((t, i) => {
      expect(lp.text_offset[i]).toBe(at);
      at += t.length;
      const top = Object.entries(lp.top_logprobs[i]);
      expect(top.length).toBe(3);
      expect(top[0]).toEqual([t, lp.token_logprobs[i]]);
      expect(Math.max(...top.map(([, v]) => v))).toBe(lp.token_logprobs[i]);
    });

    const stream = await s.client.completions.create({ prompt: STORY, max_tokens: N, logprobs: 3, stream: true, ...greedy });
    const joined: Legacy = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
    for await (const c of stream) {
      const part = c.choices[0]?.logprobs as unknown as Legacy | null;
      if (!part) continue;
      for (const k of Object.keys(joined) as (keyof Legacy)[]) (joined[k] as unknown[]).push(...part[k]);
    }
    expect(joined).toEqual(lp);

    const steps = await oracle(ref.prompt_ids, ref.generated_ids);
    lp.token_logprobs.forEach((v, i) => {
      const { lp: row, within } = steps[i];
      expect(Math.abs(v - row[ref.generated_ids[i]]), `token ${i}`).toBeLessThanOrEqual(within);
      const top = ranked(row).slice(0, 3);
      expect(Object.keys(lp.top_logprobs[i])).toEqual(top.map(text));
      top.forEach((id) => expect(Math.abs(lp.top_logprobs[i][text(id)] - row[id])).toBeLessThanOrEqual(within));
    });
  });

  it("a stop string's tokens are left out of the logprobs, streamed or not", async () => {
    const ref = runOnce(["-p", STORY, "-n", "20", "--temp", "0"]);
    // A stop string that starts where token k starts (and nowhere before): tokens k.. are left out.
    const pieces = ref.generated_ids.map(text);
    const k = [10, 11, 12, 13, 14].find((i) => ref.text.indexOf(pieces.slice(i, i + 2).join("")) === pieces.slice(0, i).join("").length)!;
    expect(k).toBeDefined();
    const kept = pieces.slice(0, k).join("");
    const body = { prompt: STORY, max_tokens: 20, logprobs: 1, stop: pieces.slice(k, k + 2).join(""), ...greedy };
    const full = await s.client.completions.create(body);
    expect(full.choices[0].finish_reason).toBe("stop");
    expect(full.choices[0].text).toBe(kept);
    expect(full.usage?.completion_tokens).toBeGreaterThan(k);
    const lp = full.choices[0].logprobs as unknown as Legacy;
    expect(lp.tokens).toEqual(pieces.slice(0, k));
    const stream = await s.client.completions.create({ ...body, stream: true });
    const tokens: string[] = [];
    for await (const c of stream) tokens.push(...((c.choices[0]?.logprobs as unknown as Legacy | null)?.tokens ?? []));
    expect(tokens).toEqual(lp.tokens);
  });

  it("logit_bias: -100 on the greedy token gives the runner-up, +100 forces a token (greedy and sampled)", async () => {
    const ref = runOnce(["-p", STORY, "-n", "1", "--temp", "0"]);
    const [row] = await oracle(ref.prompt_ids, ref.generated_ids);
    const order = ranked(row.lp);
    const [first, second] = order;
    expect(first).toBe(ref.generated_ids[0]);
    const plain = await s.client.completions.create({ prompt: STORY, max_tokens: 1, logprobs: 2, ...greedy });
    const top = Object.entries((plain.choices[0].logprobs as unknown as Legacy).top_logprobs[0]);
    expect(top.map(([t]) => t)).toEqual([text(first), text(second)]);

    const banned = await s.client.completions.create({ prompt: STORY, max_tokens: 1, logprobs: 2, logit_bias: { [first]: -100 }, ...greedy });
    const b = banned.choices[0].logprobs as unknown as Legacy;
    expect(b.tokens).toEqual([text(second)]);
    // The logprobs stay the model's: the runner-up's as it was, the banned token still listed first.
    expect(b.token_logprobs[0]).toBe(top[1][1]);
    expect(Object.entries(b.top_logprobs[0])).toEqual(top);

    // A token far down the list, with a piece of its own (no other token renders the same text).
    const forced = order.slice(50).find((id) => text(id).trim().length > 1 && order.every((o) => o === id || text(o) !== text(id)))!;
    for (const sampling of [greedy, { temperature: 1, seed: 5 }]) {
      const r = await s.client.completions.create({ prompt: STORY, max_tokens: 1, logprobs: 0, logit_bias: { [forced]: 100 }, ...sampling });
      expect((r.choices[0].logprobs as unknown as Legacy).tokens, JSON.stringify(sampling)).toEqual([text(forced)]);
    }
    // Chat too, streamed.
    const chatRef = runOnce([...CHAT_RUN, "-n", "1", "--temp", "0"]);
    const stream = await s.client.chat.completions.create({ messages: CHAT, max_tokens: 1, logit_bias: { [chatRef.generated_ids[0]]: -100, [forced]: 100 }, stream: true, ...greedy });
    let content = "";
    for await (const c of stream) content += c.choices[0]?.delta?.content ?? "";
    expect(content).toBe(text(forced));
  });

  it("a piece that is part of a UTF-8 character: its raw bytes, its text U+FFFD, streamed or not", async () => {
    const byte = Array.from({ length: tok.nVocab }, (_, id) => id).find((id) => {
      const p = tok.tokenPiece(id);
      return p.length === 1 && p[0] === 0xe2;
    })!;
    expect(byte).toBeDefined();
    const body = { messages: CHAT, max_tokens: 1, logprobs: true, top_logprobs: 1, logit_bias: { [byte]: 100 }, ...greedy };
    const full = await s.client.chat.completions.create(body);
    const [e] = full.choices[0].logprobs!.content!;
    expect(e.bytes).toEqual([0xe2]);
    expect(e.token).toBe("\ufffd");
    // The model's own distribution: the forced token is not its most likely one.
    expect(e.top_logprobs[0].bytes).not.toEqual([0xe2]);
    const streamed: unknown[] = [];
    for await (const c of await s.client.chat.completions.create({ ...body, stream: true })) streamed.push(...(c.choices[0]?.logprobs?.content ?? []));
    expect(streamed).toEqual([e]);
  });

  it("logit_bias yields to a grammar: a forced token the JSON grammar forbids is never taken", async () => {
    const forced = Array.from({ length: tok.nVocab }, (_, id) => id).find((id) => /^[a-z]{2,}$/.test(text(id).trim()))!;
    const r = await s.client.chat.completions.create({
      messages: CHAT, max_tokens: 12, response_format: { type: "json_object" }, logit_bias: { [forced]: 100 }, logprobs: true, ...greedy,
    });
    expect(r.choices[0].message.content!.trimStart().startsWith("{")).toBe(true);
    expect(r.choices[0].logprobs!.content![0].token).not.toBe(text(forced));
  });

  it("on a ring (a worker runs the first layers), the head's logprobs and logit_bias are the same", async () => {
    const r = await startServe(["--min-workers", "1", "--layer-windows", "alpha=3,head=2"], { waitReady: false });
    const w = joinWorker(r.clusterPort, "alpha");
    try {
      await r.proc.waitFor(/"alpha" .*joined/);
      await until(`${r.url}/health`, (st) => st === 200);
      await until<{ plan: { ringOrder: string[] } | null }>(`${r.url}/api/state`, (_, st) => (st.plan?.ringOrder.length ?? 0) === 2);
      const ref = runOnce(["-p", STORY, "-n", String(N), "--temp", "0"]);
      const body = { prompt: STORY, max_tokens: N, logprobs: 3, ...greedy };
      const onRing = (await r.client.completions.create(body)).choices[0].logprobs as unknown as Legacy;
      const alone = (await s.client.completions.create(body)).choices[0].logprobs as unknown as Legacy;
      expect(onRing.tokens).toEqual(alone.tokens);
      const steps = await oracle(ref.prompt_ids, ref.generated_ids);
      onRing.token_logprobs.forEach((v, i) => expect(Math.abs(v - steps[i].lp[ref.generated_ids[i]]), `token ${i}`).toBeLessThanOrEqual(steps[i].within));
      const banned = await r.client.completions.create({ ...body, max_tokens: 1, logit_bias: { [ref.generated_ids[0]]: -100 } });
      expect((banned.choices[0].logprobs as unknown as Legacy).tokens).toEqual([Object.keys(alone.top_logprobs[0])[1]]);
      expect(w.child.exitCode).toBeNull();
    } finally {
      w.child.kill("SIGKILL");
      r.proc.child.kill("SIGKILL");
    }
  }, 90_000);

  it("bad logit_bias, logprobs and top_logprobs are 400s naming the field and the key", async () => {
    const cases: [unknown, RegExp][] = [
      [{ prompt: "x", logit_bias: { abc: 5 } }, /^logit_bias: key "abc" is not a token id/],
      [{ prompt: "x", logit_bias: { "-1": 5 } }, /^logit_bias: key "-1" is not a token id/],
      [{ prompt: "x", logit_bias: { "1.5": 5 } }, /^logit_bias: key "1.5" is not a token id/],
      [{ prompt: "x", logit_bias: { [tok.nVocab]: 5 } }, new RegExp(`^logit_bias: key "${tok.nVocab}": token id ${tok.nVocab} is out of range`)],
      [{ prompt: "x", logit_bias: { 7: "high" } }, /^logit_bias: key "7": the bias must be a number/],
      [{ prompt: "x", logit_bias: { 7: 101 } }, /^logit_bias: key "7": the bias must be from -100 to 100/],
      [{ prompt: "x", logit_bias: [[7, 1]] }, /^logit_bias: must be an object/],
      [{ prompt: "x", logprobs: 6 }, /^logprobs: must be from 0 to 5/],
      [{ prompt: "x", logprobs: true }, /^logprobs: must be a whole number/],
      [{ prompt: "x", post_sampling_probs: true, n_probs: 2 }, /^post_sampling_probs: /],
    ];
    for (const [body, message] of cases) {
      const r = await post("/v1/completions", body);
      expect(r.status, JSON.stringify(body)).toBe(400);
      const j = (await r.json()) as { error: { message: string; param: string } };
      expect(j.error.message, JSON.stringify(body)).toMatch(message);
    }
    const chat = (extra: object) => post("/v1/chat/completions", { messages: CHAT, ...extra });
    for (const [extra, message] of [
      [{ logprobs: 1 }, /^logprobs: must be true or false/],
      [{ logprobs: true, top_logprobs: 21 }, /^top_logprobs: must be from 0 to 20/],
      [{ top_logprobs: 3 }, /^top_logprobs: needs logprobs: true/],
      [{ logit_bias: { x: 1 } }, /^logit_bias: key "x"/],
    ] as [object, RegExp][]) {
      const r = await chat(extra);
      expect(r.status, JSON.stringify(extra)).toBe(400);
      expect(((await r.json()) as { error: { message: string } }).error.message).toMatch(message);
    }
    // The client sees an APIError; the server stays up.
    await expect(s.client.completions.create({ prompt: "x", logit_bias: { nope: 1 } })).rejects.toBeInstanceOf(APIError);
    // llama-server's n_probs reads as logprobs on /v1.
    const n = await post("/v1/completions", { prompt: STORY, max_tokens: 2, n_probs: 2, ...greedy });
    const legacy = ((await n.json()) as { choices: { logprobs: Legacy }[] }).choices[0].logprobs;
    expect(legacy.top_logprobs.map((t) => Object.keys(t).length)).toEqual([2, 2]);
  });
});
