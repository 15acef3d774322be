// Closing a device's windows when one may still be busy with a forward pass (the native lane's, or
// one awaited): the model refuses to close while any window is open, so each busy one is retried
// until its pass ends (RingNode.close).
import type { NativeWindow } from "../native/index.js";

/** How long close() keeps trying a window busy with a pass, polling every BUSY_CLOSE_POLL_MS. */
const BUSY_CLOSE_LIMIT_MS = 60_000, BUSY_CLOSE_POLL_MS = 5;

export function tryClose(w: NativeWindow): boolean {
  try {
    w.close();
    return true;
  } catch {
    return false; // busy: a forward pass is still running on it
  }
}

export async function closeWhenIdle(windows: NativeWindow[]): Promise<void> {
  const until = performance.now() + BUSY_CLOSE_LIMIT_MS;
  let open = windows;
  while (open.length > 0 && performance.now() < until) {
    await new Promise((r) => setTimeout(r, BUSY_CLOSE_POLL_MS));
    open = open.filter((w) => !tryClose(w));
  }
}
