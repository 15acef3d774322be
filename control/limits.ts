// Every wait on the control plane has a limit; both sides read them from here.

/** PRIMA_TIME_SCALE=X (1..100) stretches every silence limit below X times, on the side that sets it:
 * for devices far slower than a phone, as an aarch64 worker under qemu-user, whose event loop stalls for
 * seconds while V8 compiles (test/arm/run.sh sets it on both sides). Unset or invalid: 1. */
const SCALE = ((v) => (Number.isFinite(v) && v >= 1 && v <= 100 ? v : 1))(Number(process.env.PRIMA_TIME_SCALE));

/** Both sides send a heartbeat this often on a joined session. */
export const HEARTBEAT_INTERVAL_MS = 300;
/** A worker silent this long is gone (with a 250 ms check, detection stays under 2 s), unless its
 * heartbeats came late lately: see heartbeatLimit. */
export const HEARTBEAT_TIMEOUT_MS = 1500 * SCALE;
/** The most heartbeatLimit gives a worker whose heartbeats come late (a frozen one is found by then). */
export const MAX_HEARTBEAT_TIMEOUT_MS = 5000 * SCALE;
/** How long the coordinator waits for a worker's next message, given the longest gap between its
 * messages lately (WorkerHandle.recentGapMs): a device starved by other work (a build on the same
 * machine) beats late but beats, and twice its own lateness tells it from a frozen one. */
export function heartbeatLimit(recentGapMs: number): number {
  return Math.min(MAX_HEARTBEAT_TIMEOUT_MS, Math.max(HEARTBEAT_TIMEOUT_MS, 2 * recentGapMs));
}
/** A worker leaves a coordinator silent this long. Longer than the coordinator's limit: a worker that
 * leaves a live coordinator (busy timing its own pass, or starved) costs a rejoin and a new plan, one
 * that waits on a dead coordinator loses nothing (a coordinator that exits closes the connection,
 * which ends the session at once; only a frozen or unplugged one is found by this limit). */
export const COORDINATOR_SILENCE_MS = 4 * HEARTBEAT_TIMEOUT_MS;
/** Whether a heartbeat check runs after a stall of this process (its timer came more than the limit
 * late: a long plan, a pass timed in JS on a slow device). The peer's heartbeats then wait unread, and
 * its silence is not judged on that check; both sides keep this rule. */
export function checkAfterStall(lastCheckMs: number, nowMs: number): boolean {
  return nowMs - lastCheckMs > HEARTBEAT_TIMEOUT_MS;
}
/** What a side logs after such a stall: how long its heartbeats waited (bench/chaos.ts reads it). */
export function stallNote(lastCheckMs: number, nowMs: number): string {
  return `this process's event loop was held for ${((nowMs - lastCheckMs) / 1000).toFixed(1)} s (heartbeats waited; the peers' silence is not judged on this check)`;
}
/** A session stream that sends no Join this long after it opened is dropped by the coordinator. */
export const JOIN_TIMEOUT_MS = 3000 * SCALE;
/** A worker waits this long for the coordinator's answer to its Join (welcome or refusal). */
export const JOIN_REPLY_TIMEOUT_MS = 5000 * SCALE;
/** A status request unanswered this long loses the worker (it answers from memory, at once). */
export const STATUS_TIMEOUT_MS = 3000 * SCALE;
/** A status request that asks the device to time its pass first (StatusRequest.timePass): a profile
 * read from the cache but for the pass, a second or two on a slow device. */
export const TIMED_STATUS_TIMEOUT_MS = 20_000 * SCALE;
/** An assignment with no progress report for this long loses the worker: setting up and paging in a
 * window may take long, but a worker reports progress at least every ASSIGN_PROGRESS_INTERVAL_MS. */
export const ASSIGN_SILENCE_MS = 5000 * SCALE;
export const ASSIGN_PROGRESS_INTERVAL_MS = 1000;
/** The coordinator's gRPC server lets open calls finish this long when it closes, then cuts them
 * (a frozen worker never acknowledges the end of its stream). */
export const SHUTDOWN_GRACE_MS = 500;

// Bounds on what a peer may make the coordinator hold (issue #18: a flood of Joins must not grow it).
/** Largest message either side accepts on the control plane. */
export const MAX_MESSAGE_BYTES = 1 << 20;
/** Largest device profile in a Join (a real one is a few KiB). */
export const MAX_PROFILE_BYTES = 256 << 10;
/** Open connections on the cluster port, in all and from one address. */
export const MAX_CONNECTIONS = 128;
export const MAX_CONNECTIONS_PER_HOST = 32;
/** A connection to the cluster port must prove the join token this soon after it opened (a Join with
 * its proof, a chunk request with its proof, or a keyed stream with its ticket), or it is closed: TLS
 * needs no secret, and an idle HTTP/2 connection that answers pings would hold its slot for good.
 * Room for the handshake (JOIN_TIMEOUT_MS) and then the Join (JOIN_TIMEOUT_MS more). */
export const PROOF_TIMEOUT_MS = 2 * JOIN_TIMEOUT_MS;
/** Connections that have not proven the token yet, in all and from one address. When all of them are
 * held, a newcomer from an address that holds fewer closes the oldest of the address that holds the
 * most: strangers from a few addresses cannot keep the household's devices out. */
export const MAX_UNPROVEN = 64;
export const MAX_UNPROVEN_PER_HOST = 16;
/** Session streams one connection may hold open at once (a worker uses one). */
export const MAX_STREAMS_PER_CONNECTION = 4;
/** Sessions open without a Join yet (each waits at most JOIN_TIMEOUT_MS). */
export const MAX_PENDING_SESSIONS = 64;
/** Joined workers at once. */
export const MAX_WORKERS = 64;
/** Joins from one address: a burst of this many, then this many per second. */
export const JOIN_BURST = 20;
export const JOINS_PER_S = 5;
