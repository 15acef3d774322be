// The package root (where package.json and binding.gyp are), wherever this file runs from: TS sources
// under vitest, or dist/ after tsc. The addon, the dashboard's assets and the ggml oracle's harness
// are found from it.
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

let root: string | undefined;

export function packageRoot(): string {
  if (root) return root;
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "package.json")) || !existsSync(join(dir, "binding.gyp"))) {
    const up = dirname(dir);
    if (up === dir) throw new Error(`prima: cannot find the package root (binding.gyp) above ${fileURLToPath(import.meta.url)}`);
    dir = up;
  }
  return (root = dir);
}
