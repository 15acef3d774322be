// Who may use serve's HTTP port, checked before any route: the Host a request names (DNS rebinding),
// the Origin a browser page sends (cross-site requests: a no-cors fetch, a text/plain form), and the
// API keys. A browser always sends Host, and Origin on every POST and cross-origin request, so a page
// on another site reaches nothing unless `--cors` names its origin; non-browser clients (curl, the
// openai SDK) send neither Origin nor Sec-Fetch-* and are only asked for the key.
import { createHash, timingSafeEqual } from "node:crypto";
import type { IncomingMessage } from "node:http";
import { hostname, networkInterfaces } from "node:os";
import { printable } from "../model/index.js";

export interface GuardOptions {
  /** API keys; each is a client of its own (its own prefix cache). Empty: no key is asked for. */
  readonly apiKeys?: readonly string[];
  /** More names the Host header may carry (`--allow-host`); "*" allows any. */
  readonly allowHosts?: readonly string[];
  /** Origins whose pages may call the API (`--cors`); "*" allows any. */
  readonly corsOrigins?: readonly string[];
}

/** Why a request is refused: a status and a message for the client. */
export interface Refusal {
  readonly status: number;
  readonly message: string;
  readonly code: string;
}

/** What the guard found out about a request that passed. */
export interface Admitted {
  /** The cross-origin page's origin that `--cors` allows; its responses carry CORS headers. */
  readonly corsOrigin?: string;
}

/** An API key must be something a client can send back exactly: visible ASCII, no spaces. Throws
 * with a message naming `source` otherwise (an empty key must never turn authentication off). */
export function checkApiKey(key: string, source: string): void {
  if (key.trim() === "") {
    throw new Error(`${source} is empty: an empty API key would leave the server open to anyone; give a key, or leave it out to run without one`);
  }
  if (!/^[\x21-\x7e]+$/.test(key)) {
    throw new Error(`${source} must be visible ASCII characters without spaces (a client sends it as "Authorization: Bearer KEY")`);
  }
}

const sha256 = (s: string) => createHash("sha256").update(s, "utf8").digest();

/** The host name of a Host header (lowercase, without port or IPv6 brackets); undefined if malformed. */
export function hostName(header: string): string | undefined {
  const h = header.toLowerCase();
  if (h.startsWith("[")) {
    const end = h.indexOf("]");
    if (end < 0 || (end + 1 < h.length && !/^:\d{1,5}$/.test(h.slice(end + 1)))) return undefined;
    return h.slice(1, end);
  }
  const m = /^([a-z0-9.\-_]+)(?::\d{1,5})?$/.exec(h);
  return m?.[1];
}

const WILDCARD_ADDRESSES = new Set(["0.0.0.0", "::", ""]);

export class RequestGuard {
  private readonly keyHashes: readonly Buffer[];
  private readonly allowHosts: ReadonlySet<string>;
  private readonly corsOrigins: ReadonlySet<string>;
  private bound: string | undefined;

  constructor(o: GuardOptions) {
    o.apiKeys?.forEach((k, i) => checkApiKey(k, `API key ${i + 1}`));
    this.keyHashes = (o.apiKeys ?? []).map(sha256);
    // A name given with a port or IPv6 brackets means its host name.
    this.allowHosts = new Set((o.allowHosts ?? []).map((h) => (h === "*" ? h : hostName(h) ?? h.toLowerCase())));
    this.corsOrigins = new Set((o.corsOrigins ?? []).map((c) => (c === "*" ? c : new URL(c).origin)));
  }

  get needsKey(): boolean {
    return this.keyHashes.length > 0;
  }

  /** The address the server listens on: its Host names are allowed too (every interface's for a
   * wildcard address). */
  bind(address: string): void {
    this.bound = address.toLowerCase().replace(/^\[(.*)\]$/, "$1");
  }

  /** The Host check and the Origin check, in that order. */
  admit(req: IncomingMessage): Refusal | Admitted {
    const host = req.headers.host;
    const name = host === undefined ? undefined : hostName(host);
    if (name === undefined || !this.hostAllowed(name)) {
      const shown = host === undefined ? "no Host header" : `Host "${printable(host, 80)}"`;
      return {
        status: 403, code: "host_not_allowed",
        message: `${shown} does not name this server; if it does (a name on your network, a reverse proxy), start serve with --allow-host NAME`,
      };
    }
    const origin = req.headers.origin;
    if (origin !== undefined) {
      if (this.sameOrigin(origin, host!)) return {};
      if (this.corsOrigins.has("*") || this.corsOrigins.has(origin)) return { corsOrigin: origin };
      return {
        status: 403, code: "cross_origin",
        message: `requests from pages of another origin (${printable(origin, 80)}) are refused; start serve with --cors ORIGIN to allow one`,
      };
    }
    // A browser request without Origin (a no-cors GET, an image) still says where it comes from; only
    // a top-level navigation (a link, a bookmark) may come from another site.
    const site = req.headers["sec-fetch-site"];
    if ((site === "cross-site" || site === "same-site") && req.headers["sec-fetch-mode"] !== "navigate" && !this.corsOrigins.has("*")) {
      return { status: 403, code: "cross_origin", message: "requests from pages of another origin are refused; start serve with --cors ORIGIN to allow one" };
    }
    return {};
  }

  private hostAllowed(name: string): boolean {
    if (this.allowHosts.has("*") || this.allowHosts.has(name)) return true;
    // Names that always mean this machine (RFC 6761: *.localhost resolves to loopback).
    if (name === "localhost" || name.endsWith(".localhost") || name === "::1" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(name)) return true;
    const me = hostname().toLowerCase();
    if (name === me || name === `${me}.local`) return true;
    if (this.bound === undefined) return false;
    if (!WILDCARD_ADDRESSES.has(this.bound)) return name === this.bound;
    // Listening on every interface: any of their addresses (read now: they change with DHCP).
    for (const list of Object.values(networkInterfaces())) {
      for (const a of list ?? []) if (a.address.toLowerCase() === name) return true;
    }
    return false;
  }

  /** The page's origin is this server as the request names it (the dashboard's own requests). */
  private sameOrigin(origin: string, host: string): boolean {
    try {
      const u = new URL(origin);
      return (u.protocol === "http:" || u.protocol === "https:") && u.host === new URL(`${u.protocol}//${host}`).host;
    } catch {
      return false;
    }
  }

  /** The headers a response to an allowed cross-origin page carries. */
  static corsHeaders(origin: string): Record<string, string> {
    return { "Access-Control-Allow-Origin": origin, Vary: "Origin" };
  }

  /** The answer to a CORS preflight (OPTIONS) from an allowed origin: the methods and the headers it
   * asked for (the openai SDK sends a few of its own beside Authorization and Content-Type). */
  static preflightHeaders(origin: string, req: IncomingMessage): Record<string, string> {
    const asked = req.headers["access-control-request-headers"] ?? "";
    const headers = /^[A-Za-z0-9\-_, ]{0,1000}$/.test(asked) && asked.trim() !== "" ? asked : "Authorization, Content-Type";
    return {
      ...RequestGuard.corsHeaders(origin),
      "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
      "Access-Control-Allow-Headers": headers,
      "Access-Control-Max-Age": "600",
    };
  }

  /**
   * The key a request presents, checked against every key in constant time (hashes of equal length,
   * compared without stopping at a match): its index, -1 for a wrong or missing key, or undefined
   * when the server asks for none. The key is taken exactly as sent (no trimming).
   */
  keyIndex(req: IncomingMessage): number | undefined {
    if (this.keyHashes.length === 0) return undefined;
    const m = /^Bearer +(.+)$/is.exec(req.headers.authorization ?? "");
    const presented = sha256(m ? m[1] : "");
    let found = -1;
    this.keyHashes.forEach((h, i) => {
      if (timingSafeEqual(presented, h) && found < 0) found = i;
    });
    return m ? found : -1;
  }
}

/**
 * Why a request's body may not be read as JSON, or undefined when it may. A browser page (it sends
 * Origin or Sec-Fetch-Site) must send application/json, which a cross-site form or no-cors fetch cannot;
 * other clients may send any type, as llama-server and Ollama accept (`curl -d` sends
 * application/x-www-form-urlencoded, and Ollama's own examples rely on it).
 */
export function bodyTypeRefusal(req: IncomingMessage): string | undefined {
  const type = (req.headers["content-type"] ?? "").split(";")[0].trim().toLowerCase();
  if (type === "application/json") return undefined;
  // Browsers send Origin on every POST and Sec-Fetch-Site on every request (Node's fetch sends only
  // Sec-Fetch-Mode, so that one does not tell).
  const browser = req.headers.origin !== undefined || req.headers["sec-fetch-site"] !== undefined;
  if (!browser) return undefined;
  const got = type === "" ? "no Content-Type" : `Content-Type ${printable(type, 80)}`;
  return `a request from a web page must send its body as Content-Type: application/json (got ${got})`;
}
