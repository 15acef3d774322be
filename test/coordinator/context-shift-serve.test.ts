// serve past the context (issue #33): a request whose max_tokens exceeds what its prompt leaves of the
// context goes on by context shift to max_tokens, finish_reason "length" only there, the same tokens as
// `run`; Ollama's options.num_keep and llama-server's n_keep choose what stays; --parallel slots shift
// too, on one device and on a ring; --no-context-shift stops at the full context as llama-server's default does.
import { afterEach, describe, expect, it } from "vitest";
import { Ollama } from "ollama";
import { killAll } from "../ring/cluster.js";
import { joinWorker, runOnce, startServe, until, type Served } from "./serve-harness.js";

afterEach(killAll);


const CTX = 64;
const PROMPT = "Once upon a time";

async function completion(s: Served, body: Record<string, unknown>) {
  return s.client.completions.create({ model: "m", prompt: PROMPT, temperature: 0, ...body } as never) as unknown as Promise<{
    choices: { text: string; finish_reason: string }[]; usage: { completion_tokens: number };
  }>;
}

describe("serve past the context", () => {
  it("shifts by default: max_tokens 4x the context, the tokens of run, finish_reason length; n_keep and num_keep", async () => {
    const s = await startServe(["--ctx", String(CTX)]);
    const r = await completion(s, { max_tokens: 4 * CTX });
    expect(r.usage.completion_tokens).toBe(4 * CTX);
    expect(r.choices[0].finish_reason).toBe("length");
    const ref = runOnce(["-p", PROMPT, "-n", String(4 * CTX), "--ctx", String(CTX), "--temp", "0"]);
    expect(r.choices[0].text).toBe(ref.text);
    expect(s.proc.stderr).toMatch(/context full: shifted the KV cache on every device \(kept 1,/);
    // llama.cpp's n_keep on the OpenAI path (and llama-server's /completion): BOS and 4 more stay
    const keep4 = runOnce(["-p", PROMPT, "-n", String(3 * CTX), "--ctx", String(CTX), "--temp", "0", "--keep", "4"]);
    const k = await completion(s, { max_tokens: 3 * CTX, n_keep: 4 });
    expect(k.choices[0].text).toBe(keep4.text);
    const llama = await (await fetch(`${s.url}/completion`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: PROMPT, n_predict: 3 * CTX, n_keep: 4, temperature: 0 }) })).json() as { content: string };
    expect(llama.content).toBe(keep4.text);
    // Ollama's num_keep
    const ollama = new Ollama({ host: s.url });
    const o = await ollama.generate({ model: "m", prompt: PROMPT, raw: true, stream: false, options: { num_predict: 3 * CTX, num_keep: 4, temperature: 0 } });
    expect(o.response).toBe(keep4.text);
    expect(o.done_reason).toBe("length");
    // no max_tokens: what the context holds, as before
    const d = await completion(s, {});
    expect(d.usage.completion_tokens).toBeLessThan(CTX);
  }, 180_000);

  it("--parallel 2: each slot shifts its own cache", async () => {
    const s = await startServe(["--ctx", String(CTX), "--parallel", "2"]);
    const ref = runOnce(["-p", PROMPT, "-n", String(3 * CTX), "--ctx", String(CTX), "--temp", "0"]);
    const [a, b] = await Promise.all([completion(s, { max_tokens: 3 * CTX }), completion(s, { max_tokens: 3 * CTX })]);
    for (const r of [a, b]) {
      expect(r.usage.completion_tokens).toBe(3 * CTX);
      expect(r.choices[0].text).toBe(ref.text);
    }
  }, 180_000);

  it("--parallel 2 on a two-device ring: each slot's shift goes round (the worker's native lane shifts that slot), the tokens of run", async () => {
    const s = await startServe(["--ctx", String(CTX), "--parallel", "2", "--min-workers", "1", "--layer-windows", "2,3"], { waitReady: false });
    const w = joinWorker(s.clusterPort, "w1");
    await until(`${s.url}/health`, (st) => st === 200, 60_000);
    const ref = runOnce(["-p", PROMPT, "-n", String(3 * CTX), "--ctx", String(CTX), "--temp", "0"]);
    const [a, b] = await Promise.all([completion(s, { max_tokens: 3 * CTX }), completion(s, { max_tokens: 3 * CTX })]);
    // 3x the context in each slot: only by shifting that slot's cache on both devices, more than once
    for (const r of [a, b]) {
      expect(r.usage.completion_tokens).toBe(3 * CTX);
      expect(r.choices[0].text).toBe(ref.text);
    }
    expect(s.proc.stderr).toMatch(/plan: 1 cycle of \[2, 3\] layers/);
    expect(w.stderr).toMatch(/ring frames run on the native lane/);
  }, 180_000);

  it("--kv-evict h2o: past the context serve evicts by H2O, the tokens of run --kv-evict h2o, not those of a plain shift", async () => {
    const s = await startServe(["--ctx", String(CTX), "--kv-evict", "h2o", "--kv-budget", "0.25"]);
    const h2o = ["-p", PROMPT, "-n", String(3 * CTX), "--ctx", String(CTX), "--temp", "0"];
    const ref = runOnce([...h2o, "--kv-evict", "h2o", "--kv-budget", "0.25"]);
    const r = await completion(s, { max_tokens: 3 * CTX });
    expect(r.usage.completion_tokens).toBe(3 * CTX);
    expect(r.choices[0].text).toBe(ref.text);
    expect(r.choices[0].text).not.toBe(runOnce(h2o).text); // the check tells H2O from a plain shift
    // a worker that joins is placed (on a ring each device adds its statistics: H2O_SCORES frames, or
    // Halda keeps the tiny model on this device); the next request gives the same tokens
    joinWorker(s.clusterPort, "w1");
    await until<{ devices: { name: string; state: string; detail?: string | null }[] }>(`${s.url}/api/state`,
      (_, b) => b.devices.some((d) => d.name === "w1" && (d.state === "left-out" || d.state === "ready")), 60_000);
    const again = await completion(s, { max_tokens: 3 * CTX });
    expect(again.choices[0].text).toBe(ref.text);
  }, 180_000);

  it("--kv-evict h2o on a two-device ring (windows by hand): the tokens of one device", async () => {
    const s = await startServe(["--ctx", String(CTX), "--kv-evict", "h2o", "--kv-budget", "0.25", "--min-workers", "1", "--layer-windows", "2,3"], { waitReady: false });
    joinWorker(s.clusterPort, "w1");
    await until(`${s.url}/health`, (st) => st === 200, 60_000);
    const ref = runOnce(["-p", PROMPT, "-n", String(3 * CTX), "--ctx", String(CTX), "--temp", "0", "--kv-evict", "h2o", "--kv-budget", "0.25"]);
    const r = await completion(s, { max_tokens: 3 * CTX });
    expect(r.usage.completion_tokens).toBe(3 * CTX);
    expect(r.choices[0].text).toBe(ref.text);
    expect(s.proc.stderr).toMatch(/plan: 1 cycle of \[2, 3\] layers/);
    expect(s.proc.stderr).toMatch(/context full: evicted by H2O on every device/);
  }, 180_000);

  it("--no-context-shift: stops at the full context, as llama-server's default", async () => {
    const s = await startServe(["--ctx", String(CTX), "--no-context-shift"]);
    const r = await completion(s, { max_tokens: 4 * CTX });
    expect(r.usage.completion_tokens).toBeLessThan(CTX);
    expect(r.choices[0].finish_reason).toBe("length");
  }, 60_000);
});
