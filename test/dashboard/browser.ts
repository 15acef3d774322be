// Browser helpers for the dashboard's tests (this suite and the real-cluster one): Debian's chromium
// through puppeteer-core (never a downloaded browser), a page that records its errors and CSP
// violations, screenshots into test-artifacts/, and readers for what the page shows.
import { expect } from "vitest";
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import puppeteer, { type Browser, type Page } from "puppeteer-core";
import { root } from "../helpers/process.js";

export const CHROMIUM = process.env.PRIMA_CHROMIUM ?? "/usr/bin/chromium";

/** Why the browser tests cannot run here, or null when they can. */
export const chromiumMissing: string | null = existsSync(CHROMIUM)
  ? null
  : `skipped: no chromium at ${CHROMIUM} (Debian: apt-get install chromium; or set PRIMA_CHROMIUM)`;

/** Screenshots go here; the folder is git-ignored. */
export const ARTIFACTS = join(root, "test-artifacts", "dashboard");

const browsers = new Set<Browser>();

/** `extraArgs`: more chromium switches (e.g. --host-resolver-rules for names that lead to loopback). */
export async function launchBrowser(extraArgs: readonly string[] = []): Promise<Browser> {
  const browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--headless=new", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage", ...extraArgs],
    protocolTimeout: 30_000,
  });
  browsers.add(browser);
  browser.once("disconnected", () => browsers.delete(browser));
  return browser;
}

/** Closes every browser these helpers launched (afterAll; kills one that does not close in 5 s). */
export async function closeBrowsers(): Promise<void> {
  await Promise.all([...browsers].map(async (b) => {
    const proc = b.process();
    const timer = setTimeout(() => proc?.kill("SIGKILL"), 5000);
    try { await b.close(); } catch { proc?.kill("SIGKILL"); } finally { clearTimeout(timer); }
  }));
  browsers.clear();
}

export interface DashboardPage {
  readonly page: Page;
  /** Console errors, uncaught exceptions and CSP violations the page reported. */
  readonly errors: string[];
  /** Writes test-artifacts/dashboard/<name>.png (full page) and returns its path. */
  shot(name: string): Promise<string>;
}

export interface OpenOptions {
  /** Put into localStorage before the page's scripts run, as if typed earlier. */
  readonly apiKey?: string;
  readonly width?: number;
  readonly height?: number;
  /** Ignore console errors matching this (e.g. the 401 and connection errors a test provokes). */
  readonly expectedErrors?: RegExp;
}

export async function openDashboard(browser: Browser, url: string, opts: OpenOptions = {}): Promise<DashboardPage> {
  const page = await browser.newPage();
  await page.setViewport({ width: opts.width ?? 1440, height: opts.height ?? 1000 });
  page.setDefaultTimeout(15_000);
  const errors: string[] = [];
  const expected = opts.expectedErrors;
  page.on("console", (m) => {
    if (m.type() === "error" && !(expected && expected.test(m.text()))) errors.push(`console: ${m.text()}`);
  });
  page.on("pageerror", (e) => errors.push(`exception: ${e instanceof Error ? e.message : String(e)}`));
  if (opts.apiKey !== undefined) {
    const key = opts.apiKey;
    await page.evaluateOnNewDocument((k: string) => localStorage.setItem("prima.apiKey", k), key);
  }
  // A CSP violation means the page tried to load or run something not its own.
  await page.evaluateOnNewDocument(() => {
    document.addEventListener("securitypolicyviolation", (e) => console.error(`CSP violation: ${e.violatedDirective} ${e.blockedURI}`));
  });
  await page.goto(url, { waitUntil: "domcontentloaded" });
  mkdirSync(ARTIFACTS, { recursive: true });
  return {
    page,
    errors,
    async shot(name) {
      const path = join(ARTIFACTS, `${name}.png`);
      await page.screenshot({ path: path as `${string}.png`, fullPage: true });
      return path;
    },
  };
}

/** Waits until the page shows a state (the device cards are drawn). */
export async function waitForState(page: Page, timeoutMs = 15_000): Promise<void> {
  await page.waitForSelector("article.device", { timeout: timeoutMs });
}

export async function bannerVisible(page: Page): Promise<boolean> {
  return page.$eval("#banner", (b) => !(b as HTMLElement).hidden && getComputedStyle(b).display !== "none");
}

export interface ShownDevice { id: string; name: string; state: string; text: string; windows: { cycle: number; first: number; end: number }[] }

/** The device cards as the page shows them. */
export async function shownDevices(page: Page): Promise<ShownDevice[]> {
  return page.$$eval("article.device", (cards) => cards.map((c) => ({
    id: c.getAttribute("data-device") ?? "",
    name: c.querySelector(".device-name")?.textContent ?? "",
    state: c.querySelector("[data-state]")?.getAttribute("data-state") ?? "",
    text: (c as HTMLElement).innerText,
    windows: [...c.querySelectorAll(".windows li")].map((li) => ({
      cycle: Number(li.getAttribute("data-cycle")),
      first: Number(li.getAttribute("data-first")),
      end: Number(li.getAttribute("data-end")),
    })),
  })));
}

export interface ShownBand {
  cycle: number;
  /** The cycle's layers, [first, end). */
  first: number;
  end: number;
  segments: { device: string; first: number; end: number; widthPx: number }[];
  widthPx: number;
}

/** The plan's layer bands: per cycle, its segments left to right ("" device: a gap). */
export async function shownBands(page: Page): Promise<ShownBand[]> {
  return page.$$eval(".band", (bands) => bands.map((b) => ({
    cycle: Number(b.getAttribute("data-cycle")),
    first: Number(b.getAttribute("data-first")),
    end: Number(b.getAttribute("data-end")),
    widthPx: b.getBoundingClientRect().width,
    segments: [...b.querySelectorAll(".seg")].map((s) => ({
      device: s.getAttribute("data-device") ?? "",
      first: Number(s.getAttribute("data-first")),
      end: Number(s.getAttribute("data-end")),
      widthPx: s.getBoundingClientRect().width,
    })),
  })));
}

/** Polls `fn` until it returns true; throws with `what` after timeoutMs. */
export async function until(what: string, fn: () => Promise<boolean> | boolean, timeoutMs = 15_000, everyMs = 100): Promise<void> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** The plan's bands as the page draws them: one per cycle, each holding its cycle's layers exactly once
 * in ring order with widths proportional to layers, the plan's windows as drawn, and over all cycles
 * every layer of the model exactly once. */
export async function expectBandsMatch(page: Page, layers: number, plan: {
  ringOrder: readonly string[]; windows: readonly { device: string; firstLayer: number; endLayer: number; cycle: number }[];
}): Promise<ShownBand[]> {
  const bands = await shownBands(page);
  const overall = new Array<number>(layers).fill(0);
  for (const band of bands) {
    const held = new Array<number>(layers).fill(0);
    for (const seg of band.segments) {
      expect(seg.device, "no gap segments").not.toBe("");
      for (let l = seg.first; l < seg.end; l++) { held[l]++; overall[l]++; }
      expect(Math.abs(seg.widthPx - ((seg.end - seg.first) / (band.end - band.first)) * band.widthPx)).toBeLessThan(1.5);
    }
    expect(held.slice(band.first, band.end)).toEqual(new Array<number>(band.end - band.first).fill(1));
    expect(band.segments.map((x) => x.device)).toEqual(plan.ringOrder);
    expect(band.segments.map((x) => [x.device, x.first, x.end])).toEqual(
      plan.windows.filter((w) => w.cycle === band.cycle).map((w) => [w.device, w.firstLayer, w.endLayer]));
  }
  expect(overall).toEqual(new Array<number>(layers).fill(1));
  return bands;
}
