// Builds test/native/simd_check.c with the kernel sources for x86: quants_x86.c once per level, with
// the flags binding.gyp gives that level's library, so the check runs what the addon runs.
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const root = join(import.meta.dirname, "..", "..");
const src = join(root, "native", "src");

type GypTarget = { target_name: string; conditions?: [string, { sources?: string[]; cflags?: string[] }][] };

/** The x86 kernel libraries of binding.gyp (prima_avx2, prima_avx512, ...) and their compiler flags. */
export function x86Levels(): { name: string; cflags: string[] }[] {
  const gyp = JSON.parse(readFileSync(join(root, "binding.gyp"), "utf8")) as { targets: GypTarget[] };
  const levels = gyp.targets.flatMap((t) => {
    const x64 = t.conditions?.find(([cond, body]) => cond === "target_arch=='x64'" && body.sources?.includes("native/src/quants_x86.c"));
    return x64 ? [{ name: t.target_name, cflags: x64[1].cflags ?? [] }] : [];
  });
  if (levels.length === 0) throw new Error("binding.gyp lists no x86 kernel library");
  return levels;
}

function gcc(args: string[]): void {
  const r = spawnSync("gcc", ["-O2", "-std=gnu11", `-I${src}`, ...args], { encoding: "utf8", timeout: 180_000 });
  if (r.status !== 0) throw new Error(`gcc ${args.join(" ")} failed:\n${r.stdout}${r.stderr}${r.error ?? ""}`);
}

/** Compiles and links the check into dir; `init` links test/native/bochs_init.c as main (a static binary
 * that boots as a Linux init). Returns the executable's path. */
export function buildX86Check(dir: string, opts: { init?: boolean } = {}): string {
  const objs = x86Levels().map(({ name, cflags }) => {
    const obj = join(dir, `${name}.o`);
    gcc([...cflags, "-c", join(src, "quants_x86.c"), "-o", obj]);
    return obj;
  });
  const exe = join(dir, opts.init ? "init" : "simd_check_x86");
  const harness = join(import.meta.dirname, "simd_check.c");
  const kernels = [join(src, "quants.c"), join(src, "kernels.c"), join(src, "ops.c"), join(src, "kv_cache.c"), join(src, "attn_tile.c"), join(src, "sparse_attn.c"), ...objs, "-lpthread", "-lm"];
  if (opts.init) {
    // the harness's main becomes simd_check_main, called by bochs_init.c's main
    const harnessObj = join(dir, "simd_check.o");
    gcc(["-Dmain=simd_check_main", "-c", harness, "-o", harnessObj]);
    gcc(["-static", "-o", exe, join(import.meta.dirname, "bochs_init.c"), harnessObj, ...kernels]);
  } else {
    gcc(["-o", exe, harness, ...kernels]);
  }
  return exe;
}
