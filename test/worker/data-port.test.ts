// The worker's data-plane port, chosen before it joins and listened on seconds later (worker/device.ts):
// "any free port" is taken where no outgoing connection's local port can land meanwhile.
import { createServer, type AddressInfo } from "node:net";
import { describe, expect, it } from "vitest";
import { ephemeralPorts, reserveDataPort } from "../../worker/device.js";
import { WorkerExit } from "../../worker/exit.js";

describe("reserveDataPort", () => {
  it.skipIf(ephemeralPorts() === undefined)("any free port: below the kernel's range for outgoing connections, and free again to listen on", async () => {
    const [low] = ephemeralPorts()!;
    for (let i = 0; i < 5; i++) {
      const port = await reserveDataPort(0, "127.0.0.1");
      expect(port).toBeGreaterThanOrEqual(1024);
      expect(port).toBeLessThan(low);
      const s = createServer();
      await new Promise<void>((resolve, reject) => s.once("error", reject).listen(port, "127.0.0.1", () => resolve()));
      await new Promise((r) => s.close(r));
    }
  });

  it("a port another program holds: the worker's exit, naming the port", async () => {
    const s = createServer();
    await new Promise<void>((resolve) => s.listen(0, "127.0.0.1", () => resolve()));
    const port = (s.address() as AddressInfo).port;
    try {
      const e = await reserveDataPort(port, "127.0.0.1").then(() => null, (x: unknown) => x);
      expect(e).toBeInstanceOf(WorkerExit);
      expect((e as Error).message).toContain(`cannot listen on the data-plane port 127.0.0.1:${port}: it is taken by another program`);
    } finally {
      await new Promise((r) => s.close(r));
    }
  });
});
