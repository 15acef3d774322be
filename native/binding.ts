// Loads the compiled addon (build/Release/prima.node) from the package root.
import { createRequire } from "node:module";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { packageRoot } from "../base/index.js";

const addonPath = join(packageRoot(), "build", "Release", "prima.node");
if (!existsSync(addonPath)) {
  throw new Error(`prima: native addon missing at ${addonPath}; run \`npm install\` (it builds with node-gyp)`);
}

/** The raw addon; typed views live in kernels.ts and model.ts. */
export const addon: Record<string, unknown> = createRequire(import.meta.url)(addonPath);
