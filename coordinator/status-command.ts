// prima-coord status [host:port]: the dashboard's state (GET /api/state of a running `serve`) in the
// terminal, for headless devices. --json prints the state as the server sent it; --watch redraws
// every 2 s and keeps retrying when the server is away. Every string the server sends passes through
// printable() first: device names and errors come from other machines and must not drive the terminal.
import { parseArgs } from "node:util";
import { printable } from "../discovery/index.js";
import type { ClusterState, DeviceState } from "./state.js";

const HELP = `usage: prima-coord status [host:port] [options]

  host:port        the server (prima-coord serve); default 127.0.0.1:8080
  --json           print the state as JSON, exactly as GET /api/state returns it
  --watch          redraw every 2 s until Ctrl-C (with --json: one JSON line every 2 s)
  --api-key KEY    the server's API key (serve --api-key; also from PRIMA_API_KEY, as serve reads it)`;

const DEFAULT_ADDRESS = "127.0.0.1:8080";
const WATCH_MS = 2000;
const TIMEOUT_MS = 5000;

/** Where output goes (tests pass their own). */
export interface StatusIo {
  readonly out: (text: string) => void;
  readonly err: (text: string) => void;
  /** Colours and screen clearing (stdout is a terminal and NO_COLOR is unset). */
  readonly tty: boolean;
}

const processIo: StatusIo = {
  out: (t) => process.stdout.write(t),
  err: (t) => process.stderr.write(t),
  tty: process.stdout.isTTY === true && !process.env.NO_COLOR,
};

class StatusError extends Error {
  override name = "StatusError";
}

/** "host:port", ":port", "port", "[::1]:port" or an http(s) URL, to the server's base URL. */
export function serverUrl(address: string): URL {
  let a = address.trim();
  if (/^\d+$/.test(a)) a = `127.0.0.1:${a}`;
  if (a.startsWith(":")) a = `127.0.0.1${a}`;
  if (!/^https?:\/\//i.test(a)) a = `http://${a}`;
  let url: URL;
  try {
    url = new URL(a);
  } catch {
    throw new StatusError(`"${printable(address)}" is not host:port`);
  }
  if (!url.port) throw new StatusError(`"${printable(address)}" has no port (host:port, e.g. ${DEFAULT_ADDRESS})`);
  return url;
}

/** GET /api/state: the body's text and the parsed state, or a StatusError saying what went wrong. */
export async function fetchState(base: URL, apiKey: string | undefined): Promise<{ text: string; state: ClusterState }> {
  const url = new URL("/api/state", base);
  let r: Response;
  try {
    r = await fetch(url, { headers: apiKey ? { Authorization: `Bearer ${apiKey}` } : {}, signal: AbortSignal.timeout(TIMEOUT_MS) });
  } catch (e) {
    const cause = e instanceof Error && e.cause instanceof Error ? e.cause : e;
    const why = cause instanceof Error ? ((cause as NodeJS.ErrnoException).code ?? cause.message) : String(cause);
    throw new StatusError(`cannot reach prima-coord serve at ${base.host} (${printable(why)}); is it running?`);
  }
  const text = await r.text();
  if (r.status === 401) {
    throw new StatusError(`the server at ${base.host} refused the request (${printable(errorText(text))}); pass its key with --api-key KEY`);
  }
  if (!r.ok) throw new StatusError(`the server at ${base.host} answered ${r.status}: ${printable(errorText(text))}`);
  let state: ClusterState;
  try {
    state = JSON.parse(text) as ClusterState;
  } catch {
    throw new StatusError(`the server at ${base.host} did not send JSON for /api/state; is it prima-coord serve?`);
  }
  if (!state || typeof state !== "object" || !state.server || !state.model || !Array.isArray(state.devices)) {
    throw new StatusError(`the server at ${base.host} sent something that is not a cluster state`);
  }
  return { text, state };
}

function errorText(body: string): string {
  try {
    const e = (JSON.parse(body) as { error?: { message?: unknown } }).error;
    if (e && typeof e.message === "string") return e.message;
  } catch {
    // Not an OpenAI-style error: show the body's start.
  }
  return body.slice(0, 200) || "no message";
}

// ---------------------------------------------------------------- the terminal view

const SET_WORDS: Readonly<Record<string, string>> = {
  M1: "its windows do not fit in RAM: part of its weights is streamed from disk each token (macOS, CPU)",
  M2: "its windows do not fit in RAM: its weights are re-read from disk each token (macOS with Metal)",
  M3: "its window does not fit in RAM: streamed from disk each token",
  M4: "its windows fit in RAM: no disk reads per token",
};

const TIMES: Readonly<Record<number, string>> = { 1: "once", 2: "twice", 3: "three times", 4: "four times" };
const num = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v);
const t = (v: unknown, max?: number): string => printable(String(v ?? "-"), max);

function bytes(n: number | null): string {
  if (!num(n)) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(i === 0 || v >= 100 ? 0 : 1)} ${units[i]}`;
}
const ms = (v: number | null | undefined): string => (num(v) ? `${v >= 100 ? v.toFixed(0) : v.toFixed(1)} ms` : "-");
const pct = (f: number | null): string => (num(f) ? `${(f * 100).toFixed(0)}%` : "-");
const rate = (b: number | null): string => (num(b) ? (b >= 1e9 ? `${(b / 1e9).toFixed(2)} GB/s` : `${(b / 1e6).toFixed(0)} MB/s`) : "-");
function ago(msSpan: number): string {
  const s = Math.max(0, Math.round(msSpan / 1000));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}
function clock(unixMs: number): string {
  const d = new Date(unixMs);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((x) => String(x).padStart(2, "0")).join(":");
}
const range = (first: number, end: number): string => (end - first === 1 ? `${first}` : `${first}-${end - 1}`);

interface Style { bold(s: string): string; dim(s: string): string; red(s: string): string; green(s: string): string; yellow(s: string): string }
function style(tty: boolean): Style {
  const sgr = (code: string) => (s: string) => (tty ? `\x1b[${code}m${s}\x1b[0m` : s);
  return { bold: sgr("1"), dim: sgr("2"), red: sgr("31"), green: sgr("32"), yellow: sgr("33") };
}

function stateWord(d: DeviceState, st: Style): string {
  const word = d.state === "loading" && num(d.loadProgress) ? `loading ${pct(d.loadProgress)}` : d.state;
  if (d.state === "lost") return st.red(word);
  if (d.state === "ready" || d.state === "busy") return st.green(word);
  if (d.state === "left-out") return st.dim(word);
  return st.yellow(word);
}

function deviceLines(s: ClusterState, d: DeviceState, st: Style): string[] {
  const out: string[] = [];
  const where = [t(d.address, 60), d.os ? t(d.os, 60) : null, d.cpu ? `${t(d.cpu, 60)}${num(d.threads) ? `, ${d.threads} threads` : ""}` : null].filter(Boolean).join(" · ");
  out.push(`${st.bold(t(d.name, 60))} ${st.dim(`(${d.isHead && d.id === "head" ? "head" : `${t(d.id, 20)}${d.isHead ? ", head" : ""}`})`)}  ${stateWord(d, st)}  ${where}`);
  if (d.state === "lost") out.push(`    ${st.red(`lost: ${t(d.detail ?? "no reason given", 200)}`)}`);
  else if (d.state === "left-out") {
    const why = s.plan?.leftOut.find((x) => x.device === d.id)?.reason ?? d.detail;
    out.push(`    left out: ${t(why ?? "no reason given", 200)}`);
  } else if (d.detail) out.push(`    ${t(d.detail, 200)}`);
  if (d.windows.length) {
    const resident = d.windows.reduce((a, w) => a + (w.residentBytes ?? 0), 0);
    const total = d.windows.reduce((a, w) => a + (w.totalBytes ?? 0), 0);
    const known = d.windows.every((w) => num(w.residentBytes) && num(w.totalBytes));
    out.push(`    windows  ${d.windows.map((w) => `cycle ${w.cycle + 1}: ${range(w.firstLayer, w.endLayer)}`).join(", ")}` +
      `  ${known && total > 0 ? `${pct(resident / total)} in RAM (${bytes(resident)} of ${bytes(total)})` : "not read yet"}` +
      (d.windows.some((w) => num(w.expertsTotal) && w.expertsTotal > 0)
        ? `, experts ${d.windows.reduce((a, w) => a + (w.expertsResident ?? 0), 0)} / ${d.windows.reduce((a, w) => a + (w.expertsTotal ?? 0), 0)} resident` : ""));
  }
  out.push(`    memory   ${bytes(d.ramAvailableBytes)} available of ${bytes(d.ramTotalBytes)} · anonymous ${bytes(d.anonRssBytes)}` +
    ` · pressure ${pct(d.memPressure)} · disk ${rate(d.diskReadBytesPerS)} · GPU ${d.gpu?.present ? `${d.gpu.name ? `${t(d.gpu.name, 40)}, ` : ""}${d.gpu.used ? "used" : "not used"}` : "none"}`);
  if (d.set) out.push(`    set      ${t(d.set, 8)}: ${SET_WORDS[d.set] ?? "unknown set"}`);
  const p = d.predicted;
  const m = d.measured;
  if (p || m) {
    const pred = p ? `predicted ${ms(p.totalMs)} (compute ${ms(p.computeMs)}, memory ${ms(p.memoryMs)}, disk ${ms(p.diskMs)}, sending ${ms(p.commMs)})` : "predicted -";
    const meas = m ? `measured ${ms(m.computeMs + m.waitMs + m.sendMs)} (compute ${ms(m.computeMs)}, waiting ${ms(m.waitMs)}, sending ${ms(m.sendMs)}${m.descheduledMs ? `, of which ${ms(m.descheduledMs)} waiting for a CPU` : ""}, ${m.majorFaultsPerToken.toFixed(1)} page faults/token; ${m.tokens} tokens)` : "measured -";
    out.push(`    ms/token ${pred}`, `             ${meas}`);
  }
  return out;
}

/** "q8_0" or "K q8_0, V q4_0" (names from the state: escaped as any string from it). */
function kvLabel(k: { typeK: string; typeV: string }): string {
  return k.typeK === k.typeV ? t(k.typeK, 20) : `K ${t(k.typeK, 20)}, V ${t(k.typeV, 20)}`;
}

/** The state as lines of text for a terminal (no trailing newline). */
export function renderStatus(s: ClusterState, base: URL, tty = false): string {
  const st = style(tty);
  const name = (id: string) => t(s.devices.find((x) => x.id === id)?.name ?? id, 40);
  const lines: string[] = [];
  const srv = s.server;
  lines.push(`${st.bold(`prima cluster ${t(s.cluster, 60)}`)}  ${srv.ready ? st.green("ready") : st.yellow("not ready")}: ${t(srv.status, 120)}` +
    `  ${st.dim(`(${base.host}, up ${ago(srv.nowUnixMs - srv.startedUnixMs)})`)}`);
  const m = s.model;
  lines.push(`model    ${t(m.name, 80)} · ${t(m.architecture, 20)} · ${m.layers} layers · ${bytes(m.sizeBytes)} · ${t(m.quantization, 20)} · context ${m.contextTokens}` +
    (m.kvCache && num(m.kvCache.bytesPerToken) ? ` · KV ${kvLabel(m.kvCache)} ${bytes(m.kvCache.bytesPerToken)}/token` : ""));
  const plan = s.plan;
  if (plan) {
    lines.push(`plan     k = ${plan.cycles} (each token goes ${TIMES[plan.cycles] ?? `${plan.cycles} times`} around the ring) · ${t(plan.planner, 30)}, generation ${plan.generation}` +
      (num(plan.predictedMsPerToken) ? ` · predicted ${ms(plan.predictedMsPerToken)}/token (${(1000 / plan.predictedMsPerToken).toFixed(1)} tok/s)` : ""));
    lines.push(`ring     ${plan.ringOrder.map((id, i) => `${name(id)} (${plan.layersPerCycle[i] ?? "?"})`).join(" -> ")}`);
    for (let c = 0; c < plan.cycles; c++) {
      const wins = plan.windows.filter((w) => w.cycle === c).sort((a, b) => a.firstLayer - b.firstLayer);
      lines.push(`  cycle ${c + 1}  ${wins.map((w) => `${name(w.device)} ${range(w.firstLayer, w.endLayer)}`).join(" | ")}`);
    }
    for (const x of plan.leftOut) lines.push(`  left out ${name(x.device)}: ${t(x.reason, 200)}`);
    for (const n of plan.notes) lines.push(`  note: ${t(n, 200)}`);
  } else {
    lines.push("plan     none yet (waiting for devices)");
  }
  lines.push("", st.bold(`devices (${s.devices.length})`));
  const ring = plan?.ringOrder ?? [];
  const pos = (d: DeviceState) => { const i = ring.indexOf(d.id); return i < 0 ? ring.length : i; };
  for (const d of [...s.devices].sort((a, b) => pos(a) - pos(b) || a.joinedUnixMs - b.joinedUnixMs)) lines.push(...deviceLines(s, d, st).map((l) => `  ${l}`));
  if (s.links.length) {
    lines.push("", `links    ${s.links.map((l) => `${name(l.from)} -> ${name(l.to)} ${num(l.hopMs) ? ms(l.hopMs) : "?"}`).join(" · ")}`);
  }
  const r = s.requests;
  const a = r.active;
  lines.push("", `requests queue ${r.queueLength} · ${r.completed} completed · ${r.failed} failed · ${r.generatedTokens} tokens generated`);
  if (a) {
    lines.push(`  now    ${t(a.kind, 20)} ${t(a.id, 40)}: ${num(a.tokensPerS) ? `${a.tokensPerS.toFixed(1)} tok/s` : "- tok/s"}, first token ${ms(a.timeToFirstTokenMs)},` +
      ` ${a.promptTokens} prompt tokens (${a.cachedTokens} reused), ${a.generatedTokens} generated`);
  }
  // serve --parallel: one entry per sequence slot
  if (Array.isArray(r.slots)) {
    lines.push(`  slots  ${r.slots.map((x) => x.request
      ? `${x.id} ${t(x.request.kind, 20)} ${x.request.generatedTokens} generated`
      : `${x.id} idle ${x.cachedTokens}/${x.nCtx} cached`).join(" · ")}`);
  }
  const events = s.events.slice(-6);
  if (events.length) {
    lines.push("", "events");
    for (const e of events) lines.push(`  ${clock(e.unixMs)} ${t(e.kind, 12).padEnd(9)} ${e.kind === "lost" || e.kind === "error" ? st.red(t(e.message, 200)) : t(e.message, 200)}`);
  }
  return lines.join("\n");
}

// ---------------------------------------------------------------- the command

export async function statusCommand(argv: string[], io: StatusIo = processIo): Promise<number> {
  let values: { json?: boolean; watch?: boolean; "api-key"?: string; help?: boolean };
  let positionals: string[];
  try {
    ({ values, positionals } = parseArgs({
      args: argv,
      allowPositionals: true,
      options: { json: { type: "boolean" }, watch: { type: "boolean" }, "api-key": { type: "string" }, help: { type: "boolean", short: "h" } },
    }));
  } catch (e) {
    io.err(`status: ${e instanceof Error ? e.message : String(e)}\n${HELP}\n`);
    return 2;
  }
  if (values.help) {
    io.out(`${HELP}\n`);
    return 0;
  }
  if (positionals.length > 1) {
    io.err(`status: one server address at most (got ${positionals.length})\n${HELP}\n`);
    return 2;
  }
  let base: URL;
  try {
    base = serverUrl(positionals[0] ?? DEFAULT_ADDRESS);
  } catch (e) {
    io.err(`status: ${(e as Error).message}\n`);
    return 2;
  }
  const key = values["api-key"] ?? (process.env.PRIMA_API_KEY || undefined);

  if (!values.watch) {
    try {
      const { text, state } = await fetchState(base, key);
      io.out(values.json ? (text.endsWith("\n") ? text : `${text}\n`) : `${renderStatus(state, base, io.tty)}\n`);
      return 0;
    } catch (e) {
      if (!(e instanceof StatusError)) throw e;
      io.err(`status: ${e.message}\n`);
      return 1;
    }
  }

  // Watch: redraw until Ctrl-C; a missing server is a line on the screen, not the end.
  let stop!: () => void;
  const stopped = new Promise<void>((resolve) => { stop = resolve; });
  const onSignal = () => stop();
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  let downSince: number | null = null;
  const stopping = stopped.then(() => "stop" as const);
  try {
    for (;;) {
      let screen: string;
      try {
        // Ctrl-C during a slow request ends at once instead of after the request's timeout.
        const got = await Promise.race([fetchState(base, key), stopping]);
        if (got === "stop") return 0;
        downSince = null;
        screen = values.json ? `${JSON.stringify(got.state)}\n` : `${renderStatus(got.state, base, io.tty)}\n`;
      } catch (e) {
        if (!(e instanceof StatusError)) throw e;
        downSince ??= Date.now();
        screen = `status: ${e.message}\n  retrying every ${WATCH_MS / 1000} s since ${clock(downSince)} (Ctrl-C stops)\n`;
        if (values.json) { io.err(screen); screen = ""; }
      }
      // Home and clear only on a terminal; piped output gets one block after another.
      if (screen) io.out(io.tty && !values.json ? `\x1b[H\x1b[2J${screen}` : `${screen}${values.json ? "" : "\n"}`);
      let timer: NodeJS.Timeout | undefined;
      const tick = new Promise<"tick">((resolve) => { timer = setTimeout(() => resolve("tick"), WATCH_MS); });
      const which = await Promise.race([tick, stopping]);
      clearTimeout(timer);
      if (which === "stop") return 0;
    }
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}
