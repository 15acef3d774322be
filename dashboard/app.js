// The page's connection to the server: the state once (GET /api/state), then its push stream
// (GET /api/stream, SSE read through fetch so the API key can go in a header). When the server goes
// away the page says so in a banner, keeps the last state on screen (dimmed) and reconnects with
// backoff; the first state after that clears the banner.
import { setupChat } from "./chat.js";
import { fill, fmtClock, h } from "./dom.js";
import { renderAll } from "./render.js";
import { errorMessage, readEvents } from "./sse.js";

const KEY_STORE = "prima.apiKey";
/** The server sends a state at least every 2 s; this much silence means the stream is dead. */
const SILENCE_MS = 6000;
const BACKOFF_MS = [500, 1000, 2000, 4000, 5000];
const REQUEST_TIMEOUT_MS = 5000;

const $ = (id) => document.getElementById(id);
const els = {
  cluster: $("cluster"), serverStatus: $("server-status"), uptime: $("uptime"), live: $("live"),
  model: $("model"), plan: $("plan"), devices: $("devices"), links: $("links"), requests: $("requests"), events: $("events"),
  banner: $("banner"), bannerText: $("banner-text"), retry: $("banner-retry"),
  auth: $("auth"), authForm: $("auth-form"), authKey: $("auth-key"), authMessage: $("auth-message"), forget: $("forget-key"),
};

let apiKey = readStoredKey();
let lastState = null;
let lastRendered = "";
let lastUpdateMs = 0;
let lastRenderMs = 0;

function readStoredKey() {
  try { return localStorage.getItem(KEY_STORE); } catch { return null; }
}

function headers() {
  return apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
}

class AuthNeeded extends Error {}

// ---------------------------------------------------------------- the API key

let keyWaiters = [];

/** Shows the key form (once for any number of callers) and resolves when a key has been entered. */
function needKey(message) {
  fill(els.authMessage, apiKey ? `The server refused the key: ${message}` : "This server needs an API key (the one given to prima-coord serve --api-key).");
  els.auth.hidden = false;
  els.authKey.value = "";
  els.authKey.focus();
  return new Promise((resolve) => keyWaiters.push(resolve));
}

els.authForm.addEventListener("submit", (e) => {
  e.preventDefault();
  const key = els.authKey.value.trim();
  if (!key) return;
  apiKey = key;
  try { localStorage.setItem(KEY_STORE, key); } catch { /* private mode: keep it for this page only */ }
  els.auth.hidden = true;
  els.forget.hidden = false;
  const waiters = keyWaiters;
  keyWaiters = [];
  for (const w of waiters) w();
});

els.forget.hidden = !apiKey;
els.forget.addEventListener("click", () => {
  apiKey = null;
  try { localStorage.removeItem(KEY_STORE); } catch { /* nothing stored */ }
  els.forget.hidden = true;
  reconnectNow();
});

// ---------------------------------------------------------------- state

function show(state) {
  if (!state || typeof state !== "object" || !state.server || !state.model || !Array.isArray(state.devices)) {
    throw new Error("the server sent something that is not a cluster state");
  }
  lastState = state;
  lastUpdateMs = Date.now();
  // Re-render when something other than the clock changed, or every 10 s for the "ago" times; not on
  // every tick, so text stays selectable.
  const key = JSON.stringify({ ...state, server: { ...state.server, nowUnixMs: 0 } });
  if (key !== lastRendered || lastUpdateMs - lastRenderMs >= 10_000) {
    renderAll(els, state);
    lastRendered = key;
    lastRenderMs = lastUpdateMs;
  }
  connected();
}

let countdown = null;

function connected() {
  clearInterval(countdown);
  document.body.classList.remove("stale");
  els.banner.hidden = true;
  fill(els.live, h("span", { class: "dot ok" }), "live");
}

function lost(reason, delayMs, attempt) {
  document.body.classList.add("stale");
  els.banner.hidden = false;
  fill(els.live, h("span", { class: "dot bad" }), "offline");
  const since = lastUpdateMs ? ` Last update at ${fmtClock(lastUpdateMs)}.` : "";
  const at = Date.now() + delayMs;
  const draw = () => {
    const left = Math.max(0, Math.ceil((at - Date.now()) / 1000));
    fill(els.bannerText, `Lost the server (${reason}).${since} ${left > 0 ? `Reconnecting in ${left} s` : "Reconnecting"} (attempt ${attempt})\u2026`);
  };
  clearInterval(countdown);
  draw();
  countdown = setInterval(draw, 250);
}

async function fetchChecked(path, signal) {
  const r = await fetch(path, { headers: { ...headers(), Accept: path.endsWith("stream") ? "text/event-stream" : "application/json" }, signal, cache: "no-store" });
  if (r.status === 401) throw new AuthNeeded(await errorMessage(r));
  if (!r.ok) throw new Error(await errorMessage(r));
  return r;
}

/** One connection: the state, then the stream until it ends or goes silent. Throws why it ended. */
async function session(controller) {
  const timer = setTimeout(() => controller.abort(new Error("no answer within 5 s")), REQUEST_TIMEOUT_MS);
  let r;
  try {
    r = await fetchChecked("/api/state", controller.signal);
    show(await r.json());
    r = await fetchChecked("/api/stream", controller.signal);
  } finally {
    clearTimeout(timer);
  }
  attempt = 0;
  let watchdog = setTimeout(() => controller.abort(new Error(`no update for ${SILENCE_MS / 1000} s`)), SILENCE_MS);
  const alive = () => {
    clearTimeout(watchdog);
    watchdog = setTimeout(() => controller.abort(new Error(`no update for ${SILENCE_MS / 1000} s`)), SILENCE_MS);
  };
  try {
    for await (const m of readEvents(r, alive)) {
      if (m.event === "state") show(JSON.parse(m.data));
    }
  } finally {
    clearTimeout(watchdog);
  }
  throw new Error("the server closed the stream");
}

let attempt = 0;
let current = null;
let wake = null;

function reconnectNow() {
  if (wake) wake();
  else if (current) current.abort(new Error("reconnecting"));
}

function sleep(ms) {
  return new Promise((resolve) => {
    const t = setTimeout(() => { wake = null; resolve(); }, ms);
    wake = () => { clearTimeout(t); wake = null; resolve(); };
  });
}

async function run() {
  for (;;) {
    current = new AbortController();
    let reason;
    try {
      await session(current);
      reason = "the stream ended";
    } catch (err) {
      if (err instanceof AuthNeeded) {
        await needKey(err.message);
        continue;
      }
      // An abort carries our own reason (silence, timeout); a failed fetch says only "Failed to fetch".
      const cause = current.signal.aborted ? current.signal.reason : err;
      reason = cause instanceof Error ? cause.message : String(cause);
      if (/failed to fetch|networkerror|network error/i.test(reason)) reason = "cannot reach it";
    }
    current.abort(new Error("session over"));
    const delay = BACKOFF_MS[Math.min(attempt, BACKOFF_MS.length - 1)];
    attempt++;
    lost(reason, delay, attempt);
    await sleep(delay);
  }
}

els.retry.addEventListener("click", () => reconnectNow());

setupChat({
  form: $("chat-form"), input: $("chat-input"), log: $("chat-log"), send: $("chat-send"), clear: $("chat-clear"),
  temperature: $("chat-temp"), maxTokens: $("chat-max"),
}, {
  headers,
  needKey,
  modelName: () => (lastState ? lastState.model.name : null),
});

void run();
