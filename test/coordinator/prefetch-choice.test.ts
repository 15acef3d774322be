// Which ring devices read their next window ahead (coordinator/prefetch-choice.ts): every device of a
// machine of its own; on a shared machine only where reading its disk leaves the CPU idle.
import { describe, expect, it } from "vitest";
import { CPU_BOUND_READ_SHARE, choosePrefetch, type PrefetchDevice } from "../../coordinator/index.js";

const dev = (label: string, machine: string, readCpuShare?: number): PrefetchDevice => ({ label, machine, readCpuShare });

describe("the prefetch choice", () => {
  it("a device alone on its machine reads ahead, whatever its disk costs the CPU", () => {
    const c = choosePrefetch("auto", [dev("head", "m1", 0.95), dev("laptop", "m2", 0.9), dev("phone", "m3")]);
    expect(c.map((x) => x.on)).toEqual([true, true, true]);
    expect(c[1].why).toMatch(/its CPU is its own/);
  });

  it("devices sharing a machine read ahead only where reading waits on the disk", () => {
    const c = choosePrefetch("auto", [dev("head", "m1", 0.9), dev("w1", "m1", CPU_BOUND_READ_SHARE), dev("w2", "m1", 0.04), dev("w3", "m2", 0.9)]);
    expect(c.map((x) => x.on)).toEqual([false, false, true, true]);
    expect(c[0].why).toBe("it shares its machine's CPUs with w1, w2 and reading its disk takes 90% of a CPU: reading ahead would take the CPU they compute on");
    expect(c[2].why).toMatch(/takes 4% of a CPU: the read waits on the disk, not on the CPU it shares with head, w1/);
  });

  it("an unknown machine is nobody's neighbour; an unmeasured or nonsense share reads ahead as before", () => {
    expect(choosePrefetch("auto", [dev("a", "", 0.9), dev("b", "", 0.9)]).map((x) => x.on)).toEqual([true, true]);
    const c = choosePrefetch("auto", [dev("a", "m", undefined), dev("b", "m", Number.NaN)]);
    expect(c.map((x) => x.on)).toEqual([true, true]);
    expect(c[1].why).toMatch(/not measured/);
  });

  it("--prefetch and --no-prefetch decide for every device", () => {
    const ds = [dev("a", "m", 0.9), dev("b", "m", 0.01)];
    expect(choosePrefetch("on", ds).map((x) => [x.on, x.why])).toEqual([[true, "--prefetch"], [true, "--prefetch"]]);
    expect(choosePrefetch("off", ds).map((x) => [x.on, x.why])).toEqual([[false, "--no-prefetch"], [false, "--no-prefetch"]]);
  });
});
