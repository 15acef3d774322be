// Several suites compare against llama.cpp's own sources and test data (tokenizer vocabularies,
// unicode tables, chat templates). node-llama-cpp ships them as a git bundle; a fresh install has
// not unpacked it yet, so unpack it once (offline, a few seconds) before any suite runs.
// The returned teardown removes the run's temporary HOME folders (vitest.config.ts makes them).
import { execFileSync } from "node:child_process";
import { existsSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { TestProject } from "vitest/node";

export const LLAMA_CPP_SOURCE = "node_modules/node-llama-cpp/llama/llama.cpp";

export default function setup(project: TestProject): () => void {
  if (!existsSync(join(LLAMA_CPP_SOURCE, "CMakeLists.txt"))) {
    execFileSync("npx", ["--no-install", "node-llama-cpp", "source", "download", "--skipBuild", "--gpu", "false"],
      { stdio: "inherit" });
  }
  const testHome = project.config.env?.PRIMA_TEST_HOME;
  return () => { if (testHome) rmSync(testHome, { recursive: true, force: true }); };
}
