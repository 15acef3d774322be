// How prima-worker ends. A service manager restarts a daemon that fails: each setup error that cannot
// fix itself has its own exit code, so the manager (or a person) can tell them apart. Errors that can
// fix themselves (the coordinator is away, or refuses this worker's model) never end the worker.

export const EXIT_OK = 0;
/** An error nobody planned for (the message says what). */
export const EXIT_ERROR = 1;
/** Wrong command line. */
export const EXIT_USAGE = 2;
/** The model file is missing, unreadable, or not a model prima can run; or the model cache refuses
 * its folder or a file in it (transfer/cache.ts CacheError). */
export const EXIT_MODEL_UNUSABLE = 3;
/** The data-plane port (--port) cannot be listened on: taken by another program, or not allowed. */
export const EXIT_PORT_UNAVAILABLE = 4;
/** The model file changed (truncated, rewritten, replaced, removed) while the worker had it mapped:
 * a restart maps it afresh. */
export const EXIT_MODEL_CHANGED = 5;
/** The model file's weights differ from the coordinator's (same header, other tensor bytes): it would
 * compute wrong text; another copy of the model is needed. */
export const EXIT_WEIGHTS_DIFFER = 6;
/** The disk of the model cache filled up while the worker was writing fetched chunks (ENOSPC): room
 * must be made (or another --model-cache given) before a restart. */
export const EXIT_DISK_FULL = 7;

export const EXIT_CODES_HELP = `exit codes:
  0  stopped (SIGINT/SIGTERM, or --once after its session)
  1  an unexpected error (the message says what)
  2  wrong command line
  3  the model file is missing, unreadable, or not a model; or the model cache refuses its folder
     or a file in it (a symbolic link, a file it did not write: see --allow-cache-link)
  4  the data-plane port (--port) cannot be listened on (taken, or not allowed)
  5  the model file changed while in use (restart the worker to map it again)
  6  the model file's weights differ from the coordinator's (same header, other tensor bytes)
  7  the disk of the model cache filled up while fetching the model (free some space, then restart)
  The coordinator being away (also in the middle of a fetch) or refusing this worker's model, and a
  model cache short of room before a fetch, do not end it: it says so once and keeps trying.`;

/** Ends the worker with `code` and a message that says why. */
export class WorkerExit extends Error {
  override name = "WorkerExit";
  constructor(readonly code: number, message: string) {
    super(message);
  }
}
