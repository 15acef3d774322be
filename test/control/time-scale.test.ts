// PRIMA_TIME_SCALE stretches the control plane's silence limits (for emulated or very slow devices):
// each process reads it once, so each case is a child process.
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import * as limits from "../../control/limits.js";
import { root } from "../helpers/process.js";

function limitsWith(scale: string | undefined): Record<string, number> {
  const url = join(root, "dist", "control", "limits.js");
  const env = { ...process.env };
  delete env.PRIMA_TIME_SCALE;
  if (scale !== undefined) env.PRIMA_TIME_SCALE = scale;
  const r = spawnSync(process.execPath, ["--input-type=module", "-e",
    `const l = await import(${JSON.stringify(url)}); console.log(JSON.stringify(Object.fromEntries(Object.entries(l).filter(([, v]) => typeof v === "number"))));`],
  { env, encoding: "utf8" });
  expect(r.status, r.stderr).toBe(0);
  return JSON.parse(r.stdout) as Record<string, number>;
}

const SCALED = ["HEARTBEAT_TIMEOUT_MS", "MAX_HEARTBEAT_TIMEOUT_MS", "COORDINATOR_SILENCE_MS", "PROOF_TIMEOUT_MS", "JOIN_TIMEOUT_MS", "JOIN_REPLY_TIMEOUT_MS", "STATUS_TIMEOUT_MS", "TIMED_STATUS_TIMEOUT_MS", "ASSIGN_SILENCE_MS"];

describe("PRIMA_TIME_SCALE", () => {
  it("multiplies the silence limits and nothing else; unset or out of range leaves them as they are", () => {
    const base = limitsWith(undefined);
    for (const k of SCALED) expect(base[k], k).toBe((limits as unknown as Record<string, number>)[k]);
    const x10 = limitsWith("10");
    for (const [k, v] of Object.entries(base)) expect(x10[k], k).toBe(SCALED.includes(k) ? 10 * v : v);
    for (const bad of ["0.5", "1000", "fast", ""]) expect(limitsWith(bad), bad).toEqual(base);
  });
});
