// The AVX-512 kernels, on emulated CPUs (this machine has no AVX-512): the x86 check (every level
// against the scalar twin, test/native/simd_check.c) boots as PID 1 of a Linux under bochs, on a
// Skylake-X model (AVX-512 F/BW/DQ/VL: prima_avx512_fns) and an Ice Lake model (adds VNNI:
// prima_avx512vnni_fns). A few minutes of emulation, so it runs when asked: `npm run test:avx512`
// (which sets PRIMA_AVX512_CHECK=1); .ci/run asks.
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { bochsMissing, bootImage, runUnderBochs } from "./bochs.js";
import { buildX86Check } from "./x86-build.js";

const asked = process.env.PRIMA_AVX512_CHECK === "1";
const missing = asked ? bochsMissing() : "not asked (npm run test:avx512)";
if (missing) console.warn(`avx512.test: skipped: ${missing}`);
if (asked && missing) throw new Error(`the AVX-512 check was asked for but cannot run: ${missing}`);

// Made only when the check runs: a skipped file runs no afterAll hook.
const dir = missing === null ? mkdtempSync(join(tmpdir(), "prima-avx512-")) : "";
afterAll(() => { if (dir) rmSync(dir, { recursive: true, force: true }); });

const hashOf = (out: string) => /quantize_ref hash ([0-9a-f]{16})/.exec(out)?.[1];

describe.skipIf(missing !== null)("AVX-512 kernels under bochs", () => {
  it("equal their scalar twins on Skylake-X (no VNNI) and Ice Lake (VNNI), with the same quantizers", async () => {
    const native = spawnSync(buildX86Check(dir), { encoding: "utf8" });
    expect(native.status, native.stdout).toBe(0);
    const image = bootImage(dir, buildX86Check(dir, { init: true }));
    const done = /simd_check (exit \d+|killed by signal \d+|could not run)|Kernel panic/;
    const [skylake, icelake] = await Promise.all([
      runUnderBochs(image, "corei7_skylake_x", dir, done, 12 * 60_000),
      runUnderBochs(image, "corei7_icelake_u", dir, done, 12 * 60_000),
    ]);
    for (const [out, vnni] of [[skylake, 0], [icelake, 1]] as const) {
      expect(out, out).toMatch(new RegExp(`cpu avx512f 1 avx512bw 1 avx512dq 1 avx512vl 1 avx512vnni ${vnni}`));
      expect(out, out).toMatch(/level avx512\b/);
      expect(out, out).toMatch(/checked [1-9]\d*, failed 0/);
      expect(out, out).toMatch(/simd_check exit 0/);
      expect(hashOf(out), out).toBe(hashOf(native.stdout));
    }
  }, 30 * 60_000);
});
