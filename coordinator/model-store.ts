// The coordinator's model store: a device without its own copy of the model asks what the model is
// and fetches the chunks of its windows on a chunk stream of the cluster port (inside its TLS). Every
// request proves the join token first (bound to its TLS connection); one that does not is told only
// that. Chunks are read one at a time and written with the socket's backpressure, so several devices
// can fetch at once without the coordinator holding whole windows in memory.
import type { TLSSocket } from "node:tls";
import type { ChunkHash, ModelDescription } from "../control/index.js";
import { printable, type GgufFile } from "../model/index.js";
import { chunkBinding, chunkProof, proofMatches, type JoinToken } from "../trust/index.js";
import { chunkCount, chunksFor, rangesForLayers, encodeChunkHeader, encodeEnd, encodeError, encodeInfo, readRequest, type ModelSource } from "../transfer/index.js";

/** What a chunk stream without a valid proof hears: nothing about the cluster or its model. */
export const CHUNK_REFUSAL = "refused: this is not the cluster's join token";

/** A request can wait this long for its first bytes, and a device this long for the next chunk. */
const CHUNK_IO_TIMEOUT_MS = 30_000;

/** Answers a chunk stream on the cluster port (transfer/wire.ts): each chunk read from the file
 * when its turn comes and written with the socket's backpressure. */
export function serveChunks(source: ModelSource, log: (line: string) => void): (socket: TLSSocket, token: JoinToken) => void {
  return (socket, token) => {
    socket.resume();
    void (async () => {
      try {
        // A worker that only fetched the certificate closes before it asks anything: not worth a line.
        const req = await readRequest(socket, CHUNK_IO_TIMEOUT_MS).catch((e: Error) => {
          if (/connection (ended|closed)/.test(e.message)) return undefined;
          throw e;
        });
        if (!req) return socket.destroy();
        if (!proofMatches(Buffer.from(req.proof, "hex"), chunkProof(token, chunkBinding(socket)))) {
          log(`refused a chunk stream from ${printable(socket.remoteAddress ?? "?")}: wrong join token`);
          socket.end(encodeError(CHUNK_REFUSAL));
          return;
        }
        if (req.info) {
          const i = source.info;
          const d: ModelDescription = { fingerprint: i.fingerprint, fileBytes: i.fileBytes, dataOffset: i.dataOffset, chunkBytes: i.chunkBytes, name: i.name };
          socket.end(encodeInfo(d));
          return;
        }
        const n = chunkCount(source.info);
        if (req.fingerprint !== source.info.fingerprint) {
          socket.end(encodeError(`this coordinator serves model ${source.info.fingerprint.slice(0, 12)}, not ${printable(req.fingerprint, 20)}`));
          return;
        }
        const bad = req.chunks.find((c) => c >= n);
        if (bad !== undefined) {
          socket.end(encodeError(`chunk ${bad} does not exist (the model has ${n})`));
          return;
        }
        socket.pause(); // nothing more to read: only the close
        // The next chunk is read from the file while this one is on the wire, into buffers used
        // again once the socket is done with them (its write callback).
        const spare: Buffer[] = [];
        const read = (c: number) => {
          const p = source.read(c, spare.pop());
          p.catch(() => {}); // its failure is met when its turn comes
          return p;
        };
        let next = req.chunks.length > 0 ? read(req.chunks[0]) : undefined;
        for (let i = 0; i < req.chunks.length; i++) {
          const { data, digest } = await next!;
          next = i + 1 < req.chunks.length ? read(req.chunks[i + 1]) : undefined;
          if (socket.destroyed) return;
          socket.write(encodeChunkHeader(req.chunks[i], data.length, digest));
          const more = socket.write(data, (e) => {
            if (!e && data.length === source.info.chunkBytes && spare.length < 2) spare.push(data);
          });
          if (!more) await once(socket, "drain", CHUNK_IO_TIMEOUT_MS);
        }
        socket.end(encodeEnd());
      } catch (e) {
        log(`a chunk stream ended: ${printable((e as Error).message, 200)}`);
        if (!socket.destroyed) socket.end(encodeError((e as Error).message));
      }
    })();
  };
}

/** Resolves on the event, rejects when the socket closes first or the time is up. */
function once(socket: TLSSocket, event: string, timeoutMs: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const done = (e?: Error) => {
      clearTimeout(timer);
      socket.off(event, ok);
      socket.off("close", closed);
      if (e) reject(e);
      else resolve();
    };
    const ok = () => done();
    const closed = () => done(new Error("the device closed the connection"));
    const timer = setTimeout(() => done(new Error(`the device read nothing for ${timeoutMs / 1000} s`)), timeoutMs);
    socket.once(event, ok);
    socket.once("close", closed);
  });
}

/** The coordinator's hashes of the chunks holding these layers (and the header), for an Assignment:
 * the device checks its own copy against them (worker/weights.ts). */
export async function windowChunkHashes(source: ModelSource, file: GgufFile, layers: Iterable<number>): Promise<ChunkHash[]> {
  const out: ChunkHash[] = [];
  for (const i of chunksFor(rangesForLayers(file, layers), source.info)) out.push({ index: i, digest: Buffer.from(await source.hashOf(i), "hex") });
  return out;
}
