// Several suites compare against llama.cpp's own sources and test data (tokenizer vocabularies,
// unicode tables, chat templates). node-llama-cpp ships them as a git bundle; a fresh install has
// not unpacked it yet, so unpack it once (offline, a few seconds) before any suite runs.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";

export const LLAMA_CPP_SOURCE = "node_modules/node-llama-cpp/llama/llama.cpp";

export default function setup(): void {
  if (existsSync(join(LLAMA_CPP_SOURCE, "CMakeLists.txt"))) return;
  execFileSync("npx", ["--no-install", "node-llama-cpp", "source", "download", "--skipBuild", "--gpu", "false"],
    { stdio: "inherit" });
}
