// The liveness watch of one link, against a fake socket: a peer that keeps sending is not pinged
// (every ping and pong wakes both processes), a silent one is, and one that stops answering is dead.
import { EventEmitter } from "node:events";
import type { Socket } from "node:net";
import type WebSocket from "ws";
import { describe, expect, it } from "vitest";
import { LivenessWatch } from "../../ring/liveness.js";

function fakeWs(answer: () => boolean) {
  const ws = Object.assign(new EventEmitter(), {
    readyState: 1, OPEN: 1, bufferedAmount: 0, pings: 0,
    ping(_data: unknown, _mask: unknown, cb: (err?: Error) => void) {
      ws.pings++;
      cb();
      if (answer()) setTimeout(() => ws.emit("pong"), 1);
    },
  });
  return ws;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("liveness watch", () => {
  it("does not ping a peer whose bytes keep coming, pings a quiet one, and reports one that stops answering", async () => {
    let answering = true;
    const ws = fakeWs(() => answering);
    const socket = new EventEmitter();
    const deaths: string[] = [];
    const watch = new LivenessWatch(ws as unknown as WebSocket, socket as unknown as Socket, 1600, (r) => deaths.push(r)); // tick 200 ms, quiet after 100 ms: a loaded machine's timers stall for tens of ms
    watch.start();
    try {
      const streaming = setInterval(() => socket.emit("data", Buffer.alloc(8)), 4);
      await sleep(1000);
      clearInterval(streaming);
      expect(ws.pings).toBe(0);

      await sleep(600); // quiet but answering: pinged about once a tick, alive
      expect(ws.pings).toBeGreaterThanOrEqual(2);
      expect(deaths).toEqual([]);

      answering = false;
      await sleep(1800); // deadAfter is 800 ms: reported within 1.5 ticks + 800 ms + a tick
      expect(deaths).toHaveLength(1);
      expect(deaths[0]).toMatch(/no answer to a ping/);
    } finally {
      watch.stop();
    }
  });
});
