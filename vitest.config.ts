import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { defineConfig } from "vitest/config";

// Everything the suite writes under HOME-relative folders (profiles, the model cache, join tokens)
// goes to one temporary folder per run, never the user's own ~/.cache or ~/.config; global-setup.ts
// removes it at the end. Child processes inherit it through the environment.
// Files whose tests compare timings taken side by side (a predicted token time with a measured one;
// the profiler's stand-in pass with the real layers', the output layer on top of a pass, streamed
// layers against layers in memory) run alone, after the rest: beside other files a neighbour's burst
// falls on one of the two timings and not the other (forward.test.ts's ratio failed so once under load).
const TIMED_ALONE = ["test/ring/placement.test.ts", "test/profiler/forward.test.ts"];

const testHome = mkdtempSync(join(tmpdir(), "prima-test-home-"));

export default defineConfig({
  test: {
    globalSetup: ["test/global-setup.ts"],
    env: {
      PRIMA_TEST_HOME: testHome,
      XDG_CACHE_HOME: join(testHome, "cache"),
      XDG_CONFIG_HOME: join(testHome, "config"),
      XDG_DATA_HOME: join(testHome, "data"),
    },
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Native kernels and child processes share 2 cores: keep files from starving each other.
    maxWorkers: 2,
    // TIMED_ALONE's files run after the rest, one at a time (see above).
    projects: [
      { extends: true, test: { name: "suite", include: ["test/**/*.test.ts"], exclude: TIMED_ALONE } },
      { extends: true, test: { name: "alone", include: TIMED_ALONE, fileParallelism: false, sequence: { groupOrder: 1 } } },
    ],
  },
});
