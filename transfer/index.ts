// transfer/: shipping a device only the bytes of its windows. The coordinator serves its model file
// chunk by chunk with BLAKE3 digests (source.ts); a device keeps a sparse copy laid out like the GGUF
// in a local cache keyed by the model's fingerprint (cache.ts; it owns only the files its manifest,
// manifest.ts, lists), fetches the chunks it lacks and verifies each (fetch.ts). The transport (the
// control plane) is the caller's.
export { CHUNK_BYTES, CHUNK_DIGEST, DIGEST_MODULE, NATIVE_DIGEST, chunkCount, chunkDigest, chunkRange, chunksFor, rangesForLayers, type ModelInfo } from "./chunks.js";
export { ModelSource, type SourceOptions } from "./source.js";
export { CacheError, CachedModel, DIRECT_WRITE_ALIGN, ModelCache, NoRoomError, TransferError, chunkBuffer, defaultModelCacheDir, freeDiskBytes, type ModelCacheOptions } from "./cache.js";
export { MANIFEST_NAME } from "./manifest.js";
export { writeFileAtomic } from "./persist.js";
export { describeProgress, fetchChunks, type Chunk, type FetchProgress, type FetchResult } from "./fetch.js";
export {
  CHUNK_MAGIC, STREAM_MAGIC, TICKET_BYTES, ChunkReceiver, encodeError, encodeInfo, encodeRecordHeader, encodeRequest, encodeStreamTicket,
  readInfo, readRequest, readTicket, sealEnd, sealError, sealRecord, type ChunkRequest,
} from "./wire.js";
