// The coordinator's model store on the control plane: a device without its own copy of the model asks
// what the model is (ModelInfo) and fetches the chunks of its windows (FetchChunks). Chunks are read one
// at a time and written with the stream's backpressure, so several devices can fetch at once without
// the coordinator holding whole windows in memory.
import * as grpc from "@grpc/grpc-js";
import type { FetchRequest, ModelChunk, ModelDescription, ModelStoreHandlers } from "../control/index.js";
import { printable } from "../model/index.js";
import { chunkCount, type ModelSource } from "../transfer/index.js";

/** A request may name every chunk of a large model, no more. */
const MAX_CHUNKS_PER_REQUEST = 1 << 16;

export function modelStoreHandlers(source: ModelSource, log: (line: string) => void): ModelStoreHandlers {
  const refuse = (call: grpc.ServerWritableStream<FetchRequest, ModelChunk>, code: grpc.status, details: string) => {
    call.emit("error", { code, details });
  };
  return {
    modelInfo: (_call, callback) => {
      const i = source.info;
      const d: ModelDescription = { fingerprint: i.fingerprint, fileBytes: i.fileBytes, dataOffset: i.dataOffset, chunkBytes: i.chunkBytes, name: i.name };
      callback(null, d);
    },
    fetchChunks: (call) => {
      const req = call.request;
      const n = chunkCount(source.info);
      if (req.fingerprint !== source.info.fingerprint) {
        refuse(call, grpc.status.NOT_FOUND, `this coordinator serves model ${source.info.fingerprint.slice(0, 12)}, not ${printable(req.fingerprint, 20)}`);
        return;
      }
      const chunks = req.chunks ?? [];
      if (chunks.length > MAX_CHUNKS_PER_REQUEST || chunks.some((c) => !Number.isInteger(c) || c < 0 || c >= n)) {
        refuse(call, grpc.status.INVALID_ARGUMENT, `chunks must be ${MAX_CHUNKS_PER_REQUEST} or fewer indexes below ${n}`);
        return;
      }
      void (async () => {
        try {
          for (const index of chunks) {
            if (call.cancelled) return;
            const { data, sha256 } = await source.read(index);
            if (!call.write({ index, data, sha256 })) {
              await new Promise<void>((resolve) => {
                const done = () => {
                  call.off("drain", done);
                  call.off("cancelled", done);
                  resolve();
                };
                call.on("drain", done);
                call.on("cancelled", done);
              });
            }
          }
          call.end();
        } catch (e) {
          log(`serving model chunks failed: ${(e as Error).message}`);
          refuse(call, grpc.status.INTERNAL, `reading the model failed: ${(e as Error).message}`);
        }
      })();
    },
  };
}
