// The cluster port's connection slots (issue #36): bounded in all and per address, and a connection
// that has not proven the join token within its limit is closed (TLS needs no secret, and an idle
// HTTP/2 connection that answers pings would otherwise hold its slot for good). Connections not yet
// proven are bounded apart; when their room is full, a newcomer from an address that holds fewer of
// them closes the oldest of the address that holds the most, so strangers from a few addresses
// cannot keep the household's own devices out.
import type { Socket } from "node:net";
import { MAX_CONNECTIONS, MAX_CONNECTIONS_PER_HOST, MAX_UNPROVEN, MAX_UNPROVEN_PER_HOST, PROOF_TIMEOUT_MS } from "../control/index.js";

export interface SlotLimits {
  readonly connections: number;
  readonly perHost: number;
  readonly unproven: number;
  readonly unprovenPerHost: number;
  readonly proofMs: number;
}

export const SLOT_LIMITS: SlotLimits = {
  connections: MAX_CONNECTIONS, perHost: MAX_CONNECTIONS_PER_HOST, unproven: MAX_UNPROVEN, unprovenPerHost: MAX_UNPROVEN_PER_HOST, proofMs: PROOF_TIMEOUT_MS,
};

interface Slot {
  readonly socket: Socket;
  readonly host: string;
  readonly peer: string;
  timer?: NodeJS.Timeout;
}

/** How gRPC names a connection's peer (call.getPeer()), and so how a slot is found from a call. */
export function peerOf(socket: { remoteAddress?: string; remotePort?: number }): string {
  return `${socket.remoteAddress ?? "?"}:${socket.remotePort ?? 0}`;
}

export class ConnectionSlots {
  private readonly byPeer = new Map<string, Slot>();
  private readonly perHost = new Map<string, number>();
  /** Not proven yet, oldest first (a Set keeps insertion order). */
  private readonly unproven = new Set<Slot>();
  private readonly unprovenPerHost = new Map<string, number>();

  /** `closed` is told of every connection closed for want of a proof (evicted or out of time). */
  constructor(private readonly closed: (host: string, reason: string) => void, private readonly limits: SlotLimits = SLOT_LIMITS) {}

  get size(): number {
    return this.byPeer.size;
  }

  /** Takes a slot for a new connection from `host` (normalised), or says why there is none. */
  admit(socket: Socket, host: string): string | null {
    const l = this.limits;
    if ((this.perHost.get(host) ?? 0) >= l.perHost) return "too many connections from this address";
    if ((this.unprovenPerHost.get(host) ?? 0) >= l.unprovenPerHost) return "too many connections from this address that have not proven the join token";
    if (this.byPeer.size >= l.connections || this.unproven.size >= l.unproven) {
      if (!this.evictFor(host)) return "too many connections";
    }
    const slot: Slot = { socket, host, peer: peerOf(socket) };
    this.byPeer.set(slot.peer, slot);
    bump(this.perHost, host, 1);
    this.unproven.add(slot);
    bump(this.unprovenPerHost, host, 1);
    slot.timer = setTimeout(() => {
      if (!this.unproven.has(slot)) return;
      this.closed(host, `it did not prove the join token within ${l.proofMs / 1000} s`);
      socket.destroy();
    }, l.proofMs);
    slot.timer.unref();
    socket.once("close", () => this.release(slot));
    return null;
  }

  /** The connection named by `peer` (peerOf) proved the token: it keeps its slot as long as it is open. */
  proven(peer: string): void {
    const slot = this.byPeer.get(peer);
    if (!slot || !this.unproven.delete(slot)) return;
    bump(this.unprovenPerHost, slot.host, -1);
    clearTimeout(slot.timer);
  }

  /** Whether the connection named by `peer` has proven the token. */
  isProven(peer: string): boolean {
    const slot = this.byPeer.get(peer);
    return slot !== undefined && !this.unproven.has(slot);
  }

  /** Closes every connection (the registry is closing). */
  destroyAll(): void {
    for (const slot of [...this.byPeer.values()]) slot.socket.destroy();
  }

  /** Makes room for a newcomer from `host`: closes the oldest unproven connection of the address
   * holding the most of them, if that is more than `host` holds. False when there is none to close. */
  private evictFor(host: string): boolean {
    let most: string | undefined;
    for (const [h, n] of this.unprovenPerHost) if (most === undefined || n > this.unprovenPerHost.get(most)!) most = h;
    if (most === undefined || this.unprovenPerHost.get(most)! <= (this.unprovenPerHost.get(host) ?? 0)) return false;
    for (const slot of this.unproven) {
      if (slot.host !== most) continue;
      this.closed(most, "its connection was closed to make room: it had not proven the join token");
      this.release(slot);
      slot.socket.destroy();
      return true;
    }
    return false;
  }

  private release(slot: Slot): void {
    if (this.byPeer.get(slot.peer) !== slot) return;
    this.byPeer.delete(slot.peer);
    bump(this.perHost, slot.host, -1);
    if (this.unproven.delete(slot)) bump(this.unprovenPerHost, slot.host, -1);
    clearTimeout(slot.timer);
  }
}

function bump(m: Map<string, number>, key: string, by: number): void {
  const n = (m.get(key) ?? 0) + by;
  if (n > 0) m.set(key, n);
  else m.delete(key);
}
