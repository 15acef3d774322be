// `prima-coord serve --parallel N` (issue #32): up to N requests decode together on one device or a
// ring, each in a sequence slot of its own KV cache, one pass over the weights per step for all of them. Greedy
// answers of concurrent requests equal each one run alone (`prima-coord run`), a client that leaves
// leaves the others' answers unchanged, and past the slots and the queue requests get 503. That the
// requests really shared steps is read from the server's counters, never from timing.
import { availableParallelism } from "node:os";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { APIError } from "openai";
import { killAll, type Proc } from "../ring/cluster.js";
import { MODEL, joinWorker, runOnce, startServe, until, type Served } from "./serve-harness.js";

const greedy = { temperature: 0 } as const;
const PROMPTS = ["Once upon a time", "The little dog", "Tim and Sue went to", "One day, a bird"];
const N = 120;

afterAll(() => killAll());

/** A counter or gauge of /metrics. */
async function metric(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = new RegExp(`^${name} (\\S+)$`, "m").exec(text);
  if (!m) throw new Error(`/metrics has no ${name}`);
  return Number(m[1]);
}

describe("serve --parallel 4", () => {
  let s: Served;
  let refs: Map<string, string>;
  beforeAll(async () => {
    s = await startServe(["--ctx", "512", "--parallel", "4", "--queue", "2"]);
    refs = new Map(PROMPTS.map((p) => [p, runOnce(["-p", p, "-n", String(N), "--temp", "0", "--ctx", "512"]).text]));
  }, 60_000);
  afterAll(() => s.proc.child.kill("SIGKILL"));

  const streamText = async (prompt: string, leaveAfter = Infinity): Promise<string> => {
    const stream = await s.client.completions.create({ prompt, max_tokens: N, stream: true, ...greedy });
    let text = "", chunks = 0;
    for await (const c of stream) {
      text += c.choices[0]?.text ?? "";
      if (++chunks >= leaveAfter) break; // leaving the loop aborts the request
    }
    return text;
  };

  it("starts with 4 slots of the whole context each, and says so", async () => {
    expect(s.proc.stderr).toMatch(/--parallel 4: 4 sequence slots of 512 tokens each \(2048 tokens of KV cache/);
    // llama-server's /slots and /props
    const slots = (await (await fetch(`${s.url}/slots`)).json()) as { id: number; is_processing: boolean; n_ctx: number }[];
    expect(slots.map((x) => [x.id, x.is_processing, x.n_ctx])).toEqual([0, 1, 2, 3].map((i) => [i, false, 512]));
    expect(((await (await fetch(`${s.url}/props`)).json()) as { total_slots: number }).total_slots).toBe(4);
    const st = (await (await fetch(`${s.url}/api/state`)).json()) as { requests: { slots: unknown[] } };
    expect(st.requests.slots).toHaveLength(4);
  });

  it("4 concurrent greedy requests give exactly the texts each gives alone, in shared steps", async () => {
    const rowsBefore = await metric(s.url, "prima_batch_rows_total"), stepsBefore = await metric(s.url, "prima_batch_steps_total");
    const texts = await Promise.all(PROMPTS.map((p) => streamText(p)));
    texts.forEach((t, i) => expect(t, PROMPTS[i]).toBe(refs.get(PROMPTS[i])));
    // more rows than passes: some pass decoded several sequences at once
    const rows = (await metric(s.url, "prima_batch_rows_total")) - rowsBefore, steps = (await metric(s.url, "prima_batch_steps_total")) - stepsBefore;
    expect(rows, `${rows} rows in ${steps} steps`).toBeGreaterThan(steps);
    expect(await metric(s.url, "prima_batch_rows_max")).toBeGreaterThan(1);
    // and each again alone, from the slots' caches (the prompt is a prefix of what a slot holds)
    for (const p of PROMPTS) {
      const r = await s.client.completions.create({ prompt: p, max_tokens: N, ...greedy });
      expect(r.choices[0].text, p).toBe(refs.get(p));
      expect(r.usage?.prompt_tokens_details?.cached_tokens, p).toBeGreaterThan(0);
    }
  }, 60_000);

  it("a client that leaves mid-stream leaves the others' answers unchanged", async () => {
    const cancelledBefore = await metric(s.url, 'prima_requests_total{outcome="cancelled"}');
    const [a, left, c] = await Promise.all([streamText(PROMPTS[0]), streamText(PROMPTS[1], 3), streamText(PROMPTS[2])]);
    expect(a).toBe(refs.get(PROMPTS[0]));
    expect(c).toBe(refs.get(PROMPTS[2]));
    expect(refs.get(PROMPTS[1])!.startsWith(left)).toBe(true);
    await expect.poll(() => metric(s.url, 'prima_requests_total{outcome="cancelled"}')).toBe(cancelledBefore + 1);
    await expect.poll(() => metric(s.url, 'prima_slots{state="processing"}')).toBe(0);
  }, 60_000);

  it("past the 4 slots and the queue of 2, requests get 503; the others are right", async () => {
    const results = await Promise.allSettled(Array.from({ length: 24 }, async (_, i) => {
      const p = PROMPTS[i % PROMPTS.length];
      const r = await s.client.completions.create({ prompt: p, max_tokens: N, ...greedy });
      return { p, text: r.choices[0].text };
    }));
    let ok = 0, busy = 0;
    for (const r of results) {
      if (r.status === "fulfilled") {
        ok++;
        expect(r.value.text, r.value.p).toBe(refs.get(r.value.p));
      } else {
        const e = r.reason as APIError;
        expect(e.status, String(e)).toBe(503);
        expect(e.headers?.get("retry-after")).toBeTruthy();
        busy++;
      }
    }
    expect(busy, "the slots and the queue overflowed").toBeGreaterThan(0);
    expect(ok).toBeGreaterThanOrEqual(6); // the 4 slots plus the queue
    expect((await fetch(`${s.url}/health`)).status).toBe(200);
  }, 60_000);
});

describe("serve --parallel 3 on a two-worker ring", () => {
  type St = {
    devices: { name: string; state: string; detail: string | null }[]; plan: { ringOrder: string[] } | null; requests: { slots: unknown[] };
    model: { kvCache: { sequenceSlots?: number } };
  };
  const prompts = PROMPTS.slice(0, 3);
  let s: Served;
  let workers: Proc[];
  beforeAll(async () => {
    s = await startServe(["--ctx", "512", "--parallel", "3", "--min-workers", "2", "--layer-windows", "2,2,1"], { waitReady: false });
    workers = [joinWorker(s.clusterPort, "w1"), joinWorker(s.clusterPort, "w2")];
    // the layers placed on the ring (the head alone serves until the workers joined)
    await until<St>(`${s.url}/api/state`, (_, b) => b.plan?.ringOrder.length === 3, 60_000);
  }, 90_000);
  afterAll(() => {
    for (const w of workers) w.child.kill("SIGKILL");
    s.proc.child.kill("SIGKILL");
  });

  it("3 concurrent greedy requests give exactly the texts each gives alone on one device, their passes round the ring at once", async () => {
    const n = 40;
    const refs = prompts.map((p) => runOnce(["-p", p, "-n", String(n), "--temp", "0", "--ctx", "512"]).text);
    const outs = await Promise.all(prompts.map((prompt) => s.client.completions.create({ prompt, max_tokens: n, ...greedy })));
    outs.forEach((o, i) => expect(o.choices[0].text, prompts[i]).toBe(refs[i]));
    // a group of sequences per device that can compute at once, each on a different device at once:
    // the ring kept full (three devices of one thread here, on this machine's CPUs)
    const groups = Math.min(3, availableParallelism());
    expect(await metric(s.url, "prima_batch_passes_in_flight_max")).toBe(groups);
    const st = (await (await fetch(`${s.url}/api/state`)).json()) as St;
    expect(st.plan?.ringOrder).toHaveLength(3);
    expect(st.requests.slots).toHaveLength(3);
    expect(st.model.kvCache.sequenceSlots).toBe(3); // the dashboard counts KV for the 3 slots
    expect(s.proc.stderr).toContain(`--parallel 3: 3 sequence slots of 512 tokens each on every device of the ring, in ${groups} group${groups === 1 ? "" : "s"} whose steps go round at once`);
    if (groups < 3) expect(s.proc.stderr).toMatch(new RegExp(`${groups} of the ring's devices compute at once: w\\d .*, w\\d .*, head share one machine's ${availableParallelism()} CPUs`));
    // the workers ran the slots' rows on their native lanes (lane.c), not in JS
    for (const w of workers) expect(w.stderr).toMatch(/ring frames run on the native lane/);
  }, 60_000);

  it("a worker killed while 3 requests stream: every sequence is replayed on the devices left and each text is the uninterrupted one", async () => {
    const n = N;
    const refs = prompts.map((p) => runOnce(["-p", p, "-n", String(n), "--temp", "0", "--ctx", "512"]).text);
    const stream = async (prompt: string, fault?: () => void) => {
      const st = await s.client.completions.create({ prompt, max_tokens: n, stream: true, ...greedy });
      let text = "", chunks = 0;
      for await (const c of st) {
        text += c.choices[0]?.text ?? "";
        if (++chunks === 10) fault?.();
      }
      return text;
    };
    const replansBefore = await metric(s.url, "prima_replans_total");
    const texts = await Promise.all(prompts.map((p, i) => stream(p, i === 0 ? () => workers[1].child.kill("SIGKILL") : undefined)));
    texts.forEach((t, i) => expect(t, `${prompts[i]}\n${s.proc.stderr.slice(-3000)}`).toBe(refs[i]));
    await s.proc.waitFor(/device w\d "w2" .*lost/, 10_000);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/prima_devices_lost_total 1\n/);
    expect(metrics).toMatch(/prima_recovery_seconds_count [1-9]\d*\n/); // each pass that went on after the loss
    // the layers were placed again while the streams ran (they went on, replayed, on the new ring)
    expect(await metric(s.url, "prima_replans_total")).toBeGreaterThan(replansBefore);
    const st = (await (await fetch(`${s.url}/api/state`)).json()) as St;
    expect(st.plan?.ringOrder).toHaveLength(2);
  }, 90_000);
});

describe("serve --parallel auto", () => {
  it("sizes the slots from memory, says why, and /props and /slots show them; a ring's flags keep one", async () => {
    const s = await startServe(["--ctx", "256", "--parallel", "auto"]);
    try {
      const m = /--parallel (\d+) \(auto: [^)]*\): [\d.]+ MiB of memory beside the model's [\d.]+ MiB of weights holds \d+ sequence slots? of 256 tokens/.exec(s.proc.stderr);
      expect(m, s.proc.stderr).not.toBeNull();
      const n = Number(m![1]);
      expect(n).toBeGreaterThanOrEqual(1);
      expect(n).toBeLessThanOrEqual(4);
      expect(((await (await fetch(`${s.url}/props`)).json()) as { total_slots: number }).total_slots).toBe(n);
      const slots = (await (await fetch(`${s.url}/slots`)).json()) as { id: number; n_ctx: number }[];
      expect(slots.map((x) => x.id)).toEqual(Array.from({ length: n }, (_, i) => i));
      expect(slots.every((x) => x.n_ctx === 256)).toBe(true);
    } finally {
      s.proc.child.kill("SIGKILL");
    }
    const ring = await startServe(["--ctx", "256", "--parallel", "auto", "--keep-all"]);
    try {
      expect(ring.proc.stderr).not.toMatch(/--parallel \d+ \(auto/);
      expect(((await (await fetch(`${ring.url}/props`)).json()) as { total_slots: number }).total_slots).toBe(1);
    } finally {
      ring.proc.child.kill("SIGKILL");
    }
  }, 60_000);
});
