// `prima-coord chat` (and `run -i`): a conversation typed into the terminal, each turn through the
// cluster's prompt cache. Driven here through its standard input, as a pipe.
import { spawn } from "node:child_process";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { readFileSync } from "node:fs";
import { Tokenizer, renderChat } from "../../model/index.js";
import { generateModel } from "../../modelgen/index.js";
import { LLAMA_CPP_SOURCE } from "../global-setup.js";
import { root } from "../helpers/process.js";
import { tempDir } from "../helpers/temp.js";
import { MODEL, runOnce } from "./serve-harness.js";

function chat(args: string[], input: string): Promise<{ code: number | null; out: string; err: string }> {
  const child = spawn(process.execPath, [`${root}dist/coordinator/cli.js`, ...args], { cwd: root, stdio: ["pipe", "pipe", "pipe"] });
  let out = "", err = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (err += d.toString()));
  child.stdin.end(input);
  const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
  return new Promise((resolve) => child.on("exit", (code) => {
    clearTimeout(timer);
    resolve({ code, out, err });
  }));
}

const dir = tempDir("prima-chat-");
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Each turn's log line: tokens generated, prompt tokens cached and in all. */
function turnsOf(err: string): { generated: number; cached: number; prompt: number }[] {
  return [...err.matchAll(/(\d+) tokens, .* \((\d+) of (\d+) prompt tokens cached\)/g)].map((m) => ({ generated: Number(m[1]), cached: Number(m[2]), prompt: Number(m[3]) }));
}

describe("prima-coord chat", () => {
  it("answers each line as run --chat would, and the second turn reuses the first one's cache", async () => {
    const r = await chat(["chat", MODEL, "--temp", "0", "-n", "24", "--threads", "1"], "Tell me about a dog.\nAnd a cat?\n");
    expect(r.code, r.err).toBe(0);
    const first = runOnce(["--chat", "--chat-template", "chatml", "-p", "Tell me about a dog.", "-n", "24", "--temp", "0"]);
    // Each reply ends with a newline (a reply may hold newlines of its own).
    expect(r.out.startsWith(`${first.text}\n`)).toBe(true);
    expect(r.out.length).toBeGreaterThan(first.text.length + 2);
    const turns = turnsOf(r.err);
    expect(turns, r.err).toHaveLength(2);
    expect(turns[0].cached).toBe(0);
    // The second turn reuses every token of the first exchange that went through the layers: the prompt
    // and the reply as generated (its last token too, unless the reply was cut by -n: that one was
    // sampled but never run).
    const ranThrough = turns[0].prompt + turns[0].generated - (turns[0].generated === 24 ? 1 : 0);
    expect(turns[1].cached, r.err).toBe(ranThrough);
  });

  it("keeps a reply's tokens as generated, even where its text would tokenize otherwise", async () => {
    // A random-weight model writes tokens in splits its tokenizer would never make ("a"+"t" for "at"):
    // tokenizing the conversation afresh loses the cache from the first reply on.
    const model = join(dir, "tiny-llama-Q8_0.gguf");
    await generateModel({ shape: "tiny-llama", type: "Q8_0", out: model, seed: 3 });
    const r = await chat(["chat", model, "--chat-template", "chatml", "--temp", "0", "-n", "24", "--threads", "1"], "Tell me about a dog.\nAnd a cat?\nAnd a bird?\n");
    expect(r.code, r.err).toBe(0);
    const turns = turnsOf(r.err);
    expect(turns, r.err).toHaveLength(3);
    for (let t = 1; t < 3; t++) {
      const prev = turns[t - 1];
      expect(turns[t].cached, r.err).toBe(prev.prompt + prev.generated - (prev.generated === 24 ? 1 : 0));
    }
  });

  it("/reset starts a new conversation, /exit leaves; run -i is the same chat", async () => {
    const r = await chat(["run", MODEL, "-i", "--temp", "0", "-n", "8", "--threads", "1"], "Hello there.\n/reset\nHello there.\n/exit\nnever read\n");
    expect(r.code, r.err).toBe(0);
    const replies = r.out.split("(a new conversation)\n");
    expect(replies).toHaveLength(2);
    expect(replies[0].length).toBeGreaterThan(1);
    expect(replies[0]).toBe(replies[1]);
  });

  it("gpt-oss: the harmony template its file carries renders each turn (llama.cpp's copy of the template)", async () => {
    const model = join(dir, "tiny-gpt-oss-MXFP4_MOE.gguf");
    const template = readFileSync(join(LLAMA_CPP_SOURCE, "models", "templates", "openai-gpt-oss-120b.jinja"), "utf8");
    await generateModel({ shape: "tiny-gpt-oss", type: "MXFP4_MOE", out: model, seed: 3, chatTemplate: template });
    const r = await chat(["chat", model, "--system", "Be brief.", "--temp", "0", "-n", "8", "--threads", "1"], "Tell me about a dog.\nAnd a cat?\n");
    expect(r.code, r.err).toBe(0);
    expect(r.err).not.toMatch(/no chat template|error/i);
    const turns = turnsOf(r.err);
    expect(turns, r.err).toHaveLength(2);
    // the first turn's prompt is the harmony rendering of the system and user messages, token for token
    const text = renderChat(model, [{ role: "system", content: "Be brief." }, { role: "user", content: "Tell me about a dog." }]);
    expect(text).toContain("<|start|>developer<|message|># Instructions\n\nBe brief.");
    expect(text.endsWith("<|start|>user<|message|>Tell me about a dog.<|end|><|start|>assistant")).toBe(true);
    expect(turns[0].prompt).toBe(Tokenizer.fromGguf(model).encode(text, { addSpecial: true, parseSpecial: true }).length);
    expect(turns[1].prompt).toBeGreaterThan(turns[0].prompt + turns[0].generated);
  });

  it("a model's reasoning goes to stderr, its answer to stdout (QwQ's template opens <think>: the shipped model only reasons)", async () => {
    const qwq = join(LLAMA_CPP_SOURCE, "models", "templates", "Qwen-QwQ-32B.jinja");
    const r = await chat(["chat", MODEL, "--chat-template", qwq, "--temp", "0", "-n", "16", "--threads", "1"], "Tell me about a dog.\nAnd a cat?\n");
    expect(r.code, r.err).toBe(0);
    expect(turnsOf(r.err), r.err).toHaveLength(2);
    const first = runOnce(["--chat", "--chat-template", qwq, "-p", "Tell me about a dog.", "-n", "16", "--temp", "0"]);
    const thought = first.text.trim();
    expect(thought.length).toBeGreaterThan(0);
    expect(r.err).toContain(thought);
    expect(r.out).toBe("\n\n"); // two turns, no answer outside the block
  });

  it("goes on past the context: a turn that overflows it shifts, and the next continues the shifted cache", async () => {
    const r = await chat(["chat", MODEL, "--temp", "0", "-n", "80", "--ctx", "64", "--threads", "1"], "Tell me about a dog.\nAnd a cat?\n");
    expect(r.code, r.err).toBe(0);
    const turns = turnsOf(r.err);
    expect(turns, r.err).toHaveLength(2);
    expect(turns[0].generated).toBe(80); // more than the context holds
    expect(r.err).toMatch(/context full: shifted the KV cache/);
    // the whole conversation (longer than the context) continues the cache as it was left
    expect(turns[1].prompt, r.err).toBeGreaterThan(64);
    expect(turns[1].cached, r.err).toBe(turns[0].prompt + 79);
    expect(turns[1].generated).toBeGreaterThan(0);
  });
});
