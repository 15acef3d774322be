// The two error types of the data plane: a frame that fails the codec's checks, and a link that
// cannot be made or stops working. Both carry a message a user can act on; neither carries a stack
// worth reading, so callers log `.message`.

/** A frame the codec refuses (decoding) or cannot write (encoding); `field` names the culprit. */
export class FrameError extends Error {
  override name = "FrameError";
  /** Header field or payload part at fault ("magic", "row width", "payload", ...). */
  readonly field: string;
  constructor(field: string, message: string) {
    super(`frame: ${message}`);
    this.field = field;
  }
}

/**
 * Why a link failed:
 * - unreachable: nothing answered at the address (refused, no route, unknown host);
 * - timeout: the peer did not finish connecting and saying HELLO in time;
 * - refused: one side refused the other's HELLO (model, hidden size, ring, protocol);
 * - protocol: the peer sent something that is not a valid frame;
 * - dead: the peer stopped answering pings or stopped reading;
 * - closed: the connection ended (by either side) while something still needed it.
 */
export type RingLinkErrorKind = "unreachable" | "timeout" | "refused" | "protocol" | "dead" | "closed";

export class RingLinkError extends Error {
  override name = "RingLinkError";
  readonly kind: RingLinkErrorKind;
  /** Who is at the other end: device id when known, and address ("dev-b (ws://10.0.0.2:9000)"). */
  readonly peer: string;
  constructor(kind: RingLinkErrorKind, peer: string, message: string) {
    super(`ring link ${peer}: ${message}`);
    this.kind = kind;
    this.peer = peer;
  }
}
