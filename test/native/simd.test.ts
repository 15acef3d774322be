// Every SIMD level against its scalar twin, in plain C (test/native/simd_check.c): here the x86 levels
// this CPU runs (built as binding.gyp builds them, test/native/x86-build.ts), and the NEON kernels, which
// this x86 machine cannot run natively, cross-compiled for AArch64 (gcc-aarch64-linux-gnu) and run
// under qemu-user. The check also prints a hash of every reference quantizer's output, which must be
// the same on every architecture (and on x86 equals llama.cpp's, see kernels.test.ts). AVX-512 runs
// under bochs: avx512.test.ts.
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { buildX86Check } from "./x86-build.js";

const root = join(import.meta.dirname, "..", "..");
const src = join(root, "native", "src");
const harness = join(root, "test", "native", "simd_check.c");
const dir = mkdtempSync(join(tmpdir(), "prima-simd-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function has(cmd: string): boolean {
  return spawnSync("sh", ["-c", `command -v ${cmd}`]).status === 0;
}

function run(cmd: string, args: string[]): { status: number | null; out: string } {
  const r = spawnSync(cmd, args, { encoding: "utf8", timeout: 120_000 });
  return { status: r.status, out: `${r.stdout ?? ""}${r.stderr ?? ""}${r.error ? String(r.error) : ""}` };
}

function hashOf(out: string): string | undefined {
  return /quantize_ref hash ([0-9a-f]{16})/.exec(out)?.[1];
}

const qemu = ["qemu-aarch64-static", "qemu-aarch64"].find(has);
const crossReason = !has("aarch64-linux-gnu-gcc")
  ? "aarch64-linux-gnu-gcc not installed (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross)"
  : !qemu ? "qemu-aarch64 not installed (apt-get install qemu-user-static)" : null;
if (crossReason) console.warn(`simd.test: skipping the NEON check: ${crossReason}`);

const nativeX64 = process.arch === "x64" && has("gcc");

describe("SIMD twins in plain C", () => {
  let nativeHash: string | undefined;

  it.skipIf(!nativeX64)("native build: every level against scalar", () => {
    const exe = buildX86Check(dir);
    const r = run(exe, []);
    expect(r.status, r.out).toBe(0);
    expect(r.out).toMatch(/checked [1-9]\d*, failed 0/);
    expect(r.out).not.toMatch(/ties away/); // a real CPU: F16 rounding ties are compared too
    nativeHash = hashOf(r.out);
    expect(nativeHash).toBeDefined();
  }, 180_000); // where the addon's objects are stale, three gcc builds of quants_x86.c: past the 60 s default on a loaded 2-core VM

  it.skipIf(crossReason !== null)("NEON under qemu: equals scalar (bit for bit on quantized types), same quantizers", () => {
    const exe = join(dir, "simd_check_arm");
    let r = run("aarch64-linux-gnu-gcc", ["-O2", "-std=gnu11", "-DPRIMA_HAVE_NEON", `-I${src}`, "-static", "-o", exe, harness,
      join(src, "quants.c"), join(src, "kernels.c"), join(src, "ops.c"), join(src, "kv_cache.c"), join(src, "attn_tile.c"), join(src, "sparse_attn.c"), join(src, "quants_neon.c"), "-lpthread", "-lm"]);
    expect(r.status, r.out).toBe(0);
    r = run(qemu!, [exe]);
    expect(r.status, r.out).toBe(0);
    expect(r.out).toMatch(/level neon/);
    expect(r.out).toMatch(/checked [1-9]\d*, failed 0/);
    if (nativeHash) expect(hashOf(r.out)).toBe(nativeHash);
  });
});
