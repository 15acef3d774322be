// native/src/wire.h is generated from ring/wire.ts: the lane and the codec share one wire format.
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { wireHeaderC } from "../../ring/wire.js";

describe("wire constants", () => {
  it("native/src/wire.h is what ring/wire.ts generates (regenerate with the command in its first lines)", () => {
    expect(readFileSync("native/src/wire.h", "utf8")).toBe(wireHeaderC());
  });
});
