// Typed surface of the native lane (bind_lane.cc, src/lane.h): a ring worker's data path on a thread
// of its own. ring/lane.ts is its only user.
import { addon } from "./binding.js";
import type { NativeModel, NativeWindow } from "./model.js";

export type LaneLinkName = "in" | "out";

export interface NativeLaneEvent {
  /** frame: a message the lane leaves to JS (`data`; after an "in" frame the lane waits for resume();
   * `code` 1: a frame to run with runFrame, one that may take long, 0: one for JS to decode);
   * failed: the link failed (`failure` "protocol" | "dead" | "closed", `text` why); closed: the
   * connection ended (`code`, 1006 when lost, and `text` the reason); error: a window's pass failed
   * (`text`), and an ERROR frame went on to the successor. */
  readonly kind: "frame" | "failed" | "closed" | "error";
  readonly link: LaneLinkName;
  readonly code: number;
  readonly failure: string;
  readonly text: string;
  readonly data?: Buffer;
}

export interface NativeLaneOptions {
  readonly cycles: number;
  /** This device's receive limits (its HELLO): frames outside them go to JS to be named and refused. */
  readonly maxTokensPerFrame: number;
  readonly maxPayloadBytes: number;
  readonly maxMessageBytes: number;
  /** Bytes of frames read and not yet run: past it the predecessor is dropped as a flood. */
  readonly maxQueuedBytes: number;
  /** ring/liveness.ts's livenessRules() and ring/link.ts's close grace: the lane keeps the same rules. */
  readonly tickMs: number;
  readonly quietMs: number;
  readonly deadAfterMs: number;
  readonly closeGraceMs: number;
  readonly fragmentBytes: number;
  readonly prefetch: boolean;
  /** Bytes of weights in the lane's windows: a pass runs on the lane thread only while they all fit
   * the weight room (setWeightRoom). */
  readonly weightBytes: number;
  /** A one-token pass (or a decode step of several sequences) runs on the lane thread when the
   * window's last one took less than this many ms (and no page fault); longer ones go to runFrame. */
  readonly quickPassMs: number;
  /** Per window, its sequence slots' windows over the same layers, the window itself first (serve
   * --parallel): SEQ_ACTIVATIONS rows run on them. Without it the lane holds one sequence. */
  readonly seqWindows?: readonly (readonly NativeWindow[])[];
}

export interface NativeLaneWindowStats {
  readonly computeMs: number;
  readonly frames: number;
  readonly tokens: number;
  readonly majorFaults: number;
}

export interface NativeLaneStats {
  readonly waitMs: number;
  readonly sendMs: number;
  /** Of the windows' computeMs and of sendMs: the lane thread preempted (threadpool.h). */
  readonly descheduledMs: number;
  readonly frames: number;
  readonly windows: readonly NativeLaneWindowStats[];
}

/** A keyed link's state (ring/seal.ts): each direction's AES-256-GCM key and next sequence number. */
export interface NativeLaneCrypto {
  readonly tx: { readonly key: Uint8Array; readonly seq: number };
  readonly rx: { readonly key: Uint8Array; readonly seq: number };
}

export interface NativeLane {
  /** Hands over a connected socket (the lane takes a dup of fd) from which nothing unparsed was read;
   * with `crypto`, the lane seals what it sends on it and opens what it receives (a plaintext link without). */
  attach(link: LaneLinkName, fd: number, crypto?: NativeLaneCrypto): void;
  /** A whole frame for the successor. */
  send(frame: Uint8Array): void;
  /** Runs a frame the lane left with code 1 on a libuv thread; settles once its rows (or an ERROR frame,
   * and then it rejects) are queued for the successor. */
  runFrame(frame: Buffer): Promise<void>;
  resume(): void;
  /** Close handshake with code and reason; code 0 ends the connection at once. */
  closeLink(link: LaneLinkName, code: number, reason?: string): void;
  setWeightRoom(bytes: number): void;
  setReleaseAfterUse(on: boolean): void;
  stats(): NativeLaneStats;
  resetStats(): void;
  kvClear(): void;
  kvTruncate(position: number): void;
  /** Every window's context shift (NativeWindow.kvShift), or of one sequence slot's windows, between frames. */
  kvShift(p0: number, nDiscard: number, nPast: number, slot?: number): void;
  /** Each window's H2O statistics (NativeWindow.h2oScores; null without them), between frames. */
  h2oScores(): (Float32Array | null)[];
  /** Ends the thread and its sockets (no close frames). The windows are usable from JS again. */
  stop(): void;
}

type LaneCtor = new (model: NativeModel, windows: readonly NativeWindow[], cycles: readonly number[], options: NativeLaneOptions,
  onEvent: (ev: NativeLaneEvent) => void) => NativeLane;

/** The cycle of an ACTIVATIONS or SEQ_ACTIVATIONS frame the lane would run itself under these limits, or -1 (lane.c's
 * prima_lane_frame_cycle): whatever it accepts, ring/validation.ts must accept too. */
export function laneFrameCycle(frame: Uint8Array, hiddenSize: number, maxTokensPerFrame: number, maxPayloadBytes: number): number {
  return (addon.laneFrameCycle as (f: Uint8Array, h: number, t: number, p: number) => number)(frame, hiddenSize, maxTokensPerFrame, maxPayloadBytes);
}

export function startNativeLane(model: NativeModel, windows: readonly NativeWindow[], cycles: readonly number[],
  options: NativeLaneOptions, onEvent: (ev: NativeLaneEvent) => void): NativeLane {
  return new (addon.NativeLane as LaneCtor)(model, windows, cycles, options, onEvent);
}
