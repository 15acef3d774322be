// Clusters on the local network: the coordinator publishes `_prima._tcp` on its cluster (gRPC) port
// with a TXT record (cluster name, protocol version, model name and fingerprint); workers browse for
// it. Discovery is only a hint for where to dial: liveness comes from the control plane's heartbeats
// (a crashed coordinator never sends a goodbye), so every lookup is a fresh query, never a cache.
import { isIPv4 } from "node:net";
import { hostname } from "node:os";
import type { Service } from "bonjour-service";
import { printable } from "../base/index.js";
import { DiscoveryError, openMdns, type MdnsOptions } from "./mdns.js";

/** The DNS-SD service type: `_prima._tcp`. */
export const SERVICE_TYPE = "prima";
/** How long a worker listens before saying that nothing answered. */
export const DISCOVERY_TIMEOUT_MS = 3000;
/** After the first answer, how long to wait for other clusters before choosing. */
export const DISCOVERY_GRACE_MS = 500;
const GOODBYE_LIMIT_MS = 1000;
const REQUERY_FIRST_MS = 1000;
const REQUERY_MAX_MS = 30_000;
/** A DNS label (the cluster name is one, and part of the instance name) holds at most 63 bytes. */
const MAX_LABEL_BYTES = 63;
/** Each TXT string is at most 255 bytes including its key. */
const MAX_TXT_VALUE_BYTES = 200;

export interface ClusterAd {
  /** The cluster's name (serve --name): what `prima-worker --cluster NAME` selects. */
  readonly name: string;
  /** The coordinator's cluster (gRPC) port. */
  readonly port: number;
  readonly model: string;
  readonly fingerprint: string;
  readonly protocolVersion: number;
}

export interface PublishOptions extends ClusterAd, MdnsOptions {}

export interface Publication {
  /** The DNS-SD instance name (unique per host and port). */
  readonly instance: string;
  /** Sends a goodbye and closes the socket; resolves within about two seconds. */
  stop(): Promise<void>;
}

/** A cluster that answered. Every string is escaped (printable) and bounded: safe to print. */
export interface FoundCluster {
  readonly name: string;
  /** The address the answer came from (the coordinator's address on this network). */
  readonly host: string;
  readonly port: number;
  readonly model: string;
  readonly fingerprint: string;
  /** The control-plane protocol version it speaks; undefined when the record did not say. */
  readonly protocol: number | undefined;
  readonly instance: string;
}

/** `host:port` to dial (IPv6 hosts bracketed). */
export function clusterAddress(c: Pick<FoundCluster, "host" | "port">): string {
  return `${c.host.includes(":") ? `[${c.host}]` : c.host}:${c.port}`;
}

/** Truncates to at most `max` UTF-8 bytes without splitting a character. */
function clampBytes(s: string, max: number): string {
  let out = "";
  let bytes = 0;
  for (const ch of s) {
    bytes += Buffer.byteLength(ch);
    if (bytes > max) break;
    out += ch;
  }
  return out;
}

/**
 * Publishes the cluster until stop(). Throws a DiscoveryError for bad settings (name, port,
 * interface); afterwards mDNS errors are only logged.
 */
export function publishCluster(o: PublishOptions): Publication {
  if (o.name === "" || Buffer.byteLength(o.name) > MAX_LABEL_BYTES || printable(o.name, MAX_LABEL_BYTES) !== o.name) {
    throw new DiscoveryError(`cluster name ${JSON.stringify(printable(o.name, 80))} must be 1 to ${MAX_LABEL_BYTES} bytes of printable text`);
  }
  if (!Number.isInteger(o.port) || o.port < 1 || o.port > 65535) throw new DiscoveryError(`cluster port ${o.port} is not a port number`);
  const mdns = openMdns(o);
  // Instance names must be unique on the link (two households may both call theirs "prima").
  const instance = clampBytes(`${o.name}@${hostname()}:${o.port}`.replaceAll(".", "-"), MAX_LABEL_BYTES);
  const txt = {
    cluster: o.name,
    proto: String(o.protocolVersion),
    model: clampBytes(o.model, MAX_TXT_VALUE_BYTES),
    fp: clampBytes(o.fingerprint, MAX_TXT_VALUE_BYTES),
  };
  let service: Service | undefined;
  try {
    // No probing: the instance name is already unique, and bonjour-service reports a clash with
    // console.log instead of an error.
    service = mdns.bonjour.publish({ name: instance, type: SERVICE_TYPE, port: o.port, txt, probe: false, disableIPv6: true });
  } catch (e) {
    o.log?.(`mDNS: cannot publish ${printable(instance)}: ${printable(e instanceof Error ? e.message : String(e), 300)}`);
  }
  let stopped: Promise<void> | undefined;
  return {
    instance,
    stop() {
      stopped ??= (async () => {
        if (service) {
          const s = service;
          await new Promise<void>((resolve) => {
            const timer = setTimeout(resolve, GOODBYE_LIMIT_MS);
            try {
              s.stop(() => {
                clearTimeout(timer);
                resolve();
              });
            } catch {
              clearTimeout(timer);
              resolve();
            }
          });
        }
        await mdns.close();
      })();
      return stopped;
    },
  };
}

/** The cluster a bonjour-service answer describes, or undefined when it names no usable address. */
function toCluster(s: Service): FoundCluster | undefined {
  const port = s.port;
  if (!Number.isInteger(port) || port < 1 || port > 65535) return undefined;
  // The answer's source address is on a network this device shares with the coordinator; the A
  // records list all of its interfaces (container bridges too). Fall back to them only if needed.
  const referer = s.referer?.address;
  const host = referer && isIPv4(referer) ? referer : (s.addresses ?? []).find((a) => isIPv4(a));
  if (!host) return undefined;
  const txt: unknown = s.txt;
  const field = (key: string, max: number): string => {
    if (typeof txt !== "object" || txt === null || !Object.hasOwn(txt, key)) return "";
    const v = (txt as Record<string, unknown>)[key];
    return typeof v === "string" ? printable(v, max) : "";
  };
  const proto = field("proto", 16);
  const instance = printable(typeof s.name === "string" ? s.name : "", MAX_LABEL_BYTES);
  return {
    name: field("cluster", MAX_LABEL_BYTES) || instance,
    host,
    port,
    model: field("model", 80),
    fingerprint: field("fp", 64),
    protocol: /^\d{1,6}$/.test(proto) ? Number(proto) : undefined,
    instance,
  };
}

function clustersOf(services: readonly Service[]): FoundCluster[] {
  const byAddress = new Map<string, FoundCluster>();
  for (const s of services) {
    const c = toCluster(s);
    if (c) byAddress.set(clusterAddress(c), c);
  }
  // A stable order, so a list to choose from reads the same each time.
  return [...byAddress.values()].sort((a, b) => a.name.localeCompare(b.name) || clusterAddress(a).localeCompare(clusterAddress(b)));
}

/** One line per cluster, for choosing. */
export function describeClusters(clusters: readonly FoundCluster[]): string {
  return clusters
    .map((c) => `  ${c.name}  at ${clusterAddress(c)}  model ${c.model || "?"}${c.fingerprint ? ` (${c.fingerprint.slice(0, 12)})` : ""}`)
    .join("\n");
}

const FALLBACK = "join by address instead: prima-worker --join HOST:PORT (the coordinator's cluster port, e.g. --join 192.168.1.10:7400)";

/** What to say when no (matching) cluster answered within timeoutMs. */
export function noClusterMessage(timeoutMs: number, cluster: string | undefined, heard: readonly FoundCluster[]): string {
  const within = `within ${(timeoutMs / 1000).toFixed(timeoutMs % 1000 === 0 ? 0 : 1)} s`;
  if (cluster !== undefined && heard.length > 0) {
    return `no cluster named "${printable(cluster, MAX_LABEL_BYTES)}" answered on mDNS ${within}; these did:\n${describeClusters(heard)}\n` +
      `choose one with --cluster NAME, or ${FALLBACK}`;
  }
  const what = cluster === undefined ? "no prima cluster" : `no cluster named "${printable(cluster, MAX_LABEL_BYTES)}"`;
  return `${what} answered on mDNS ${within}. Multicast may not reach this device (Docker bridge networks, WSL2, ` +
    `Wi-Fi client isolation, Termux); ${FALLBACK}`;
}

/** The one cluster to join among those that answered, or a DiscoveryError saying why there is none. */
export function chooseCluster(found: readonly FoundCluster[], cluster: string | undefined, timeoutMs = DISCOVERY_TIMEOUT_MS): FoundCluster {
  const matching = cluster === undefined ? found : found.filter((c) => c.name === cluster);
  if (matching.length === 1) return matching[0];
  if (matching.length === 0) throw new DiscoveryError(noClusterMessage(timeoutMs, cluster, found));
  const how = cluster === undefined ? "choose one with --cluster NAME or --join HOST:PORT" : "they share a name: choose one with --join HOST:PORT";
  throw new DiscoveryError(`${matching.length} prima clusters answered on mDNS; ${how}:\n${describeClusters(matching)}`);
}

export interface BrowseOptions extends MdnsOptions {
  /** How long to listen. */
  readonly timeoutMs: number;
  /** Only clusters with this name. */
  readonly cluster?: string;
}

/** Every cluster that answers within timeoutMs (one query, repeated each second against loss). */
export async function browseClusters(o: BrowseOptions): Promise<FoundCluster[]> {
  const mdns = openMdns(o);
  const browser = mdns.bonjour.find({ type: SERVICE_TYPE });
  const requery = setInterval(() => browser.update(), REQUERY_FIRST_MS);
  try {
    await new Promise((r) => setTimeout(r, o.timeoutMs));
    const all = clustersOf(browser.services);
    return o.cluster === undefined ? all : all.filter((c) => c.name === o.cluster);
  } finally {
    clearInterval(requery);
    browser.stop();
    await mdns.close();
  }
}

export interface FindOptions extends MdnsOptions {
  /** The cluster's name (--cluster); default: the only one that answers. */
  readonly cluster?: string;
  /** Default DISCOVERY_TIMEOUT_MS. */
  readonly timeoutMs?: number;
  /** After the first matching answer, wait this long for others (default DISCOVERY_GRACE_MS). */
  readonly graceMs?: number;
  /**
   * Keep browsing past timeoutMs instead of failing: called once, then queries continue (backing
   * off to one every 30 s) until a cluster answers or `signal` aborts.
   */
  readonly onSilence?: (message: string) => void;
  readonly signal?: AbortSignal;
}

/**
 * The cluster to join: the only one that answers, or the one named. Rejects with a DiscoveryError
 * listing the choices when several answer, or saying that multicast may be unavailable (with the
 * --join HOST:PORT form) when none answers within timeoutMs (unless onSilence keeps it browsing).
 */
export async function findCluster(o: FindOptions): Promise<FoundCluster> {
  const timeoutMs = o.timeoutMs ?? DISCOVERY_TIMEOUT_MS;
  const graceMs = o.graceMs ?? DISCOVERY_GRACE_MS;
  if (o.signal?.aborted) throw new DiscoveryError("discovery stopped");
  const mdns = openMdns(o);
  const browser = mdns.bonjour.find({ type: SERVICE_TYPE });
  const matching = () => clustersOf(browser.services).filter((c) => o.cluster === undefined || c.name === o.cluster);
  const timers = new Set<NodeJS.Timeout>();
  const later = (ms: number, f: () => void) => {
    const t = setTimeout(() => {
      timers.delete(t);
      f();
    }, ms);
    timers.add(t);
  };
  try {
    return await new Promise<FoundCluster>((resolve, reject) => {
      let settling = false;
      const settle = () => {
        try {
          resolve(chooseCluster(clustersOf(browser.services), o.cluster, timeoutMs));
        } catch (e) {
          reject(e);
        }
      };
      const onAnswer = () => {
        if (settling || matching().length === 0) return;
        settling = true;
        later(graceMs, settle);
      };
      browser.on("up", onAnswer);
      browser.on("srv-update", onAnswer);
      browser.on("txt-update", onAnswer);
      later(timeoutMs, () => {
        if (settling) return;
        if (!o.onSilence) return settle(); // rejects: nothing (matching) answered
        o.onSilence(noClusterMessage(timeoutMs, o.cluster, clustersOf(browser.services)));
      });
      // Queries can be lost, and a coordinator that starts later announces itself only a few times.
      const requery = (ms: number) => later(ms, () => {
        browser.update();
        requery(Math.min(ms * 2, REQUERY_MAX_MS));
      });
      requery(REQUERY_FIRST_MS);
      o.signal?.addEventListener("abort", () => reject(new DiscoveryError("discovery stopped")), { once: true });
    });
  } finally {
    for (const t of timers) clearTimeout(t);
    browser.stop();
    await mdns.close();
  }
}
