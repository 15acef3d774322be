// The thread pool's CPU spreading for ring devices (prima_pool_spread) and its barrier spinning, checked in plain C:
// test/native/pool_check.c, built against native/src/threadpool.c.
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";

const root = join(import.meta.dirname, "..", "..");
const dir = mkdtempSync(join(tmpdir(), "prima-pool-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const linuxGcc = process.platform === "linux" && spawnSync("sh", ["-c", "command -v gcc"]).status === 0;
// With one CPU there is nothing to spread and the check would only say so.
const canSpread = linuxGcc && availableParallelism() >= 2;

describe("thread pool", () => {
  it.skipIf(!canSpread)("spreads a job's threads over distinct CPUs, keeps them spinning at its barriers, and gives the caller its CPUs back", () => {
    const exe = join(dir, "pool_check");
    const src = join(root, "native", "src");
    const build = spawnSync("gcc", ["-O2", "-std=gnu11", `-I${src}`, "-o", exe, join(import.meta.dirname, "pool_check.c"), join(src, "threadpool.c"), "-lpthread"], { encoding: "utf8" });
    expect(build.status, `${build.stdout}${build.stderr}`).toBe(0);
    const r = spawnSync(exe, [], { encoding: "utf8", timeout: 60_000 });
    expect(r.status, `${r.stdout}${r.stderr}`).toBe(0);
    expect(r.stdout).toMatch(/^pool ok \(\d+ threads\)/);
  });
});
