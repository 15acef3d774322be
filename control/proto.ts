// The gRPC control plane (protos/prima.proto) loaded at run time with @grpc/proto-loader, and
// TypeScript shapes of its messages (field names camelCased as proto-loader delivers them).
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** 2: TLS pinned by the join token, a Challenge before the Join, weights checked per chunk. 3: chunk
 * digests are BLAKE3, not SHA-256. 4: sequence slots (Assignment.seqSlots, the ring's SEQ_ACTIVATIONS
 * frames): an older worker would hold one slot and fail a --parallel ring's rows. 5: a sequence slot's
 * context shift (the ring's KV_SHIFT with a slot). */
export const PROTOCOL_VERSION = 5;

export interface Join {
  protocolVersion: number;
  deviceName: string;
  hardwareId: string;
  dataHost: string;
  dataPort: number;
  modelFingerprint: string;
  modelPath: string;
  profileJson: string;
  /** trust/token.ts joinProof over the session's Challenge. */
  proof?: Uint8Array;
}
export interface Challenge { nonce: Uint8Array }
export interface ChunkHash { index: number; digest: Uint8Array }
export interface Welcome { deviceId: string }
export interface WindowMsg { firstLayer: number; endLayer: number; cycle: number }
export interface Assignment {
  ringId: string;
  windows: WindowMsg[];
  successorUrl: string;
  ctx: number;
  maxBatch: number;
  cycles: number;
  prefetch: boolean;
  releaseAfterUse: boolean;
  threads: number;
  ringOrder: string[];
  wireDtype: number;
  /** Keys of the links from the predecessor and to the successor (32 bytes each; empty on a message
   * without them). A worker refuses an assignment without both: it never links in the clear. */
  predecessorLinkKey?: Uint8Array;
  successorLinkKey?: Uint8Array;
  /** The coordinator's digest (transfer's chunkDigest) of every chunk (of chunkBytes) holding this device's windows; the
   * device refuses to run them on other bytes. */
  windowChunks?: ChunkHash[];
  chunkBytes?: number;
  /** The KV cache's types by llama.cpp's names (f16, q8_0, q4_0); empty or absent: f16. */
  cacheTypeK?: string;
  cacheTypeV?: string;
  /** Sparse attention's settings (model/attention.ts attentionSpec); empty or absent: dense. */
  attention?: string;
  /** "h2o": the windows gather H2O's attention statistics (--kv-evict h2o); empty or absent: none. */
  kvEvict?: string;
  /** Sequence slots (serve --parallel on a ring): a KV cache per slot for every window; 0 or absent: 1. */
  seqSlots?: number;
}
export interface LoadProgress { fraction: number; stage: string }
export interface Ready { anonBytes: number; ringId?: string }
export interface Heartbeat { sentUnixMs: number }
export interface KvCommand { op: "CLEAR" | "TRUNCATE"; position: number }
export interface WindowStatus {
  firstLayer: number; endLayer: number; cycle: number; residentBytes: number; totalBytes: number;
  frames: number; tokens: number; computeMs: number; majorFaults: number;
  /** Expert prefetch of a MoE window (RingNode's expertPrefetchStatus); 0 otherwise. */
  expertsPredicted?: number; expertsRouted?: number; expertBytesUsed?: number; expertBytesWasted?: number;
  /** A MoE window's experts wholly in memory, of all of them (native Residency); 0 of 0 otherwise. */
  expertsResident?: number; expertsTotal?: number;
}
export interface Status {
  windows: WindowStatus[]; waitMs: number; sendMs: number; anonRssBytes: number; memTotalBytes: number;
  /** Of the windows' computeMs and of sendMs: the thread preempted (0 from a worker that predates it). */
  descheduledMs?: number;
  memAvailableBytes: number; memPressure: number; frames: number;
  /** Room for layer windows as the device reads it while it holds none (0 while it holds some). */
  layerRoomBytes: number;
  /** Asked for with StatusRequest.timePass: the profile with the pass timed just now ("" if not). */
  profileJson?: string;
  /** Bytes the process has read from storage since it started (0 where unknown, and from a worker
   * that predates it). */
  readBytes?: number;
}
export interface StatusRequest { timePass?: boolean }
export interface Failure {
  message: string;
  /** The answer to the oldest status request (the device could not read its status); other failures
   * (a ring link that broke) leave status requests to their own answers. */
  answersStatus?: boolean;
}
export interface ModelDescription { fingerprint: string; fileBytes: number; dataOffset: number; chunkBytes: number; name: string }
export interface Shutdown { reason: string }

interface WorkerFields { join: Join; heartbeat: Heartbeat; progress: LoadProgress; ready: Ready; status: Status; failure: Failure }
interface CoordinatorFields {
  challenge: Challenge; welcome: Welcome; assignment: Assignment; kv: KvCommand; statusRequest: StatusRequest; shutdown: Shutdown; heartbeat: Heartbeat;
}
/** A oneof message: exactly one field set; `msg` names it on received messages (proto-loader's oneofs). */
type OneOf<F> = { [K in keyof F]: { msg?: K } & Pick<F, K> }[keyof F];
/** One message on the worker -> coordinator stream. */
export type WorkerMessage = OneOf<WorkerFields>;
/** One message on the coordinator -> worker stream. */
export type CoordinatorMessage = OneOf<CoordinatorFields>;

export type SessionStream = grpc.ServerDuplexStream<WorkerMessage, CoordinatorMessage>;
export type ClientSessionStream = grpc.ClientDuplexStream<WorkerMessage, CoordinatorMessage>;

function protoPath(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const p = join(dir, "protos", "prima.proto");
    if (existsSync(p)) return p;
    const up = dirname(dir);
    if (up === dir) throw new Error("prima: protos/prima.proto not found");
    dir = up;
  }
}

interface CoordinatorPackage {
  Coordinator: grpc.ServiceClientConstructor;
}

let loaded: CoordinatorPackage | undefined;
function pkg(): CoordinatorPackage {
  if (!loaded) {
    const def = protoLoader.loadSync(protoPath(), { keepCase: false, longs: Number, enums: String, defaults: true, oneofs: true });
    loaded = (grpc.loadPackageDefinition(def) as unknown as { prima: CoordinatorPackage }).prima;
  }
  return loaded;
}

export function coordinatorService(): grpc.ServiceDefinition {
  return pkg().Coordinator.service;
}

export interface CoordinatorClient extends grpc.Client {
  session(options?: grpc.CallOptions): ClientSessionStream;
}

/** A client of the coordinator at address; `secure` from trust/'s clusterCredentials (pinned TLS). */
export function coordinatorClient(address: string, secure: { credentials: grpc.ChannelCredentials; options: grpc.ChannelOptions }): CoordinatorClient {
  const Ctor = pkg().Coordinator;
  return new Ctor(address, secure.credentials, {
    ...secure.options,
    "grpc.keepalive_time_ms": 10_000,
    "grpc.max_receive_message_length": 16 << 20,
  }) as unknown as CoordinatorClient;
}
