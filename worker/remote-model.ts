// A worker without `--model`: it asks the coordinator what the model is, keeps a sparse copy in its
// model cache (transfer/), fetches the header to open it like any GGUF, and on each assignment fetches
// the chunks of its windows it does not have yet.
import { connect } from "node:net";
import { coordinatorClient, type CoordinatorClient, type ModelDescription } from "../control/index.js";
import { LocalModel, type OpenOptions } from "../engine/index.js";
import {
  ModelCache, TransferError, chunksFor, describeProgress, encodeRequest, fetchChunks, rangesForLayers, readChunks, type CachedModel, type Chunk,
} from "../transfer/index.js";

/** A fetch that receives nothing for this long is given up (and tried again by the caller). */
const STALL_MS = 30_000;
const INFO_TIMEOUT_MS = 10_000;

export interface RemoteModelOptions {
  /** host:port of the coordinator. */
  readonly coordinator: string;
  readonly cacheDir?: string;
  readonly cacheLimitBytes?: number;
  readonly open: OpenOptions;
  readonly log: (line: string) => void;
}

function modelInfo(client: CoordinatorClient): Promise<ModelDescription> {
  return new Promise((resolve, reject) => {
    client.modelInfo({}, { deadline: Date.now() + INFO_TIMEOUT_MS }, (err, res) => {
      if (err || !res) reject(new TransferError(`the coordinator did not describe its model: ${err?.details || err?.message || "no answer"}`));
      else resolve(res);
    });
  });
}

/** The chunks asked for, on a chunk stream of the coordinator's cluster port (transfer/wire.ts). */
function chunksFrom(address: string, info: { fingerprint: string; chunkBytes: number }): (chunks: number[]) => AsyncIterable<Chunk> {
  const i = address.lastIndexOf(":");
  const host = address.slice(0, i).replace(/^\[(.*)\]$/, "$1"), port = Number(address.slice(i + 1));
  return async function* (chunks) {
    const socket = connect({ host, port });
    socket.setNoDelay(true);
    try {
      socket.write(encodeRequest({ fingerprint: info.fingerprint, chunks }));
      yield* readChunks(socket, info.chunkBytes, STALL_MS);
    } catch (e) {
      throw new TransferError(`fetching the model's chunks from ${address} failed: ${(e as Error).message}`);
    } finally {
      socket.destroy();
    }
  };
}

export class RemoteModel {
  private constructor(
    private current: LocalModel,
    readonly cached: CachedModel,
    private readonly address: string,
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
    const client = coordinatorClient(o.coordinator);
    try {
      const d = await modelInfo(client);
      const info = { fingerprint: d.fingerprint, fileBytes: Number(d.fileBytes), dataOffset: Number(d.dataOffset), chunkBytes: d.chunkBytes, name: d.name };
      const cache = new ModelCache(o.cacheDir, o.cacheLimitBytes);
      const cached = cache.open(info);
      const header = chunksFor([[0, info.dataOffset]], info);
      cached.checkRoom(header, o.log);
      await fetchChunks(cached, header, chunksFrom(o.coordinator, info));
      o.log(`model ${info.fingerprint.slice(0, 12)} from the coordinator: header in ${cached.path} (${cached.done.size} chunks of ${(info.chunkBytes / 2 ** 20).toFixed(0)} MiB held)`);
      return new RemoteModel(LocalModel.open(cached.path, o.open), cached, o.coordinator, o.open, o.log);
    } finally {
      client.close();
    }
  }

  get path(): string {
    return this.cached.path;
  }

  /** Fetches what the layers need and this device lacks, then maps the file again (call it with no
   * window of the old mapping in use); reports progress as a fraction and words. */
  async fetchLayers(layers: Iterable<number>, progress: (fraction: number, stage: string) => void): Promise<void> {
    const wanted = chunksFor(rangesForLayers(this.model.gguf, layers), this.cached.info);
    const missing = this.cached.missing(wanted);
    if (missing.length === 0) return;
    this.cached.checkRoom(wanted, this.log);
    const bytes = this.cached.bytesOf(missing);
    this.log(`fetching ${missing.length} chunks (${(bytes / 2 ** 20).toFixed(1)} MiB) of this device's windows from the coordinator`);
    let lastLog = 0;
    const r = await fetchChunks(this.cached, wanted, chunksFrom(this.address, this.cached.info), (p) => {
      const stage = `fetching layers: ${describeProgress(p)}`;
      progress(p.totalBytes ? p.doneBytes / p.totalBytes : 1, stage);
      if (performance.now() - lastLog > 2000) {
        lastLog = performance.now();
        this.log(stage);
      }
    });
    this.log(`fetched ${(r.fetchedBytes / 2 ** 20).toFixed(1)} MiB in ${(r.ms / 1000).toFixed(1)} s` +
      `${r.badChunks ? ` (${r.badChunks === 1 ? "1 chunk failed its hash" : `${r.badChunks} chunks failed their hashes`} and came again)` : ""}`);
    this.current.close();
    this.current = LocalModel.open(this.cached.path, this.openOptions);
  }

  close(): void {
    this.cached.close();
    this.current.close();
  }
}
