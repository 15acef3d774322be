// TLS on the cluster port. The coordinator terminates TLS on each accepted socket itself (one port for
// gRPC and chunk requests, told apart by ALPN, and the keyed chunk streams those requests open, told
// apart from TLS by their first bytes); a worker accepts only the certificate its token pins.
import * as grpc from "@grpc/grpc-js";
import type { Socket } from "node:net";
import { connect, createServer, type Server, type TLSSocket } from "node:tls";
import { CHUNK_EXPORTER_LABEL, CHUNK_STREAM_LABEL, TrustError, sha256, type JoinToken } from "./token.js";

/** gRPC (HTTP/2). */
export const ALPN_GRPC = "h2";
/** A chunk stream (transfer/wire.ts). */
export const ALPN_CHUNKS = "prima-chunks/1";
/** The name a worker asks for (SNI): the certificate is pinned by hash, never checked by name, and an
 * IP address is not a valid SNI name. */
const SERVER_NAME = "prima-cluster";

export interface ClusterKeys {
  readonly keyPem: string;
  readonly certPem: string;
}

/** A TLS record of the handshake type: how every TLS connection starts (its ClientHello). */
const TLS_HANDSHAKE_RECORD = 0x16;

/**
 * The coordinator's TLS: takes accepted TCP sockets and hands each, once its handshake is done, to
 * onSecure with the protocol it chose. A handshake that fails or takes over handshakeMs is dropped. A
 * socket that starts with `streamMagic` instead is a keyed stream: once its `streamHeadBytes` (the
 * magic and what follows) are in, it goes to onStream with them; anything else is dropped.
 */
export class TlsGate {
  private readonly server: Server;

  constructor(
    keys: ClusterKeys, private readonly handshakeMs: number, onSecure: (socket: TLSSocket, alpn: string) => void,
    private readonly stream?: { readonly magic: Buffer; readonly headBytes: number; readonly onStream: (socket: Socket, head: Buffer) => void },
  ) {
    // A tls.Server that never listens: it only runs handshakes on the sockets given to it.
    this.server = createServer({ key: keys.keyPem, cert: keys.certPem, ALPNProtocols: [ALPN_GRPC, ALPN_CHUNKS], handshakeTimeout: handshakeMs, minVersion: "TLSv1.3" }, (s) => {
      const alpn = s.alpnProtocol;
      if (typeof alpn === "string") onSecure(s, alpn);
      else s.destroy(); // a client that names no protocol is not ours
    });
    this.server.on("tlsClientError", (_e, s) => s.destroy());
  }

  accept(socket: Socket): void {
    if (!this.stream) return void this.server.emit("connection", socket);
    // Its first bytes say what it is; TLS gets them back (unshift) and runs the handshake as usual.
    const stream = this.stream;
    let got = Buffer.alloc(0);
    const timer = setTimeout(() => socket.destroy(), this.handshakeMs);
    const onData = (d: Buffer) => {
      got = Buffer.concat([got, d]);
      if (got[0] === TLS_HANDSHAKE_RECORD) {
        done();
        socket.unshift(got);
        this.server.emit("connection", socket);
      } else if (!got.subarray(0, stream.magic.length).equals(stream.magic.subarray(0, got.length))) {
        done();
        socket.destroy(); // neither TLS nor a keyed stream
      } else if (got.length >= stream.headBytes) {
        done();
        if (got.length > stream.headBytes) socket.unshift(got.subarray(stream.headBytes));
        stream.onStream(socket, got.subarray(0, stream.headBytes));
      }
    };
    const done = () => {
      clearTimeout(timer);
      socket.off("data", onData);
      socket.off("close", done);
      socket.pause();
    };
    socket.on("data", onData);
    socket.once("close", done);
  }

  /** A rotated identity: new handshakes use it. */
  setKeys(keys: ClusterKeys): void {
    this.server.setSecureContext({ key: keys.keyPem, cert: keys.certPem });
  }
}

/** Keying material of this TLS connection (RFC 5705) that a chunk stream's proof covers: the same at
 * both ends, unknown to anyone else, different on every connection. */
export function chunkBinding(s: TLSSocket): Buffer {
  return exported(s, CHUNK_EXPORTER_LABEL);
}

/** 32 bytes of this TLS session's keying material under a label (RFC 5705). */
function exported(s: TLSSocket, label: string): Buffer {
  return s.exportKeyingMaterial(32, label, Buffer.from("prima"));
}

/** The key of the keyed stream a chunk request on this TLS connection opens (transfer/wire.ts): the
 * same at both ends, unknown to anyone else, different on every connection. */
export function chunkStreamKey(s: TLSSocket): Buffer {
  return exported(s, CHUNK_STREAM_LABEL);
}

/** host and port of "host:port" or "[v6]:port". */
export function splitAddress(address: string): { host: string; port: number } {
  const i = address.lastIndexOf(":");
  return { host: address.slice(0, i).replace(/^\[(.*)\]$/, "$1"), port: Number(address.slice(i + 1)) };
}

export class PinMismatchError extends TrustError {
  override name = "PinMismatchError";
}

function pinMatches(raw: Buffer | undefined, pin: Buffer): boolean {
  return raw !== undefined && raw.length > 0 && sha256(raw).equals(pin);
}

/** A TLS connection to the coordinator, refused unless it presents the pinned certificate; resolves
 * once the handshake is done and the certificate checked, before anything is written. */
export function connectPinned(address: string, token: JoinToken, alpn: string, timeoutMs: number): Promise<TLSSocket> {
  const { host, port } = splitAddress(address);
  return new Promise((resolve, reject) => {
    // The chain is not verified (self-signed): the pin below is the whole check.
    const s = connect({ host, port, servername: SERVER_NAME, ALPNProtocols: [alpn], rejectUnauthorized: false, minVersion: "TLSv1.3" });
    const timer = setTimeout(() => fail(new Error(`no TLS handshake with ${address} within ${timeoutMs / 1000} s`)), timeoutMs);
    const fail = (e: Error) => {
      clearTimeout(timer);
      s.destroy();
      reject(e);
    };
    s.once("error", fail);
    s.once("secureConnect", () => {
      clearTimeout(timer);
      s.off("error", fail);
      if (!pinMatches(s.getPeerCertificate(true)?.raw, token.pin)) {
        s.destroy();
        reject(new PinMismatchError(`${address} is not the coordinator this token names: its certificate differs (an impostor, or the token was rotated)`));
        return;
      }
      if (s.alpnProtocol !== alpn) {
        s.destroy();
        reject(new TrustError(`${address} does not speak ${alpn}`));
        return;
      }
      resolve(s);
    });
  });
}

/** gRPC credentials that accept only the pinned certificate. gRPC verifies a chain against root
 * certificates, so the coordinator's own certificate, fetched over a pinned connection first, is the
 * root, and checkServerIdentity checks the pin again. Fetched for every session (a handshake costs
 * milliseconds): an impostor or a rotated certificate is then named as such, not as a TLS error. */
export async function clusterCredentials(address: string, token: JoinToken, timeoutMs: number): Promise<{ credentials: grpc.ChannelCredentials; options: grpc.ChannelOptions }> {
  const s = await connectPinned(address, token, ALPN_CHUNKS, timeoutMs);
  const raw = s.getPeerCertificate(true).raw;
  s.destroy();
  const pem = `-----BEGIN CERTIFICATE-----\n${raw.toString("base64").match(/.{1,64}/g)!.join("\n")}\n-----END CERTIFICATE-----\n`;
  const credentials = grpc.credentials.createSsl(Buffer.from(pem), null, null, {
    checkServerIdentity: (_host, cert) => (pinMatches(cert.raw, token.pin) ? undefined : new PinMismatchError(`${address} presented another certificate than the token names`)),
  });
  return { credentials, options: { "grpc.ssl_target_name_override": SERVER_NAME } };
}
