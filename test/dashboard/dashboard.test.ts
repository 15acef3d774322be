// The dashboard in a real browser (Debian's chromium) against a fake server with serve's HTTP
// contract: every device and window shown, the layer band exact, hostile strings shown as text,
// the lost-server banner cleared by reconnecting, and the API key asked for once.
import type { Browser } from "puppeteer-core";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { request } from "node:http";
import { dashboardPaths } from "../../dashboard/index.js";
import { bannerVisible, chromiumMissing, closeBrowsers, expectBandsMatch, launchBrowser, openDashboard, shownDevices, until, waitForState } from "./browser.js";
import { FakeServer } from "./fake-server.js";
import { HOSTILE_HTML, HOSTILE_TERM, hostileState, sampleState } from "./fixture.js";

const servers: FakeServer[] = [];
async function fake(opts: ConstructorParameters<typeof FakeServer>[0]): Promise<FakeServer> {
  const s = await new FakeServer(opts).start();
  servers.push(s);
  return s;
}
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.stop()));
});

function get(url: string): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: string }> {
  return new Promise((resolve, reject) => {
    request(url, (res) => {
      let body = "";
      res.on("data", (d: Buffer) => { body += d.toString(); });
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    }).on("error", reject).end();
  });
}

describe("dashboard assets", () => {
  it("serves the page and its modules with their types and strict headers, and nothing else", async () => {
    const s = await fake({ state: sampleState() });
    expect(dashboardPaths()).toEqual(expect.arrayContaining(["/", "/index.html", "/app.js", "/style.css"]));
    for (const [path, type] of [["/", "text/html"], ["/app.js", "text/javascript"], ["/style.css", "text/css"], ["/render.js?v=1", "text/javascript"]]) {
      const r = await get(`${s.url}${path}`);
      expect(r.status, path).toBe(200);
      expect(r.headers["content-type"]).toContain(type);
      expect(r.headers["content-security-policy"]).toContain("default-src 'self'");
      expect(r.headers["x-content-type-options"]).toBe("nosniff");
    }
    // The server's own module and anything outside the folder are not assets.
    for (const path of ["/index.ts", "/../package.json", "/%2e%2e/package.json", "/dashboard/index.html", "/nope.js"]) {
      expect((await get(`${s.url}${path}`)).status, path).toBe(404);
    }
  });
});

if (chromiumMissing) console.warn(`dashboard browser tests ${chromiumMissing}`);

describe.skipIf(chromiumMissing !== null)(chromiumMissing ? `dashboard in chromium (${chromiumMissing})` : "dashboard in chromium", () => {
  let browser: Browser;
  beforeAll(async () => {
    browser = await launchBrowser();
  });
  afterAll(async () => {
    await closeBrowsers();
  });

  it("shows every device with its windows, and a band covering every layer once per cycle", async () => {
    const state = sampleState();
    const s = await fake({ state });
    const d = await openDashboard(browser, s.url);
    await waitForState(d.page);
    await d.shot("a-cluster");
    await d.page.emulateMediaFeatures([{ name: "prefers-color-scheme", value: "dark" }]);
    await d.shot("a-cluster-dark");
    await d.page.emulateMediaFeatures([{ name: "prefers-color-scheme", value: "light" }]);

    const devices = await shownDevices(d.page);
    expect(devices.map((x) => x.id).sort()).toEqual(state.devices.map((x) => x.id).sort());
    for (const dev of state.devices) {
      const shown = devices.find((x) => x.id === dev.id)!;
      expect(shown.name).toBe(dev.name);
      expect(shown.state).toBe(dev.state);
      expect(shown.windows).toEqual(dev.windows.map((w) => ({ cycle: w.cycle, first: w.firstLayer, end: w.endLayer })));
      expect(shown.text).toContain(dev.address);
    }
    // Halda's sets are explained, the lost and left-out devices say why.
    expect(devices.find((x) => x.id === "w1")!.text).toContain("its window does not fit in RAM: streamed from disk each token");
    expect(devices.find((x) => x.id === "w4")!.text).toContain("no heartbeat for 2.1 s");
    expect(devices.find((x) => x.id === "w3")!.text).toContain("it would add 310 ms per token");
    expect(devices.find((x) => x.id === "w2")!.text).toContain("62%");
    // The part of compute and sending another process had the CPU for, where the device reports it.
    expect(devices.find((x) => x.id === "w1")!.text).toMatch(/of which waiting for a CPU\s*[\s\S]{0,3}0\.65 ms/);
    expect(devices.find((x) => x.id === "head")!.text).not.toContain("waiting for a CPU");

    // Each cycle's band spans that cycle's layers (k = 2: 0-10, 11-21), every one held exactly once;
    // over the cycles every layer of the model runs exactly once.
    const bands = await expectBandsMatch(d.page, state.model.layers, state.plan!);
    expect(bands.map((b) => [b.cycle, b.first, b.end])).toEqual([[0, 0, 11], [1, 11, 22]]);
    const text = await d.page.$eval("main", (m) => (m as HTMLElement).innerText);
    for (const want of ["tinyllama-1.1b-chat", "llama", "Q4_K_M", "638 MiB", "k = 2", "18.4", "420 ms", "1.90 ms", "re-planned on 3 devices",
      "q8_0 \u00b7 11.7 KiB per token, 23.4 MiB at 2,048"]) {
      expect(text).toContain(want);
    }
    expect(await d.page.$eval("[data-stat=queue] .stat-value", (e) => e.textContent)).toBe("2");
    expect(await d.page.$$eval("svg.chart polyline", (p) => p.length)).toBe(1);
    expect(await bannerVisible(d.page)).toBe(false);

    // A state with a hole and an overlap is drawn as such, not smoothed over.
    const broken = sampleState();
    s.setState({ ...broken, plan: { ...broken.plan!, windows: broken.plan!.windows.map((w, i) => (i === 1 ? { ...w, endLayer: 6 } : i === 4 ? { ...w, firstLayer: 15 } : w)) } });
    await until("the coverage problems", async () => (await d.page.$$(".problems li")).length === 2);
    expect(await d.page.$$eval(".problems li", (l) => l.map((x) => x.textContent))).toEqual([
      "cycle 1: layer 6 held by no device", "cycle 2: layer 15 held more than once"]);
    await d.shot("a-plan-with-gap");

    // serve --parallel: each sequence slot under Requests, its request or what its cache holds
    const par = sampleState();
    s.setState({ ...par, requests: { ...par.requests, slots: [
      { id: 0, state: "processing", nCtx: 512, cachedTokens: 40, request: par.requests.active },
      { id: 1, state: "idle", nCtx: 512, cachedTokens: 12, request: null },
    ] } });
    await until("the slots", async () => (await d.page.$$(".slots li")).length === 2);
    expect(await d.page.$$eval(".slots li", (l) => l.map((x) => x.textContent))).toEqual([
      "generating slot 0: chat, 45 prompt tokens (30 reused), 112 generated", "idle slot 1: 12 of 512 tokens cached"]);
    expect(d.errors).toEqual([]);
  });

  it("shows hostile strings as text, never as markup", async () => {
    const s = await fake({ state: hostileState() });
    const d = await openDashboard(browser, s.url);
    await waitForState(d.page);
    await d.shot("b-hostile");
    const page = d.page;
    // Nothing injected ran or exists.
    expect(await page.evaluate(() => (window as unknown as { __pwned?: number }).__pwned)).toBeUndefined();
    expect(await page.$$("main img, main script, main iframe, main a, main b, aside img, header img, header b")).toHaveLength(0);
    expect(await page.$$eval("main svg", (svgs) => svgs.every((x) => x.classList.contains("chart")))).toBe(true);
    // The text is there verbatim; terminal controls are shown as visible escapes, not passed through.
    const names = (await shownDevices(page)).map((x) => x.name);
    expect(names).toContain(HOSTILE_HTML);
    const visibleTerm = String.raw`evil\x1b[2J\x1b[31mred\x07\x0d\x9b1m`;
    expect(names).toContain(visibleTerm);
    expect(names.join("")).not.toContain("\u001b");
    expect(await page.$eval("#cluster", (e) => e.textContent)).toBe(HOSTILE_HTML);
    expect(await page.$eval(".model-name", (e) => e.textContent)).toBe(`<script>window.__pwned=2</script>${visibleTerm}`);
    const lost = await page.$eval(".lost-reason", (e) => e.textContent);
    expect(lost).toContain(`<a href="javascript:window.__pwned=6">reason</a>`);
    expect(await page.$eval(".events li .ev-msg", (e) => e.textContent)).toBe(`${HOSTILE_HTML}${visibleTerm}`);
    expect(await page.$eval(".left-out li", (e) => e.textContent)).toContain(`<img src=x onerror="window.__pwned=3">`);
    expect(await page.$eval(".device .kv dd:nth-of-type(2)", (e) => e.textContent)).toBe(`<iframe src="javascript:window.__pwned=5"></iframe>`);
    expect(await page.title()).toContain("<img src=x");
    expect(d.errors).toEqual([]);
    void HOSTILE_TERM;
  });

  it("shows a banner when the server goes away and clears it when the server is back, without a reload", async () => {
    const s = await fake({ state: sampleState() });
    const d = await openDashboard(browser, s.url, { expectedErrors: /Failed to load resource|ERR_CONNECTION|ERR_EMPTY_RESPONSE|ERR_INCOMPLETE/ });
    await waitForState(d.page);
    await d.page.evaluate(() => { (window as unknown as { __loaded: number }).__loaded = 1; });
    const port = s.port;
    await s.stop();
    await until("the banner", () => bannerVisible(d.page), 10_000);
    expect(await d.page.$eval("#banner-text", (e) => e.textContent)).toMatch(/Lost the server \(.+\)\..*Reconnecting/);
    expect(await d.page.$eval("body", (b) => b.classList.contains("stale"))).toBe(true);
    await d.shot("c-banner");

    // Back on the same port, with a changed state: the page picks it up by itself.
    const next = sampleState();
    const back = await fake({ state: { ...next, cluster: "home again", requests: { ...next.requests, queueLength: 5 } }, port });
    expect(back.port).toBe(port);
    await until("the banner to clear", async () => !(await bannerVisible(d.page)), 15_000);
    await until("the new state", async () => (await d.page.$eval("#cluster", (e) => e.textContent)) === "home again");
    expect(await d.page.$eval("[data-stat=queue] .stat-value", (e) => e.textContent)).toBe("5");
    expect(await d.page.evaluate(() => (window as unknown as { __loaded?: number }).__loaded)).toBe(1); // no reload
    expect(await d.page.$eval("body", (b) => b.classList.contains("stale"))).toBe(false);
    await d.shot("c-reconnected");
    expect(d.errors).toEqual([]);
  });

  it("asks for the API key once, keeps it, and then shows the state", async () => {
    const s = await fake({ state: sampleState(), apiKey: "s3cret-key" });
    const d = await openDashboard(browser, s.url, { expectedErrors: /401/ });
    await d.page.waitForSelector("#auth:not([hidden])");
    expect(await d.page.$$("article.device")).toHaveLength(0);
    await d.shot("d-key-asked");
    await d.page.type("#auth-key", "wrong");
    await d.page.click("#auth-submit");
    await until("the refusal", async () => /refused the key: missing or wrong API key/.test(await d.page.$eval("#auth-message", (e) => e.textContent ?? "")));
    await d.page.type("#auth-key", "s3cret-key");
    await d.page.click("#auth-submit");
    await waitForState(d.page);
    expect(await d.page.$eval("#auth", (e) => (e as HTMLElement).hidden)).toBe(true);
    expect(await d.page.evaluate(() => localStorage.getItem("prima.apiKey"))).toBe("s3cret-key");
    expect(s.log).toContain("GET /api/stream 200");
    await d.shot("d-key-accepted");

    // A reload uses the kept key without asking; the chat panel sends it too.
    await d.page.reload({ waitUntil: "domcontentloaded" });
    await waitForState(d.page);
    expect(await d.page.$eval("#auth", (e) => (e as HTMLElement).hidden)).toBe(true);
    await d.page.type("#chat-input", "Tell me a story");
    await d.page.keyboard.press("Enter");
    await until("the streamed answer", async () => (await d.page.$$eval(".msg.assistant .msg-body", (b) => b.map((x) => x.textContent))).includes("Once upon a time."));
    const sent = s.log.find((l) => l.startsWith("POST /v1/chat/completions"))!;
    expect(JSON.parse(sent.slice(sent.indexOf("{")))).toMatchObject({
      model: "tinyllama-1.1b-chat", stream: true, temperature: 0.7, max_tokens: 256, messages: [{ role: "user", content: "Tell me a story" }],
    });
    await d.shot("d-chat");
    expect(d.errors).toEqual([]);
  });
});
