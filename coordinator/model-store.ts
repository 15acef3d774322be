// The coordinator's model store: a device without its own copy of the model asks what the model is
// and asks for the chunks of its windows on the cluster port, inside its TLS; the chunks come on the
// keyed stream that request opens (transfer/wire.ts). Every request proves the join token first
// (bound to its TLS connection); one that does not is told only that. Chunks are read a few at a time
// (READ_AHEAD) and written with the socket's backpressure, so several devices can fetch at once
// without the coordinator holding whole windows in memory.
import { randomBytes } from "node:crypto";
import type { Socket } from "node:net";
import type { TLSSocket } from "node:tls";
import type { ChunkHash, ModelDescription } from "../control/index.js";
import { printable, type GgufFile } from "../model/index.js";
import { streamSeal } from "../native/index.js";
import { chunkBinding, chunkProof, chunkStreamKey, proofMatches, type JoinToken } from "../trust/index.js";
import {
  TICKET_BYTES, chunkCount, chunksFor, encodeError, encodeInfo, encodeStreamTicket, rangesForLayers, readRequest, sealEnd, sealError, sealRecord, type ModelSource,
} from "../transfer/index.js";
import type { ChunkService } from "./registry.js";

/** What a chunk stream without a valid proof hears: nothing about the cluster or its model. */
export const CHUNK_REFUSAL = "refused: this is not the cluster's join token";

/** A request can wait this long for its first bytes, and a device this long for the next chunk. */
const CHUNK_IO_TIMEOUT_MS = 30_000;
/** Chunks read from the file ahead of the one being sent (each a chunk's memory per stream). */
const READ_AHEAD = 2;
/** A ticket is good for this long, once. */
const TICKET_MS = 10_000;
/** Tickets not yet used, at most (a device has one at a time; the cluster port bounds connections). */
const MAX_TICKETS = 256;

interface Pending {
  readonly request: TLSSocket;
  readonly key: Buffer;
  readonly chunks: readonly number[];
  readonly timer: NodeJS.Timeout;
}

/** Answers chunk requests and the keyed streams they open (transfer/wire.ts): each chunk read from
 * the file when its turn comes, sealed in place and written with the socket's backpressure. */
export function serveChunks(source: ModelSource, log: (line: string) => void): ChunkService {
  const pending = new Map<string, Pending>();
  const forget = (ticket: string) => {
    const p = pending.get(ticket);
    if (!p) return undefined;
    pending.delete(ticket);
    clearTimeout(p.timer);
    return p;
  };
  return {
    request: (socket: TLSSocket, token: JoinToken, proven: () => void) => {
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
          proven();
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
          if (pending.size >= MAX_TICKETS) {
            socket.end(encodeError("too many chunk streams are waiting to start; try again"));
            return;
          }
          // The chunks come on a keyed stream named by a one-time ticket; this connection stays open
          // (idle) until that stream is done, and its end ends the ticket.
          const ticket = randomBytes(TICKET_BYTES);
          const id = ticket.toString("hex");
          pending.set(id, { request: socket, key: chunkStreamKey(socket), chunks: req.chunks, timer: setTimeout(() => forget(id) && socket.destroy(), TICKET_MS).unref() });
          socket.once("close", () => forget(id));
          socket.write(encodeStreamTicket(ticket));
        } catch (e) {
          log(`a chunk request ended: ${printable((e as Error).message, 200)}`);
          if (!socket.destroyed) socket.end(encodeError((e as Error).message));
        }
      })();
    },
    stream: (socket: Socket, ticket: Buffer, proven: () => void) => {
      const p = forget(ticket.toString("hex"));
      if (!p) return void socket.destroy(); // unknown, used or expired: nothing said
      proven();
      socket.on("error", () => socket.destroy());
      // The device says nothing after its ticket: anything more ends the stream.
      socket.on("data", () => socket.destroy()).resume();
      socket.once("close", () => p.request.destroy());
      void sendChunks(source, socket, p.key, p.chunks).catch((e: Error) => log(`a chunk stream ended: ${printable(e.message, 200)}`));
    },
  };
}

/** The chunks asked for as sealed records on a keyed stream, then END (or ERROR and why). */
async function sendChunks(source: ModelSource, socket: Socket, key: Buffer, chunks: readonly number[]): Promise<void> {
  const seal = streamSeal(key, true);
  key.fill(0);
  const write = (parts: Buffer[], done?: (e?: Error | null) => void): boolean => {
    socket.cork();
    for (let i = 0; i < parts.length - 1; i++) socket.write(parts[i]);
    const more = socket.write(parts[parts.length - 1], done);
    socket.uncork();
    return more;
  };
  try {
    // The next chunks are read from the file while this one is sealed and on the wire, into buffers
    // used again once the socket is done with them (its write callback).
    const spare: Buffer[] = [];
    const read = (c: number) => {
      const p = source.read(c, spare.pop());
      p.catch(() => {}); // its failure is met when its turn comes
      return p;
    };
    const ahead = chunks.slice(0, READ_AHEAD).map(read);
    for (let i = 0; i < chunks.length; i++) {
      const { data, digest } = await ahead.shift()!;
      if (i + READ_AHEAD < chunks.length) ahead.push(read(chunks[i + READ_AHEAD]));
      if (socket.destroyed) return;
      // Sealed in place: `data` is the read buffer, which the next read overwrites anyway.
      const more = write(sealRecord(seal, chunks[i], data, digest), (e) => {
        if (!e && data.length === source.info.chunkBytes && spare.length < READ_AHEAD + 1) spare.push(data);
      });
      if (!more) await once(socket, "drain", CHUNK_IO_TIMEOUT_MS);
    }
    write(sealEnd(seal));
    socket.end();
  } catch (e) {
    if (!socket.destroyed) {
      write(sealError(seal, (e as Error).message));
      socket.end();
    }
    throw e;
  } finally {
    seal.close();
  }
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

/** The coordinator's hashes of the chunks holding these layers (and the header), for an Assignment:
 * the device checks its own copy against them (worker/weights.ts). */
export async function windowChunkHashes(source: ModelSource, file: GgufFile, layers: Iterable<number>): Promise<ChunkHash[]> {
  const out: ChunkHash[] = [];
  // One buffer for the chunks hashed now: a fresh one per chunk stayed garbage until a collection,
  // and a head hashing its workers' windows just before its own run (a memory-capped head, the first
  // plan of a fresh process) held +37 MiB of it, read its room short and streamed its window.
  let scratch: Buffer | undefined;
  for (const i of chunksFor(rangesForLayers(file, layers), source.info)) {
    out.push({ index: i, digest: Buffer.from(await source.hashOf(i, (scratch ??= Buffer.allocUnsafe(source.info.chunkBytes))), "hex") });
  }
  return out;
}
