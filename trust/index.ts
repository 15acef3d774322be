// trust/: who may join a cluster. The join token (token.ts), the coordinator's key, certificate and
// token kept per cluster name (store.ts), and TLS on the cluster port pinned to that certificate (tls.ts).
export { CHUNK_EXPORTER_LABEL, CHUNK_STREAM_LABEL, TrustError, chunkProof, formatToken, joinProof, parseToken, proofMatches, type JoinToken } from "./token.js";
export { TrustStore, configDir, createIdentity, workerToken, type ClusterIdentity } from "./store.js";
export { ALPN_CHUNKS, ALPN_GRPC, PinMismatchError, TlsGate, chunkBinding, chunkStreamKey, clusterCredentials, connectPinned, splitAddress, type ClusterKeys } from "./tls.js";
