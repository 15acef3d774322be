import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { defineConfig } from "vitest/config";

// Everything the suite writes under HOME-relative folders (profiles, the model cache, join tokens)
// goes to one temporary folder per run, never the user's own ~/.cache or ~/.config; global-setup.ts
// removes it at the end. Child processes inherit it through the environment.
const testHome = mkdtempSync(join(tmpdir(), "prima-test-home-"));

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
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
  },
});
