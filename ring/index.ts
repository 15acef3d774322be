// ring/: the data plane. Activations travel from each device to its successor over one persistent
// binary WebSocket per device pair: a 32-byte little-endian header and a payload (frame.ts), a
// HELLO handshake that checks model and ring (hello.ts, handshake.ts), and links that send in order
// with backpressure and watch their peer's liveness (link.ts, dial.ts, listener.ts). On a worker, the
// native lane (lane.ts) can take both links over and run the frames in C.
// Which device runs which window when is the ring driver's business, not this folder's.
export { FrameError, RingLinkError, type RingLinkErrorKind } from "./errors.js";
export { f16ToF32, f32ToF16 } from "./f16.js";
export {
  decodeFrame, encodeFrame, readFrameHeader,
  type ActivationsFrame, type ErrorFrame, type Frame, type HelloFrame, type KvShiftFrame, type SeqActivationsFrame,
} from "./frame.js";
export {
  CONTROL_PAYLOAD_MAX_BYTES, FRAME_HEADER_BYTES, FRAME_HEADER_VERSION, FRAME_MAGIC, FrameTypeId, PAYLOAD_DTYPE_BYTES,
  PROTOCOL_VERSION, PayloadDtypeId,
  type FrameHeader, type FrameLimits, type FrameTypeName, type Hello, type PayloadDtype,
} from "./validation.js";
export { helloMismatch, type RingIdentity } from "./hello.js";
// The link handshake's proofs (bench/crypto times them).
export { DialerProof, listenerAnswer } from "./seal.js";
export {
  CloseCode, DEFAULT_FRAGMENT_BYTES, DEFAULT_HANDSHAKE_TIMEOUT_MS, DEFAULT_MAX_TOKENS_PER_FRAME, resolveLinkOptions,
  type ResolvedLinkOptions, type RingLinkOptions,
} from "./options.js";
export { DEFAULT_LIVENESS_TIMEOUT_MS } from "./liveness.js";
export { RingLink, type FrameSendStats, type PeerRole, type RingLinkClosed, type RingLinkCounters } from "./link.js";
export { dialSuccessor, dialSuccessorWithin } from "./dial.js";
export { RingListener, RingPort, type DroppedPeer, type RingListenerOptions } from "./listener.js";
// The piped-ring driver (the lead's): a device's node, the head's pipeline, windows per cycle.
export { RingLane, type RingLaneOptions } from "./lane.js";
export { RING_COMPUTE_OPTIONS, RingNode, expertPrefetchStatus, type NodeStats, type RingFrame, type RingNodeOptions, type WindowSpec, type WindowStats } from "./node.js";
export { RingPipeline, type RingPipelineOptions } from "./pipeline.js";
export { RingSeqSlots } from "./seq-slots.js";
export { PlanError, evenLayerWindows, ringWindows, type RingWindows } from "./windows.js";
