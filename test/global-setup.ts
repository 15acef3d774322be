// Several suites compare against llama.cpp's own sources and test data (tokenizer vocabularies,
// unicode tables, chat templates). node-llama-cpp ships them as a git bundle; a fresh install has
// not unpacked it yet, so unpack it once (offline, a few seconds) before any suite runs.
// It makes the run's temporary HOME folder (vitest.config.ts names it) and its teardown removes it.
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { TestProject } from "vitest/node";
import { unmountUnder } from "./helpers/mounts.js";

export const LLAMA_CPP_SOURCE = "node_modules/node-llama-cpp/llama/llama.cpp";

export default function setup(project: TestProject): () => void {
  if (!existsSync(join(LLAMA_CPP_SOURCE, "CMakeLists.txt"))) {
    execFileSync("npx", ["--no-install", "node-llama-cpp", "source", "download", "--skipBuild", "--gpu", "false"],
      { stdio: "inherit" });
  }
  const testHome = project.config.env?.PRIMA_TEST_HOME;
  if (testHome) mkdirSync(testHome, { recursive: true, mode: 0o700 });
  return () => {
    if (!testHome) return;
    unmountUnder(testHome); // small disks of test files killed before their own cleanup (helpers/temp.ts)
    rmSync(testHome, { recursive: true, force: true });
  };
}
