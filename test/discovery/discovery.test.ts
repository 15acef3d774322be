// Discovery as a library on loopback: publish and browse round trip, several clusters, none, a
// hostile responder's TXT record, and mDNS errors that must not take the process down.
import dgram from "node:dgram";
import makeMdns from "multicast-dns";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import {
  DiscoveryError, browseClusters, chooseCluster, findCluster, printable, publishCluster, type Publication,
} from "../../discovery/index.js";
import { LOOPBACK, freeUdpPort, loopbackMulticastWorks, sendToGroup } from "./mdns-helpers.js";

const fp = (c: string) => c.repeat(64);
const published: Publication[] = [];
afterEach(async () => {
  await Promise.all(published.splice(0).map((p) => p.stop()));
});

describe("printable", () => {
  it("shows control characters, C1, bidi overrides and lone surrogates as escapes, and bounds the length", () => {
    expect(printable("home\x1b[2J\r\n\x07")).toBe("home\\x1b[2J\\x0d\\x0a\\x07");
    expect(printable("a\u009bb\u202ec\u2066d\ud800")).toBe("a\\x9bb\\u{202e}c\\u{2066}d\\u{d800}");
    expect(printable("käse 🧀 ok")).toBe("käse 🧀 ok");
    expect(printable("x".repeat(500), 10)).toBe(`${"x".repeat(10)}…`);
  });
});

let loopback = false;
beforeAll(async () => {
  loopback = await loopbackMulticastWorks();
  if (!loopback) console.warn("skipping mDNS tests: multicast on 127.0.0.1 does not come back on this machine");
});

describe("mDNS on loopback", () => {
  let mdnsPort = 0;
  let logs: string[] = [];
  const on = () => ({ interface: LOOPBACK, mdnsPort, log: (l: string) => logs.push(l) });
  const publish = (name: string, port: number, model = "stories260K") => {
    const p = publishCluster({ name, port, model, fingerprint: fp(name[0]), protocolVersion: 1, ...on() });
    published.push(p);
    return p;
  };

  afterEach(() => {
    logs = [];
  });
  const setup = async (ctx: { skip: (note?: string) => void }) => {
    if (!loopback) ctx.skip("multicast on loopback does not work here");
    mdnsPort = await freeUdpPort();
  };

  it("publish and browse: the cluster's name, address, model, fingerprint and protocol; gone after stop", async (ctx) => {
    await setup(ctx);
    const pub = publish("home", 7400);
    const found = await findCluster({ ...on(), timeoutMs: 3000 });
    expect(found).toMatchObject({ name: "home", host: "127.0.0.1", port: 7400, model: "stories260K", fingerprint: fp("h"), protocol: 1 });
    expect(found.instance).toMatch(/^home@.*:7400$/);
    expect(await browseClusters({ ...on(), timeoutMs: 800 })).toEqual([found]);
    await pub.stop();
    expect(await browseClusters({ ...on(), timeoutMs: 800 })).toEqual([]);
    expect(logs).toEqual([]);
  });

  it("several clusters: the error lists each with its address and model; --cluster picks one", async (ctx) => {
    await setup(ctx);
    publish("home", 7400, "llama-8b");
    publish("office", 7401, "qwen-7b");
    const err = await findCluster({ ...on(), timeoutMs: 3000 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DiscoveryError);
    const message = (err as Error).message;
    expect(message).toMatch(/^2 prima clusters answered/);
    expect(message).toMatch(/--cluster NAME/);
    expect(message).toMatch(/home +at 127\.0\.0\.1:7400 +model llama-8b/);
    expect(message).toMatch(/office +at 127\.0\.0\.1:7401 +model qwen-7b/);
    expect(await findCluster({ ...on(), cluster: "office" })).toMatchObject({ name: "office", port: 7401 });
    const missing = await findCluster({ ...on(), cluster: "garage", timeoutMs: 1500 }).catch((e: unknown) => e);
    expect((missing as Error).message).toMatch(/no cluster named "garage" answered on mDNS within 1.5 s; these did:\n.*home.*\n.*office/);
  });

  it("none: the error says multicast may be unavailable and shows --join HOST:PORT, after the timeout", async (ctx) => {
    await setup(ctx);
    const t0 = Date.now();
    const err = await findCluster({ ...on(), timeoutMs: 1000 }).catch((e: unknown) => e);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(990);
    expect(Date.now() - t0).toBeLessThan(3000);
    expect(err).toBeInstanceOf(DiscoveryError);
    expect((err as Error).message).toMatch(/^no prima cluster answered on mDNS within 1 s/);
    expect((err as Error).message).toMatch(/Docker bridge networks, WSL2, Wi-Fi client isolation, Termux/);
    expect((err as Error).message).toMatch(/prima-worker --join HOST:PORT/);
  });

  it("with onSilence it says so once and keeps browsing until a cluster appears", async (ctx) => {
    await setup(ctx);
    const said: string[] = [];
    const finding = findCluster({ ...on(), timeoutMs: 500, onSilence: (m) => said.push(m) });
    await new Promise((r) => setTimeout(r, 1500));
    expect(said).toHaveLength(1);
    publish("late", 7402);
    expect(await finding).toMatchObject({ name: "late", port: 7402 });
    expect(said).toHaveLength(1);
  });

  it("an abort signal ends the search", async (ctx) => {
    await setup(ctx);
    const stop = new AbortController();
    const finding = findCluster({ ...on(), timeoutMs: 200, onSilence: () => undefined, signal: stop.signal });
    setTimeout(() => stop.abort(), 300);
    await expect(finding).rejects.toThrow(/discovery stopped/);
  });

  it("a hostile responder: escape sequences, invalid UTF-8, oversized and missing fields are escaped or dropped; garbage datagrams are ignored", async (ctx) => {
    await setup(ctx);
    // A raw responder (not our publisher) that answers every query with crafted records.
    const evil = makeMdns({ interface: LOOPBACK, bind: "0.0.0.0", port: mdnsPort });
    evil.on("warning", () => undefined);
    const instance = "evil\x1b]0;pwned\x07";
    evil.on("query", () => {
      evil.respond({
        answers: [
          { name: "_prima._tcp.local", type: "PTR", ttl: 120, data: `${instance}._prima._tcp.local` },
          { name: "_prima._tcp.local", type: "PTR", ttl: 120, data: "noport._prima._tcp.local" },
        ],
        additionals: [
          { name: `${instance}._prima._tcp.local`, type: "SRV", ttl: 120, data: { port: 7777, target: "evil.local" } },
          {
            name: `${instance}._prima._tcp.local`, type: "TXT", ttl: 120, data: [
              Buffer.from("cluster=\x1b[31mred\x1b[0m\r\u202eevil"),
              Buffer.from([0x6d, 0x6f, 0x64, 0x65, 0x6c, 0x3d, 0xff, 0xfe, 0xc3, 0x1b, 0x5b, 0x32, 0x4a]), // model=<invalid UTF-8>ESC[2J
              Buffer.from(`fp=${"\u009b".repeat(100)}`),
              Buffer.from("proto=1; rm -rf /"),
              Buffer.from("__proto__=x"),
              Buffer.from("novalue"),
            ],
          },
          { name: "noport._prima._tcp.local", type: "SRV", ttl: 120, data: { port: 0, target: "x.local" } },
        ],
      });
    });
    try {
      await sendToGroup(mdnsPort, Buffer.from("\x00\x01garbage that is no DNS message"));
      await sendToGroup(mdnsPort, Buffer.alloc(1500, 0xff));
      const found = await browseClusters({ ...on(), timeoutMs: 1000 });
      expect(found).toHaveLength(1); // the port-0 service is dropped
      const c = found[0];
      expect(c.port).toBe(7777);
      expect(c.host).toBe("127.0.0.1");
      expect(c.protocol).toBeUndefined();
      // bonjour-service cuts a TXT value at a line break; what is left is escaped.
      expect(c.name).toBe("\\x1b[31mred\\x1b[0m");
      expect(c.model).toBe("\ufffd\ufffd\ufffd\\x1b[2J");
      for (const v of [c.name, c.model, c.fingerprint, c.instance]) {
        expect(v).not.toMatch(/[\u0000-\u001f\u007f-\u009f\u202e]/);
      }
      expect(c.fingerprint.length).toBeLessThanOrEqual(64 * 4 + 1);
      // The choice list made from it is as safe to print.
      expect(() => chooseCluster([c, { ...c, port: 7778 }], undefined)).toThrow(/^2 prima clusters/);
    } finally {
      await new Promise<void>((r) => evil.destroy(() => r()));
    }
  });

  it("the mDNS port taken (EADDRINUSE): publishing logs it, nothing throws, stop still resolves", async (ctx) => {
    await setup(ctx);
    const holder = dgram.createSocket({ type: "udp4", reuseAddr: false });
    await new Promise<void>((r) => holder.bind(mdnsPort, "0.0.0.0", () => r()));
    try {
      const pub = publish("blocked", 7403);
      const t0 = Date.now();
      while (!logs.some((l) => /EADDRINUSE/.test(l)) && Date.now() - t0 < 3000) await new Promise((r) => setTimeout(r, 50));
      expect(logs.join("\n")).toMatch(/mDNS error: .*EADDRINUSE/);
      await pub.stop();
      const err = await findCluster({ ...on(), timeoutMs: 300 }).catch((e: unknown) => e);
      expect((err as Error).message).toMatch(/no prima cluster answered/);
    } finally {
      holder.close();
    }
  });

  it("bad settings are clear errors: an interface that is not this machine's, a bad cluster name", async (ctx) => {
    await setup(ctx);
    expect(() => publishCluster({ name: "x", port: 1, model: "", fingerprint: "", protocolVersion: 1, interface: "203.0.113.9", mdnsPort }))
      .toThrow(/mDNS interface 203.0.113.9 \(PRIMA_MDNS_INTERFACE\) is not an IPv4 address of this machine; have: .*127\.0\.0\.1/);
    await expect(findCluster({ interface: "no-such-if0", mdnsPort })).rejects.toThrow(/not a network interface/);
    expect(() => publishCluster({ name: "a\x1bb", port: 1, model: "", fingerprint: "", protocolVersion: 1, ...on() })).toThrow(/printable/);
    expect(() => publishCluster({ name: "n".repeat(64), port: 1, model: "", fingerprint: "", protocolVersion: 1, ...on() })).toThrow(/1 to 63 bytes/);
  });
});
