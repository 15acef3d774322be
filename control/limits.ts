// Every wait on the control plane has a limit; both sides read them from here.

/** Both sides send a heartbeat this often on a joined session. */
export const HEARTBEAT_INTERVAL_MS = 300;
/** A side silent this long is gone (with a 250 ms check, detection stays under 2 s). */
export const HEARTBEAT_TIMEOUT_MS = 1500;
/** A session stream that sends no Join this long after it opened is dropped by the coordinator. */
export const JOIN_TIMEOUT_MS = 3000;
/** A worker waits this long for the coordinator's answer to its Join (welcome or refusal). */
export const JOIN_REPLY_TIMEOUT_MS = 5000;
/** A status request unanswered this long loses the worker (it answers from memory, at once). */
export const STATUS_TIMEOUT_MS = 3000;
/** An assignment with no progress report for this long loses the worker: setting up and paging in a
 * window may take long, but a worker reports progress at least every ASSIGN_PROGRESS_INTERVAL_MS. */
export const ASSIGN_SILENCE_MS = 5000;
export const ASSIGN_PROGRESS_INTERVAL_MS = 1000;
/** The coordinator's gRPC server lets open calls finish this long when it closes, then cuts them
 * (a frozen worker never acknowledges the end of its stream). */
export const SHUTDOWN_GRACE_MS = 500;
