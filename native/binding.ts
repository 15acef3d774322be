// Loads the compiled addon (build/Release/prima.node) from the package root, wherever this file runs from
// (TS sources under vitest, or dist/ after tsc).
import { createRequire } from "node:module";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "package.json")) || !existsSync(join(dir, "binding.gyp"))) {
    const up = dirname(dir);
    if (up === dir) throw new Error("prima: cannot find the package root (binding.gyp)");
    dir = up;
  }
  return dir;
}

const addonPath = join(packageRoot(), "build", "Release", "prima.node");
if (!existsSync(addonPath)) {
  throw new Error(`prima: native addon missing at ${addonPath}; run \`npm install\` (it builds with node-gyp)`);
}

/** The raw addon; typed views live in kernels.ts and model.ts. */
export const addon: Record<string, unknown> = createRequire(import.meta.url)(addonPath);
