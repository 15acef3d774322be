// Weights are mapped, never copied: at full context a process's anonymous memory is the KV cache plus
// a small fixed working set, even when the weights are much larger (the benchmark model's numbers
// come from `npm run bench`, bench/memory.ts, which this test runs on a generated model).
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect, it } from "vitest";
import { generateModel } from "../../modelgen/index.js";
import { modelShapeByName } from "../../model/index.js";
import type { MemoryReport } from "../../bench/memory.js";

it("anonymous RSS at 2048 tokens of context stays within the KV cache + 64 MiB, below the weights", async () => {
  const dir = mkdtempSync(join(tmpdir(), "prima-memtest-"));
  const path = join(dir, "m.gguf");
  const shape = { ...modelShapeByName("tiny-llama")!, name: "mem", nEmbd: 1024, nLayers: 4, nHead: 8, nHeadKv: 8, nFf: 4096, contextLength: 2048 };
  await generateModel({ shape, type: "F16", out: path, seed: 1 });
  const out = execFileSync(process.execPath, ["dist/bench/memory.js", path, "2048"], { encoding: "utf8" });
  rmSync(dir, { recursive: true, force: true });
  const r = JSON.parse(out) as MemoryReport;
  expect(r.kvBytes).toBe(2 * 4 * 2048 * 1024 * 2);
  expect(r.weightBytes).toBeGreaterThan(120 * 2 ** 20);
  expect(r.peakAnonBytes).toBeGreaterThan(r.kvBytes); // the cache really was filled
  expect(r.peakAnonBytes - r.kvBytes).toBeLessThan(64 * 2 ** 20);
  expect(r.peakAnonBytes).toBeLessThan(r.weightBytes);
}, 120_000);
