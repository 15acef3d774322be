// `prima-coord chat` (and `run -i`): a conversation typed into the terminal, each turn through the
// cluster's prompt cache. Driven here through its standard input, as a pipe.
import { spawn } from "node:child_process";
import { describe, expect, it } from "vitest";
import { root } from "../helpers/process.js";
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

describe("prima-coord chat", () => {
  it("answers each line as run --chat would, and the second turn reuses the first one's cache", async () => {
    const r = await chat(["chat", MODEL, "--temp", "0", "-n", "24", "--threads", "1"], "Tell me about a dog.\nAnd a cat?\n");
    expect(r.code, r.err).toBe(0);
    const first = runOnce(["--chat", "--chat-template", "chatml", "-p", "Tell me about a dog.", "-n", "24", "--temp", "0"]);
    // Each reply ends with a newline (a reply may hold newlines of its own).
    expect(r.out.startsWith(`${first.text}\n`)).toBe(true);
    expect(r.out.length).toBeGreaterThan(first.text.length + 2);
    const cached = [...r.err.matchAll(/\((\d+) of (\d+) prompt tokens cached\)/g)].map((m) => [Number(m[1]), Number(m[2])]);
    expect(cached).toHaveLength(2);
    expect(cached[0][0]).toBe(0);
    // The second turn's prompt starts with the whole first exchange.
    expect(cached[1][0]).toBeGreaterThan(cached[0][1]);
  });

  it("/reset starts a new conversation, /exit leaves; run -i is the same chat", async () => {
    const r = await chat(["run", MODEL, "-i", "--temp", "0", "-n", "8", "--threads", "1"], "Hello there.\n/reset\nHello there.\n/exit\nnever read\n");
    expect(r.code, r.err).toBe(0);
    const replies = r.out.split("(a new conversation)\n");
    expect(replies).toHaveLength(2);
    expect(replies[0].length).toBeGreaterThan(1);
    expect(replies[0]).toBe(replies[1]);
  });
});
