// DOM building and number formatting for the page. Every string reaches the DOM as a text node or an
// attribute value set through the DOM API, never as markup: the state carries device names, OS
// strings and errors that other machines wrote.

const SVG_NS = "http://www.w3.org/2000/svg";

/**
 * Characters that could fake a layout or hide text become visible escapes, as the terminal shows them
 * (discovery/escape.ts): C0, DEL and C1 controls as \xNN (ESC is \x1b), bidirectional and line
 * controls and lone surrogates as \u{NNNN}. Plain ASCII, so every font can show them.
 */
const UNPRINTABLE = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]/gu;
/** The same, keeping tabs and line feeds (a chat message has lines; a device name does not). */
const UNPRINTABLE_IN_TEXT = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]/gu;
export function shown(value, multiline = false) {
  return String(value ?? "").replace(multiline ? UNPRINTABLE_IN_TEXT : UNPRINTABLE, (c) => {
    const code = c.codePointAt(0);
    return code < 0x100 ? `\\x${code.toString(16).padStart(2, "0")}` : `\\u{${code.toString(16)}}`;
  });
}

function build(el, props, children) {
  for (const [k, v] of Object.entries(props ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    // Event handler attributes would turn data into code; handlers are attached with addEventListener.
    if (/^on/i.test(k)) throw new Error(`h(): refusing attribute ${k}`);
    if (k === "class") el.setAttribute("class", Array.isArray(v) ? v.filter(Boolean).join(" ") : String(v));
    else el.setAttribute(k, k === "title" ? shown(v) : String(v));
  }
  append(el, children);
  return el;
}

/** Appends children: nodes as they are, strings and numbers as text, arrays flattened, null skipped. */
export function append(el, children) {
  for (const c of [children].flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.appendChild(c instanceof Node ? c : document.createTextNode(shown(c)));
  }
  return el;
}

/** A text node for prose with lines (chat messages): tabs and line feeds kept, other controls escaped. */
export function textLines(value) {
  return document.createTextNode(shown(value, true));
}

/** An HTML element: h("div", { class: "card" }, "text", child...). */
export function h(tag, props, ...children) {
  return build(document.createElement(tag), props, children);
}

/** An SVG element. */
export function s(tag, props, ...children) {
  return build(document.createElementNS(SVG_NS, tag), props, children);
}

/** Replaces an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

export const DASH = "\u2014";

export const isNum = (v) => typeof v === "number" && Number.isFinite(v);

export function fmtBytes(n) {
  if (!isNum(n)) return DASH;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(i === 0 || v >= 100 ? 0 : 1)} ${units[i]}`;
}

/** Speeds in decimal units, as disks are sold. */
export function fmtRate(bytesPerS) {
  if (!isNum(bytesPerS)) return DASH;
  if (bytesPerS >= 1e9) return `${(bytesPerS / 1e9).toFixed(2)} GB/s`;
  return `${(bytesPerS / 1e6).toFixed(bytesPerS >= 1e8 ? 0 : 1)} MB/s`;
}

export function fmtMs(ms) {
  if (!isNum(ms)) return DASH;
  return `${ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toFixed(2)} ms`;
}

export function fmtNum(n, digits = 1) {
  return isNum(n) ? n.toFixed(digits) : DASH;
}

export function fmtPct(fraction) {
  return isNum(fraction) ? `${(fraction * 100).toFixed(fraction < 0.1 ? 1 : 0)}%` : DASH;
}

export function fmtInt(n) {
  return isNum(n) ? Math.round(n).toLocaleString("en-US") : DASH;
}

export function fmtClock(unixMs) {
  if (!isNum(unixMs)) return DASH;
  const d = new Date(unixMs);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((x) => String(x).padStart(2, "0")).join(":");
}

export function fmtAgo(ms) {
  if (!isNum(ms)) return DASH;
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

/** A labelled horizontal meter; fraction 0..1 (null: empty, marked unknown). */
export function meter(fraction, cls) {
  const bar = h("div", { class: ["meter", cls, isNum(fraction) ? null : "unknown"] });
  const fillEl = h("div", { class: "meter-fill" });
  fillEl.style.width = `${Math.max(0, Math.min(1, isNum(fraction) ? fraction : 0)) * 100}%`;
  bar.appendChild(fillEl);
  return bar;
}
