import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { defineConfig } from "vitest/config";
import { BaseSequencer, type TestSpecification } from "vitest/node";

// Everything the suite writes under HOME-relative folders (profiles, the model cache, join tokens)
// goes to one temporary folder per run, never the user's own ~/.cache or ~/.config; global-setup.ts
// removes it at the end. Child processes inherit it through the environment.
// Files whose tests compare timings taken side by side (the profiler's stand-in pass with the real
// layers', the output layer on top of a pass, streamed layers against layers in memory; the profile's
// pass against its kernels timed a test earlier) run alone, after the rest: beside other files a
// neighbour's burst falls on one of the two timings and not the other (forward.test.ts's ratio failed so
// once under load, profiler.test.ts's pass once with three files beside it).
const TIMED_ALONE = ["test/profiler/forward.test.ts", "test/profiler/profiler.test.ts"];

// Started first where vitest has no durations of its own yet (a fresh clone): it then starts bigger
// files first, and a short file with long tests (families-ring, 43 lines, 54 s) ran last while the
// other worker had nothing left to do. Only the order changes; a file missing here runs anyway.
const SLOW_FIRST = [
  "test/ring/piped-ring.test.ts", "test/coordinator/failover.test.ts", "test/ring/families-ring.test.ts",
  "test/coordinator/structured.test.ts", "test/modelgen/modelgen.test.ts", "test/coordinator/serve.test.ts",
  "test/native/simd.test.ts", "test/control/registry-limits.test.ts", "test/ring/context-shift-ring.test.ts", "test/ring/placement.test.ts",
];

class SlowFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const rank = (f: TestSpecification): number => {
      const at = SLOW_FIRST.findIndex((p) => f.moduleId.endsWith(p));
      const timed = this.ctx.cache.getFileTestResults(`${f.project.name}:${relative(this.ctx.config.root, f.moduleId)}`);
      return at < 0 || timed ? SLOW_FIRST.length : at;
    };
    // vitest's order, then within each project's files the listed ones first, stably.
    const runs: TestSpecification[][] = [];
    for (const f of await super.sort(files)) {
      const last = runs.at(-1);
      if (last && last[0].project.name === f.project.name) last.push(f);
      else runs.push([f]);
    }
    return runs.flatMap((run) => run.map((f, i) => ({ f, i, r: rank(f) })).sort((a, b) => a.r - b.r || a.i - b.i).map(({ f }) => f));
  }
}

// Named here, made by global-setup.ts: vitest evaluates this file more than once, and a folder made
// here on each evaluation left an empty one behind on every run.
const testHome = join(tmpdir(), `prima-test-home-${process.pid}-${Date.now().toString(36)}`);

export default defineConfig({
  test: {
    globalSetup: ["test/global-setup.ts"],
    env: {
      PRIMA_TEST_HOME: testHome,
      XDG_CACHE_HOME: join(testHome, "cache"),
      XDG_CONFIG_HOME: join(testHome, "config"),
      XDG_DATA_HOME: join(testHome, "data"),
    },
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Three files at once on 2 cores: about a third of the suite's time is waiting (timers, child
    // processes starting, peers joining), which a third file fills (392 s -> 326 s on a quiet Zen 4
    // host); the files that time two things side by side run alone (TIMED_ALONE).
    maxWorkers: 3,
    sequence: { sequencer: SlowFirst },
    // TIMED_ALONE's files run after the rest, one at a time (see above).
    projects: [
      { extends: true, test: { name: "suite", include: ["test/**/*.test.ts"], exclude: TIMED_ALONE } },
      { extends: true, test: { name: "alone", include: TIMED_ALONE, fileParallelism: false, sequence: { groupOrder: 1 } } },
    ],
  },
});
