// A ring prices a mixture of experts with each layer's routing measured unless told otherwise
// (docs/HALDA.md "Where the shares come from"); the two flags cannot both be given.
import { describe, expect, it } from "vitest";
import { parseClusterArgs, UsageError } from "../../coordinator/args.js";

const measured = (argv: string[]) => parseClusterArgs(["m.gguf", ...argv], {}, "help", "run").cluster.measureRouting;

describe("--uniform-routing / --measure-routing", () => {
  it("measured by default and with --measure-routing, uniform with --uniform-routing", () => {
    expect(measured([])).toBe(true);
    expect(measured(["--measure-routing"])).toBe(true);
    expect(measured(["--uniform-routing"])).toBe(false);
  });

  it("refuses both at once by name", () => {
    expect(() => measured(["--measure-routing", "--uniform-routing"])).toThrow(UsageError);
    expect(() => measured(["--measure-routing", "--uniform-routing"])).toThrow(/--measure-routing and --uniform-routing: choose one/);
  });
});
