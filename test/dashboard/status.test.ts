// prima-coord status against the fake server: --json is /api/state itself, the terminal view names
// every device and escapes what devices wrote, errors are clear, and --watch survives a server that
// goes away and comes back, then stops on Ctrl-C.
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { renderStatus, serverUrl, statusCommand, type StatusIo } from "../../coordinator/status-command.js";
import { killAll, startNode } from "../helpers/process.js";
import { until } from "./browser.js";
import { FakeServer } from "./fake-server.js";
import { HOSTILE_HTML, hostileState, sampleState } from "./fixture.js";

const servers: FakeServer[] = [];
async function fake(opts: ConstructorParameters<typeof FakeServer>[0]): Promise<FakeServer> {
  const s = await new FakeServer(opts).start();
  servers.push(s);
  return s;
}
// The key comes from --api-key or PRIMA_API_KEY; these tests say which, so none may leak in.
const savedKey = process.env.PRIMA_API_KEY;
beforeAll(() => { delete process.env.PRIMA_API_KEY; });
afterAll(() => { if (savedKey !== undefined) process.env.PRIMA_API_KEY = savedKey; });
afterEach(async () => {
  killAll();
  await Promise.all(servers.splice(0).map((s) => s.stop()));
});

function capture(tty = false): StatusIo & { stdout: string; stderr: string } {
  const io = { stdout: "", stderr: "", tty, out: (t: string) => { io.stdout += t; }, err: (t: string) => { io.stderr += t; } };
  return io;
}

/** Any escape sequence or control character other than a line feed. */
const CONTROL = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/;

describe("prima-coord status", () => {
  it("--json prints exactly what /api/state returns", async () => {
    const s = await fake({ state: sampleState(), tickMs: 0 });
    const io = capture();
    expect(await statusCommand(["--json", `127.0.0.1:${s.port}`], io)).toBe(0);
    const body = await (await fetch(`${s.url}/api/state`)).text();
    expect(io.stdout).toBe(`${body}\n`);
    expect(JSON.parse(io.stdout)).toEqual(s.state);
    expect(io.stderr).toBe("");
  });

  it("shows devices, windows, states and ms per token in the terminal", async () => {
    const state = sampleState();
    const s = await fake({ state, tickMs: 0 });
    const io = capture();
    expect(await statusCommand([`127.0.0.1:${s.port}`], io)).toBe(0);
    const out = io.stdout;
    for (const d of state.devices) expect(out).toContain(d.name);
    for (const want of [
      "prima cluster home", "tinyllama-1.1b-chat", "22 layers", "Q4_K_M", "k = 2", "laptop (5) -> phone (2) -> desktop (4)",
      "cycle 1  laptop 0-4 | phone 5-6 | desktop 7-10", "cycle 2  laptop 11-15 | phone 16-17 | desktop 18-21",
      "windows  cycle 1: 0-4, cycle 2: 11-15", "M3: its window does not fit in RAM: streamed from disk each token",
      "loading 62%", "lost: no heartbeat for 2.1 s", "left out: disk 35 MB/s", "predicted 27.2 ms", "waiting 18.0 ms",
      "212.4 page faults/token", "laptop -> phone 1.9 ms", "queue 2", "18.4 tok/s", "first token 420 ms", "re-planned on 3 devices",
      "context 2048 · KV q8_0 11.7 KiB/token",
    ]) expect(out, want).toContain(want);
    expect(out).not.toMatch(CONTROL);
  });

  it("escapes hostile strings: no terminal control reaches the screen", async () => {
    const s = await fake({ state: hostileState(), tickMs: 0 });
    const io = capture();
    expect(await statusCommand([`127.0.0.1:${s.port}`], io)).toBe(0);
    expect(io.stdout).not.toMatch(CONTROL);
    expect(io.stdout).toContain(String.raw`evil\x1b[2J\x1b[31mred\x07\x0d\x9b1m`);
    expect(io.stdout).toContain(HOSTILE_HTML); // markup means nothing to a terminal: shown as it is
    // On a terminal our own colours are the only escapes: SGR sequences, nothing that moves or clears.
    const tty = renderStatus(hostileState(), serverUrl("127.0.0.1:1"), true);
    const sequences = tty.match(/\u001b[^a-zA-Z]*[a-zA-Z]/g) ?? [];
    expect(sequences.length).toBeGreaterThan(0);
    for (const seq of sequences) expect(seq).toMatch(/^\u001b\[[0-9;]*m$/);
    expect(tty.replace(/\u001b\[[0-9;]*m/g, "")).not.toMatch(CONTROL);
  });

  it("says clearly when the server is not there, refuses the key, or is not prima", async () => {
    const gone = await fake({ state: sampleState() });
    const port = gone.port;
    await gone.stop();
    let io = capture();
    expect(await statusCommand([`127.0.0.1:${port}`], io)).toBe(1);
    expect(io.stderr).toBe(`status: cannot reach prima-coord serve at 127.0.0.1:${port} (ECONNREFUSED); is it running?\n`);

    const locked = await fake({ state: sampleState(), apiKey: "k1", tickMs: 0 });
    io = capture();
    expect(await statusCommand(["--json", `127.0.0.1:${locked.port}`], io)).toBe(1);
    expect(io.stderr).toContain("refused the request (missing or wrong API key); pass its key with --api-key KEY");
    io = capture();
    expect(await statusCommand(["--json", "--api-key", "k1", `127.0.0.1:${locked.port}`], io)).toBe(0);
    expect(JSON.parse(io.stdout)).toEqual(locked.state);

    io = capture();
    expect(await statusCommand(["--bogus"], io)).toBe(2);
    expect(io.stderr).toContain("usage: prima-coord status");
    io = capture();
    expect(await statusCommand(["host-without-port"], io)).toBe(2);
    expect(io.stderr).toContain("has no port");
    expect(serverUrl("8080").host).toBe("127.0.0.1:8080");
    expect(serverUrl("[::1]:9000").host).toBe("[::1]:9000");
  });

  it("--watch redraws, keeps retrying while the server is away, and stops on Ctrl-C", async () => {
    const s = await fake({ state: sampleState() });
    const port = s.port;
    // The compiled module, in a process of its own: Ctrl-C is a real SIGINT.
    const p = startNode(["--input-type=module", "-e",
      `const m = await import("./dist/coordinator/status-command.js"); process.exitCode = await m.statusCommand(process.argv.slice(1));`,
      "--", "--watch", `127.0.0.1:${port}`], { PRIMA_API_KEY: "" });
    const draws = () => (p.stdout.match(/prima cluster home/g) ?? []).length;
    await until("two redraws", () => draws() >= 2, 10_000);
    await s.stop();
    await p.waitFor(/cannot reach prima-coord serve at 127\.0\.0\.1:\d+ \(ECONNREFUSED\); is it running\?\n {2}retrying every 2 s/, 10_000);
    const before = draws();
    await fake({ state: sampleState(), port });
    await until("a redraw after the server came back", () => draws() > before, 10_000);
    p.child.kill("SIGINT");
    expect(await p.exited).toBe(0);
    expect(p.stdout).not.toMatch(/[\u0000-\u0009\u000b-\u001f]/); // not a terminal: no clearing, no colour
  });
});
