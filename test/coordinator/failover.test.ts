// A device lost in the middle of a streamed request: the coordinator places the layers on the
// devices left, replays the prompt and the tokens sent so far, and the stream goes on with exactly the
// text of an uninterrupted run. The device, restarted, is used again from the next request on.
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { execFileSync } from "node:child_process";
import { killAll, type Proc } from "../ring/cluster.js";
import { PLACEMENT_SHAPE, testModel } from "../profiler/models.js";
import { joinWorker, runOnce, startServe, until, type Served } from "./serve-harness.js";

const PROMPT = "Once upon a time";
// A token costs this model's ring ~25 ms of CPU: 80 of them leave 70 after the fault at the 10th to
// stream on (200 made each request 5 s of CPU, and the file mostly generating).
const N = 80;

interface PlanView { plan: { generation: number; ringOrder: string[] } | null; devices: { id: string; name: string; state: string }[] }

describe("failover during a streamed request (12 layers of 1024, Q8_0, two workers)", () => {
  let model: string;
  let expected: string;
  beforeAll(async () => {
    model = await testModel(PLACEMENT_SHAPE, "Q8_0");
    expected = runOnce(["-p", PROMPT, "-n", String(N), "--temp", "0", "--ctx", "512"], model).text;
  }, 120_000);
  afterEach(() => killAll());

  async function cluster(): Promise<{ s: Served; alpha: Proc; bravo: Proc }> {
    const s = await startServe(["--ctx", "512", "--min-workers", "2", "--layer-windows", "alpha=4,bravo=4,head=4"], { model, waitReady: false });
    const alpha = joinWorker(s.clusterPort, "alpha", model);
    const bravo = joinWorker(s.clusterPort, "bravo", model);
    await until<PlanView>(`${s.url}/api/state`, (_, b) => (b.plan?.ringOrder.length ?? 0) === 3, 60_000);
    return { s, alpha, bravo };
  }

  /** Streams the request, calls `fault` at the 10th chunk, and returns the text and the longest pause. */
  async function streamWithFault(s: Served, fault: () => void): Promise<{ text: string; pauseMs: number; finish: string | null }> {
    const stream = await s.client.completions.create({ prompt: PROMPT, max_tokens: N, stream: true, temperature: 0 });
    let text = "", n = 0, pauseMs = 0, last = 0, finish: string | null = null;
    for await (const c of stream) {
      const now = Date.now();
      if (n > 10) pauseMs = Math.max(pauseMs, now - last);
      last = now;
      text += c.choices[0]?.text ?? "";
      finish = c.choices[0]?.finish_reason ?? finish;
      if (++n === 10) fault();
    }
    return { text, pauseMs, finish };
  }

  for (const [how, signal] of [["killed (SIGKILL)", "SIGKILL"], ["frozen (SIGSTOP)", "SIGSTOP"]] as const) {
    it(`a worker ${how} at the 10th token: the stream completes with the uninterrupted text`, async () => {
      const { s, bravo } = await cluster();
      const r = await streamWithFault(s, () => bravo.child.kill(signal)).catch((e: Error) => {
        throw new Error(`${e.message}\ncoordinator:\n${s.proc.stderr.slice(-4000)}`);
      });
      // The device is declared lost (its session's heartbeats stop) even when the ring recovered first.
      await s.proc.waitFor(/device w\d "bravo" .*lost/, 5000);
      const metrics = await (await fetch(`${s.url}/metrics`)).text();
      const pauseS = Number(/prima_last_recovery_seconds ([\d.e-]+)/.exec(metrics)?.[1]);
      console.log(`failover (${how}): the stream paused ${(pauseS * 1000).toFixed(0)} ms (from the last token before the loss to the next)`);
      expect(r.text, s.proc.stderr.slice(-3000)).toBe(expected);
      expect(r.finish).toBe("length");
      // A pause was measured (its length, under 3 s plus the replay on a quiet machine, is the chaos
      // benchmark's figure: a loaded machine stretches it).
      expect(pauseS).toBeGreaterThan(0);
      expect(Number.isFinite(pauseS)).toBe(true);
      expect(metrics).toMatch(/prima_recovery_seconds_count 1\n/);
      expect(metrics).toMatch(/prima_devices_lost_total 1\n/);
      // The event says where the pause went: detection, each step of re-placing, the replay of the
      // prompt and the 10 tokens or more sent before the loss (bench/chaos.ts sums these parts).
      const events = ((await (await fetch(`${s.url}/api/state`)).json()) as { events: { kind: string; message: string }[] }).events;
      const said = events.find((e) => e.kind === "recovered")?.message ?? "";
      const parts = /pause \([\d.]+ s of it replaying (\d+) tokens; detection [\d.]+ s, re-placing [\d.]+ s: (.*)\)$/.exec(said);
      expect(parts, said).not.toBeNull();
      expect(Number(parts![1])).toBeGreaterThanOrEqual(10);
      for (const step of ["take-down", "answering", "assignments", "dial"]) expect(parts![2]).toMatch(new RegExp(`\\b${step} [\\d.]+ s`));
      if (signal === "SIGSTOP") bravo.child.kill("SIGKILL");
      // The server stays up and serves the next request on the devices left.
      const next = await s.client.completions.create({ prompt: PROMPT, max_tokens: N, temperature: 0 });
      expect(next.choices[0].text).toBe(expected);
    }, 90_000);
  }

  it("a worker whose ring link is cut from outside: the ring is rebuilt and the text is the same", async () => {
    const { s, bravo } = await cluster();
    let cut = 0;
    const r = await streamWithFault(s, () => {
      // Destroy bravo's TCP connections on the data plane (not its control session to the cluster
      // port): the kernel aborts them as a pulled cable or a NAT dropping them would, in effect.
      const pid = bravo.child.pid!;
      const lines = execFileSync("ss", ["-tpnH", "state", "established"], { encoding: "utf8" }).split("\n").filter((l) => l.includes(`pid=${pid},`));
      for (const l of lines) {
        const [, , local, peer] = l.trim().split(/\s+/);
        if (!local || !peer || peer.endsWith(`:${s.clusterPort}`)) continue;
        execFileSync("ss", ["-K", "-t", "src", local, "dst", peer], { stdio: "ignore" });
        cut++;
      }
    }).catch((e: Error) => {
      throw new Error(`${e.message}\ncoordinator:\n${s.proc.stderr.slice(-4000)}`);
    });
    expect(cut, "bravo's data-plane connections were cut").toBeGreaterThan(0);
    expect(r.text).toBe(expected);
  }, 90_000);

  it("three workers, the middle one killed: its successor stays in the ring (one device lost, not two)", async () => {
    const s = await startServe(["--ctx", "512", "--min-workers", "3", "--layer-windows", "alpha=3,bravo=3,charlie=3,head=3"], { model, waitReady: false });
    const [, bravo, charlie] = ["alpha", "bravo", "charlie"].map((n) => joinWorker(s.clusterPort, n, model));
    await until<PlanView>(`${s.url}/api/state`, (_, b) => (b.plan?.ringOrder.length ?? 0) === 4, 60_000);
    // Ring order alpha -> bravo -> charlie -> head: charlie's link from its predecessor breaks.
    const r = await streamWithFault(s, () => bravo.child.kill("SIGKILL")).catch((e: Error) => {
      throw new Error(`${e.message}\ncoordinator:\n${s.proc.stderr.slice(-4000)}`);
    });
    expect(r.text, s.proc.stderr.slice(-3000)).toBe(expected);
    const st = await until<PlanView>(`${s.url}/api/state`, (_, b) => b.plan !== null);
    const names = st.plan!.ringOrder.map((id) => st.devices.find((d) => d.id === id)?.name);
    expect(names, s.proc.stderr.slice(-4000)).toEqual(["alpha", "charlie", "head (this coordinator)"]);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/prima_devices_lost_total 1\n/);
    expect(charlie.stderr).not.toMatch(/session ended/);
    expect(s.proc.stderr).not.toMatch(/"charlie" \(127\.0\.0\.1\) lost:|"charlie" .*did not answer/);
  }, 120_000);

  it("a worker that rejoins during a request is placed without waiting for another request, and the text is the same", async () => {
    const { s, bravo: first } = await cluster();
    let bravo = first;
    const joins = () => s.proc.stderr.match(/"bravo" \(127\.0\.0\.1\) joined/g)?.length ?? 0;
    // Bravo restarts while requests run back to back; if it happens to join in the gap between two
    // requests (where the old code placed it too), it is killed and restarted once more.
    let during = false;
    for (let attempt = 0; attempt < 4 && !during; attempt++) {
      bravo.child.kill("SIGKILL");
      await until<PlanView>(`${s.url}/api/state`, (_, b) => (b.plan?.ringOrder.length ?? 0) === 2, 60_000);
      const before = joins();
      bravo = joinWorker(s.clusterPort, "bravo", model);
      while (joins() === before) {
        let text = "";
        let n = 0;
        const stream = await s.client.completions.create({ prompt: PROMPT, max_tokens: N, stream: true, temperature: 0 });
        for await (const c of stream) {
          // Joined while tokens were still coming (the last one not yet here).
          if (++n < N && joins() > before) during = true;
          text += c.choices[0]?.text ?? "";
        }
        expect(text, s.proc.stderr.slice(-3000)).toBe(expected);
      }
    }
    expect(during, "bravo joined during a request").toBe(true);
    // No request is sent now: the ring takes bravo back on its own.
    const st = await until<PlanView>(`${s.url}/api/state`, (_, b) => (b.plan?.ringOrder.length ?? 0) === 3, 30_000).catch((e: Error) => {
      throw new Error(`${e.message}\ncoordinator:\n${s.proc.stderr.slice(-4000)}`);
    });
    expect(st.plan!.ringOrder.map((id) => st.devices.find((d) => d.id === id)?.name)).toEqual(["alpha", "bravo", "head (this coordinator)"]);
  }, 240_000);

  it("a worker restarted after a loss rejoins, and the next request uses it", async () => {
    const { s, bravo } = await cluster();
    const r = await streamWithFault(s, () => bravo.child.kill("SIGKILL"));
    expect(r.text).toBe(expected);
    const gen = (await until<PlanView>(`${s.url}/api/state`, (_, b) => b.plan !== null)).plan!.generation;
    joinWorker(s.clusterPort, "bravo", model);
    // (It timed out once in a full run on a loaded machine: the coordinator's log says why next time.)
    const st = await until<PlanView>(`${s.url}/api/state`, (_, b) => (b.plan?.generation ?? 0) > gen && (b.plan?.ringOrder.length ?? 0) === 3, 60_000)
      .catch((e: Error) => {
        throw new Error(`${e.message}\ncoordinator:\n${s.proc.stderr.slice(-4000)}`);
      });
    const names = st.plan!.ringOrder.map((id) => st.devices.find((d) => d.id === id)?.name);
    expect(names).toEqual(["alpha", "bravo", "head (this coordinator)"]);
    const next = await s.client.completions.create({ prompt: PROMPT, max_tokens: N, temperature: 0 });
    expect(next.choices[0].text).toBe(expected);
  }, 90_000);
});
