// Builds test/native/simd_check.c with the kernel sources for x86: quants_x86.c once per level, with
// the flags binding.gyp gives that level's library, so the check runs what the addon runs. Where the
// addon's build left its objects (node-gyp's obj.target/), newer than each one's sources and headers, those
// very objects are linked: the same code, and ~20 s less of compiling quants_x86.c three times.
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, statSync } from "node:fs";
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

const buildDir = join(root, "build");
const objRoot = join(buildDir, "Release", "obj.target");

/** The addon's own object for a source of a gyp target, where it is newer than every file its
 * dependency list (make's .d, written by node-gyp) names; else one compiled into dir now. */
function objectFor(dir: string, target: string, source: string, cflags: string[]): string {
  const rel = join(target, "native", "src", source.replace(/\.c$/, ".o"));
  const built = join(objRoot, rel);
  const deps = join(buildDir, "Release", ".deps", "Release", "obj.target", `${rel}.d`);
  if (existsSync(built) && existsSync(deps)) {
    const inputs = [...readFileSync(deps, "utf8").matchAll(/(?:^|\s)(\.\.\/native\/src\/[\w.-]+\.[ch])\b/g)].map((m) => join(buildDir, m[1]));
    const at = statSync(built).mtimeMs;
    if (inputs.some((f) => f.endsWith(source)) && inputs.every((f) => existsSync(f) && statSync(f).mtimeMs <= at)) return built;
  }
  const obj = join(dir, `${target}-${source.replace(/\.c$/, ".o")}`);
  gcc([...cflags, "-c", join(src, source), "-o", obj]);
  return obj;
}

/** Compiles and links the check into dir; `init` links test/native/bochs_init.c as main (a static binary
 * that boots as a Linux init). Returns the executable's path. */
export function buildX86Check(dir: string, opts: { init?: boolean } = {}): string {
  const objs = x86Levels().map(({ name, cflags }) => objectFor(dir, name, "quants_x86.c", cflags));
  const exe = join(dir, opts.init ? "init" : "simd_check_x86");
  const harness = join(import.meta.dirname, "simd_check.c");
  const common = ["quants.c", "kernels.c", "ops.c", "kv_cache.c", "attn_tile.c", "sparse_attn.c"].map((f) => objectFor(dir, "prima", f, []));
  const kernels = [...common, ...objs, "-lpthread", "-lm"];
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
