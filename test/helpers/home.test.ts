// The suite writes nothing into the user's own folders: vitest.config.ts points every HOME-relative
// folder the code uses at one temporary folder per run.
import { homedir, tmpdir } from "node:os";
import { describe, expect, it } from "vitest";
import { defaultCacheDir } from "../../profiler/index.js";
import { defaultModelCacheDir } from "../../transfer/index.js";
import { configDir } from "../../trust/index.js";

describe("the suite's home", () => {
  it("puts profiles, the model cache and join tokens under the run's temporary folder", () => {
    const testHome = process.env.PRIMA_TEST_HOME;
    expect(testHome, "vitest.config.ts sets PRIMA_TEST_HOME").toBeTruthy();
    expect(testHome!.startsWith(tmpdir())).toBe(true);
    for (const dir of [defaultCacheDir(), defaultModelCacheDir(), configDir()]) {
      expect(dir.startsWith(testHome!), dir).toBe(true);
      expect(dir.startsWith(homedir() + "/")).toBe(false);
    }
  });
});
