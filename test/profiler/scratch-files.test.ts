// Scratch files a killed profiler left behind are removed by the next profile; those of running
// processes, young ones and others' files stay.
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, expect, it } from "vitest";
import { removeLeftOverScratch } from "../../profiler/scratch-files.js";

const dir = mkdtempSync(join(tmpdir(), "prima-scratch-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

it("removes a gone process's old scratch file and keeps the rest", () => {
  const gone = spawnSync(process.execPath, ["-e", "process.stdout.write(String(process.pid))"]).stdout.toString();
  expect(Number(gone)).toBeGreaterThan(0);
  const file = (name: string, ageS: number) => {
    const p = join(dir, name);
    writeFileSync(p, "x");
    const t = Date.now() / 1000 - ageS;
    utimesSync(p, t, t);
    return p;
  };
  const left = file(`prima-forward-${gone}.gguf`, 3600);
  const young = file(`.prima-disk-probe-${gone}-1.tmp`, 5);
  const mine = file(`prima-forward-${process.pid}.gguf`, 3600);
  const parent = file(`prima-forward-${process.ppid}.gguf`, 3600);
  const other = file(`prima-forward-notes.txt`, 3600);
  const model = file(`model-${gone}.gguf`, 3600);
  removeLeftOverScratch(dir, "prima-forward-");
  removeLeftOverScratch(dir, ".prima-disk-probe-");
  expect(existsSync(left)).toBe(false);
  for (const kept of [young, mine, parent, other, model]) expect(existsSync(kept), kept).toBe(true);
  removeLeftOverScratch(join(dir, "absent"), "prima-forward-"); // a folder that is not there: nothing thrown
});
