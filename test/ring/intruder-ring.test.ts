// An intruder on a real ring's data ports (both workers' and the head's) while it generates: every
// byte it receives is checked for the fingerprint, the device names and any HELLO or refusal that
// explains itself (a ring id only travels in those), and the ring's tokens are the single device's.
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync, readdirSync, readlinkSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { modelFingerprint, readGguf } from "../../model/index.js";
import { encodeFrame } from "../../ring/index.js";
import { killAll, startCoordinator, startWorker } from "./cluster.js";

afterEach(killAll);

const model = "models/stories260K.gguf";
const gen = ["-p", "Once upon a time", "-n", "400", "--ctx", "512", "--temp", "0"];

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", () => r()));
  const port = (s.address() as AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/** TCP ports process `pid` listens on (its socket inodes matched against /proc/net/tcp{,6}). */
function listeningPorts(pid: number): number[] {
  const inodes = new Set<string>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = readlinkSync(`/proc/${pid}/fd/${fd}`).match(/^socket:\[(\d+)\]$/);
      if (m) inodes.add(m[1]);
    } catch {
      // closed meanwhile
    }
  }
  const ports: number[] = [];
  for (const table of ["tcp", "tcp6"]) {
    for (const line of readFileSync(`/proc/${pid}/net/${table}`, "utf8").split("\n").slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length > 9 && f[3] === "0A" && inodes.has(f[9])) ports.push(parseInt(f[1].split(":").pop()!, 16));
    }
  }
  return [...new Set(ports)];
}

/** One intrusion: what the intruder sends once connected; resolves with every byte it heard. */
function intrude(port: number, act: (ws: WebSocket) => void): Promise<Buffer> {
  return new Promise((resolve) => {
    const heard: Buffer[] = [];
    const ws = new WebSocket(`ws://127.0.0.1:${port}`, { perMessageDeflate: false, handshakeTimeout: 2000 });
    ws.on("upgrade", (res) => heard.push(Buffer.from(JSON.stringify(res.headers))));
    ws.on("message", (d) => heard.push(Buffer.from(d as Buffer)));
    ws.on("error", () => {});
    ws.on("open", () => act(ws));
    ws.on("close", (_code, reason) => resolve(Buffer.concat([...heard, reason])));
    setTimeout(() => ws.terminate(), 3000).unref();
  });
}

const hello = (ringId: string) => encodeFrame({
  type: "hello",
  hello: { protocolVersion: 2, deviceId: "w9", modelFingerprint: "guess", hiddenSize: 64, ringId, maxTokensPerFrame: 8, maxPayloadBytes: 2048 },
});
const attacks: Array<(ws: WebSocket) => void> = [
  (ws) => ws.send(hello("guess")), // the old way to be told the ring id
  (ws) => {
    ws.send(Buffer.concat([Buffer.from("PRMK\x01\0\0\0", "latin1"), randomBytes(32)]));
    ws.once("message", () => ws.send(randomBytes(120)));
  },
  (ws) => ws.send(randomBytes(64)),
];

describe("an intruder on the ring's data ports", () => {
  it("learns nothing and changes nothing (workers' ports and the head's)", async () => {
    const expected = JSON.parse(execFileSync(process.execPath, ["dist/coordinator/cli.js", "run", model, "--json", ...gen], { encoding: "utf8" })).generated_ids;
    const fingerprint = modelFingerprint(readGguf(model));
    const dataPorts = [await freePort(), await freePort()];
    const coord = startCoordinator(["run", model, "--port", "0", "--min-workers", "2", "--layer-windows", "2,2,1", "--json", ...gen]);
    const grpcPort = Number((await coord.waitFor(/listening for workers on port (\d+)/))[1]);
    startWorker(["--join", `127.0.0.1:${grpcPort}`, "--model", model, "--name", "alpha-dev", "--once", "--threads", "1", "--port", String(dataPorts[0])]);
    await coord.waitFor(/"alpha-dev" .*joined/);
    startWorker(["--join", `127.0.0.1:${grpcPort}`, "--model", model, "--name", "bravo-dev", "--once", "--threads", "1", "--port", String(dataPorts[1])]);
    await coord.waitFor(/"bravo-dev" .* ready/, 60_000);
    const headPorts = listeningPorts(coord.child.pid!).filter((p) => p !== grpcPort);
    expect(headPorts.length).toBeGreaterThan(0);
    const targets = [...dataPorts, ...headPorts];

    let running = true;
    const exited = coord.exited.then((code) => {
      running = false;
      return code;
    });
    const heard: Buffer[] = [];
    let intrusions = 0;
    while (running) {
      for (const port of targets) {
        for (const act of attacks) {
          heard.push(await intrude(port, act));
          intrusions++;
        }
      }
    }
    const code = await exited;
    const why = coord.stderr.slice(-2000);
    expect(code, why).toBe(0);
    expect(intrusions, "intrusions while the ring ran").toBeGreaterThanOrEqual(targets.length * attacks.length);
    const report = JSON.parse(coord.stdout.split("\n").find((l) => l.startsWith("{"))!) as { generated_ids: number[]; devices: number };
    expect(report.devices).toBe(3);
    expect(report.generated_ids).toEqual(expected);
    const all = Buffer.concat(heard);
    for (const secret of [fingerprint, fingerprint.slice(0, 16), "alpha-dev", "bravo-dev", "ringId", "deviceId", "modelFingerprint", "ring \"", "127.0.0.1",
      '"w1"', '"w2"', '"head"', "expected device"]) {
      expect(all.includes(Buffer.from(secret)), `the intruder heard "${secret}"`).toBe(false);
    }
    // The devices logged the intruders (refused, locally, with the real reason).
    expect(coord.stderr).toMatch(/dropped 127\.0\.0\.1:\d+: refused/);
  }, 120_000);
});
