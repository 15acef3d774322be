// The dashboard in Debian's chromium against a real cluster (issue #16): `prima-coord serve` and two
// `prima-worker` processes on loopback, layers placed by name so the plan is known. The page lists every
// device with the windows /api/state reports and a band that holds every layer exactly once; a chat
// message typed into the panel streams into the page and equals the API's greedy answer; a worker
// killed with SIGKILL shows as "lost", with the reason, within 3 s; a stopped server shows the banner,
// and the same server back on the same port clears it without a reload. Screenshots of each step go
// to test-artifacts/dashboard/cluster-*.png.
import type { Browser } from "puppeteer-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ClusterState } from "../../coordinator/state.js";
import { killAll, type Proc } from "../ring/cluster.js";
import { joinWorker, startServe, until as untilHttp, type Served } from "../coordinator/serve-harness.js";
import {
  bannerVisible, chromiumMissing, closeBrowsers, expectBandsMatch, launchBrowser, openDashboard, shownDevices, until,
  waitForState, type DashboardPage,
} from "./browser.js";

/** stories260K has 5 layers: alpha 0-1, bravo 2-3, the head 4, one cycle; ring order by name. */
const LAYER_WINDOWS = "alpha=2,bravo=2,head=1";
const SERVE_ARGS = ["--min-workers", "2", "--layer-windows", LAYER_WINDOWS, "--ctx", "512"];
/** What the page may log while the server is away (its fetches fail) or refuses. */
const CONNECTION_ERRORS = /Failed to load resource|ERR_CONNECTION|ERR_EMPTY_RESPONSE|ERR_INCOMPLETE|net::ERR_/;

if (chromiumMissing) console.warn(`dashboard real-cluster tests ${chromiumMissing}`);

async function apiState(url: string): Promise<ClusterState> {
  const r = await fetch(`${url}/api/state`, { signal: AbortSignal.timeout(5000) });
  expect(r.status).toBe(200);
  return (await r.json()) as ClusterState;
}

const shot = (d: DashboardPage, name: string) => d.shot(`cluster-${name}`);

describe.skipIf(chromiumMissing !== null)(chromiumMissing ? `dashboard on a real cluster (${chromiumMissing})` : "dashboard on a real cluster", () => {
  let browser: Browser;
  let s: Served;
  let alpha: Proc;
  let bravo: Proc;
  let d: DashboardPage;
  const procs: Proc[] = [];

  beforeAll(async () => {
    browser = await launchBrowser();
    s = await startServe(SERVE_ARGS, { waitReady: false });
    procs.push(s.proc);
    bravo = joinWorker(s.clusterPort, "bravo");
    alpha = joinWorker(s.clusterPort, "alpha");
    procs.push(alpha, bravo);
    await untilHttp(`${s.url}/health`, (st) => st === 200, 60_000);
    await untilHttp<ClusterState>(`${s.url}/api/state`, (_, st) =>
      st.plan?.ringOrder.length === 3 && st.devices.every((x) => x.state === "ready"), 30_000);
    d = await openDashboard(browser, s.url, { expectedErrors: CONNECTION_ERRORS });
    await waitForState(d.page);
  }, 120_000);

  afterAll(async () => {
    try {
      await closeBrowsers();
    } finally {
      stopProcs();
    }
  });
  function stopProcs(): void {
    // Every process this file started, by PID (one already gone must not stop the others).
    for (const p of procs) {
      if (p.child.exitCode !== null || p.child.signalCode !== null || !p.child.pid) continue;
      try { process.kill(p.child.pid, "SIGKILL"); } catch { /* exited meanwhile */ }
    }
    killAll();
  }

  it("lists every device with the windows /api/state reports, and a band holding every layer once", async () => {
    // The page follows the state stream; wait until it shows what /api/state says now.
    let st: ClusterState | undefined;
    const key = (ws: readonly { cycle: number; first: number; end: number }[]) => JSON.stringify(ws);
    await until("the page to show the state's devices and windows", async () => {
      st = await apiState(s.url);
      const shown = await shownDevices(d.page);
      return shown.length === st.devices.length && st.devices.every((dev) => {
        const x = shown.find((y) => y.id === dev.id);
        return x !== undefined && x.state === dev.state &&
          key(x.windows) === key(dev.windows.map((w) => ({ cycle: w.cycle, first: w.firstLayer, end: w.endLayer })));
      });
    }, 15_000);
    const state = st!;
    await shot(d, "a-devices");

    // Every device of the state, with its name, address, state and windows.
    const shown = await shownDevices(d.page);
    expect(shown.map((x) => x.id).sort()).toEqual(state.devices.map((x) => x.id).sort());
    const byName = new Map(state.devices.map((x) => [x.name, x]));
    expect([...byName.keys()].filter((n) => n === "alpha" || n === "bravo").sort()).toEqual(["alpha", "bravo"]);
    for (const dev of state.devices) {
      const card = shown.find((x) => x.id === dev.id)!;
      expect(card.name, dev.id).toBe(dev.name);
      expect(card.state, dev.id).toBe(dev.state);
      expect(card.windows, dev.id).toEqual(dev.windows.map((w) => ({ cycle: w.cycle, first: w.firstLayer, end: w.endLayer })));
      expect(card.windows.length, `${dev.name} holds layers`).toBeGreaterThan(0);
      expect(card.text).toContain(dev.address);
    }
    // The windows are the ones asked for by name (the plan is deterministic).
    const plan = state.plan!;
    const idOf = (name: string) => state.devices.find((x) => x.name === name)!.id;
    const head = state.devices.find((x) => x.isHead)!;
    expect(plan.ringOrder).toEqual([idOf("alpha"), idOf("bravo"), head.id]);
    expect(plan.windows.map((w) => [w.device, w.cycle, w.firstLayer, w.endLayer])).toEqual(
      [[idOf("alpha"), 0, 0, 2], [idOf("bravo"), 0, 2, 4], [head.id, 0, 4, 5]]);

    // The bands, by the page's rules: each cycle's band spans its layers, each held exactly once, in
    // ring order, as the plan's windows; over all cycles every layer of the model exactly once; and the
    // page reports no coverage problem.
    const bands = await expectBandsMatch(d.page, state.model.layers, plan);
    expect(bands.map((b) => b.cycle)).toEqual(Array.from({ length: plan.cycles }, (_, c) => c));
    expect(await d.page.$$(".problems li")).toHaveLength(0);
    const main = await d.page.$eval("main", (m) => (m as HTMLElement).innerText);
    expect(main).toContain(state.model.name);
    expect(main).toContain(`k = ${plan.cycles}`);
    // the KV cache in its type: stories260K's 5 layers x (K + V) x 4 heads x 8 in F16, 512 tokens of context
    expect(state.model.kvCache).toEqual({ typeK: "f16", typeV: "f16", bytesPerToken: 5 * 2 * 32 * 2, attention: "dense" });
    expect(main).toContain("f16 \u00b7 640 B per token, 320 KiB at 512");
    expect(await bannerVisible(d.page)).toBe(false);
    expect(d.errors).toEqual([]);
  });

  it("a chat message typed into the panel streams into the page and equals the API's greedy answer", async () => {
    const page = d.page;
    // What the panel sends, as it sends it.
    const sent: string[] = [];
    const onRequest = (r: { url(): string; method(): string; postData(): string | undefined }) => {
      if (r.method() === "POST" && r.url().endsWith("/v1/chat/completions")) sent.push(r.postData() ?? "");
    };
    page.on("request", onRequest);
    // Every change to the answer's text while it streams.
    await page.evaluate(() => {
      const w = window as unknown as { __lengths: number[] };
      w.__lengths = [];
      new MutationObserver(() => {
        const body = document.querySelector("#chat-log .msg.assistant:last-child .msg-body");
        if (body) w.__lengths.push((body.textContent ?? "").length);
      }).observe(document.getElementById("chat-log")!, { childList: true, subtree: true, characterData: true });
    });
    // Replace what the fields hold, as a user would (select all, type).
    for (const [field, value] of [["#chat-temp", "0"], ["#chat-max", "48"]]) {
      await page.focus(field);
      await page.keyboard.down("Control");
      await page.keyboard.press("a");
      await page.keyboard.up("Control");
      await page.keyboard.type(value);
      expect(await page.$eval(field, (e) => (e as HTMLInputElement).value)).toBe(value);
    }
    const question = "Tell me a story about a dog.";
    await page.type("#chat-input", question);
    await page.keyboard.press("Enter");
    try {
      await page.waitForSelector("#chat-log .msg.assistant .msg-meta, #chat-log .msg.assistant .msg-error", { timeout: 30_000 });
    } catch (e) {
      await shot(d, "b-chat-unfinished");
      const log = await page.$eval("#chat-log", (x) => (x as HTMLElement).innerText);
      throw new Error(`the chat did not finish: ${(e as Error).message}\npage: ${log}\nsent: ${sent.join("\n")}\nserve: ${s.proc.stderr.slice(-3000)}`);
    }
    page.off("request", onRequest);
    await shot(d, "b-chat");
    expect(await page.$$("#chat-log .msg-error")).toHaveLength(0);
    const answer = await page.$eval("#chat-log .msg.assistant .msg-body", (e) => e.textContent ?? "");
    const meta = await page.$eval("#chat-log .msg.assistant .msg-meta", (e) => e.textContent ?? "");
    const lengths = await page.evaluate(() => (window as unknown as { __lengths: number[] }).__lengths);

    // The panel asked for what the test typed: greedy, 48 tokens, the one message, streamed.
    expect(sent).toHaveLength(1);
    const body = JSON.parse(sent[0]) as { messages: { role: string; content: string }[]; max_tokens: number; temperature: number; stream: boolean; model: string };
    expect(body).toMatchObject({ messages: [{ role: "user", content: question }], max_tokens: 48, temperature: 0, stream: true });

    // It streamed: the text grew in several steps, each a prefix of the next.
    const growing = lengths.filter((n, i) => n > 0 && n !== lengths[i - 1]);
    expect(growing.length, `lengths seen: ${lengths.join(",")}`).toBeGreaterThan(5);
    expect(growing).toEqual([...growing].sort((a, b) => a - b));
    const pieces = Number(/^(\d+) pieces/.exec(meta)?.[1]);
    expect(pieces).toBeGreaterThan(5);

    // The same request through the API (the openai client) gives the same text.
    const api = await s.client.chat.completions.create({ model: body.model, messages: [{ role: "user", content: question }], max_tokens: 48, temperature: 0 });
    const expected = api.choices[0].message.content ?? "";
    expect(expected.length).toBeGreaterThan(0);
    expect(answer).toBe(expected);
    expect(d.errors).toEqual([]);
  });

  it("a worker killed with SIGKILL turns its card to lost, with the reason, within 3 s", async () => {
    const st = await apiState(s.url);
    const id = st.devices.find((x) => x.name === "alpha")!.id;
    const killedAt = Date.now();
    process.kill(alpha.child.pid!, "SIGKILL");
    await until("alpha's card to say lost", async () => (await shownDevices(d.page)).find((x) => x.id === id)?.state === "lost", 10_000, 50);
    const tookMs = Date.now() - killedAt;
    await shot(d, "c-worker-lost");
    expect(tookMs, `the card said lost after ${tookMs} ms`).toBeLessThan(3000);
    expect(await alpha.exited).toBeNull(); // killed by the signal, not exited

    // The reason on the card is the one the server reports.
    const after = await apiState(s.url);
    const lost = after.devices.find((x) => x.id === id)!;
    expect(lost.state).toBe("lost");
    expect(lost.detail ?? "").not.toBe("");
    const reason = await d.page.$eval(`article.device[data-device="${id}"] .lost-reason`, (e) => e.textContent ?? "");
    expect(reason).toBe(`Lost: ${lost.detail}`);
    // The other worker is still there.
    expect((await shownDevices(d.page)).find((x) => x.name === "bravo")?.state).not.toBe("lost");
    expect(d.errors).toEqual([]);
  });

  it("a stopped server shows the banner; the server back on the same port clears it without a reload", async () => {
    const page = d.page;
    await page.evaluate(() => { (window as unknown as { __loaded: number }).__loaded = 1; });
    const port = Number(new URL(s.url).port);
    const clusterPort = s.clusterPort;
    s.proc.child.kill("SIGTERM");
    const code = await Promise.race([s.proc.exited, new Promise((r) => setTimeout(() => r("hung"), 15_000))]);
    expect(code, "serve stops on SIGTERM").toBe(0);
    await until("the banner", () => bannerVisible(page), 10_000);
    expect(await page.$eval("#banner-text", (e) => e.textContent)).toMatch(/Lost the server \(.+\)\..*Reconnecting/);
    expect(await page.$eval("body", (b) => b.classList.contains("stale"))).toBe(true);
    await shot(d, "d-server-gone");

    // The same server on the same ports: the surviving worker comes back by itself, and so does the page.
    s = await startServe([...SERVE_ARGS, "--port", String(port), "--cluster-port", String(clusterPort)], { waitReady: false });
    procs.push(s.proc);
    expect(Number(new URL(s.url).port)).toBe(port);
    await until("the banner to clear", async () => !(await bannerVisible(page)), 20_000);
    expect(await page.evaluate(() => (window as unknown as { __loaded?: number }).__loaded)).toBe(1); // no reload
    expect(await page.$eval("body", (b) => b.classList.contains("stale"))).toBe(false);
    // It shows the new server's state: its devices (the head, and bravo once it rejoins).
    await untilHttp<ClusterState>(`${s.url}/api/state`, (_, st) => st.devices.some((x) => x.name === "bravo"), 30_000);
    let st: ClusterState | undefined;
    await until("the page to show the new server's devices", async () => {
      st = await apiState(s.url);
      const ids = (await shownDevices(page)).map((x) => x.id).sort();
      return JSON.stringify(ids) === JSON.stringify(st.devices.map((x) => x.id).sort());
    }, 15_000);
    expect((await shownDevices(page)).map((x) => x.name).sort()).toEqual(st!.devices.map((x) => x.name).sort());
    expect(st!.server.startedUnixMs).toBeGreaterThan(Date.now() - 60_000);
    await shot(d, "e-server-back");
    expect(d.errors).toEqual([]);
  });
});
