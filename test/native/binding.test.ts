// The addon loader names a wrong architecture instead of passing on dlopen's "No such file or directory".
import { spawnSync } from "node:child_process";
import { copyFileSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { elfArch } from "../../native/binding.js";
import { root } from "../helpers/process.js";
import { ownedDir } from "../helpers/temp.js";

const dir = ownedDir(join(tmpdir(), `prima-binding-${process.pid}`));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The header of a little-endian 64-bit ELF shared object for machine `machine`. */
function elfHeader(machine: number): Buffer {
  const h = Buffer.alloc(64);
  h.writeUInt32BE(0x7f454c46, 0);
  h[4] = 2; // 64-bit
  h[5] = 1; // little-endian
  h[6] = 1;
  h.writeUInt16LE(3, 16); // ET_DYN
  h.writeUInt16LE(machine, 18);
  return h;
}

describe("addon loader", () => {
  it("reads the architecture of an ELF file: this build's addon is this node's", () => {
    expect(elfArch(join(root, "build", "Release", "prima.node"))).toBe(process.arch);
    const f = join(dir, "arm64.so");
    writeFileSync(f, elfHeader(183));
    expect(elfArch(f)).toBe("arm64");
    writeFileSync(f, "not an ELF file at all");
    expect(elfArch(f)).toBeNull();
  });

  it("names both architectures when the addon was built for another one", () => {
    // a package copy whose addon is an aarch64 (x64 on arm64 hosts) ELF file
    const other = process.arch === "arm64" ? 62 : 183;
    const pkg = join(dir, "pkg");
    mkdirSync(join(pkg, "build", "Release"), { recursive: true });
    for (const d of ["native", "base"]) mkdirSync(join(pkg, "dist", d), { recursive: true });
    for (const f of ["package.json", "binding.gyp"]) copyFileSync(join(root, f), join(pkg, f));
    copyFileSync(join(root, "dist", "native", "binding.js"), join(pkg, "dist", "native", "binding.js"));
    for (const f of ["index.js", "escape.js", "package-root.js"]) copyFileSync(join(root, "dist", "base", f), join(pkg, "dist", "base", f));
    writeFileSync(join(pkg, "build", "Release", "prima.node"), elfHeader(other));
    const r = spawnSync(process.execPath, ["-e", `import(${JSON.stringify(join(pkg, "dist", "native", "binding.js"))})`], { encoding: "utf8" });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain(`is built for ${other === 183 ? "arm64" : "x64"}, but this node runs on ${process.arch}`);
    expect(r.stderr).not.toContain("No such file or directory");
  });
});
