// Halda's planning time on 6 devices x 80 layers (the paper's D1-D6 and Llama 3-70B Q4_K_M, where
// every device's disk may overload: 2^6 set assignments), against the 100 ms goal and against
// faithful mode (prima.cpp's Algorithm 1) measured in the same run.
//
//   npm run build && node dist/bench/halda.js [--reps N]
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { halda, parseDeviceProfiles, type HaldaOptions } from "../halda/index.js";
import { modelProfile, modelShapeByName, syntheticModelDescription } from "../model/index.js";
import { median, root } from "./procs.js";

const GOAL_MS = 100;


function timeMs(reps: number, f: () => void): number {
  f(); // warm-up: JIT and the solver's first allocations
  const times: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t = performance.now();
    f();
    times.push(performance.now() - t);
  }
  return median(times);
}

export async function main(argv: string[] = []): Promise<void> {
  const repsAt = argv.indexOf("--reps");
  const reps = repsAt >= 0 ? Number(argv[repsAt + 1]) : 15;
  const devices = parseDeviceProfiles(JSON.parse(readFileSync(`${root}deploy/devices/paper-d1-d6.json`, "utf8"))).devices;
  const model = modelProfile(syntheticModelDescription(modelShapeByName("llama3-70b")!, "Q4_K_M"), { nCtx: 1024 });
  const cases: [string, HaldaOptions][] = [
    ["exact, with device selection (default)", {}],
    ["exact, no device selection", { dropWindowLayers: 0 }],
    ["exact, prefetch guard (every k)", { prefetchGuard: true }],
    ["faithful (prima.cpp), with device selection", { mode: "prima" }],
  ];
  const results = cases.map(([name, o]) => {
    const plan = halda(devices, model, o);
    return { name, ms: timeMs(reps, () => halda(devices, model, o)), plan };
  });
  const faithfulMs = results[3].ms;
  console.log(`\n## halda: ${devices.length} devices x ${model.nLayers} layers (paper D1-D6, llama3-70b Q4_K_M, median of ${reps})\n`);
  console.log("| mode | ms per plan | vs the 100 ms goal | vs faithful | plan (k; windows) | predicted ms/token |");
  console.log("|---|---|---|---|---|---|");
  for (const r of results) {
    console.log(`| ${r.name} | ${r.ms.toFixed(1)} | ${(r.ms / GOAL_MS).toFixed(2)}x | ${(r.ms / faithfulMs).toFixed(2)}x | ` +
      `k=${r.plan.k}; ${r.plan.devices.map((d) => `${d.name.split("-")[0]}:${d.windowLayers}`).join(" ")} | ${r.plan.latencyMs.toFixed(0)} |`);
  }
  console.log(`\nreproduce: npm run build && node dist/bench/halda.js --reps ${reps}`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).catch((e: unknown) => {
    console.error(`bench halda: ${e instanceof Error ? e.message : String(e)}`);
    process.exitCode = 1;
  });
}
