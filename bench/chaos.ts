// Chaos: streamed requests back to back on a served ring of two loopback workers, while a script kills
// (SIGKILL, or SIGSTOP then SIGKILL) a random worker every ~20 s and restarts it a few seconds later,
// and two busy processes load the CPU throughout (issue #36: a build on the same machine).
// It prints requests completed correctly (the uninterrupted greedy text), failed with a clear error,
// wrong (must be 0), hung (must be 0), the median and worst pause from a loss to the next token, the
// devices lost other than the one killed (goal 0), and the server's memory and open files at the
// start and the end (no leak).
//   node dist/bench/chaos.js model.gguf [seconds]
import { spawn } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { coordCli, median, readSse, runAlone, start, stop, waitFor, workerCli, type Proc } from "./procs.js";

const PROMPT = "Once upon a time";
const TOKENS = 48;
const REQUEST_LIMIT_MS = 60_000;

/** A process that spins on one core until it is killed. */
function hog(): Proc {
  const child = spawn(process.execPath, ["-e", "for (;;) {}"], { stdio: "ignore" });
  return { child, out: "", err: "", exited: new Promise((r) => child.on("exit", r)) };
}

/** Losses per device name in the server's log ("device w3 \"alpha\" (127.0.0.1) lost: ..."). */
function lossesByName(log: string): Map<string, number> {
  const n = new Map<string, number>();
  for (const m of log.matchAll(/device w\d+ "([^"]*)" \([^)]*\) lost: /g)) n.set(m[1], (n.get(m[1]) ?? 0) + 1);
  return n;
}

function rssMiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) / 1024 : NaN;
}

const openFiles = (pid: number) => readdirSync(`/proc/${pid}/fd`).length;

async function streamOnce(url: string, signal: AbortSignal): Promise<string> {
  const r = await fetch(`${url}/v1/completions`, {
    method: "POST", headers: { "Content-Type": "application/json" }, signal,
    body: JSON.stringify({ prompt: PROMPT, max_tokens: TOKENS, temperature: 0, stream: true }),
  });
  let text = "";
  await readSse(r, (c) => {
    const err = c.error as { message: string } | undefined;
    if (err) throw new Error(err.message);
    text += (c.choices as { text?: string }[] | undefined)?.[0]?.text ?? "";
  });
  return text;
}

/** Where the pauses went, from the recovered events' parts ("... pause (1.20 s of it replaying 40
 * tokens; detection 0.50 s, re-placing 0.90 s: take-down 0.01 s, ...)"): each part's median and worst. */
function pauseParts(messages: string[]): string {
  const parts = new Map<string, number[]>();
  for (const m of messages) {
    const seen = new Map<string, number>();
    const replay = /pause \(([\d.]+) s of it replaying/.exec(m);
    if (replay) seen.set("replay", Number(replay[1]));
    for (const p of (/tokens; (.*)\)$/.exec(m)?.[1] ?? "").matchAll(/([a-z][a-z' -]*?):? ([\d.]+) s/g)) {
      const name = p[1].replace(/^then /, "");
      seen.set(name, (seen.get(name) ?? 0) + Number(p[2]));
    }
    for (const [n, v] of seen) parts.set(n, [...(parts.get(n) ?? []), v * 1000]);
  }
  if (parts.size === 0) return "- where the pauses went: no recovered event says";
  const rows = [...parts].map(([n, v]) => `${n} ${median(v).toFixed(0)} / ${Math.max(...v).toFixed(0)}`);
  return `- where the pauses went, median / worst ms over ${messages.length} (a part absent from a recovery counts in neither): ${rows.join(", ")}`;
}

/** `hogs`: busy processes beside the cluster for the whole run (a build on the same machine). */
export async function main(model: string, seconds = 180, hogs = 2): Promise<void> {
  if (!(Number.isInteger(hogs) && hogs >= 0 && hogs <= 64)) throw new Error(`--chaos-hogs ${hogs}: a whole number from 0 to 64 is expected`);
  const ref = start(coordCli, ["run", model, "--json", "-p", PROMPT, "-n", String(TOKENS), "--temp", "0", "--ctx", "256", "--threads", "1"]);
  await ref.exited;
  const expected = (JSON.parse(ref.out.split("\n").find((l) => l.startsWith("{"))!) as { text: string }).text;
  const serve = start(coordCli, ["serve", model, "--no-discovery", "--port", "0", "--cluster-port", "0", "--ctx", "256", "--threads", "1", "--min-workers", "2", "--keep-all"]);
  const workers = new Map<string, Proc>();
  const procs: Proc[] = [serve];
  // What the server said about losses and recoveries, with the time it said it: printed at the end,
  // to tell where a long pause went.
  const t0 = performance.now();
  const story: string[] = [];
  serve.child.stderr!.on("data", (d: Buffer) => {
    for (const line of d.toString().split("\n")) {
      if (/ lost: |recover|placing|placed again|plan: |held for|did not answer|reports: |the ring broke| ready in /.test(line)) story.push(`${((performance.now() - t0) / 1000).toFixed(1)} s ${line.slice(0, 300)}`);
    }
  });
  try {
    const url = `http://127.0.0.1:${(await waitFor(serve, /listening on http:\/\/127\.0\.0\.1:(\d+)/))[1]}`;
    const clusterPort = (await waitFor(serve, /listening for workers on port (\d+)/, 120_000))[1];
    const tokenFile = (await waitFor(serve, /--token-file (\S+)/))[1]; // the join token (trust/)
    const retired: Proc[] = []; // workers killed: their logs still count
    const join = (name: string) => {
      const old = workers.get(name);
      if (old) retired.push(old);
      const w = start(workerCli, ["--join", `127.0.0.1:${clusterPort}`, "--model", model, "--name", name, "--threads", "1", "--token-file", tokenFile]);
      workers.set(name, w);
      procs.push(w);
      // What the worker's side of a re-placement cost (worker/device.ts, worker/cli.ts say it).
      w.child.stderr!.on("data", (d: Buffer) => {
        for (const line of d.toString().split("\n")) {
          if (/windows set up in|checked this device's weights in|held for|session ended/.test(line)) story.push(`${((performance.now() - t0) / 1000).toFixed(1)} s ${name}: ${line.slice(0, 300)}`);
        }
      });
    };
    join("alpha");
    join("bravo");
    for (let t = 0; ; t += 250) {
      const h = await fetch(`${url}/health`).catch(() => undefined);
      if (h?.status === 200) break;
      if (t > 120_000) throw new Error("the ring did not form within 120 s");
      await new Promise((r) => setTimeout(r, 250));
    }
    await streamOnce(url, AbortSignal.timeout(REQUEST_LIMIT_MS)); // warm-up
    for (let i = 0; i < hogs; i++) procs.push(hog());
    const lostBefore = lossesByName(serve.err);
    const killed = new Map<string, number>();
    const rss0 = rssMiB(serve.child.pid!), fds0 = openFiles(serve.child.pid!);
    const counts = { correct: 0, failed: 0, wrong: 0, hung: 0, kills: 0 };
    const errors = new Map<string, number>();
    const deadline = Date.now() + seconds * 1000;
    let stopKilling = false;
    const killer = (async () => {
      while (!stopKilling && Date.now() < deadline - 10_000) {
        await new Promise((r) => setTimeout(r, 15_000 + Math.random() * 10_000));
        if (stopKilling) break;
        const name = Math.random() < 0.5 ? "alpha" : "bravo";
        const w = workers.get(name)!;
        const freeze = Math.random() < 0.3;
        console.error(`chaos: ${freeze ? "freezing" : "killing"} ${name}`);
        story.push(`${((performance.now() - t0) / 1000).toFixed(1)} s chaos: ${freeze ? "freezing" : "killing"} ${name}`);
        w.child.kill(freeze ? "SIGSTOP" : "SIGKILL");
        counts.kills++;
        killed.set(name, (killed.get(name) ?? 0) + 1);
        await new Promise((r) => setTimeout(r, 3000));
        w.child.kill("SIGKILL");
        await w.exited;
        join(name);
      }
    })();
    while (Date.now() < deadline) {
      const limit = AbortSignal.timeout(REQUEST_LIMIT_MS);
      try {
        const text = await streamOnce(url, limit);
        if (text === expected) counts.correct++;
        else {
          counts.wrong++;
          console.error(`chaos: WRONG text: ${JSON.stringify(text.slice(0, 120))}`);
        }
      } catch (e) {
        if (limit.aborted) counts.hung++;
        else {
          counts.failed++;
          const m = (e as Error).message.replace(/\d+/g, "N").slice(0, 160);
          errors.set(m, (errors.get(m) ?? 0) + 1);
          await new Promise((r) => setTimeout(r, 500));
        }
      }
    }
    stopKilling = true;
    await killer;
    const state = (await (await fetch(`${url}/api/state`)).json()) as { events: { kind: string; message: string }[] };
    // Pauses from the latest events (the state keeps 50), the count from /metrics.
    const pauses = state.events.filter((e) => e.kind === "recovered").map((e) => Number(/after a ([\d.]+) s pause/.exec(e.message)?.[1]) * 1000);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    const recoveries = Number(/^prima_recovery_seconds_count (\d+)/m.exec(metrics)?.[1] ?? pauses.length);
    const rss1 = rssMiB(serve.child.pid!), fds1 = openFiles(serve.child.pid!);
    // Each kill loses its device once; any other loss is a device that fell out with it (or alone).
    let extraLosses = 0;
    for (const [name, n] of lossesByName(serve.err)) extraLosses += Math.max(0, n - (lostBefore.get(name) ?? 0) - (killed.get(name) ?? 0));
    console.log(`\n## chaos: ${seconds} s of streamed requests (${TOKENS} tokens each) on serve + 2 workers, a worker killed or frozen every ~20 s, ${hogs} busy processes beside them\n`);
    console.log("| kills | correct | failed (clear error) | wrong (goal 0) | hung (goal 0) | recoveries | pause median ms (latest) | pause worst ms (latest) | other devices lost (goal 0) | server RSS MiB start -> end | open files start -> end |");
    console.log("|---|---|---|---|---|---|---|---|---|---|---|");
    console.log(`| ${counts.kills} | ${counts.correct} | ${counts.failed} | ${counts.wrong} | ${counts.hung} | ${recoveries} | ${median(pauses).toFixed(0)} of ${pauses.length} | ` +
      `${pauses.length ? Math.max(...pauses).toFixed(0) : "-"} | ${extraLosses} | ${rss0.toFixed(0)} -> ${rss1.toFixed(0)} | ${fds0} -> ${fds1} |`);
    for (const [m, n] of errors) console.log(`- ${n} x failed: ${m}`);
    // Each pause less its replay (the prompt and tokens so far run again): detection and re-placing.
    const placing = state.events.filter((e) => e.kind === "recovered").map((e) => /after a ([\d.]+) s pause \(([\d.]+) s of it replaying/.exec(e.message))
      .filter((m) => m !== null).map((m) => (Number(m[1]) - Number(m[2])) * 1000);
    if (placing.length) console.log(`- the pauses less their replay (goal < 3 s): median ${median(placing).toFixed(0)} ms, worst ${Math.max(...placing).toFixed(0)} ms, of ${placing.length}`);
    console.log(pauseParts(state.events.filter((e) => e.kind === "recovered").map((e) => e.message)));
    // A restarted worker rejoins during a request: placing it pauses the stream too (not a loss).
    const joins = state.events.filter((e) => / pause to place a device that joined /.test(e.message)).map((e) => e.message);
    const joinPauses = joins.map((m) => Number(/after a ([\d.]+) s pause/.exec(m)?.[1]) * 1000);
    if (joins.length) console.log(`- pauses to place a device that rejoined mid-request: median ${median(joinPauses).toFixed(0)} ms, worst ${Math.max(...joinPauses).toFixed(0)} ms, of ${joins.length}; ${pauseParts(joins).replace(/^- where the pauses went, /, "where they went, ")}`);
    console.error(`chaos: what the server said about losses and recoveries:\n${story.join("\n")}`);
    for (const e of state.events.filter((x) => x.kind === "recovered" || / pause to place a device that joined /.test(x.message))) console.error(`chaos: ${e.kind}: ${e.message}`);
    // Event-loop stalls past the heartbeat limit that each process logged (control/limits.ts stallNote).
    const held = (p: Proc) => [...p.err.matchAll(/event loop was held for ([\d.]+) s/g)].map((m) => Number(m[1]));
    const stalls = [serve, ...workers.values(), ...retired].flatMap(held);
    console.log(`- event-loop stalls over 1.5 s: ${stalls.length}${stalls.length ? `, longest ${Math.max(...stalls).toFixed(1)} s (serve: ${held(serve).map((x) => x.toFixed(1)).join(", ") || "none"})` : ""}`);
  } finally {
    for (const p of procs) await stop(p);
  }
}

runAlone(import.meta, "chaos", "[seconds]", main, 180);
