// One mDNS endpoint (bonjour-service over multicast-dns) that cannot take the process down: socket
// errors, bind failures and packets the library chokes on are logged (escaped, each message once)
// and dropped. Where multicast goes is chosen here: one interface (an option or
// $PRIMA_MDNS_INTERFACE, which tests set to loopback) or, by default, every interface.
import dgram from "node:dgram";
import type { EventEmitter } from "node:events";
import { isIPv4 } from "node:net";
import { networkInterfaces } from "node:os";
import Bonjour from "bonjour-service";
import { printable } from "../base/index.js";

export const MDNS_PORT = 5353;
/** An IPv4 address or interface name ("lo", "127.0.0.1", "eth0"): multicast goes only there. */
export const INTERFACE_ENV = "PRIMA_MDNS_INTERFACE";
/** Another UDP port than 5353: lets concurrent tests on one machine stay apart. */
export const PORT_ENV = "PRIMA_MDNS_PORT";
const CLOSE_LIMIT_MS = 1000;

export interface MdnsOptions {
  /** IPv4 address or interface name; default $PRIMA_MDNS_INTERFACE, else every interface. */
  readonly interface?: string;
  /** UDP port; default $PRIMA_MDNS_PORT, else 5353. */
  readonly mdnsPort?: number;
  /** Where mDNS errors and warnings go (escaped); default nowhere. */
  readonly log?: (line: string) => void;
}

/** A discovery failure with a message meant for the user (no cluster, several, bad settings). */
export class DiscoveryError extends Error {
  override name = "DiscoveryError";
}

export interface Mdns {
  readonly bonjour: Bonjour;
  /** Closes the socket; resolves within about a second whatever the library does. */
  close(): Promise<void>;
}

/** The IPv4 address to use for `spec` (an address of this machine or an interface name). */
export function resolveInterface(spec: string | undefined): string | undefined {
  if (spec === undefined || spec.trim() === "") return undefined;
  const want = spec.trim();
  const have: string[] = [];
  for (const [name, addrs] of Object.entries(networkInterfaces())) {
    for (const a of addrs ?? []) {
      if (a.family !== "IPv4") continue;
      have.push(`${name} ${a.address}`);
      if (a.address === want || name === want) return a.address;
    }
  }
  // An address that is not ours would make the OS route multicast by its default route, i.e.
  // through an interface nobody chose: refuse instead.
  const what = isIPv4(want) ? "an IPv4 address of this machine" : "a network interface with an IPv4 address";
  throw new DiscoveryError(`mDNS interface ${printable(want, 64)} (${INTERFACE_ENV}) is not ${what}; have: ${have.join(", ") || "none"}`);
}

function resolvePort(port: number | undefined): number {
  const env = process.env[PORT_ENV];
  const p = port ?? (env !== undefined && env !== "" ? Number(env) : MDNS_PORT);
  if (!Number.isInteger(p) || p < 1 || p > 65535) throw new DiscoveryError(`mDNS port ${printable(String(env ?? port), 16)} (${PORT_ENV}) is not a port number`);
  return p;
}

export function openMdns(o: MdnsOptions): Mdns {
  const iface = resolveInterface(o.interface ?? process.env[INTERFACE_ENV]);
  const port = resolvePort(o.mdnsPort);
  const seen = new Set<string>();
  const report = (what: string, e: unknown) => {
    const line = `mDNS ${what}: ${printable(e instanceof Error ? e.message : String(e), 300)}`;
    // multicast-dns retries failed group joins every 5 s: say each thing once, not every time.
    if (seen.has(line) || seen.size > 100) return;
    seen.add(line);
    o.log?.(line);
  };
  const socket = dgram.createSocket({ type: "udp4", reuseAddr: true });
  // The library parses each datagram inside the socket's "message" event; a throw there (a record it
  // did not expect) would be an uncaught exception. Drop that datagram instead.
  const emit = socket.emit.bind(socket) as (event: string | symbol, ...args: unknown[]) => boolean;
  (socket as unknown as { emit: typeof emit }).emit = (event, ...args) => {
    try {
      return emit(event, ...args);
    } catch (e) {
      report("packet dropped", e);
      return true;
    }
  };
  // multicast-dns binds to `interface` unless `bind` is given, and a socket bound to a unicast
  // address never sees multicast on Linux: bind to any address, send and join only on `interface`.
  const config = { interface: iface, bind: "0.0.0.0", port, socket };
  const bonjour = new Bonjour(config as unknown as ConstructorParameters<typeof Bonjour>[0], (e: unknown) => report("error", e));
  const mdns = (bonjour as unknown as { server?: { mdns?: EventEmitter } }).server?.mdns;
  if (!mdns) throw new DiscoveryError("bonjour-service changed: its multicast-dns endpoint is not where prima expects it");
  // Bind failures (EADDRINUSE, EACCES) arrive as "error" events nobody listens to: that would throw.
  mdns.on("error", (e: unknown) => report("error", e));
  mdns.on("warning", (e: unknown) => report("warning", e));
  let closed: Promise<void> | undefined;
  return {
    bonjour,
    close() {
      closed ??= new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, CLOSE_LIMIT_MS);
        try {
          bonjour.destroy(() => {
            clearTimeout(timer);
            resolve();
          });
        } catch (e) {
          report("close", e);
          clearTimeout(timer);
          resolve();
        }
      });
      return closed;
    },
  };
}
