// ClusterState (coordinator/state.ts) to DOM. Each section is rebuilt from the state when the state
// changes; sections hold no inputs, so rebuilding loses nothing the user typed.
import { DASH, fill, fmtAgo, fmtBytes, fmtClock, fmtInt, fmtMs, fmtNum, fmtPct, fmtRate, h, isNum, meter, s } from "./dom.js";

/** Halda's memory sets, in words (HALDA.md section 2.2). */
const SET_WORDS = {
  M1: "its windows do not fit in RAM: part of its weights is streamed from disk each token (macOS, CPU)",
  M2: "its windows do not fit in RAM: its weights are re-read from disk each token (macOS with Metal)",
  M3: "its window does not fit in RAM: streamed from disk each token",
  M4: "its windows fit in RAM: no disk reads per token",
};

const STATE_WORDS = {
  joining: "joining",
  profiling: "measuring itself",
  loading: "loading its windows",
  ready: "ready",
  busy: "generating",
  lost: "lost",
  "left-out": "left out",
};

// Distinct on light and dark backgrounds; a device keeps its colour for the page's lifetime.
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6", "#d37295", "#8cd17d"];
const colours = new Map();
function colourOf(id) {
  if (!colours.has(id)) colours.set(id, PALETTE[colours.size % PALETTE.length]);
  return colours.get(id);
}

function swatch(id) {
  const el = h("span", { class: "swatch" });
  el.style.background = colourOf(id);
  return el;
}

function deviceLabel(state, id) {
  const d = state.devices.find((x) => x.id === id);
  return d ? d.name : id;
}

/** Devices in ring order, then the others in the order they joined. */
function orderedDevices(state) {
  const ring = state.plan ? state.plan.ringOrder : [];
  const pos = (d) => { const i = ring.indexOf(d.id); return i < 0 ? ring.length + 1 : i; };
  return [...state.devices].sort((a, b) => pos(a) - pos(b) || a.joinedUnixMs - b.joinedUnixMs);
}

function kv(rows) {
  return h("dl", { class: "kv" }, rows.filter(Boolean).map(([k, v]) => [h("dt", null, k), h("dd", null, v)]));
}

function layerRange(first, end) {
  return end - first === 1 ? `layer ${first}` : `layers ${first}\u2013${end - 1}`;
}

// ---------------------------------------------------------------- header and model

export function renderHeader(els, state) {
  fill(els.cluster, state.cluster || "prima");
  document.title = `${state.cluster || "prima"} \u00b7 prima`;
  const srv = state.server;
  const word = srv.ready ? "ready" : "not ready";
  fill(els.serverStatus, h("span", { class: ["pill", srv.ready ? "ok" : "warn"] }, word), srv.status && srv.status !== word ? ` ${srv.status}` : "");
  fill(els.uptime, `up ${fmtAgo(srv.nowUnixMs - srv.startedUnixMs)}`, ` \u00b7 cluster port ${srv.clusterPort}`);
}

export function renderModel(el, state) {
  const m = state.model;
  fill(el,
    h("h2", null, "Model"),
    h("div", { class: "model-name" }, m.name),
    kv([
      ["architecture", m.architecture],
      ["layers", fmtInt(m.layers)],
      ["size", fmtBytes(m.sizeBytes)],
      ["quantization", m.quantization],
      ["context", `${fmtInt(m.contextTokens)} tokens`],
      m.kvCache && isNum(m.kvCache.bytesPerToken) && ["KV cache",
        `${m.kvCache.typeK === m.kvCache.typeV ? m.kvCache.typeK : `K ${m.kvCache.typeK}, V ${m.kvCache.typeV}`} \u00b7 ${fmtBytes(m.kvCache.bytesPerToken)} per token, ${fmtBytes(m.kvCache.bytesPerToken * m.contextTokens)} at ${fmtInt(m.contextTokens)}` +
          (isNum(m.kvCache.sequenceSlots) ? `, ${fmtBytes(m.kvCache.bytesPerToken * m.contextTokens * m.kvCache.sequenceSlots)} for ${fmtInt(m.kvCache.sequenceSlots)} sequence slots` : "")],
      m.kvCache && typeof m.kvCache.attention === "string" && m.kvCache.attention !== "dense" && ["attention", m.kvCache.attention],
      ["file", h("span", { class: "mono wrap" }, m.path)],
      ["fingerprint", h("span", { class: "mono", title: m.fingerprint }, String(m.fingerprint).slice(0, 16))],
    ]));
}

// ---------------------------------------------------------------- the plan

const TIMES = { 1: "once", 2: "twice", 3: "three times", 4: "four times" };

/**
 * The layers cycle c runs: with W layers per cycle, [c*W, (c+1)*W) (ring/windows.ts). When the plan's
 * numbers do not add up to the model, the span of the cycle's windows, so the page still draws them.
 */
export function cycleLayers(plan, layers, c) {
  const W = plan.layersPerCycle.reduce((a, b) => a + b, 0);
  if (W > 0 && W * plan.cycles === layers) return [c * W, (c + 1) * W];
  const wins = plan.windows.filter((w) => w.cycle === c);
  if (!wins.length) return [0, 0];
  return [Math.min(...wins.map((w) => w.firstLayer)), Math.max(...wins.map((w) => w.endLayer))];
}

/**
 * What is wrong with the plan's windows: in each cycle every one of its layers held exactly once, and
 * over all cycles every layer of the model exactly once. Empty when the plan is sound.
 */
export function checkCoverage(plan, layers) {
  const problems = [];
  const runs = (count, lo, hi, pred) => {
    const out = [];
    for (let l = lo; l < hi; l++) {
      if (!pred(count[l])) continue;
      let e = l;
      while (e + 1 < hi && pred(count[e + 1])) e++;
      out.push([l, e + 1]);
      l = e;
    }
    return out;
  };
  const total = new Array(layers).fill(0);
  for (let c = 0; c < plan.cycles; c++) {
    const [lo, hi] = cycleLayers(plan, layers, c);
    const count = new Array(layers).fill(0);
    for (const w of plan.windows) {
      if (w.cycle !== c) continue;
      if (w.firstLayer < lo || w.endLayer > hi) problems.push(`cycle ${c + 1}: the window of ${w.device} (${layerRange(w.firstLayer, w.endLayer)}) is outside the cycle's ${layerRange(lo, hi)}`);
      for (let l = Math.max(0, w.firstLayer); l < Math.min(layers, w.endLayer); l++) { count[l]++; total[l]++; }
    }
    for (const [a, b] of runs(count, lo, hi, (n) => n === 0)) problems.push(`cycle ${c + 1}: ${layerRange(a, b)} held by no device`);
    for (const [a, b] of runs(count, lo, hi, (n) => n > 1)) problems.push(`cycle ${c + 1}: ${layerRange(a, b)} held more than once`);
  }
  if (!problems.length) {
    for (const [a, b] of runs(total, 0, layers, (n) => n === 0)) problems.push(`${layerRange(a, b)} of the model run in no cycle`);
  }
  return problems;
}

/** One cycle's band: its layers left to right, a segment per window in the device's colour. */
function band(state, cycle) {
  const [lo, hi] = cycleLayers(state.plan, state.model.layers, cycle);
  const wins = state.plan.windows.filter((w) => w.cycle === cycle).sort((a, b) => a.firstLayer - b.firstLayer);
  const row = h("div", { class: "band", "data-cycle": cycle, "data-first": lo, "data-end": hi });
  let at = lo;
  const seg = (first, end, cls, dev) => {
    const name = dev === null ? "no device" : deviceLabel(state, dev);
    const el = h("div", {
      class: ["seg", cls],
      "data-device": dev ?? "",
      "data-first": first,
      "data-end": end,
      title: `${name}: ${layerRange(first, end)} (cycle ${cycle + 1})`,
    }, h("span", { class: "seg-label" }, name), h("span", { class: "seg-range" }, end - first === 1 ? `${first}` : `${first}\u2013${end - 1}`));
    el.style.flexGrow = String(Math.max(0, end - first));
    if (dev !== null) el.style.background = colourOf(dev);
    row.appendChild(el);
  };
  for (const w of wins) {
    if (w.firstLayer > at) seg(at, w.firstLayer, "gap", null);
    seg(w.firstLayer, w.endLayer, null, w.device);
    at = Math.max(at, w.endLayer);
  }
  if (at < hi) seg(at, hi, "gap", null);
  return row;
}

export function renderPlan(el, state) {
  const plan = state.plan;
  if (!plan) {
    fill(el, h("h2", null, "Plan"), h("p", { class: "muted" }, "No plan yet: the ring is waiting for devices to join and measure themselves."));
    return;
  }
  const k = plan.cycles;
  const problems = checkCoverage(plan, state.model.layers);
  const ring = h("div", { class: "ring-order" });
  plan.ringOrder.forEach((id, i) => {
    if (i > 0) ring.appendChild(h("span", { class: "arrow" }, "\u2192"));
    ring.appendChild(h("span", { class: "chip" }, swatch(id), deviceLabel(state, id),
      h("span", { class: "muted" }, ` ${fmtInt(plan.layersPerCycle[i])} layers/cycle`)));
  });
  ring.appendChild(h("span", { class: "arrow muted", title: "back to the first device for the next cycle" }, k > 1 ? `\u21ba \u00d7${k}` : ""));

  const bands = h("div", { class: "bands" });
  for (let c = 0; c < k; c++) {
    const [lo, hi] = cycleLayers(plan, state.model.layers, c);
    bands.append(h("div", { class: "band-label" }, h("strong", null, `cycle ${c + 1}`), h("br"), layerRange(lo, hi)), band(state, c));
  }

  fill(el,
    h("h2", null, "Plan", h("span", { class: "sub" }, ` generation ${plan.generation} \u00b7 ${plan.planner} \u00b7 made ${fmtClock(plan.madeUnixMs)}`)),
    h("p", { class: "lead" },
      `k = ${k}: each token goes around the ring ${TIMES[k] ?? `${k} times`}, every device running one window of its layers in each cycle. `,
      isNum(plan.predictedMsPerToken) ? `Predicted ${fmtMs(plan.predictedMsPerToken)} per token (${fmtNum(1000 / plan.predictedMsPerToken)} tokens/s).` : ""),
    ring,
    bands,
    problems.length ? h("ul", { class: "problems" }, problems.map((p) => h("li", null, p))) : null,
    plan.leftOut.length ? h("div", { class: "left-out" }, h("h3", null, "Left out by Halda"),
      h("ul", null, plan.leftOut.map((x) => h("li", null, h("strong", null, deviceLabel(state, x.device)), `: ${x.reason}`)))) : null,
    plan.notes.length ? h("ul", { class: "notes" }, plan.notes.map((n) => h("li", null, n))) : null,
  );
}

// ---------------------------------------------------------------- devices

function gpuText(g) {
  if (!g || !g.present) return "none";
  return `${g.name ? `${g.name}, ` : ""}${g.used ? "used" : "present, not used"}`;
}

function windowsBlock(d, state) {
  if (!d.windows.length) return h("p", { class: "muted" }, d.state === "left-out" ? "holds no layers" : "no windows");
  return h("ul", { class: "windows" }, d.windows.map((w) => {
    const frac = isNum(w.residentBytes) && isNum(w.totalBytes) && w.totalBytes > 0 ? w.residentBytes / w.totalBytes : null;
    return h("li", { "data-cycle": w.cycle, "data-first": w.firstLayer, "data-end": w.endLayer },
      h("span", { class: "win-name" }, `cycle ${w.cycle + 1}: ${layerRange(w.firstLayer, w.endLayer)}`),
      h("span", { class: "muted" }, ` (${w.endLayer - w.firstLayer} of ${state.model.layers})`),
      meter(frac, "residency"),
      h("span", { class: "win-res muted" }, frac === null ? "not read yet" : `${fmtPct(frac)} in RAM (${fmtBytes(w.residentBytes)} of ${fmtBytes(w.totalBytes)})`),
      isNum(w.expertsResident) && isNum(w.expertsTotal) && w.expertsTotal > 0
        ? h("span", { class: "win-experts muted" }, `, experts ${w.expertsResident} / ${w.expertsTotal} resident`) : null);
  }));
}

const PART_CLASSES = ["p-compute", "p-memory", "p-disk", "p-wait", "p-send"];

function stacked(parts, scale) {
  const bar = h("div", { class: "stack" });
  parts.forEach((v, i) => {
    if (!isNum(v) || v <= 0 || !(scale > 0)) return;
    const seg = h("div", { class: PART_CLASSES[i] });
    seg.style.width = `${(v / scale) * 100}%`;
    bar.appendChild(seg);
  });
  return bar;
}

function timingBlock(d) {
  const p = d.predicted;
  const m = d.measured;
  if (!p && !m) return h("p", { class: "muted" }, "No timing yet.");
  const mTotal = m ? m.computeMs + m.waitMs + m.sendMs : null;
  const scale = Math.max(p ? p.totalMs : 0, mTotal ?? 0);
  const row = (label, pv, mv) => h("tr", null, h("th", null, label), h("td", null, pv), h("td", null, mv));
  return h("div", { class: "timing" },
    h("table", null,
      h("thead", null, h("tr", null, h("th", null, "ms per token"), h("th", null, "predicted"), h("th", null, m ? `measured (${fmtInt(m.tokens)} tokens)` : "measured"))),
      h("tbody", null,
        row(h("span", null, h("i", { class: "key p-compute" }), "compute"), p ? fmtMs(p.computeMs) : DASH, m ? fmtMs(m.computeMs) : DASH),
        row(h("span", null, h("i", { class: "key p-memory" }), "reading weights from RAM"), p ? fmtMs(p.memoryMs) : DASH, m ? "in compute" : DASH),
        row(h("span", null, h("i", { class: "key p-disk" }), "page faults (disk)"), p ? fmtMs(p.diskMs) : DASH,
          m ? `${fmtNum(m.majorFaultsPerToken)} faults/token` : DASH),
        row(h("span", null, h("i", { class: "key p-wait" }), "waiting for its predecessor"), DASH, m ? fmtMs(m.waitMs) : DASH),
        row(h("span", null, h("i", { class: "key p-send" }), "sending"), p ? fmtMs(p.commMs) : DASH, m ? fmtMs(m.sendMs) : DASH),
        // Part of compute and sending: another process (another device, on a shared machine) had the CPU.
        m && isNum(m.descheduledMs) ? row(h("span", { class: "muted" }, "of which waiting for a CPU"), DASH, fmtMs(m.descheduledMs)) : null,
        h("tr", { class: "total" }, h("th", null, "total"), h("td", null, p ? fmtMs(p.totalMs) : DASH), h("td", null, m ? fmtMs(mTotal) : DASH)),
      )),
    p ? h("div", { class: "stack-row" }, h("span", { class: "muted" }, "predicted"), stacked([p.computeMs, p.memoryMs, p.diskMs, 0, p.commMs], scale)) : null,
    m ? h("div", { class: "stack-row" }, h("span", { class: "muted" }, "measured"), stacked([m.computeMs, 0, 0, m.waitMs, m.sendMs], scale)) : null,
  );
}

function deviceCard(d, state) {
  const leftOut = state.plan ? state.plan.leftOut.find((x) => x.device === d.id) : undefined;
  const ramUsed = isNum(d.ramTotalBytes) && isNum(d.ramAvailableBytes) && d.ramTotalBytes > 0 ? 1 - d.ramAvailableBytes / d.ramTotalBytes : null;
  const stripe = h("div", { class: "stripe" });
  stripe.style.background = colourOf(d.id);
  const statusLine = h("div", { class: "status-line" },
    h("span", { class: ["pill", `st-${d.state}`], "data-state": d.state }, STATE_WORDS[d.state] ?? d.state),
    d.state === "loading" && isNum(d.loadProgress) ? h("span", { class: "progress" }, meter(d.loadProgress, "load"), ` ${fmtPct(d.loadProgress)}`) : null,
    d.detail && d.state !== "lost" && d.state !== "left-out" ? h("span", { class: "detail" }, d.detail) : null);
  return h("article", { class: ["device", `st-${d.state}`], "data-device": d.id },
    stripe,
    h("header", null,
      h("h3", { class: "device-name" }, d.name),
      h("span", { class: "badges" },
        d.isHead ? h("span", { class: "badge head" }, "head") : null,
        d.isHead && d.id === "head" ? null : h("span", { class: "badge" }, d.id),
        isNum(d.ringPosition) ? h("span", { class: "badge" }, `ring #${d.ringPosition + 1}`) : null)),
    statusLine,
    d.state === "lost" ? h("div", { class: "alert lost-reason" }, "Lost: ", d.detail || "no reason given") : null,
    d.state === "left-out" || leftOut ? h("div", { class: "alert info left-out-reason" }, "Left out: ", leftOut ? leftOut.reason : d.detail || "no reason given") : null,
    kv([
      ["address", h("span", { class: "mono" }, d.address)],
      ["OS", d.os ?? DASH],
      ["CPU", `${d.cpu ?? DASH}${isNum(d.threads) ? ` \u00b7 ${d.threads} threads` : ""}`],
      ["RAM", h("span", { class: "ram" }, meter(ramUsed, "ram"),
        `${fmtBytes(d.ramAvailableBytes)} available of ${fmtBytes(d.ramTotalBytes)}`)],
      ["anonymous memory", isNum(d.anonRssBytes) ? `${fmtBytes(d.anonRssBytes)} (KV cache and working set)` : DASH],
      ["memory pressure", isNum(d.memPressure) ? `${fmtPct(d.memPressure)} of RAM: largest drop of available memory in the last run` : DASH],
      ["disk read", fmtRate(d.diskReadBytesPerS)],
      ["GPU", gpuText(d.gpu)],
      d.set ? ["Halda's set", h("span", { class: "set" }, h("strong", null, d.set), `: ${SET_WORDS[d.set] ?? "unknown set"}`)] : null,
      ["joined", `${fmtAgo(state.server.nowUnixMs - d.joinedUnixMs)} ago`],
    ]),
    h("h4", null, "Windows"),
    windowsBlock(d, state),
    h("h4", null, "Time per token"),
    timingBlock(d));
}

export function renderDevices(el, state) {
  const devices = orderedDevices(state);
  const missing = state.plan ? state.plan.leftOut.filter((x) => !state.devices.some((d) => d.id === x.device)) : [];
  fill(el,
    h("h2", null, "Devices", h("span", { class: "sub" }, ` ${devices.length} joined`)),
    h("div", { class: "devices" }, devices.map((d) => deviceCard(d, state))),
    missing.length ? h("ul", { class: "muted" }, missing.map((x) => h("li", null, `${x.device}: left out: ${x.reason}`))) : null);
}

// ---------------------------------------------------------------- links

export function renderLinks(el, state) {
  fill(el, h("h2", null, "Links"),
    state.links.length
      ? h("table", { class: "links" },
        h("thead", null, h("tr", null, h("th", null, "from"), h("th", null, "to"), h("th", null, "hop (one token)"))),
        h("tbody", null, state.links.map((l) => h("tr", null,
          h("td", null, swatch(l.from), deviceLabel(state, l.from)),
          h("td", null, swatch(l.to), deviceLabel(state, l.to)),
          h("td", { class: "num" }, isNum(l.hopMs) ? fmtMs(l.hopMs) : "not measured")))))
      : h("p", { class: "muted" }, "No links: the ring is not wired."));
}

// ---------------------------------------------------------------- requests and chart

const CHART_SPAN_MS = 5 * 60_000;

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 2.5, 5, 10].map((m) => m * p).find((x) => x >= v) ?? v;
}

export function chart(history, nowMs) {
  const W = 360, H = 120, padL = 34, padB = 18, padT = 8, padR = 6;
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": "tokens per second over the last 5 minutes" });
  const end = isNum(nowMs) ? nowMs : Date.now();
  const start = end - CHART_SPAN_MS;
  const pts = history.filter((p) => isNum(p.unixMs) && isNum(p.tokensPerS) && p.unixMs >= start);
  const top = niceMax(Math.max(0, ...pts.map((p) => p.tokensPerS)));
  const x = (t) => padL + ((t - start) / CHART_SPAN_MS) * (W - padL - padR);
  const y = (v) => H - padB - (v / top) * (H - padB - padT);
  for (const f of [0, 0.5, 1]) {
    svg.appendChild(s("line", { x1: padL, x2: W - padR, y1: y(top * f), y2: y(top * f), class: "grid" }));
    svg.appendChild(s("text", { x: padL - 4, y: y(top * f) + 3, class: "ylabel" }, fmtNum(top * f, top * f >= 10 || f === 0 ? 0 : 1)));
  }
  for (const [t, label] of [[start, "\u22125 min"], [end - CHART_SPAN_MS / 2, "\u22122.5"], [end, "now"]]) {
    svg.appendChild(s("text", { x: x(t), y: H - 4, class: "xlabel" }, label));
  }
  if (pts.length === 1) {
    svg.appendChild(s("circle", { cx: x(pts[0].unixMs).toFixed(1), cy: y(pts[0].tokensPerS).toFixed(1), r: 3, class: "point" }));
  } else if (pts.length >= 2) {
    const line = pts.map((p) => `${x(p.unixMs).toFixed(1)},${y(p.tokensPerS).toFixed(1)}`).join(" ");
    svg.appendChild(s("polygon", { points: `${x(pts[0].unixMs).toFixed(1)},${y(0)} ${line} ${x(pts[pts.length - 1].unixMs).toFixed(1)},${y(0)}`, class: "area" }));
    svg.appendChild(s("polyline", { points: line, class: "line" }));
  } else {
    svg.appendChild(s("text", { x: W / 2, y: H / 2, class: "empty" }, "no tokens generated yet"));
  }
  return svg;
}

export function renderRequests(el, state) {
  const r = state.requests;
  const a = r.active;
  fill(el,
    h("h2", null, "Requests"),
    h("div", { class: "stats" },
      stat(a && isNum(a.tokensPerS) ? fmtNum(a.tokensPerS) : DASH, "tokens/s now", "tps"),
      stat(a && isNum(a.timeToFirstTokenMs) ? fmtMs(a.timeToFirstTokenMs) : DASH, "time to first token", "ttft"),
      stat(fmtInt(r.queueLength), "waiting in queue", "queue")),
    a ? h("p", { class: "active" }, h("span", { class: "pill st-busy" }, "generating"), " ",
      `${a.kind} ${a.id}: ${fmtInt(a.promptTokens)} prompt tokens (${fmtInt(a.cachedTokens)} reused), ${fmtInt(a.generatedTokens)} generated, started ${fmtAgo(state.server.nowUnixMs - a.startedUnixMs)} ago`)
      : h("p", { class: "muted active" }, "Idle: no request running."),
    // serve --parallel N: each sequence slot, idle (with what its cache holds) or its request
    r.slots ? h("ul", { class: "slots small" }, ...r.slots.map((x) => h("li", { "data-slot": String(x.id) },
      h("span", { class: `pill ${x.request ? "st-busy" : "st-ready"}` }, x.request ? "generating" : "idle"), " ",
      x.request
        ? `slot ${x.id}: ${x.request.kind}, ${fmtInt(x.request.promptTokens)} prompt tokens (${fmtInt(x.request.cachedTokens)} reused), ${fmtInt(x.request.generatedTokens)} generated`
        : `slot ${x.id}: ${fmtInt(x.cachedTokens)} of ${fmtInt(x.nCtx)} tokens cached`))) : null,
    chart(r.history, state.server.nowUnixMs),
    h("p", { class: "muted small" }, `${fmtInt(r.completed)} completed \u00b7 ${fmtInt(r.failed)} failed \u00b7 ${fmtInt(r.generatedTokens)} tokens generated since start`));
}

function stat(value, label, id) {
  return h("div", { class: "stat", "data-stat": id }, h("div", { class: "stat-value" }, value), h("div", { class: "stat-label" }, label));
}

// ---------------------------------------------------------------- events

export function renderEvents(el, state) {
  const events = [...state.events].reverse().slice(0, 60);
  fill(el, h("h2", null, "Recent events"),
    events.length
      ? h("ol", { class: "events" }, events.map((e) => h("li", { class: `ev-${e.kind}` },
        h("time", null, fmtClock(e.unixMs)), h("span", { class: "ev-kind" }, e.kind), h("span", { class: "ev-msg" }, e.message))))
      : h("p", { class: "muted" }, "Nothing has happened yet."));
}

/** Renders every section; `els` maps section names to their elements in index.html. */
export function renderAll(els, state) {
  renderHeader(els, state);
  renderModel(els.model, state);
  renderPlan(els.plan, state);
  renderDevices(els.devices, state);
  renderLinks(els.links, state);
  renderRequests(els.requests, state);
  renderEvents(els.events, state);
}
