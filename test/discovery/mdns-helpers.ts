// Discovery tests keep multicast on loopback: every endpoint joins and sends on 127.0.0.1 only
// (PRIMA_MDNS_INTERFACE=127.0.0.1 for child processes), and each test uses a UDP port of its own
// instead of 5353, so concurrent tests (and other suites' clusters) never hear each other.
import dgram from "node:dgram";

export const LOOPBACK = "127.0.0.1";
export const MDNS_GROUP = "224.0.0.251";

/** A UDP port nobody uses right now (the kernel picks it). */
export function freeUdpPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = dgram.createSocket("udp4");
    s.once("error", reject);
    s.bind(0, "0.0.0.0", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** Sends one datagram to the mDNS group on loopback only (multicast interface 127.0.0.1). */
export function sendToGroup(port: number, payload: Buffer): Promise<void> {
  return new Promise((resolve, reject) => {
    const s = dgram.createSocket({ type: "udp4", reuseAddr: true });
    s.once("error", reject);
    s.bind(0, "0.0.0.0", () => {
      s.setMulticastInterface(LOOPBACK);
      s.send(payload, port, MDNS_GROUP, (e) => s.close(() => (e ? reject(e) : resolve())));
    });
  });
}

/** Whether multicast sent on 127.0.0.1 comes back to a member on 127.0.0.1 (it does on Linux). */
export async function loopbackMulticastWorks(): Promise<boolean> {
  const port = await freeUdpPort();
  return new Promise((resolve) => {
    const r = dgram.createSocket({ type: "udp4", reuseAddr: true });
    const done = (ok: boolean) => {
      clearTimeout(timer);
      r.close();
      resolve(ok);
    };
    const timer = setTimeout(() => done(false), 1000);
    r.on("error", () => done(false));
    r.on("message", () => done(true));
    r.bind(port, "0.0.0.0", () => {
      try {
        r.addMembership(MDNS_GROUP, LOOPBACK);
      } catch {
        done(false);
        return;
      }
      sendToGroup(port, Buffer.from("ping")).catch(() => done(false));
    });
  });
}
