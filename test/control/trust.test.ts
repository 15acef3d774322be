// Issue #18's attacks on the control plane, on loopback: a joiner without the token is refused and
// learns nothing (gRPC and chunk streams); a forged profile or status is refused by name; a worker
// that reaches a coordinator with another certificate refuses it; a joiner naming another address is
// refused (nothing is dialled); a flood of Joins with big profiles leaves the coordinator's memory
// flat; a worker with the same header and other weights is refused by name; a keyed chunk stream
// opens only with its one-time ticket and carries no plaintext. Plus the token's store.
import { copyFileSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { X509Certificate } from "node:crypto";
import { hostname } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { MAX_PROFILE_BYTES, type CoordinatorMessage } from "../../control/index.js";
import { CHUNK_REFUSAL, serveChunks } from "../../coordinator/model-store.js";
import { TOKEN_REFUSAL, WorkerRegistry } from "../../coordinator/registry.js";
import { modelFingerprint, readGguf } from "../../model/index.js";
import { connect } from "node:net";
import { ModelSource, STREAM_MAGIC, chunkRange, encodeRequest, readInfo, readTicket } from "../../transfer/index.js";
import { ALPN_CHUNKS, TrustStore, chunkBinding, chunkProof, connectPinned, createIdentity, type JoinToken } from "../../trust/index.js";
import { killAll, root, startNode } from "../helpers/process.js";
import { testIdentity, testTrust } from "../helpers/trust.js";
import { startCoordinator, startWorker } from "../ring/cluster.js";
import { fakeWorker, type FakeWorker } from "./fake-worker.js";
import { tempDir } from "../helpers/temp.js";

const model = "models/stories260K.gguf";
const gguf = readGguf(`${root}${model}`);
const FP = modelFingerprint(gguf);
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  killAll();
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function registry(o: { allowAdvertise?: boolean } = {}) {
  const lines: string[] = [];
  const source = new ModelSource({ path: `${root}${model}`, fileBytes: gguf.fileBytes, dataOffset: gguf.dataOffset, fingerprint: FP, name: "stories260K.gguf" });
  const reg = new WorkerRegistry({
    modelFingerprint: FP, trust: await testTrust(), log: (l) => lines.push(l), chunks: serveChunks(source, (l) => lines.push(l)), ...o,
  });
  const port = await reg.listen(0, "127.0.0.1");
  cleanups.push(async () => {
    await reg.close();
    await source.close();
  });
  return { reg, address: `127.0.0.1:${port}`, port, lines };
}

async function fake(address: string, name: string, o: Partial<Parameters<typeof fakeWorker>[0]> = {}): Promise<FakeWorker> {
  const f = fakeWorker({ address, name, fingerprint: FP, token: (await testIdentity()).token, ...o });
  cleanups.push(() => f.close());
  return f;
}

const shutdownReason = (m: CoordinatorMessage) => (m.msg === "shutdown" ? m.shutdown.reason : "");

/** A profile Halda accepts, with fields replaced. */
function profile(over: Record<string, unknown> = {}, memory: Record<string, unknown> = {}): string {
  return JSON.stringify({
    version: 1,
    profile: { name: "forger", os: "linux", cpuFlopsPerS: { Q8_0: 3e10, F32: 1e10 }, ramTotalBytes: 8e9, ramAvailableBytes: 4e9, diskSeqReadBytesPerS: 1e9, ...over },
    details: { memory: { totalBytes: 8e9, availableBytes: 5e9, physicalTotalBytes: 8e9, physicalAvailableBytes: 5e9, ...memory } },
  });
}

describe("who may join", () => {
  it("a joiner without the token is refused, and hears nothing about the cluster, its model or its ring", async () => {
    const { reg, address, lines } = await registry();
    const f = await fake(address, "intruder", { proof: "wrong" });
    const m = await f.next("shutdown", 5000);
    await f.ended;
    expect(shutdownReason(m)).toBe(TOKEN_REFUSAL);
    // All it received: the challenge (32 random bytes) and the refusal.
    expect(f.received.map((x) => x.msg)).toEqual(["challenge", "shutdown"]);
    const said = JSON.stringify(f.received);
    for (const secret of [FP, FP.slice(0, 12), hostname(), "stories"]) expect(said).not.toContain(secret);
    expect(reg.live()).toHaveLength(0);
    expect(lines.join("\n")).toMatch(/refused a worker from 127\.0\.0\.1.*the join token is not this cluster's/);
    // The certificate anyone can see names neither the machine nor the cluster.
    const cert = new X509Certificate((await testIdentity()).certPem);
    expect(cert.subject).toBe("CN=prima cluster");
    expect(cert.subject + (cert.subjectAltName ?? "")).not.toContain(hostname());
  });

  it("a chunk stream without the token's proof is refused with nothing about the model", async () => {
    const { address, lines } = await registry();
    const id = await testIdentity();
    const wrong: JoinToken = { pin: id.token.pin, secret: Buffer.alloc(32, 7) };
    for (const token of [wrong, id.token]) {
      const s = await connectPinned(address, id.token, ALPN_CHUNKS, 5000);
      s.write(encodeRequest({ proof: chunkProof(token, chunkBinding(s)).toString("hex"), info: true, fingerprint: "", chunks: [] }));
      const answer = await readInfo(s, 5000).then((d) => JSON.stringify(d), (e: Error) => `error: ${e.message}`);
      s.destroy();
      if (token === wrong) {
        expect(answer).toBe(`error: ${CHUNK_REFUSAL}`);
      } else {
        expect(JSON.parse(answer)).toMatchObject({ fingerprint: FP, fileBytes: gguf.fileBytes });
      }
    }
    // A proof is bound to its TLS connection: one made for another connection does not pass.
    const a = await connectPinned(address, id.token, ALPN_CHUNKS, 5000);
    const b = await connectPinned(address, id.token, ALPN_CHUNKS, 5000);
    b.write(encodeRequest({ proof: chunkProof(id.token, chunkBinding(a)).toString("hex"), info: true, fingerprint: "", chunks: [] }));
    expect(await readInfo(b, 5000).then(() => "answered", (e: Error) => e.message)).toBe(CHUNK_REFUSAL);
    a.destroy();
    b.destroy();
    expect(lines.join("\n")).toMatch(/refused a chunk stream from 127\.0\.0\.1: wrong join token/);
  });

  it("a keyed chunk stream opens once, only with its ticket, and no weight byte travels in clear", async () => {
    const { address, port } = await registry();
    const id = await testIdentity();
    /** Everything the coordinator sends on a raw connection that starts with `first`, until it closes. */
    const raw = (first: Buffer) => new Promise<Buffer>((resolve, reject) => {
      const got: Buffer[] = [];
      const c = connect(port, "127.0.0.1", () => c.write(first));
      const timer = setTimeout(() => reject(new Error("the coordinator kept the connection open")), 10_000);
      c.on("data", (d: Buffer) => got.push(d));
      c.on("error", () => {});
      c.on("close", () => {
        clearTimeout(timer);
        resolve(Buffer.concat(got));
      });
    });
    const tls = await connectPinned(address, id.token, ALPN_CHUNKS, 5000);
    tls.write(encodeRequest({ proof: chunkProof(id.token, chunkBinding(tls)).toString("hex"), fingerprint: FP, chunks: [0] }));
    const ticket = await readTicket(tls, 5000);
    // Not TLS and not a keyed stream; a stream with a made-up ticket: both closed without a byte.
    expect((await raw(Buffer.from("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))).length).toBe(0);
    expect((await raw(Buffer.concat([STREAM_MAGIC, Buffer.alloc(ticket.length, 1)]))).length).toBe(0);
    const stream = await raw(Buffer.concat([STREAM_MAGIC, ticket]));
    const [s0, e0] = chunkRange(0, { fileBytes: gguf.fileBytes, chunkBytes: 4 << 20 });
    expect(stream.length).toBeGreaterThan(e0 - s0); // the whole chunk, sealed, came
    // No 32 bytes of the file in a row appear on the wire (its tensor data is far from constant).
    const file = readFileSync(`${root}${model}`);
    for (let off = gguf.dataOffset; off + 32 <= e0; off += 4099) expect(stream.includes(file.subarray(off, off + 32)), `file bytes at ${off}`).toBe(false);
    // Used once: the same ticket again opens nothing.
    expect((await raw(Buffer.concat([STREAM_MAGIC, ticket]))).length).toBe(0);
    tls.destroy();
  });

  it("a worker that reaches a coordinator with another certificate refuses it before it says anything", async () => {
    const { address, port, lines } = await registry();
    const other = await createIdentity(); // the token of another cluster: another pin
    const w = startWorker(["--join", address, "--model", model, "--name", "careful", "--threads", "1", "--token", other.tokenText]);
    await w.waitFor(new RegExp(`127\\.0\\.0\\.1:${port} is not the coordinator this token names: its certificate differs`), 20_000);
    await new Promise((r) => setTimeout(r, 500));
    // It never opened a session: the coordinator saw no join, and refused none.
    expect(lines.join("\n")).not.toMatch(/refused a worker|joined/);
    expect(w.stderr).not.toMatch(/joined /);
  }, 30_000);

  it("a worker without any token is told how to get one", async () => {
    const w = startNode([`${root}dist/worker/cli.js`, "--join", "127.0.0.1:9", "--model", model], { PRIMA_TOKEN: "" });
    expect(await w.exited).toBe(2);
    expect(w.stderr).toMatch(/the cluster's join token is needed: --token TOKEN, --token-file FILE or PRIMA_TOKEN/);
  });
});

describe("what a joiner may claim", () => {
  it("a forged profile (1e18 FLOP/s, more RAM available than it has, a negative speed) is refused by name", async () => {
    const { reg, address } = await registry();
    const cases: [string, RegExp][] = [
      [profile({ cpuFlopsPerS: { Q8_0: 1e18 } }), /device "forger": its profile is refused: cpuFlopsPerS\.Q8_0 = 1\.00e\+18 FLOP\/s is more than any device has/],
      [profile({ ramAvailableBytes: 16e9 }), /device "forger": its profile is refused: ramAvailableBytes \(16000000000\) is more than ramTotalBytes \(8000000000\)/],
      [profile({}, { availableBytes: 9e9 }), /details\.memory\.availableBytes \(9000000000\) is more than details\.memory\.totalBytes/],
      [profile({ diskSeqReadBytesPerS: -5 }), /device "forger": its profile is refused: .*diskSeqReadBytesPerS/],
      ["x".repeat(MAX_PROFILE_BYTES + 1), /device "forger": its profile is \d+ bytes, over the limit of 262144/],
    ];
    for (const [profileJson, why] of cases) {
      const f = await fake(address, "forger", { join: { profileJson } });
      expect(shutdownReason(await f.next("shutdown", 5000))).toMatch(why);
    }
    expect(reg.live()).toHaveLength(0);
    // A plausible one joins.
    await fake(address, "honest", { join: { profileJson: profile() } });
    expect((await reg.waitFor(1, 5000))[0].join.deviceName).toBe("honest");
  });

  it("a status that claims more memory than the device has loses the worker, named", async () => {
    const { reg, address } = await registry();
    const f = await fake(address, "boaster");
    const [w] = await reg.waitFor(1, 5000);
    const asked = w.status();
    await f.next("statusRequest");
    f.send({ status: { windows: [], waitMs: 0, sendMs: 0, anonRssBytes: 1, memTotalBytes: 8e9, memAvailableBytes: 1e12, memPressure: 0, frames: 0 } });
    expect((await asked.then(() => null, (e: Error) => e))?.message).toMatch(/device w1 "boaster" \(127\.0\.0\.1\) failed: its status is not plausible: memAvailableBytes \(1000000000000\) is more than memTotalBytes/);
    expect(reg.live()).toHaveLength(0);
  });

  it("a joiner that names another data address (10.x, another host) is refused; nothing is dialled", async () => {
    const { reg, address } = await registry();
    for (const dataHost of ["10.1.2.3", "192.0.2.7", "example.org"]) {
      const f = await fake(address, "pointer", { join: { dataHost } });
      expect(shutdownReason(await f.next("shutdown", 5000))).toMatch(new RegExp(`its data host ${dataHost.replace(/\./g, "\\.")} is not the address it connects from \\(127\\.0\\.0\\.1\\)`));
    }
    expect(reg.live()).toHaveLength(0);
    // Its own address is fine, and is where the ring would dial.
    await fake(address, "local", { join: { dataHost: "127.0.0.1" } });
    expect((await reg.waitFor(1, 5000))[0].dataUrl).toBe("ws://127.0.0.1:9");
  });

  it("--allow-advertise lets the operator accept another data address", async () => {
    const { reg, address } = await registry({ allowAdvertise: true });
    await fake(address, "nat", { join: { dataHost: "192.0.2.7" } });
    expect((await reg.waitFor(1, 5000))[0].dataHost).toBe("192.0.2.7"); // never dialled here
  });

  it("a flood of Joins with big profiles leaves the coordinator's memory flat and refuses them all", async () => {
    // The coordinator in a process of its own, so that its memory is what is measured.
    const host = startNode(["--expose-gc", "--input-type=module", "-e", `
      import { WorkerRegistry } from "${root}dist/coordinator/registry.js";
      import { createIdentity } from "${root}dist/trust/index.js";
      import { readFileSync } from "node:fs";
      const identity = await createIdentity();
      const reg = new WorkerRegistry({ modelFingerprint: "${FP}", trust: { identity }, log: (l) => console.error(l) });
      const rss = () => Number(/VmRSS:\\s+(\\d+)/.exec(readFileSync("/proc/self/status", "utf8"))[1]) * 1024;
      console.log("port " + await reg.listen(0, "127.0.0.1") + " token " + identity.tokenText);
      // Collected first: what is measured is what the coordinator keeps, not garbage not yet collected.
      setInterval(() => { globalThis.gc(); const m = process.memoryUsage();
        console.log("rss " + rss() + " kept " + (m.heapUsed + m.external) + " live " + reg.live().length); }, 200);`]);
    const [, port, tokenText] = await host.waitFor(/port (\d+) token (\S+)/);
    const token = (await import("../../trust/index.js")).parseToken(tokenText);
    const rssNow = async () => {
      const mark = host.stdout.length;
      await new Promise((r) => setTimeout(r, 450));
      const m = [...host.stdout.slice(mark).matchAll(/rss (\d+) kept (\d+) live (\d+)/g)].at(-1)!;
      return { rss: Number(m[1]), kept: Number(m[2]), live: Number(m[3]) };
    };
    await new Promise((r) => setTimeout(r, 300));
    const before = await rssNow();
    const big = profile({ name: "x".repeat(900 << 10) }); // under the message limit, over the profile limit
    const huge = "y".repeat(8 << 20); // over the message limit
    const t0 = Date.now();
    for (let round = 0; round < 3; round++) {
      const flood = Array.from({ length: 20 }, (_, i) => fakeWorker({
        address: `127.0.0.1:${port}`, name: `flood${round}-${i}`, fingerprint: FP, token, join: { profileJson: i % 5 === 0 ? huge : big },
      }));
      await Promise.all(flood.map((f) => Promise.race([f.ended, new Promise((r) => setTimeout(r, 8000))])));
      for (const f of flood) f.close();
    }
    // A connection still being torn down may hold its last message (8 MB) for a moment on a loaded
    // machine: what counts is what is kept once they are gone, so the samples of up to 5 s, the least.
    let after = await rssNow();
    for (const t1 = Date.now(); after.kept - before.kept >= 8 << 20 && Date.now() - t1 < 5000;) {
      const next = await rssNow();
      after = next.kept < after.kept ? next : after;
    }
    expect(after.live).toBe(0);
    // 60 Joins of 0.9 to 8 MB (135 MB of profiles; the first 16 under the message limit reach the profile
    // check, 14 MB): the coordinator keeps none of them. What it keeps is its collected heap and external
    // buffers (they grow about 1 MB here). Its RSS also holds pages the
    // allocator keeps after the flood's buffers are freed (25-55 MB here), so RSS bounds only the
    // gross case: all the profiles kept.
    expect(after.kept - before.kept, host.stderr.slice(-2000)).toBeLessThan(8 << 20);
    expect(after.rss - before.rss, host.stderr.slice(-2000)).toBeLessThan(112 << 20);
    expect(Date.now() - t0).toBeLessThan(30_000);
    expect(host.stderr).toMatch(/its profile is \d+ bytes, over the limit|too many joins from this address/);
  }, 60_000);
});

describe("model identity covers the weights", () => {
  it("a worker with the same header and other weights is refused by name (exit 6), instead of computing wrong text", async () => {
    const dir = tempDir("prima-weights-");
    const copy = join(dir, "other-weights.gguf");
    copyFileSync(`${root}${model}`, copy);
    // One byte of layer 1's attention weights changed: the header (the fingerprint) is the same.
    const t = gguf.tensors.find((x) => x.name === "blk.1.attn_q.weight")!;
    const bytes = readFileSync(copy);
    bytes[gguf.dataOffset + t.offset + 10] ^= 0x55;
    writeFileSync(copy, bytes);
    expect(modelFingerprint(readGguf(copy))).toBe(FP);
    const coord = startCoordinator(["run", model, "--port", "0", "--min-workers", "1", "--layer-windows", "3,2", "-n", "8", "--temp", "0", "--join-timeout", "20"]);
    const port = (await coord.waitFor(/listening for workers on port (\d+)/))[1];
    const w = startWorker(["--join", `127.0.0.1:${port}`, "--model", copy, "--name", "impostor", "--threads", "1"]);
    expect(await Promise.race([w.exited, new Promise((r) => setTimeout(() => r("running"), 20_000))]), w.stderr).toBe(6);
    expect(w.stderr).toMatch(/has other weights than the coordinator's: 1 of 1 chunks differ, the first bytes 0\.\.4194304 \(layers 0, 1, 2, 3, 4\)/);
    await coord.waitFor(/device w1 "impostor".*other weights than the coordinator's/, 10_000);
    expect(coord.stdout).not.toMatch(/Once upon a time/);
    expect(statSync(copy).size).toBe(gguf.fileBytes);
  }, 40_000);
});

describe("rotating the token", () => {
  it("a running coordinator picks up a rotated token: workers of the old one are let go and cannot come back", async () => {
    const dir = tempDir("prima-rotate-");
    const store = await TrustStore.open("rotating", { dir });
    const lines: string[] = [];
    const reg = new WorkerRegistry({ modelFingerprint: FP, trust: store, log: (l) => lines.push(l) });
    const port = await reg.listen(0, "127.0.0.1");
    cleanups.push(() => reg.close());
    const old = store.identity.token;
    const f = fakeWorker({ address: `127.0.0.1:${port}`, name: "before", fingerprint: FP, token: old });
    cleanups.push(() => f.close());
    const [w] = await reg.waitFor(1, 5000);
    const lost = new Promise<string>((resolve) => reg.once("lost", (_w: unknown, reason: string) => resolve(reason)));
    const rotated = await TrustStore.open("rotating", { dir, rotate: true }); // prima-coord token --rotate
    expect(await Promise.race([lost, new Promise((r) => setTimeout(() => r("not lost"), 4000))])).toBe("the cluster's join token was rotated");
    expect(w.lost).toBeTruthy();
    // The old token names the old certificate: the coordinator's new one is refused by the worker.
    const again = fakeWorker({ address: `127.0.0.1:${port}`, name: "again", fingerprint: FP, token: { pin: old.pin, secret: old.secret } });
    cleanups.push(() => again.close());
    expect(await again.ended).toMatch(/is not the coordinator this token names/);
    const fresh = fakeWorker({ address: `127.0.0.1:${port}`, name: "after", fingerprint: FP, token: rotated.identity.token });
    cleanups.push(() => fresh.close());
    expect((await reg.waitFor(1, 5000))[0].join.deviceName).toBe("after");
  }, 20_000);
});

describe("the join token's store", () => {
  it("creates a token once per cluster name with 0600 files, reads it back, and rotates it", async () => {
    const dir = tempDir("prima-trust-");
    const a = await TrustStore.open("home", { dir });
    expect(a.created).toBe(true);
    expect(statSync(a.keyFile).mode & 0o777).toBe(0o600);
    expect(statSync(a.tokenFile).mode & 0o777).toBe(0o600);
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    expect(readFileSync(a.tokenFile, "utf8").trim()).toBe(a.identity.tokenText);
    const again = await TrustStore.open("home", { dir });
    expect(again.created).toBe(false);
    expect(again.identity.tokenText).toBe(a.identity.tokenText);
    const other = await TrustStore.open("../evil name", { dir }); // a name that is not a file name
    expect(other.keyFile.startsWith(`${dir}/cluster-`)).toBe(true);
    // A rotation (prima-coord token --rotate) while the first is running: it picks it up.
    const rotated = await TrustStore.open("home", { dir, rotate: true });
    expect(rotated.identity.tokenText).not.toBe(a.identity.tokenText);
    expect(rotated.identity.token.pin.equals(a.identity.token.pin)).toBe(false);
    expect(a.refresh()).toBe(true);
    expect(a.identity.tokenText).toBe(rotated.identity.tokenText);
  });

  it("a coordinator that makes its token does not keep the certificate library (its memory is room for layers)", async () => {
    // In a process of its own: whether the library came in shows on the global Reflect, which its
    // polyfill (reflect-metadata) extends.
    const dir = tempDir("prima-trust-");
    const p = startNode(["--input-type=module", "-e", `
      import { TrustStore } from "${root}dist/trust/index.js";
      const s = await TrustStore.open("home", { dir: ${JSON.stringify(dir)} });
      console.log("made " + s.created + " loaded " + (typeof Reflect.getMetadata === "function") + " token " + s.identity.tokenText);`]);
    const [, made, loaded, tokenText] = await p.waitFor(/made (\w+) loaded (\w+) token (\S+)/);
    expect(made).toBe("true");
    expect(loaded).toBe("false");
    expect((await TrustStore.open("home", { dir })).identity.tokenText).toBe(tokenText);
  });
});
