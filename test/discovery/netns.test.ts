// The default configuration (every interface, port 5353, no PRIMA_MDNS_INTERFACE) can only be tried
// where every interface is a test's own: inside a network namespace this test creates, with nothing
// but loopback (multicast enabled and routed there). Needs root and iproute2; skips otherwise.
import { execFileSync } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { root } from "../helpers/process.js";

const ns = `prima-disc-${process.pid}`;
let ready = false;
let why = "";

function ip(...args: string[]): void {
  execFileSync("ip", args, { stdio: "pipe", timeout: 10_000 });
}

beforeAll(() => {
  if (process.getuid?.() !== 0) {
    why = "not root: cannot create a network namespace";
    return;
  }
  try {
    ip("netns", "add", ns);
    ip("netns", "exec", ns, "ip", "link", "set", "lo", "up");
    ip("netns", "exec", ns, "ip", "link", "set", "lo", "multicast", "on");
    ip("netns", "exec", ns, "ip", "route", "add", "224.0.0.0/4", "dev", "lo");
    ready = true;
  } catch (e) {
    why = `cannot set up a network namespace: ${(e as Error).message.split("\n")[0]}`;
  }
});

afterAll(() => {
  try {
    ip("netns", "del", ns);
  } catch {
    // never created
  }
});

// Publishes and finds in one process inside the namespace, with no interface or port given.
const script = `
import { publishCluster, findCluster } from ${JSON.stringify(`${root}dist/discovery/index.js`)};
const logs = [];
const pub = publishCluster({ name: "nsdefault", port: 7400, model: "m", fingerprint: "f".repeat(64), protocolVersion: 1, log: (l) => logs.push(l) });
try {
  const found = await findCluster({ timeoutMs: 3000, log: (l) => logs.push(l) });
  console.log(JSON.stringify({ found, logs }));
} finally {
  await pub.stop();
}`;

describe("mDNS with the default settings, in a network namespace of its own", () => {
  it("publishes on 5353 over every interface (here: loopback only) and finds the cluster", (ctx) => {
    if (!ready) ctx.skip(why);
    const env = { ...process.env };
    delete env.PRIMA_MDNS_INTERFACE;
    delete env.PRIMA_MDNS_PORT;
    const out = execFileSync("ip", ["netns", "exec", ns, process.execPath, "--input-type=module", "-e", script], { encoding: "utf8", timeout: 20_000, env });
    const { found, logs } = JSON.parse(out.trim().split("\n").pop()!);
    expect(found).toMatchObject({ name: "nsdefault", host: "127.0.0.1", port: 7400, model: "m", protocol: 1 });
    expect(logs).toEqual([]);
  });
});
