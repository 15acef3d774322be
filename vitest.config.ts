import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    globalSetup: ["test/global-setup.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Native kernels and child processes share 2 cores: keep files from starving each other.
    maxWorkers: 2,
  },
});
