// The time a ring device's thread spent preempted (native threadpool.h's prima_descheduled_ms, through
// the binding): its rule, and a real preemption. On one machine that shares its CPUs among a ring's
// devices, a device's timed send or compute goes on while another device's threads hold its CPU; the
// prediction report takes that time out of the device's own (coordinator/placement.ts).
import { spawn, spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { descheduledMs, threadClock } from "../../native/index.js";
import { root } from "../helpers/process.js";

describe("thread clock", () => {
  it("counts wall time less CPU time only where the thread was switched out involuntarily and never blocked", () => {
    expect(descheduledMs([10, 1, 5], [12, 2, 5], 5)).toBeCloseTo(3, 12); // preempted: 5 ms on the clock, 2 on the CPU
    expect(descheduledMs([10, 1, 5], [12, 2, 6], 5)).toBe(0); // it also blocked: it may have waited on purpose
    expect(descheduledMs([10, 1, 5], [12, 1, 5], 5)).toBe(0); // never switched out: the gap is not a wait for a CPU
    expect(descheduledMs([10, 1, 5], [16, 3, 5], 5)).toBe(0); // more CPU than wall time (clock granularity): none
    const a = threadClock();
    let x = 0;
    for (let i = 0; i < 5e6; i++) x += Math.sqrt(i);
    const b = threadClock();
    expect(x).toBeGreaterThan(0);
    expect(b[0]).toBeGreaterThan(a[0]); // this thread's CPU time ran on
    expect(b[1]).toBeGreaterThanOrEqual(a[1]);
    expect(b[2]).toBeGreaterThanOrEqual(a[2]);
  });

  const taskset = process.platform === "linux" && spawnSync("sh", ["-c", "command -v taskset"]).status === 0;
  it.skipIf(!taskset)("finds the time another process held the only CPU a busy thread may use", async () => {
    // A 300 ms busy loop on CPU 0 beside a busy rival on the same CPU.
    const script = `const { threadClock, descheduledMs } = await import(${JSON.stringify(join(root, "dist", "native", "index.js"))});
      const c0 = threadClock(), t0 = performance.now();
      let x = 0; // integer work, the clock read rarely: nothing to collect, so the thread never blocks on a GC helper
      while (performance.now() - t0 < 300) for (let i = 0; i < 1e5; i++) x = (x + i) | 0;
      const wall = performance.now() - t0, c1 = threadClock();
      console.log(JSON.stringify({ wall, cpu: c1[0] - c0[0], preempted: descheduledMs(c0, c1, wall) }));`;
    const run = () => new Promise<{ wall: number; cpu: number; preempted: number }>((resolve, reject) => {
      const child = spawn("taskset", ["-c", "0", process.execPath, "--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "pipe"] });
      let out = "", err = "";
      child.stdout.on("data", (d: Buffer) => { out += d.toString(); });
      child.stderr.on("data", (d: Buffer) => { err += d.toString(); });
      const limit = setTimeout(() => child.kill("SIGKILL"), 20_000);
      child.on("exit", (code) => {
        clearTimeout(limit);
        if (code === 0) resolve(JSON.parse(out)); else reject(new Error(`exit ${code}: ${err}`));
      });
    });
    const rival = spawn("taskset", ["-c", "0", process.execPath, "-e", "for (;;) {}"], { stdio: "ignore" });
    try {
      await new Promise((r) => setTimeout(r, 100));
      const shared = await run();
      // The scheduler splits the CPU: about half the loop's wall time was the rival's.
      expect(shared.preempted).toBeGreaterThan(0.2 * shared.wall);
      expect(shared.preempted).toBeCloseTo(shared.wall - shared.cpu, 0);
    } finally {
      rival.kill("SIGKILL");
      await new Promise((r) => (rival.exitCode !== null || rival.signalCode !== null ? r(null) : rival.on("exit", r)));
    }
  });
});
