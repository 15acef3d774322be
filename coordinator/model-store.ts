// The coordinator's model store: a device without its own copy of the model asks what the model is
// (ModelInfo, on gRPC) and fetches the chunks of its windows on a chunk stream of the cluster port.
// Chunks are read one at a time and written with the socket's backpressure, so several devices can
// fetch at once without the coordinator holding whole windows in memory.
import type { ModelDescription, ModelStoreHandlers } from "../control/index.js";
import { printable } from "../model/index.js";
import type { Socket } from "node:net";
import { chunkCount, encodeChunkHeader, encodeEnd, encodeError, readRequest, type ModelSource } from "../transfer/index.js";

export function modelStoreHandlers(source: ModelSource): ModelStoreHandlers {
  return {
    modelInfo: (_call, callback) => {
      const i = source.info;
      const d: ModelDescription = { fingerprint: i.fingerprint, fileBytes: i.fileBytes, dataOffset: i.dataOffset, chunkBytes: i.chunkBytes, name: i.name };
      callback(null, d);
    },
  };
}

/** A request can wait this long for its first bytes, and a device this long for the next chunk. */
const CHUNK_IO_TIMEOUT_MS = 30_000;

/** Answers a chunk stream on the cluster port (transfer/wire.ts): each chunk read from the file
 * when its turn comes and written with the socket's backpressure. */
export function serveChunks(source: ModelSource, log: (line: string) => void): (socket: Socket) => void {
  return (socket) => {
    socket.resume();
    void (async () => {
      try {
        const req = await readRequest(socket, CHUNK_IO_TIMEOUT_MS);
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
        // The next chunk is read from the file while this one is on the wire.
        let next = req.chunks.length > 0 ? source.read(req.chunks[0]) : undefined;
        for (let i = 0; i < req.chunks.length; i++) {
          const { data, sha256 } = await next!;
          next = i + 1 < req.chunks.length ? source.read(req.chunks[i + 1]) : undefined;
          next?.catch(() => {}); // its failure is met when its turn comes
          if (socket.destroyed) return;
          socket.write(encodeChunkHeader(req.chunks[i], data.length, sha256));
          if (!socket.write(data)) await once(socket, "drain", CHUNK_IO_TIMEOUT_MS);
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
function once(socket: Socket, event: string, timeoutMs: number): Promise<void> {
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
