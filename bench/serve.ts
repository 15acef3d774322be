// The service's costs, against `prima-coord run` in the same run:
//  1. API overhead per generated token: a streamed /v1/completions request's decode time per token
//     (first token to last, at the client) over `run`'s decode time per token, same model, prompt and
//     threads, in alternating rounds;
//  2. a chat's second turn: time to first token with the first turn's KV cache reused, against the
//     same request cold (after an unrelated request took the cache);
//  3. serve --parallel 8: aggregate generated tokens/s of 1, 2, 4 and 8 clients streaming at once,
//     each client's time per token and the mean sequences per decode pass (/metrics), on one device
//     and on a three-device loopback ring; and what bounds the one-device figure, the cost of one
//     pass of 1, 2, 4 and 8 sequences.
//   node dist/bench/serve.js [model.gguf] [rounds]
import { LocalModel, SeqSlots } from "../engine/index.js";
import { ensureLlamaBench, llamaBatchCost } from "./llama-bench.js";
import { coordCli, median, type Proc, readSse, runAlone, start, stop, waitFor, workerCli } from "./procs.js";

const PROMPT = "Once upon a time";
const TOKENS = 64;
const THREADS = "2";

/** The server's decode counters (/metrics). */
async function decodeCounters(url: string): Promise<{ seconds: number; steps: number }> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const num = (name: string) => Number(new RegExp(`^${name} ([\\d.e+-]+)$`, "m").exec(text)?.[1] ?? NaN);
  return { seconds: num("prima_decode_seconds_total"), steps: num("prima_decode_steps_total") };
}

async function runDecodeMsPerToken(model: string): Promise<number> {
  const p = start(coordCli, ["run", model, "--json", "-p", PROMPT, "-n", String(TOKENS), "--temp", "0", "--ctx", "512", "--threads", THREADS]);
  await p.exited;
  const r = JSON.parse(p.out.split("\n").find((l) => l.startsWith("{"))!) as { decode_tok_s: number };
  return 1000 / r.decode_tok_s;
}

/** One streamed request: decode ms per token at the client, and the time to its first token. */
async function streamed(url: string, body: object): Promise<{ msPerToken: number; ttftMs: number; text: string }> {
  const t0 = performance.now();
  const r = await fetch(`${url}/v1/${"messages" in body ? "chat/completions" : "completions"}`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ ...body, stream: true }),
  });
  let text = "", first = 0, last = 0, n = 0;
  await readSse(r, (c) => {
    const choice = (c.choices as { text?: string; delta?: { content?: string } }[] | undefined)?.[0];
    const piece = choice?.text ?? choice?.delta?.content ?? "";
    if (!piece) return;
    const now = performance.now();
    if (n === 0) first = now;
    last = now;
    n++;
    text += piece;
  });
  return { msPerToken: n > 1 ? (last - first) / (n - 1) : NaN, ttftMs: first - t0, text };
}

export async function main(model: string, rounds = 5): Promise<void> {
  const serve = start(coordCli, ["serve", model, "--no-discovery", "--port", "0", "--cluster-port", "0", "--ctx", "512", "--threads", THREADS, "--parallel", "1"]);
  try {
    const url = `http://127.0.0.1:${(await waitFor(serve, /listening on http:\/\/127\.0\.0\.1:(\d+)/))[1]}`;
    await waitFor(serve, /ready: /, 120_000);
    // Warm both up: the weights in the page cache, the server's first request.
    await runDecodeMsPerToken(model);
    await streamed(url, { prompt: PROMPT, max_tokens: 8, temperature: 0 });
    const api: number[] = [], cli: number[] = [], apiServer: number[] = [];
    for (let r = 0; r < rounds; r++) {
      const order = r % 2 === 0 ? ["api", "cli"] : ["cli", "api"];
      for (const which of order) {
        if (which === "cli") cli.push(await runDecodeMsPerToken(model));
        else {
          const before = await decodeCounters(url);
          api.push((await streamed(url, { prompt: PROMPT, max_tokens: TOKENS, temperature: 0 })).msPerToken);
          const after = await decodeCounters(url);
          apiServer.push((after.seconds - before.seconds) * 1000 / (after.steps - before.steps));
        }
      }
    }
    const ratio = median(api) / median(cli);
    console.log(`\n## serve: API overhead per generated token (${rounds} alternating rounds, ${TOKENS} tokens, ${THREADS} threads)\n`);
    console.log("| prima-coord run ms/token (median) | streamed /v1/completions ms/token at the client (median) | the same at the server | ratio, client (goal <= 1.02) | ratio, server |");
    console.log("|---|---|---|---|---|");
    console.log(`| ${median(cli).toFixed(2)} | ${median(api).toFixed(2)} | ${median(apiServer).toFixed(2)} | ${ratio.toFixed(3)} | ${(median(apiServer) / median(cli)).toFixed(3)} |`);

    // A chat's second turn, warm (the first turn's cache reused) and cold (the cache taken by another request).
    const system = "You are a storyteller who tells long stories about animals in a forest, with many details about each animal.";
    const first = [{ role: "system", content: system }, { role: "user", content: "Tell me a story about a fox and a rabbit who become friends." }];
    const warm: number[] = [], cold: number[] = [];
    let same = 0;
    for (let r = 0; r < rounds; r++) {
      const a1 = await streamed(url, { messages: first, max_tokens: 48, temperature: 0 });
      const second = [...first, { role: "assistant", content: a1.text }, { role: "user", content: "What happened next?" }];
      const w = await streamed(url, { messages: second, max_tokens: 4, temperature: 0 });
      await streamed(url, { prompt: "Unrelated", max_tokens: 2, temperature: 0 });
      const c = await streamed(url, { messages: second, max_tokens: 4, temperature: 0 });
      if (w.text === c.text) same++;
      warm.push(w.ttftMs);
      cold.push(c.ttftMs);
    }
    console.log(`\n## serve: a chat's second turn, time to first token (${rounds} rounds)\n`);
    console.log("| cold ms (median) | cached ms (median) | cached / cold | rounds where cached and cold answered alike |");
    console.log("|---|---|---|---|");
    console.log(`| ${median(cold).toFixed(1)} | ${median(warm).toFixed(1)} | ${(median(warm) / median(cold)).toFixed(3)} | ${same} of ${rounds} |`);
  } finally {
    await stop(serve);
  }
  await passCost(model);
  await parallelClients(model, rounds);
}

/** Aggregate decode of 1, 2, 4 and 8 clients streaming at once into `serve --parallel 8`, each
 *  sending `rounds` requests back to back: on one device, and on a three-device loopback ring
 *  (serve and two workers, one thread each, since three processes share two cores). */
export async function parallelClients(model: string, rounds = 3): Promise<void> {
  const clientCounts = [1, 2, 4, 8];
  const setups = [
    { name: "one device", threads: THREADS, workers: 0, windows: "" },
    // the layers in even thirds (Halda, seeing three processes share two cores, gives the head nearly all)
    { name: "three-device loopback ring", threads: "1", workers: 2, windows: "w0=7,w1=7,head=8" },
  ];
  for (const setup of setups) {
    const serve = start(coordCli, ["serve", model, "--no-discovery", "--port", "0", "--cluster-port", "0", "--ctx", "512", "--threads", setup.threads,
      "--parallel", String(Math.max(...clientCounts)), ...(setup.windows ? ["--min-workers", String(setup.workers), "--layer-windows", setup.windows] : [])]);
    const procs: Proc[] = [serve];
    try {
      const url = `http://127.0.0.1:${(await waitFor(serve, /listening on http:\/\/127\.0\.0\.1:(\d+)/))[1]}`;
      if (setup.workers) {
        const clusterPort = (await waitFor(serve, /listening for workers on port (\d+)/, 120_000))[1];
        const tokenFile = (await waitFor(serve, /--token-file (\S+)/))[1];
        for (let w = 0; w < setup.workers; w++) {
          procs.push(start(workerCli, ["--join", `127.0.0.1:${clusterPort}`, "--model", model, "--name", `w${w}`, "--threads", setup.threads, "--token-file", tokenFile]));
        }
      }
      await waitFor(serve, /ready: /, 180_000);
      // serve says ready before its workers join; a ring answers once /health does
      for (let t = 0; (await fetch(`${url}/health`).catch(() => undefined))?.status !== 200; t += 250) {
        if (t > 180_000) throw new Error(`the ${setup.name} did not form within 180 s`);
        await new Promise((r) => setTimeout(r, 250));
      }
      await streamed(url, { prompt: PROMPT, max_tokens: 8, temperature: 0 });
      const prompts = [PROMPT, "The little dog", "One day, a bird", "Tim and Sue went to"];
      console.log(`\n## serve --parallel ${Math.max(...clientCounts)}, ${setup.name}: concurrent clients (${rounds} requests of ${TOKENS} tokens each per client, ${setup.threads} thread${setup.threads === "1" ? "" : "s"} a device)\n`);
      console.log("| clients | tokens | seconds | aggregate tokens/s | x one client's (goal at 4: >= " + (setup.workers ? "2" : "2.5") + ") | a client's ms/token (median) | x one client's (goal <= 1.5) | sequences per pass (mean) |");
      console.log("|---|---|---|---|---|---|---|---|");
      let alone: { rate: number; ms: number } | undefined;
      for (const clients of clientCounts) {
        const before = await batchCounters(url);
        const perToken: number[] = [];
        const t0 = performance.now();
        await Promise.all(Array.from({ length: clients }, async (_, c) => {
          for (let r = 0; r < rounds; r++) perToken.push((await streamed(url, { prompt: prompts[c % prompts.length], max_tokens: TOKENS, temperature: 0 })).msPerToken);
        }));
        const s = (performance.now() - t0) / 1000;
        const after = await batchCounters(url);
        const tokens = after.tokens - before.tokens;
        const rate = tokens / s, ms = median(perToken);
        alone ??= { rate, ms };
        console.log(`| ${clients} | ${tokens} | ${s.toFixed(2)} | ${rate.toFixed(1)} | ${(rate / alone.rate).toFixed(2)} | ${ms.toFixed(1)} | ${(ms / alone.ms).toFixed(2)} | ${((after.rows - before.rows) / (after.steps - before.steps)).toFixed(2)} |`);
      }
    } finally {
      for (const p of procs.reverse()) await stop(p);
    }
  }
}

/** What bounds the one-device figures: one decode pass of 1, 2, 4 and 8 sequences in engine SeqSlots
 *  (no HTTP, no sampling), its time against one sequence's. Where a pass is bound by reading the weights
 *  (more cores than memory bandwidth) 4 rows cost little more than 1; where by arithmetic, nearly 4x.
 *  Beside it llama.cpp's batch of as many tokens against its one-token step (llama-bench): the bound
 *  the host sets either engine. */
export async function passCost(model: string, steps = 12, log: (s: string) => void = console.error): Promise<void> {
  const sizes = [1, 2, 4, 8] as const;
  ensureLlamaBench(log);
  const peer = llamaBatchCost(model, { threads: Number(THREADS), sizes, reps: 3 });
  const m = LocalModel.open(model, { threads: Number(THREADS) });
  const slots = new SeqSlots(m, 8, 512);
  try {
    for (let i = 0; i < 8; i++) await slots.prefill(i, Int32Array.from([1, 100 + i, 200, 300]), 0);
    console.log(`\n## serve --parallel: one decode pass of N sequences on one device (engine SeqSlots, median of ${steps}, ${THREADS} threads)\n`);
    console.log("| sequences | ms a pass | x one sequence's | ms a sequence | llama.cpp: a batch of as many tokens, x its one token's (llama-bench -p N) |");
    console.log("|---|---|---|---|---|");
    let one = 0;
    const cost = new Map<number, number>();
    for (const n of sizes) {
      const ms: number[] = [];
      for (let k = 0; k < steps; k++) {
        const t0 = performance.now();
        await slots.step(Array.from({ length: n }, (_, i) => ({ slot: i, token: 500 + k, pos: slots.filled(i) })));
        ms.push(performance.now() - t0);
      }
      const t = median(ms);
      one ||= t;
      cost.set(n, t / one);
      console.log(`| ${n} | ${t.toFixed(1)} | ${(t / one).toFixed(2)} | ${(t / n).toFixed(1)} | ${peer.get(n)?.toFixed(2) ?? "-"} |`);
    }
    // 4 clients' aggregate is at most 4 / (a pass of 4's cost) one client's: every pass full, nothing else.
    const bound = (x: number | undefined) => (x ? `${(4 / x).toFixed(2)}x` : "-");
    console.log(`\n4 clients' aggregate can be at most 4 / (a pass of 4's cost) one client's (goal 2.5x): prima ${bound(cost.get(4))}, llama.cpp ${bound(peer.get(4))}`);
  } finally {
    slots.close();
    m.close();
  }
}

/** The server's batching counters (/metrics). */
async function batchCounters(url: string): Promise<{ steps: number; rows: number; tokens: number }> {
  const t = await (await fetch(`${url}/metrics`)).text();
  const num = (name: string) => Number(new RegExp(`^${name} ([\\d.e+-]+)$`, "m").exec(t)?.[1] ?? NaN);
  return { steps: num("prima_batch_steps_total"), rows: num("prima_batch_rows_total"), tokens: num("prima_generated_tokens_total") };
}

runAlone(import.meta, "serve", "[rounds]", main, 5);
