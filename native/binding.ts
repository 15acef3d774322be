// Loads the compiled addon (build/Release/prima.node) from the package root.
import { createRequire } from "node:module";
import { closeSync, existsSync, openSync, readSync } from "node:fs";
import { join } from "node:path";
import { packageRoot } from "../base/index.js";

/** 32-bit CPUs are refused by name: the kernels, the model maps (whole GGUF files) and the sizes are
 * written for a 64-bit address space, and no 32-bit build was ever run. */
const SUPPORTED_ARCHS = ["x64", "arm64"];
if (!SUPPORTED_ARCHS.includes(process.arch)) {
  const hint = process.arch === "arm" ? " (32-bit ARM: on a Raspberry Pi, install the 64-bit Raspberry Pi OS; on a phone, a 64-bit Termux)" : "";
  throw new Error(`prima: this CPU architecture (${process.arch}) is not supported; prima runs on x64 and arm64${hint}`);
}

const addonPath = join(packageRoot(), "build", "Release", "prima.node");
if (!existsSync(addonPath)) {
  throw new Error(`prima: native addon missing at ${addonPath}; run \`npm install\` (it builds with node-gyp)`);
}

/** ELF machine numbers (e_machine) as Node names architectures. */
const ELF_MACHINES: Record<number, string> = { 3: "ia32", 40: "arm", 62: "x64", 183: "arm64" };

/** The architecture an ELF shared object was built for, or null when the file is not ELF. */
export function elfArch(path: string): string | null {
  const head = Buffer.alloc(20);
  const fd = openSync(path, "r");
  try {
    if (readSync(fd, head, 0, 20, 0) < 20 || head.readUInt32BE(0) !== 0x7f454c46) return null;
  } finally {
    closeSync(fd);
  }
  const machine = head[5] === 2 ? head.readUInt16BE(18) : head.readUInt16LE(18);
  return ELF_MACHINES[machine] ?? `ELF machine ${machine}`;
}

function load(): Record<string, unknown> {
  try {
    return createRequire(import.meta.url)(addonPath);
  } catch (e) {
    // dlopen of another architecture's library says "cannot open shared object file: No such file or
    // directory" (the file is there): name the architectures instead.
    const built = elfArch(addonPath);
    if (built && built !== process.arch) {
      throw new Error(`prima: the native addon at ${addonPath} is built for ${built}, but this node runs on ${process.arch}; ` +
        "rebuild it on this machine (`npm rebuild prima` or `npx node-gyp rebuild` in the package)", { cause: e });
    }
    throw e;
  }
}

/** The raw addon; typed views live in kernels.ts and model.ts. */
export const addon: Record<string, unknown> = load();
