// Every wait on the control plane has a limit; both sides read them from here.

/** PRIMA_TIME_SCALE=X (1..100) stretches every silence limit below X times, on the side that sets it:
 * for devices far slower than a phone, as an aarch64 worker under qemu-user, whose event loop stalls for
 * seconds while V8 compiles (test/arm/run.sh sets it on both sides). Unset or invalid: 1. */
const SCALE = ((v) => (Number.isFinite(v) && v >= 1 && v <= 100 ? v : 1))(Number(process.env.PRIMA_TIME_SCALE));

/** Both sides send a heartbeat this often on a joined session. */
export const HEARTBEAT_INTERVAL_MS = 300;
/** A side silent this long is gone (with a 250 ms check, detection stays under 2 s). */
export const HEARTBEAT_TIMEOUT_MS = 1500 * SCALE;
/** Whether a heartbeat check runs after a stall of this process (its timer came more than the limit
 * late: a long plan, a pass timed in JS on a slow device). The peer's heartbeats then wait unread, and
 * its silence is not judged on that check; both sides keep this rule. */
export function checkAfterStall(lastCheckMs: number, nowMs: number): boolean {
  return nowMs - lastCheckMs > HEARTBEAT_TIMEOUT_MS;
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
/** Session streams one connection may hold open at once (a worker uses one). */
export const MAX_STREAMS_PER_CONNECTION = 4;
/** Sessions open without a Join yet (each waits at most JOIN_TIMEOUT_MS). */
export const MAX_PENDING_SESSIONS = 64;
/** Joined workers at once. */
export const MAX_WORKERS = 64;
/** Joins from one address: a burst of this many, then this many per second. */
export const JOIN_BURST = 20;
export const JOINS_PER_S = 5;
