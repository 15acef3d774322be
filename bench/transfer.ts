// Shipping a device its window (transfer/): the chunks of half the benchmark model's layers fetched
// over the control plane on loopback into a fresh sparse cache, against a plain copy of the same bytes
// over a TCP socket (read from the file, written to the socket, read and dropped), in alternating
// rounds; and SHA-256's cost per GB on this CPU.
//   node dist/bench/transfer.js model.gguf [rounds]
import { mkdtempSync, openSync, readSync, rmSync, closeSync } from "node:fs";
import { createServer, connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { WorkerRegistry } from "../coordinator/registry.js";
import { modelStoreHandlers } from "../coordinator/model-store.js";
import { modelFingerprint, readGguf } from "../model/index.js";
import { ModelSource, chunkRange, chunksFor, rangesForLayers, sha256 } from "../transfer/index.js";
import { RemoteModel } from "../worker/remote-model.js";
import { median, runAlone } from "./procs.js";

/** The bytes of `chunks`, read from the file and sent over a loopback socket; resolves with MB/s. */
async function plainCopy(path: string, ranges: [number, number][]): Promise<number> {
  const total = ranges.reduce((a, [s, e]) => a + e - s, 0);
  const server = createServer((sock) => {
    const fd = openSync(path, "r");
    const buf = Buffer.allocUnsafe(4 << 20);
    let i = 0, off = ranges[0]?.[0] ?? 0;
    const pump = () => {
      while (i < ranges.length) {
        const [, e] = ranges[i];
        const n = readSync(fd, buf, 0, Math.min(buf.length, e - off), off);
        off += n;
        if (off >= e) {
          i++;
          off = ranges[i]?.[0] ?? 0;
        }
        if (!sock.write(Buffer.from(buf.subarray(0, n)))) return void sock.once("drain", pump);
      }
      closeSync(fd);
      sock.end();
    };
    pump();
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as { port: number }).port;
  const t0 = performance.now();
  let got = 0;
  await new Promise<void>((resolve, reject) => {
    const c = connect(port, "127.0.0.1");
    c.on("data", (d: Buffer) => (got += d.length));
    c.on("end", resolve);
    c.on("error", reject);
  });
  const s = (performance.now() - t0) / 1000;
  server.close();
  if (got !== total) throw new Error(`plain copy: ${got} bytes of ${total}`);
  return total / s / 1e6;
}

export async function main(model: string, rounds = 3): Promise<void> {
  const f = readGguf(model);
  const fingerprint = modelFingerprint(f);
  const source = new ModelSource({ path: model, fileBytes: f.fileBytes, dataOffset: f.dataOffset, fingerprint, name: "bench" });
  const nLayers = new Set(f.tensors.map((t) => /^blk\.(\d+)\./.exec(t.name)?.[1]).filter((x) => x !== undefined)).size;
  const layers = Array.from({ length: Math.ceil(nLayers / 2) }, (_, i) => i);
  const chunks = chunksFor(rangesForLayers(f, layers), source.info);
  const ranges = chunks.map((c) => chunkRange(c, source.info));
  const bytes = ranges.reduce((a, [s, e]) => a + e - s, 0);
  const registry = new WorkerRegistry({ modelFingerprint: fingerprint, modelStore: modelStoreHandlers(source, () => {}) });
  const port = await registry.listen(0, "127.0.0.1");
  const ours: number[] = [], plain: number[] = [];
  try {
    // The coordinator hashes each chunk on its first read and keeps the hash: warm it (and the page cache).
    for (const c of chunks) await source.read(c);
    for (let r = 0; r < rounds; r++) {
      const order = r % 2 === 0 ? ["ours", "plain"] : ["plain", "ours"];
      for (const which of order) {
        if (which === "plain") {
          plain.push(await plainCopy(model, ranges));
          continue;
        }
        const dir = mkdtempSync(join(tmpdir(), "prima-bench-transfer-"));
        try {
          const remote = await RemoteModel.open({ coordinator: `127.0.0.1:${port}`, cacheDir: dir, open: { threads: 1 }, log: () => {} });
          const t0 = performance.now();
          await remote.fetchLayers(layers, () => {});
          ours.push(remote.cached.bytesOf(chunks.filter((c) => c !== 0)) / ((performance.now() - t0) / 1000) / 1e6);
          remote.close();
        } finally {
          rmSync(dir, { recursive: true, force: true });
        }
      }
    }
  } finally {
    await registry.close();
    await source.close();
  }
  const buf = Buffer.alloc(256 << 20, 7);
  const t0 = performance.now();
  sha256(buf);
  const hashSPerGB = (performance.now() - t0) / 1000 / (buf.length / 1e9);
  console.log(`\n## transfer: ${layers.length} of ${nLayers} layers' chunks (${(bytes / 2 ** 20).toFixed(0)} MiB), loopback, ${rounds} alternating rounds\n`);
  console.log("| fetched into a sparse cache, verified (MB/s, median) | plain socket copy of the same bytes (MB/s, median) | ratio (goal >= 0.8) | SHA-256 s per GB |");
  console.log("|---|---|---|---|");
  console.log(`| ${median(ours).toFixed(0)} | ${median(plain).toFixed(0)} | ${(median(ours) / median(plain)).toFixed(2)} | ${hashSPerGB.toFixed(2)} |`);
}

runAlone(import.meta, "transfer", "[rounds]", main, 3);
