// A worker without `--model`: it asks the coordinator what the model is, keeps a sparse copy in its
// model cache (transfer/), fetches the header to open it like any GGUF, and on each assignment fetches
// the chunks of its windows it does not have yet. Both asked for on the cluster port: TLS pinned to the
// coordinator's certificate, and each request proves the join token (trust/); the chunks come on the
// keyed stream the request opens (transfer/wire.ts).
import type { ModelDescription } from "../control/index.js";
import { LocalModel, type OpenOptions } from "../engine/index.js";
import { connect } from "node:net";
import { dirname } from "node:path";
import { streamSeal } from "../native/index.js";
import { ALPN_CHUNKS, PinMismatchError, chunkBinding, chunkProof, chunkStreamKey, connectPinned, splitAddress, type JoinToken } from "../trust/index.js";
import { EXIT_DISK_FULL, WorkerExit } from "./exit.js";
import {
  ModelCache, STREAM_MAGIC, TransferError, chunksFor, freeDiskBytes, describeProgress, encodeRequest, fetchChunks, rangesForLayers, ChunkReceiver, readInfo, readTicket,
  type CachedModel, type Chunk, type FetchResult,
} from "../transfer/index.js";

/** A fetch that receives nothing for this long is given up (and tried again by the caller). */
const STALL_MS = 30_000;
const INFO_TIMEOUT_MS = 10_000;

export interface RemoteModelOptions {
  /** host:port of the coordinator. */
  readonly coordinator: string;
  readonly token: JoinToken;
  readonly cacheDir?: string;
  readonly cacheLimitBytes?: number;
  /** Use a model cache folder that is a symbolic link (--allow-cache-link). */
  readonly cacheAllowLink?: boolean;
  readonly open: OpenOptions;
  readonly log: (line: string) => void;
}

/** The worker's end when `e` is the disk filling up (ENOSPC) under the cache; else undefined. */
export function diskFullExit(e: unknown, cacheDir: string): WorkerExit | undefined {
  if ((e as { code?: unknown } | null)?.code !== "ENOSPC") return undefined;
  let free = "";
  try {
    free = ` (${freeDiskBytes(cacheDir)} bytes free now)`;
  } catch {
    // the figure is a courtesy
  }
  return new WorkerExit(EXIT_DISK_FULL, `the disk of the model cache ${cacheDir} filled up while fetching the model${free}: ${(e as Error).message}; ` +
    "free some space there (or give another --model-cache), then start the worker again");
}

/** What the coordinator's model is (a chunk stream's info request). */
async function modelInfo(address: string, token: JoinToken): Promise<ModelDescription> {
  const socket = await connectPinned(address, token, ALPN_CHUNKS, INFO_TIMEOUT_MS);
  try {
    socket.write(encodeRequest({ proof: chunkProof(token, chunkBinding(socket)).toString("hex"), info: true, fingerprint: "", chunks: [] }));
    const d = (await readInfo(socket, INFO_TIMEOUT_MS)) as Partial<ModelDescription>;
    if (typeof d?.fingerprint !== "string" || !Number.isSafeInteger(d.fileBytes) || !Number.isSafeInteger(d.dataOffset) || !Number.isInteger(d.chunkBytes) || typeof d.name !== "string") {
      throw new Error("its model description is incomplete");
    }
    return d as ModelDescription;
  } catch (e) {
    throw new TransferError(`the coordinator did not describe its model: ${(e as Error).message}`);
  } finally {
    socket.destroy();
  }
}

/** The chunks asked for: requested on the cluster port's TLS, received on the keyed stream that
 * opens (transfer/wire.ts), each record read straight into its chunk's buffer and opened there. */
function chunksFrom(address: string, token: JoinToken, info: { fingerprint: string; chunkBytes: number }): (chunks: number[]) => AsyncIterable<Chunk> {
  return async function* (chunks) {
    let request, stream;
    try {
      request = await connectPinned(address, token, ALPN_CHUNKS, STALL_MS);
      request.write(encodeRequest({ proof: chunkProof(token, chunkBinding(request)).toString("hex"), fingerprint: info.fingerprint, chunks }));
      const ticket = await readTicket(request, STALL_MS);
      const key = chunkStreamKey(request);
      const rx = new ChunkReceiver(info.chunkBytes, STALL_MS, streamSeal(key, false));
      key.fill(0);
      const { host, port } = splitAddress(address);
      stream = connect({ host, port, onread: rx.onread });
      stream.setNoDelay(true);
      rx.attach(stream);
      stream.write(Buffer.concat([STREAM_MAGIC, ticket]));
      yield* rx.chunks();
    } catch (e) {
      if (e instanceof PinMismatchError) throw e;
      throw new TransferError(`fetching the model's chunks from ${address} failed: ${(e as Error).message}`);
    } finally {
      stream?.destroy();
      request?.destroy();
    }
  };
}

export class RemoteModel {
  private constructor(
    private current: LocalModel,
    readonly cached: CachedModel,
    private readonly address: string,
    private readonly token: JoinToken,
    private readonly openOptions: OpenOptions,
    private readonly log: (line: string) => void,
  ) {}

  /** The model as mapped now: opened again after each fetch, since the engine refuses a file that
   * changed under it (and writing chunks changes it). */
  get model(): LocalModel {
    return this.current;
  }

  /** Describes the coordinator's model, fetches its header into the cache and opens it. */
  static async open(o: RemoteModelOptions): Promise<RemoteModel> {
    const d = await modelInfo(o.coordinator, o.token);
    const info = { fingerprint: d.fingerprint, fileBytes: Number(d.fileBytes), dataOffset: Number(d.dataOffset), chunkBytes: d.chunkBytes, name: d.name };
    const cache = new ModelCache(o.cacheDir, { limitBytes: o.cacheLimitBytes, allowLink: o.cacheAllowLink });
    const cached = cache.open(info);
    const header = chunksFor([[0, info.dataOffset]], info);
    cached.checkRoom(header, o.log);
    try {
      await fetchChunks(cached, header, chunksFrom(o.coordinator, o.token, info));
    } catch (e) {
      throw diskFullExit(e, cache.dir) ?? e;
    }
    o.log(`model ${info.fingerprint.slice(0, 12)} from the coordinator: header in ${cached.path} (${cached.done.size} chunks of ${(info.chunkBytes / 2 ** 20).toFixed(0)} MiB held)`);
    return new RemoteModel(LocalModel.open(cached.path, o.open), cached, o.coordinator, o.token, o.open, o.log);
  }

  get path(): string {
    return this.cached.path;
  }

  /** The last fetch of fetchLayers: bytes, chunks that came again, and its time (from the request to
   * the last chunk verified, written and recorded; the model's reopening after it is not in it). */
  lastFetch: FetchResult | undefined;

  /** While a fetch writes into the mapped file: the file changes by this device's own hand. */
  private fetching = false;

  /** Why the mapped model file cannot be used (it changed under the worker), or null. Not asked of
   * the file while this device writes fetched chunks into it: it is mapped again when that ends. */
  fileProblem(): string | null {
    return this.fetching ? null : this.current.native.fileProblem();
  }

  /** The chunks these layers need that this device lacks: what fetchLayers writes (all, or some
   * when it fails partway). */
  missingFor(layers: Iterable<number>): number[] {
    return this.cached.missing(chunksFor(rangesForLayers(this.model.gguf, layers), this.cached.info));
  }

  /** Fetches what the layers need and this device lacks, then maps the file again (call it with no
   * window of the old mapping in use); reports progress as a fraction and words. Throws a WorkerExit
   * (EXIT_DISK_FULL) when the disk fills up meanwhile; other failures (the coordinator went away)
   * leave what was verified for the next fetch. */
  fetchLayers(layers: Iterable<number>, progress: (fraction: number, stage: string) => void): Promise<void> {
    // One at a time: a fetch cut off by a lost coordinator may still be ending (up to STALL_MS) when
    // the next session's assignment starts another on the same file.
    const run = this.fetches.then(() => this.fetchNow([...layers], progress));
    this.fetches = run.catch(() => {});
    return run;
  }

  private fetches: Promise<void> = Promise.resolve();

  private async fetchNow(layers: readonly number[], progress: (fraction: number, stage: string) => void): Promise<void> {
    const wanted = chunksFor(rangesForLayers(this.model.gguf, layers), this.cached.info);
    const missing = this.cached.missing(wanted);
    if (missing.length === 0) return;
    this.cached.checkRoom(wanted, this.log);
    const bytes = this.cached.bytesOf(missing);
    this.log(`fetching ${missing.length} chunks (${(bytes / 2 ** 20).toFixed(1)} MiB) of this device's windows from the coordinator`);
    let lastLog = 0;
    let r: FetchResult;
    this.fetching = true;
    try {
      r = await fetchChunks(this.cached, wanted, chunksFrom(this.address, this.token, this.cached.info), (p) => {
        const stage = `fetching layers: ${describeProgress(p)}`;
        progress(p.totalBytes ? p.doneBytes / p.totalBytes : 1, stage);
        if (performance.now() - lastLog > 2000) {
          lastLog = performance.now();
          this.log(stage);
        }
      });
    } catch (e) {
      throw diskFullExit(e, dirname(this.cached.path)) ?? e;
    } finally {
      // Chunks written before a failure changed the file as well: mapped again either way, so the
      // file the worker checks (fileProblem) is the file as this device left it.
      this.current.close();
      this.current = LocalModel.open(this.cached.path, this.openOptions);
      this.fetching = false;
    }
    this.lastFetch = r;
    this.log(`fetched ${(r.fetchedBytes / 2 ** 20).toFixed(1)} MiB in ${(r.ms / 1000).toFixed(1)} s` +
      `${r.badChunks ? ` (${r.badChunks === 1 ? "1 chunk failed its hash" : `${r.badChunks} chunks failed their hashes`} and came again)` : ""}`);
  }

  /** Chunks whose bytes turned out not to be the coordinator's (its file changed since they were
   * fetched): no longer held, so the next assignment fetches them again. */
  forgetChunks(chunks: Iterable<number>): void {
    for (const c of chunks) this.cached.done.delete(c);
    this.cached.persist();
  }

  close(): void {
    this.cached.close();
    this.current.close();
  }
}
