// Shipping a device its window (transfer/): the chunks of half the benchmark model's layers fetched
// on loopback (asked for on the cluster port's TLS, received on the keyed stream that opens) into a
// fresh sparse cache, against a plain copy of the same bytes
// over a TCP socket (read from the file, written to the socket, read and dropped), in alternating
// rounds; and the chunk digest's cost per GB on this CPU (SHA-256's beside it, the digest it replaced).
//   node dist/bench/transfer.js model.gguf [rounds]
import { createHash } from "node:crypto";
import { closeSync, mkdtempSync, openSync, readFileSync, readSync, rmSync } from "node:fs";
import { createServer, connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { readGguf } from "../model/index.js";
import { CHUNK_BYTES, chunkRange, chunksFor, chunkDigest, rangesForLayers } from "../transfer/index.js";
import { RemoteModel } from "../worker/index.js";
import { workerToken } from "../trust/index.js";
import { coordCli, median, runAlone, start, stop, waitFor } from "./procs.js";

/** The plain peer, in a process of its own as a coordinator would be: sends the byte ranges of the
 * file to whoever connects (read into one buffer, written with the socket's backpressure). */
function plainServer(path: string, ranges: [number, number][]): Promise<number> {
  const server = createServer((sock) => {
    const fd = openSync(path, "r");
    let i = 0, off = ranges[0]?.[0] ?? 0;
    const pump = () => {
      while (i < ranges.length) {
        const [, e] = ranges[i];
        const buf = Buffer.allocUnsafe(Math.min(4 << 20, e - off));
        const n = readSync(fd, buf, 0, buf.length, off);
        off += n;
        if (off >= e) {
          i++;
          off = ranges[i]?.[0] ?? 0;
        }
        if (!sock.write(buf.subarray(0, n))) return void sock.once("drain", pump);
      }
      closeSync(fd);
      sock.end();
    };
    pump();
  });
  return new Promise((r) => server.listen(0, "127.0.0.1", () => r((server.address() as { port: number }).port)));
}

/** Receives everything the plain peer sends; resolves with MB/s. */
async function plainCopy(port: number, total: number): Promise<number> {
  const t0 = performance.now();
  let got = 0;
  await new Promise<void>((resolve, reject) => {
    const c = connect(port, "127.0.0.1");
    c.on("data", (d: Buffer) => (got += d.length));
    c.on("end", resolve);
    c.on("error", reject);
  });
  if (got !== total) throw new Error(`plain copy: ${got} bytes of ${total}`);
  return total / ((performance.now() - t0) / 1000) / 1e6;
}

/** CPU seconds (user + system, all threads, ended ones too) a process has used so far. */
function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(f[11]) + Number(f[12])) / 100; // utime, stime in clock ticks (USER_HZ = 100 on Linux)
}

/** The chunks of the first half of the layers, and their byte ranges. */
function windowOf(model: string) {
  const f = readGguf(model);
  const info = { fileBytes: f.fileBytes, chunkBytes: CHUNK_BYTES };
  const nLayers = new Set(f.tensors.map((t) => /^blk\.(\d+)\./.exec(t.name)?.[1]).filter((x) => x !== undefined)).size;
  const layers = Array.from({ length: Math.ceil(nLayers / 2) }, (_, i) => i);
  const chunks = chunksFor(rangesForLayers(f, layers), info);
  const ranges = chunks.map((c) => chunkRange(c, info));
  return { layers, nLayers, chunks, ranges, bytes: ranges.reduce((a, [s, e]) => a + e - s, 0) };
}

export async function main(model: string, rounds = 3): Promise<void> {
  const w = windowOf(model);
  // Both peers run in processes of their own, as on two machines: serve (its chunk stream) and a plain sender.
  const serve = start(coordCli, ["serve", model, "--no-discovery", "--port", "0", "--cluster-port", "0", "--layer-windows", "head=1"]);
  const plain = start(fileURLToPath(import.meta.url), ["--plain-server", model]);
  const ours: number[] = [], copies: number[] = [];
  // CPU per GB fetched, in the device's process (this one) and the coordinator's, over the timed fetches.
  let deviceCpu = 0, coordCpu = 0, fetchedGB = 0;
  try {
    const clusterPort = (await waitFor(serve, /listening for workers on port (\d+)/, 120_000))[1];
    const token = workerToken({ tokenFile: (await waitFor(serve, /--token-file (\S+)/))[1] })!;
    const plainPort = Number((await waitFor(plain, /plain server on (\d+)/))[1]);
    for (let r = 0; r <= rounds; r++) {
      const order = r % 2 === 0 ? ["ours", "plain"] : ["plain", "ours"];
      for (const which of order) {
        if (which === "plain") {
          const mbs = await plainCopy(plainPort, w.bytes);
          if (r > 0) copies.push(mbs); // round 0 warms the page cache and the coordinator's hashes
          continue;
        }
        const dir = mkdtempSync(join(tmpdir(), "prima-bench-transfer-"));
        try {
          // On loopback nothing corrupts a chunk: one that failed its hash is a bug in the transfer
          // (its refetch would otherwise hide in the rate).
          const log = (line: string) => {
            if (/failed (its|their) hash/.test(line)) throw new Error(`transfer: ${line}`);
          };
          const remote = await RemoteModel.open({ coordinator: `127.0.0.1:${clusterPort}`, token, cacheDir: dir, open: { threads: 1 }, log });
          const c0 = [cpuSeconds(process.pid), cpuSeconds(serve.child.pid!)];
          await remote.fetchLayers(w.layers, () => {});
          // The fetch's own time: from the request to the last chunk verified, written and recorded
          // (the model's reopening after it, ~12 ms here, is the engine's, not the transfer's).
          const bytes = remote.cached.bytesOf(w.chunks.filter((c) => c !== 0));
          const mbs = bytes / (remote.lastFetch!.ms / 1000) / 1e6;
          if (r > 0) {
            ours.push(mbs);
            deviceCpu += cpuSeconds(process.pid) - c0[0];
            coordCpu += cpuSeconds(serve.child.pid!) - c0[1];
            fetchedGB += bytes / 1e9;
          }
          remote.close();
        } finally {
          rmSync(dir, { recursive: true, force: true });
        }
      }
    }
  } finally {
    await stop(serve);
    await stop(plain);
  }
  const buf = Buffer.alloc(256 << 20, 7);
  const sPerGB = (hash: (b: Buffer) => unknown) => {
    const t0 = performance.now();
    hash(buf);
    return (performance.now() - t0) / 1000 / (buf.length / 1e9);
  };
  const digestSPerGB = sPerGB(chunkDigest);
  const sha256SPerGB = sPerGB((b) => createHash("sha256").update(b).digest());
  console.log(`\n## transfer: ${w.layers.length} of ${w.nLayers} layers' chunks (${(w.bytes / 2 ** 20).toFixed(0)} MiB), loopback, two processes, ${rounds} alternating rounds\n`);
  console.log("| fetched into a sparse cache, verified (MB/s, median) | plain socket copy of the same bytes (MB/s, median) | ratio (goal >= 0.8) | CPU s per GB: device / coordinator | BLAKE3 (chunk digest) s per GB | SHA-256 s per GB |");
  console.log("|---|---|---|---|---|---|");
  console.log(`| ${median(ours).toFixed(0)} | ${median(copies).toFixed(0)} | ${(median(ours) / median(copies)).toFixed(2)} | ${(deviceCpu / fetchedGB).toFixed(2)} / ${(coordCpu / fetchedGB).toFixed(2)} | ${digestSPerGB.toFixed(2)} | ${sha256SPerGB.toFixed(2)} |`);
}

if (process.argv[2] === "--plain-server") {
  const w = windowOf(process.argv[3]);
  void plainServer(process.argv[3], w.ranges).then((port) => console.error(`plain server on ${port}`));
} else runAlone(import.meta, "transfer", "[rounds]", main, 9);
