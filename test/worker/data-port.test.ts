// The worker's data-plane port, bound before it joins and held for its life (worker/device.ts): no
// other program's socket can take it between assignments.
import { createServer, type AddressInfo } from "node:net";
import { describe, expect, it } from "vitest";
import { reserveDataPort } from "../../worker/device.js";
import { WorkerExit } from "../../worker/exit.js";

describe("reserveDataPort", () => {
  it("any free port: held until closed, then free", async () => {
    const bind = (port: number) => new Promise<NodeJS.ErrnoException | null>((resolve) => {
      const s = createServer();
      s.once("error", resolve).listen(port, "127.0.0.1", () => s.close(() => resolve(null)));
    });
    for (let i = 0; i < 5; i++) {
      const held = await reserveDataPort(0, "127.0.0.1");
      expect(held.port).toBeGreaterThanOrEqual(1024);
      expect((await bind(held.port))?.code).toBe("EADDRINUSE");
      await held.close();
      expect(await bind(held.port)).toBeNull();
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
