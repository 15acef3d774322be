// Who may use serve's HTTP port, as a real browser and real clients meet it: a page of another origin
// (served by a second loopback server) cannot run a generation with a no-cors fetch or a text/plain
// form, nor read the API through DNS rebinding (a name of its own that leads to the server); with
// --cors its origin can; the dashboard's own page still works. Without a browser: Host and
// Content-Type checks, empty API keys refused at start, prompt caches kept apart per key.
import { spawnSync } from "node:child_process";
import { createServer, request, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import OpenAI from "openai";
import type { Browser, Page } from "puppeteer-core";
import { root, testConfigDir } from "../helpers/process.js";
import { killAll } from "../ring/cluster.js";
import { chromiumMissing, closeBrowsers, launchBrowser, openDashboard, waitForState } from "../dashboard/browser.js";
import { MODEL, startServe, type Served } from "./serve-harness.js";

const STORY = "Once upon a time";

afterAll(async () => {
  await closeBrowsers();
  killAll();
});

/** Requests that ended in each outcome, from /metrics. */
async function outcomes(url: string, headers: Record<string, string> = {}): Promise<Record<string, number>> {
  const text = await (await fetch(`${url}/metrics`, { headers })).text();
  return Object.fromEntries([...text.matchAll(/prima_requests_total\{outcome="(\w+)"\} (\d+)/g)].map((m) => [m[1], Number(m[2])]));
}

/** A GET with a Host header of our choosing (fetch() sets its own). */
function getWithHost(url: string, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request(url, { headers: { Host: host } }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.on("error", reject);
    req.end();
  });
}

/** A completion POSTed from a local address of our choosing; its cached_tokens. */
function cachedFrom(url: string, localAddress: string, prompt: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ prompt, max_tokens: 2, temperature: 0 });
    const req = request(`${url}/v1/completions`, { method: "POST", localAddress, headers: { "Content-Type": "application/json" } }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (text += c));
      res.on("end", () => {
        try {
          resolve((JSON.parse(text) as { usage: { prompt_tokens_details: { cached_tokens: number } } }).usage.prompt_tokens_details.cached_tokens);
        } catch (e) {
          reject(new Error(`${res.statusCode} ${text.slice(0, 300)}: ${(e as Error).message}`));
        }
      });
    });
    req.on("error", reject);
    req.setTimeout(60_000, () => req.destroy(new Error("no answer within 60 s")));
    req.end(body);
  });
}

/** Another origin on loopback: a blank page at http://127.0.0.2:PORT/. */
async function otherOrigin(): Promise<{ server: Server; port: number }> {
  const server = createServer((req, res) => {
    if (req.url === "/") {
      res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
      res.end("<!doctype html><title>another site</title><p>another site</p>");
    } else {
      res.writeHead(404);
      res.end();
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.2", resolve));
  return { server, port: (server.address() as AddressInfo).port };
}

/** The page's script: a no-cors POST (its answer is opaque to the page, but the server would run it). */
function noCorsPost(page: Page, target: string): Promise<string> {
  return page.evaluate(async (u: string, prompt: string) => {
    const r = await fetch(u, { method: "POST", mode: "no-cors", headers: { "Content-Type": "text/plain" }, body: JSON.stringify({ prompt, max_tokens: 3 }) });
    return r.type;
  }, target, STORY);
}

/** The page's script: a text/plain form whose body is JSON (`name=value` with the = inside a string). */
async function formPost(page: Page, target: string): Promise<number | undefined> {
  const [nav] = await Promise.all([
    page.waitForNavigation(),
    page.evaluate((u: string, prompt: string) => {
      const form = document.createElement("form");
      form.method = "POST";
      form.action = u;
      form.enctype = "text/plain";
      const input = document.createElement("input");
      input.name = `{"prompt":"${prompt}","max_tokens":3,"pad":"`;
      input.value = "\"}";
      form.appendChild(input);
      document.body.appendChild(form);
      form.submit();
    }, target, STORY),
  ]);
  return nav?.status();
}

/** The page's script: a CORS fetch with JSON (preflighted); the text it read, or the error. */
function corsPost(page: Page, target: string): Promise<{ ok: boolean; text: string }> {
  return page.evaluate(async (u: string, prompt: string) => {
    try {
      const r = await fetch(u, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt, max_tokens: 3, temperature: 0 }) });
      const j = (await r.json()) as { choices?: { text: string }[] };
      return { ok: r.ok, text: j.choices?.[0]?.text ?? JSON.stringify(j) };
    } catch (e) {
      return { ok: false, text: String(e) };
    }
  }, target, STORY);
}

describe.skipIf(chromiumMissing !== null)("a page of another origin, in chromium", () => {
  let s: Served;
  let other: { server: Server; port: number };
  let allowing: Served;
  let browser: Browser;
  beforeAll(async () => {
    other = await otherOrigin();
    s = await startServe(["--ctx", "256"]);
    allowing = await startServe(["--ctx", "256", "--cors", `http://127.0.0.2:${other.port}`]);
    // rebind.test and other.test: names an attacker's DNS would hand out, leading here to loopback.
    browser = await launchBrowser([
      "--host-resolver-rules=MAP rebind.test 127.0.0.1, MAP other.test 127.0.0.2",
      "--disable-features=HttpsUpgrades,HttpsFirstBalancedModeAutoEnable",
    ]);
  }, 120_000);
  afterAll(async () => {
    await closeBrowsers();
    s.proc.child.kill("SIGKILL");
    allowing.proc.child.kill("SIGKILL");
    await new Promise((r) => other.server.close(r));
  });

  it("cannot run a generation with a no-cors fetch or a text/plain form", async () => {
    const page = await browser.newPage();
    await page.goto(`http://127.0.0.2:${other.port}/`);
    const before = await outcomes(s.url);
    expect(await noCorsPost(page, `${s.url}/v1/completions`)).toBe("opaque");
    expect(await formPost(page, `${s.url}/v1/completions`)).toBe(403);
    const after = await outcomes(s.url);
    expect(after.ok).toBe(before.ok);
    expect(s.proc.stderr).not.toMatch(/request \d+ \(/);
    // Nor can it read anything with CORS.
    await page.goto(`http://127.0.0.2:${other.port}/`);
    const r = await corsPost(page, `${s.url}/v1/completions`);
    expect(r.ok).toBe(false);
    expect(r.text).toMatch(/Failed to fetch/);
  });

  it("cannot read the API through DNS rebinding: a Host that is not this server's is refused", async () => {
    // The page is at http://rebind.test:PORT, a name leading to the server: same-origin for the
    // browser, so only the Host header tells the server apart.
    const port = new URL(s.url).port;
    const page = await browser.newPage();
    const nav = await page.goto(`http://rebind.test:${port}/api/state`);
    expect(nav?.status()).toBe(403);
    const read = await page.evaluate(async () => {
      const state = await fetch("/api/state");
      const gen = await fetch("/v1/completions", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt: "x", max_tokens: 2 }) });
      return [state.status, gen.status, await state.text()];
    });
    expect(read.slice(0, 2)).toEqual([403, 403]);
    expect(read[2]).toMatch(/--allow-host/);
  });

  it("with --cors ORIGIN, that origin's page can call the API (preflight and all); others still cannot", async () => {
    const page = await browser.newPage();
    await page.goto(`http://127.0.0.2:${other.port}/`);
    const before = await outcomes(allowing.url);
    const r = await corsPost(page, `${allowing.url}/v1/completions`);
    expect(r.ok, r.text).toBe(true);
    expect(r.text.length).toBeGreaterThan(0);
    expect((await outcomes(allowing.url)).ok).toBe(before.ok + 1);
    // Still only JSON: its text/plain no-cors POST runs nothing (415).
    await noCorsPost(page, `${allowing.url}/v1/completions`);
    expect((await outcomes(allowing.url)).ok).toBe(before.ok + 1);
    // The same server from a page of an origin it does not name.
    await page.goto(`http://other.test:${other.port}/`);
    const refused = await corsPost(page, `${allowing.url}/v1/completions`);
    expect(refused.ok).toBe(false);
    expect((await outcomes(allowing.url)).ok).toBe(before.ok + 1);
  });

  it("the dashboard served at / still works from its own origin, chat included", async () => {
    const d = await openDashboard(browser, `${s.url}/`);
    await waitForState(d.page);
    const before = await outcomes(s.url);
    const status = await d.page.evaluate(async () => {
      const r = await fetch("/v1/chat/completions", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ messages: [{ role: "user", content: "Hi" }], max_tokens: 2 }) });
      return r.status;
    });
    expect(status).toBe(200);
    expect((await outcomes(s.url)).ok).toBe(before.ok + 1);
    expect(d.errors).toEqual([]);
  });
});

describe("Host, Content-Type and API keys, without a browser", () => {
  let s: Served;
  beforeAll(async () => {
    s = await startServe(["--ctx", "256", "--allow-host", "prima.home"]);
  }, 60_000);
  afterAll(() => s.proc.child.kill("SIGKILL"));

  it("answers only requests whose Host names it (loopback names, its address, --allow-host)", async () => {
    const port = new URL(s.url).port;
    for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, "LOCALHOST", `[::1]:${port}`, `prima.home:${port}`, "app.localhost"]) {
      expect(await getWithHost(`${s.url}/v1/models`, host), host).toBe(200);
    }
    for (const host of [`evil.example:${port}`, "prima.home.evil.example", "127.0.0.1.nip.io", "a b"]) {
      expect(await getWithHost(`${s.url}/v1/models`, host), host).toBe(403);
    }
    // HTTP/1.0 without a Host header at all.
    const { connect } = await import("node:net");
    const answer = await new Promise<string>((resolve, reject) => {
      let text = "";
      const sock = connect(Number(port), "127.0.0.1", () => sock.write("GET /v1/models HTTP/1.0\r\n\r\n"));
      sock.setEncoding("utf8");
      sock.on("data", (c: string) => (text += c));
      sock.on("end", () => resolve(text));
      sock.on("error", reject);
    });
    expect(answer).toMatch(/^HTTP\/1\.1 403 /);
  });

  it("parses a browser's body as JSON only when sent as application/json (415 otherwise); other clients' whatever its type, as llama-server and Ollama do", async () => {
    const body = JSON.stringify({ prompt: STORY, max_tokens: 2 });
    // What a page of this server's own origin sends (Origin, Sec-Fetch-*), with a form's or a no-cors fetch's type.
    const pageHeaders = [{ Origin: s.url }, { "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "no-cors" }];
    for (const type of [undefined, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]) {
      for (const page of pageHeaders) {
        const r = await fetch(`${s.url}/v1/completions`, { method: "POST", body, headers: { ...page, ...(type ? { "Content-Type": type } : {}) } });
        expect(r.status, `${type} ${JSON.stringify(page)}`).toBe(415);
        expect(((await r.json()) as { error: { code: string } }).error.code).toBe("unsupported_media_type");
      }
      // curl -d sends application/x-www-form-urlencoded: Ollama's and llama-server's examples work.
      const asks: [string, object][] = [
        ["/v1/completions", { prompt: STORY, max_tokens: 2 }], ["/api/generate", { prompt: STORY, stream: false, options: { num_predict: 2 } }], ["/completion", { prompt: STORY, n_predict: 2 }],
      ];
      for (const [path, ask] of asks) {
        const r = await fetch(`${s.url}${path}`, { method: "POST", body: JSON.stringify(ask), headers: type ? { "Content-Type": type } : {} });
        expect(r.status, `${path} ${type}: ${await r.clone().text()}`).toBe(200);
      }
    }
    const ok = await fetch(`${s.url}/v1/completions`, { method: "POST", body, headers: { Origin: s.url, "Content-Type": "Application/JSON; charset=utf-8" } });
    expect(ok.status).toBe(200);
  });

  it("refuses an empty or blank API key at start instead of running without one", () => {
    const run = (args: string[], env: NodeJS.ProcessEnv = {}) => spawnSync(process.execPath, [`${root}dist/coordinator/cli.js`, "serve", MODEL, "--no-discovery", "--port", "0", ...args], {
      cwd: root, encoding: "utf8", timeout: 30_000, env: { ...process.env, XDG_CONFIG_HOME: testConfigDir, PRIMA_API_KEY: undefined, ...env },
    });
    for (const [args, env, source] of [
      [["--api-key", ""], {}, "--api-key"],
      [["--api-key", "   "], {}, "--api-key"],
      [["--api-key", "good", "--api-key", ""], {}, "--api-key"],
      [[], { PRIMA_API_KEY: "" }, "PRIMA_API_KEY"],
      [[], { PRIMA_API_KEY: " " }, "PRIMA_API_KEY"],
    ] as const) {
      const r = run([...args], env);
      expect(r.status, `${args.join(" ")} ${JSON.stringify(env)}: ${r.stderr}`).toBe(2);
      expect(r.stderr).toContain(`${source} is empty`);
      expect(r.stderr).not.toMatch(/listening/);
    }
    const spaced = run(["--api-key", " key"]);
    expect(spaced.status).toBe(2);
    expect(spaced.stderr).toMatch(/without spaces/);
  });

  it("without keys, keeps each client address's prompt cache to itself", async () => {
    const secret = "Once upon a time there was a girl named Lily who had a secret";
    await cachedFrom(s.url, "127.0.0.1", secret);
    expect(await cachedFrom(s.url, "127.0.0.1", `${secret} box`)).toBeGreaterThan(10);
    expect(await cachedFrom(s.url, "127.0.0.2", `${secret} box`)).toBe(0);
    // And back: the other client's request replaced the cache, so nothing of it shows either.
    expect(await cachedFrom(s.url, "127.0.0.1", `${secret} box`)).toBe(0);
  });
});

describe("serve with two API keys", () => {
  let s: Served;
  beforeAll(async () => {
    s = await startServe(["--ctx", "256", "--api-key", "alice-key", "--api-key", "bob-key"], { apiKey: "alice-key" });
  }, 60_000);
  afterAll(() => s.proc.child.kill("SIGKILL"));

  const cached = (r: OpenAI.Completions.Completion) => (r.usage as { prompt_tokens_details?: { cached_tokens?: number } }).prompt_tokens_details?.cached_tokens;

  it("takes each key exactly (no trimming, no prefix), and no other", async () => {
    const status = async (auth: string) => (await fetch(`${s.url}/v1/models`, { headers: { Authorization: auth } })).status;
    expect(await status("Bearer alice-key")).toBe(200);
    expect(await status("bearer bob-key")).toBe(200);
    for (const wrong of ["Bearer alice-ke", "Bearer alice-key2", "Bearer alice-key bob-key", "Bearer  ", "alice-key", "Bearer ALICE-KEY"]) {
      expect(await status(wrong), wrong).toBe(401);
    }
  });

  it("keeps each key's prompt cache to itself: cached_tokens tells bob nothing of alice's prompt", async () => {
    const alice = s.client;
    const bob = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: "bob-key", maxRetries: 0, timeout: 60_000 });
    const secret = "Once upon a time there was a girl named Lily who had a secret";
    await alice.completions.create({ prompt: secret, max_tokens: 2, temperature: 0 });
    // Alice again: her own cache serves her.
    const again = await alice.completions.create({ prompt: `${secret} box`, max_tokens: 2, temperature: 0 });
    expect(cached(again)).toBeGreaterThan(10);
    // Bob guesses the same prefix: nothing is reused, nothing is revealed.
    const guess = await bob.completions.create({ prompt: `${secret} box`, max_tokens: 2, temperature: 0 });
    expect(cached(guess)).toBe(0);
    expect(guess.choices[0].text).toBe(again.choices[0].text);
  });
});
