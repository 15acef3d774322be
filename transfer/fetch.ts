// Fetching the chunks a device is missing, from whatever carries them (the control plane's stream),
// verifying each against the coordinator's hash; a bad chunk is fetched again. Progress is reported
// as bytes, rate and time left.
import type { CachedModel } from "./cache.js";
import { TransferError } from "./cache.js";

export interface Chunk {
  readonly index: number;
  readonly data: Uint8Array;
  /** chunkDigest of the coordinator's bytes. */
  readonly digest: string;
  /** Gives `data`'s memory back to the source (called once the chunk is written or refused). */
  readonly release?: () => void;
}

export interface FetchProgress {
  readonly doneBytes: number;
  readonly totalBytes: number;
  readonly bytesPerS: number;
  /** Seconds left at the current rate (null before there is a rate). */
  readonly secondsLeft: number | null;
}

export interface FetchResult {
  /** Bytes received (retries included), and chunks that failed their hash. */
  readonly fetchedBytes: number;
  readonly badChunks: number;
  readonly ms: number;
}

const ROUNDS = 4;

export function describeProgress(p: FetchProgress): string {
  const mib = (b: number) => (b / 2 ** 20).toFixed(1);
  const left = p.secondsLeft === null ? "" : `, ${p.secondsLeft < 1 ? "<1" : p.secondsLeft.toFixed(0)} s left`;
  return `fetched ${mib(p.doneBytes)} of ${mib(p.totalBytes)} MiB at ${(p.bytesPerS / 1e6).toFixed(1)} MB/s${left}`;
}

/**
 * Fetches the chunks of `wanted` that `model` lacks through `source` (which yields the chunks asked
 * for, in any order). Chunks that fail their hash are asked for again, a few rounds at most.
 */
export async function fetchChunks(
  model: CachedModel, wanted: readonly number[], source: (chunks: number[]) => AsyncIterable<Chunk>,
  onProgress?: (p: FetchProgress) => void,
): Promise<FetchResult> {
  const t0 = performance.now();
  const totalBytes = model.bytesOf(model.missing(wanted));
  let doneBytes = 0, fetchedBytes = 0, badChunks = 0, lastReport = 0;
  /** Progress at most every 500 ms, and at the end (`last`). */
  const report = (last = false) => {
    const now = performance.now();
    if (onProgress && (last || now - lastReport > 500)) {
      lastReport = now;
      const rate = doneBytes / Math.max(1e-3, (now - t0) / 1000);
      onProgress({ doneBytes, totalBytes, bytesPerS: rate, secondsLeft: rate > 0 ? (totalBytes - doneBytes) / rate : null });
    }
  };
  for (let round = 0; round < ROUNDS; round++) {
    const missing = model.missing(wanted);
    if (missing.length === 0) break;
    const asked = new Set(missing);
    // Receiving the next chunk overlaps hashing and writing the ones before (off this thread); the
    // source bounds how many are in flight by the buffers it lends.
    const inFlight = new Set<Promise<void>>();
    let writeFailed: Error | undefined;
    try {
      for await (const c of source(missing)) {
        if (!asked.delete(c.index)) {
          c.release?.();
          throw new TransferError(`the coordinator sent chunk ${c.index}, which was not asked for`);
        }
        if (writeFailed) {
          c.release?.();
          throw writeFailed;
        }
        fetchedBytes += c.data.length;
        const p = model.writeVerified(c.index, c.data, c.digest).then(
          (ok) => {
            if (ok) doneBytes += c.data.length;
            else badChunks++;
            report();
          },
          (e: Error) => void (writeFailed ??= e),
        ).finally(() => {
          c.release?.();
          inFlight.delete(p);
        });
        inFlight.add(p);
      }
    } finally {
      // Whatever was received before a failure still counts once it is written and verified.
      await Promise.all(inFlight);
    }
    if (writeFailed) throw writeFailed;
  }
  report(true);
  model.persist();
  const left = model.missing(wanted);
  if (left.length > 0) {
    throw new TransferError(`${left.length} chunk${left.length === 1 ? "" : "s"} of the model could not be fetched intact after ${ROUNDS} tries (first: chunk ${left[0]})`);
  }
  return { fetchedBytes, badChunks, ms: performance.now() - t0 };
}
