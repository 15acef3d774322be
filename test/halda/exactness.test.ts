// Exact mode against brute force: on seeded random small clusters, Halda's predicted latency equals the
// minimum over every k, window and GPU-layer count of an independent evaluation of the model
// (oracle.ts), and with the head's priority (masterPriority > 1, the default) the head holds as many
// layers as the most any plan of that latency gives it (HALDA.md §3: a secondary key). Any mismatch fails.

import { describe, expect, test } from "vitest";
import { halda, HaldaError, type HaldaOptions, type Plan } from "../../halda/index.js";
import { bruteForce, bruteForceSubsets, defaultOracleOptions, kCandidates, tieMs, type OracleOptions } from "./oracle.js";
import { mulberry32, randomInstance, type InstanceShape } from "./random-instances.js";
import { modelTerms, resolveOptions } from "../../halda/terms.js";

const rel = (a: number, b: number) => Math.abs(a - b) / Math.max(1, Math.abs(b));

interface Variant {
  readonly name: string;
  readonly count: number;
  readonly layerChoices?: readonly number[];
  readonly shape?: InstanceShape;
  readonly options: (rand: () => number, L: number, M: number) => { halda: HaldaOptions; oracle: OracleOptions };
}

const variants: Variant[] = [
  {
    // The main check: no tie-break factor, so Halda's objective is the model's latency itself.
    name: "auto k, masterPriority 1", count: 320,
    options: (rand, _L, _M) => {
      const headComputeTerm = rand() < 0.5 ? "outputLayer" : "oneLayer";
      const keepOutputInMetal = rand() < 0.7;
      return {
        halda: { masterPriority: 1, dropWindowLayers: 0, headComputeTerm, keepOutputInMetal },
        oracle: { ...defaultOracleOptions, headComputeTerm, keepOutputInMetal },
      };
    },
  },
  {
    name: "auto k, default masterPriority 1.01 (a secondary key)", count: 60,
    options: () => ({ halda: { dropWindowLayers: 0 }, oracle: { ...defaultOracleOptions, masterPriority: 1.01 } }),
  },
  {
    // Where the old factor on the head's whole coefficient discounted 1% of its disk reload.
    name: "overloaded head, default masterPriority 1.01", count: 120, shape: { headOverloaded: true },
    options: () => ({ halda: { dropWindowLayers: 0 }, oracle: { ...defaultOracleOptions, masterPriority: 1.01 } }),
  },
  {
    name: "user k", count: 60, layerChoices: [8, 12, 16, 20, 24, 30, 32],
    options: (rand, L, M) => {
      const ks = kCandidates(L, M, 0).filter((k) => k > 1);
      const k = ks.length > 0 ? ks[Math.floor(rand() * ks.length)] : 1;
      return { halda: { masterPriority: 1, dropWindowLayers: 0, k }, oracle: { ...defaultOracleOptions, k } };
    },
  },
  {
    // Our engine's paging (HALDA.md §2.1 priced as measured): an overloaded device rereads its whole
    // RAM-side window each token; with heads that must overload, where the cliff matters most.
    name: "whole-window reload", count: 160, shape: { headOverloaded: true },
    options: (rand) => {
      const masterPriority = rand() < 0.5 ? 1 : 1.01;
      return { halda: { masterPriority, dropWindowLayers: 0, overloadReload: "window" }, oracle: { ...defaultOracleOptions, masterPriority, overloadReload: "window" } };
    },
  },
  {
    // prima's engine streams what does not fit (native streamBeyond): the excess, one layer and a margin more.
    name: "streamed overflow", count: 120, shape: { headOverloaded: true },
    options: (rand) => {
      const masterPriority = rand() < 0.5 ? 1 : 1.01;
      return { halda: { masterPriority, dropWindowLayers: 0, overloadReload: "stream" }, oracle: { ...defaultOracleOptions, masterPriority, overloadReload: "stream" } };
    },
  },
  {
    // Mixtures of experts (docs/HALDA.md "Mixture of experts"): an overloaded device rereads only the
    // routed experts that are not resident, a convex term the ILP carries as an auxiliary variable.
    name: "MoE, uniform routing", count: 120, shape: { headOverloaded: true, moe: "uniform" },
    options: (rand) => {
      const masterPriority = rand() < 0.5 ? 1 : 1.01;
      return { halda: { masterPriority, dropWindowLayers: 0 }, oracle: { ...defaultOracleOptions, masterPriority } };
    },
  },
  {
    name: "MoE, skewed routing", count: 200, shape: { headOverloaded: true, moe: "skewed" },
    options: (rand) => {
      const masterPriority = rand() < 0.5 ? 1 : 1.01;
      return { halda: { masterPriority, dropWindowLayers: 0 }, oracle: { ...defaultOracleOptions, masterPriority } };
    },
  },
  {
    name: "MoE, skewed routing, user k", count: 60, layerChoices: [8, 12, 16, 20, 24, 30, 32], shape: { moe: "skewed" },
    options: (rand, L, M) => {
      const ks = kCandidates(L, M, 0).filter((k) => k > 1);
      const k = ks.length > 0 ? ks[Math.floor(rand() * ks.length)] : 1;
      return { halda: { masterPriority: 1, dropWindowLayers: 0, k }, oracle: { ...defaultOracleOptions, k } };
    },
  },
  {
    name: "MoE, streamed overflow", count: 80, shape: { headOverloaded: true, moe: "skewed" },
    options: () => ({ halda: { masterPriority: 1, dropWindowLayers: 0, overloadReload: "stream" }, oracle: { ...defaultOracleOptions, overloadReload: "stream" } }),
  },
  {
    name: "MoE, whole-window reload", count: 80, shape: { headOverloaded: true, moe: "skewed" },
    options: () => ({ halda: { masterPriority: 1, dropWindowLayers: 0, overloadReload: "window" }, oracle: { ...defaultOracleOptions, overloadReload: "window" } }),
  },
  {
    name: "prefetch guard", count: 150, layerChoices: [8, 12, 16, 20, 24, 30, 32],
    options: () => ({ halda: { masterPriority: 1, dropWindowLayers: 0, prefetchGuard: true }, oracle: { ...defaultOracleOptions, prefetchGuard: true } }),
  },
];

describe("exact mode equals brute force", () => {
  let seed = 1000;
  for (const v of variants) {
    test(`${v.name}: ${v.count} random instances`, () => {
      let feasible = 0, infeasible = 0, kAbove1 = 0, overloaded = 0, headOverloaded = 0, partlyResident = 0;
      for (let i = 0; i < v.count; i++) {
        const rand = mulberry32(seed++);
        const inst = randomInstance(rand, 4, 32, v.layerChoices, v.shape);
        const { halda: hOpt, oracle: oOpt } = v.options(rand, inst.model.nLayers, inst.devices.length);
        const hOptions: HaldaOptions = { ...hOpt, registerLoadTerms: inst.registerLoadTerms };
        const oOptions: OracleOptions = { ...oOpt, registerLoadTerms: inst.registerLoadTerms };
        const brute = bruteForce(inst.devices, inst.model, oOptions);
        let plan: Plan | null = null;
        try {
          plan = halda(inst.devices, inst.model, hOptions);
        } catch (e) {
          if (!(e instanceof HaldaError)) throw e;
          expect(e.reason, `seed ${seed - 1}: ${e.message}`).toBe("infeasible");
        }
        const where = `seed ${seed - 1} (${v.name}): halda ${plan ? `${plan.latencyMs} k=${plan.k} w=[${plan.devices.map((d) => d.windowLayers)}] n=[${plan.devices.map((d) => d.gpuLayers)}]` : "infeasible"}, brute force ${brute ? `${brute.latencyMs} k=${brute.k} w=[${brute.w}] n=[${brute.n}]` : "infeasible"}`;
        expect(plan === null, where).toBe(brute === null);
        if (!plan || !brute) { infeasible++; continue; }
        feasible++;
        expect(rel(plan.latencyMs, brute.latencyMs), where).toBeLessThan(1e-9);
        expect(plan.objectiveMs, where).toBe(plan.latencyMs);
        if (oOptions.masterPriority > 1) expect(plan.devices[0].layersPerToken, where).toBe(brute.headLayers);
        if (plan.k > 1) kAbove1++;
        if (plan.devices.some((d) => d.set !== "M4")) overloaded++;
        if (plan.devices[0].set !== "M4") headOverloaded++;
        const x = inst.model.moe;
        if (x) {
          // overloaded with some experts resident: the regime where routing skew matters
          const bp = inst.model.layerBytes + inst.model.kvBytesPerTokenLayer * inst.model.nCtx, dense = bp - x.nExpert * x.expertBytes;
          if (plan.devices.some((d) => {
            const r = d.layersPerToken - (d.set === "M3" ? d.gpuLayersPerToken : 0);
            return d.set !== "M4" && d.set !== "M2" && d.ramLayerCapacityBytes > r * dense && d.ramLayerCapacityBytes < r * bp;
          })) partlyResident++;
        }
      }
      // The instances must exercise both answers and the overload sets, or the check means little.
      expect(feasible).toBeGreaterThan(v.count * (v.name === "prefetch guard" ? 0.3 : 0.6));
      expect(infeasible).toBeGreaterThan(0);
      expect(overloaded).toBeGreaterThan(v.count * (v.name === "prefetch guard" ? 0.04 : 0.1));
      if (v.name.endsWith("user k")) expect(kAbove1).toBeGreaterThan(v.count * 0.3);
      if (v.name === "prefetch guard") expect(kAbove1).toBeGreaterThan(0);
      if (v.shape?.headOverloaded) expect(headOverloaded).toBeGreaterThan(v.count * 0.3);
      // under the page cache's pricing, where which experts stay resident decides the reread
      if (v.shape?.moe && v.shape.headOverloaded && !/stream|window/.test(v.name)) expect(partlyResident).toBeGreaterThan(v.count * 0.2);
      console.log(`${v.name}: ${feasible} feasible (${overloaded} with an overloaded device, ${headOverloaded} with the head overloaded, ${kAbove1} with k > 1${v.shape?.moe ? `, ${partlyResident} with experts partly resident` : ""}), ${infeasible} infeasible`);
    });
  }
});

test("ties go to the head: on identical devices every split costs the same, and the head takes all but one layer each", () => {
  const model = randomInstance(mulberry32(7), 2, 32, [32]).model;
  const device = (name: string) => ({ name, os: "linux" as const, cpuFlopsPerS: { "*": 1e11 }, ramAvailableBytes: 64 * 2 ** 30, diskSeqReadBytesPerS: 2e9 });
  const devices = [device("head"), device("a"), device("b")];
  const plan = halda(devices, model, { dropWindowLayers: 0 });
  const brute = bruteForce(devices, model, { ...defaultOracleOptions, masterPriority: 1.01 })!;
  expect(plan.devices.map((d) => d.windowLayers)).toEqual([30, 1, 1]);
  expect(brute.headLayers).toBe(30);
  expect(rel(plan.latencyMs, brute.latencyMs)).toBeLessThan(1e-9);
});

// The tests of selection against brute force take the fastest-priced subset (overRoomMargin 0); the
// margin's second stage is checked after them.
describe("device selection equals brute force over every subset", () => {
  test("the best subset, and each dropped device's best plan with it: 100 random clusters of 2-5 devices, half with an overloaded head", () => {
    let planned = 0, infeasible = 0, droppedSome = 0, beatsPaperRule = 0;
    for (let seed = 9000; seed < 9100; seed++) {
      const rand = mulberry32(seed);
      const inst = randomInstance(rand, 5, 24, undefined, { headOverloaded: seed % 2 === 1 });
      const oracle: OracleOptions = { ...defaultOracleOptions, masterPriority: 1.01, registerLoadTerms: inst.registerLoadTerms };
      const subsets = bruteForceSubsets(inst.devices, inst.model, oracle);
      let plan: Plan | null = null;
      try {
        plan = halda(inst.devices, inst.model, { registerLoadTerms: inst.registerLoadTerms, overRoomMargin: 0 });
      } catch (e) {
        if (!(e instanceof HaldaError)) throw e;
        expect(e.reason, `seed ${seed}: ${e.message}`).toBe("infeasible");
      }
      expect(plan === null, `seed ${seed}: halda ${plan ? "has a plan" : "has none"}, ${subsets.length} feasible subsets`).toBe(subsets.length === 0);
      if (!plan) { infeasible++; continue; }
      planned++;
      const least = Math.min(...subsets.map((x) => x.result.latencyMs));
      const where = `seed ${seed}: halda ${plan.latencyMs} on [${plan.devices.map((d) => d.index)}], brute force ${least} on ${subsets.filter((x) => x.result.latencyMs <= least + tieMs(least)).map((x) => `[${x.subset}]`).join(" or ")}`;
      expect(rel(plan.latencyMs, least), where).toBeLessThan(1e-9);
      // Among equally fast subsets, the fewest devices.
      const fewest = Math.min(...subsets.filter((x) => x.result.latencyMs <= least + tieMs(least)).map((x) => x.subset.length));
      expect(plan.devices.length, where).toBe(fewest);
      for (const d of plan.dropped) {
        const having = subsets.filter((x) => x.subset.includes(d.index)).map((x) => x.result.latencyMs);
        if (having.length === 0) expect(d.latencyWithMs, where).toBeNull();
        else expect(rel(d.latencyWithMs!, Math.min(...having)), `${where}; dropped ${d.name}: with it ${d.latencyWithMs}`).toBeLessThan(1e-9);
        expect(rel(d.latencyWithoutMs, least), where).toBeLessThan(1e-9);
      }
      if (plan.dropped.length > 0) droppedSome++;
      const paper = halda(inst.devices, inst.model, { registerLoadTerms: inst.registerLoadTerms, selection: "paper" });
      expect(paper.latencyMs, where).toBeGreaterThanOrEqual(plan.latencyMs - tieMs(plan.latencyMs));
      if (paper.latencyMs > plan.latencyMs + tieMs(plan.latencyMs)) beatsPaperRule++;
    }
    // The instances must drop devices, and sometimes differently from prima.cpp's rule, or the check means little.
    expect(planned).toBeGreaterThan(60);
    expect(infeasible).toBeGreaterThan(0);
    expect(droppedSome).toBeGreaterThan(20);
    expect(beatsPaperRule).toBeGreaterThan(2);
    console.log(`selection: ${planned} planned (${droppedSome} dropping a device, ${beatsPaperRule} faster than prima.cpp's rule), ${infeasible} infeasible`);
  });
});

test("whole-window reload: the best subset equals brute force over every subset (its lower bound stays a bound)", () => {
  let planned = 0;
  for (let seed = 9200; seed < 9260; seed++) {
    const inst = randomInstance(mulberry32(seed), 5, 24, undefined, { headOverloaded: seed % 2 === 1 });
    const oracle: OracleOptions = { ...defaultOracleOptions, masterPriority: 1.01, registerLoadTerms: inst.registerLoadTerms, overloadReload: "window" };
    const subsets = bruteForceSubsets(inst.devices, inst.model, oracle);
    let plan: Plan | null = null;
    try {
      plan = halda(inst.devices, inst.model, { registerLoadTerms: inst.registerLoadTerms, overloadReload: "window", overRoomMargin: 0 });
    } catch (e) {
      if (!(e instanceof HaldaError)) throw e;
    }
    expect(plan === null, `seed ${seed}`).toBe(subsets.length === 0);
    if (!plan) continue;
    planned++;
    const least = Math.min(...subsets.map((x) => x.result.latencyMs));
    expect(rel(plan.latencyMs, least), `seed ${seed}: halda ${plan.latencyMs}, brute force ${least}`).toBeLessThan(1e-9);
  }
  expect(planned).toBeGreaterThan(30);
});

test("MoE, skewed routing: the best subset equals brute force over every subset (its lower bound stays a bound)", () => {
  let planned = 0;
  for (let seed = 9300; seed < 9350; seed++) {
    const inst = randomInstance(mulberry32(seed), 5, 24, undefined, { headOverloaded: seed % 2 === 1, moe: "skewed" });
    const oracle: OracleOptions = { ...defaultOracleOptions, masterPriority: 1.01, registerLoadTerms: inst.registerLoadTerms };
    const subsets = bruteForceSubsets(inst.devices, inst.model, oracle);
    let plan: Plan | null = null;
    try {
      plan = halda(inst.devices, inst.model, { registerLoadTerms: inst.registerLoadTerms, overRoomMargin: 0 });
    } catch (e) {
      if (!(e instanceof HaldaError)) throw e;
    }
    expect(plan === null, `seed ${seed}`).toBe(subsets.length === 0);
    if (!plan) continue;
    planned++;
    const least = Math.min(...subsets.map((x) => x.result.latencyMs));
    expect(rel(plan.latencyMs, least), `seed ${seed}: halda ${plan.latencyMs}, brute force ${least}`).toBeLessThan(1e-9);
  }
  expect(planned).toBeGreaterThan(25);
});

test("over-room margin: within 15% of the fastest-priced subset, the fewest layers beyond the devices' rooms (every subset planned alone)", () => {
  let planned = 0, moved = 0;
  for (let seed = 9400; seed < 9700; seed++) {
    const inst = randomInstance(mulberry32(seed), 4, 24, undefined, { headOverloaded: seed % 2 === 1, ...(seed % 3 === 0 ? { moe: "skewed" as const } : {}) });
    const bp = modelTerms(inst.model, resolveOptions({})).layerBytesWithKv;
    // each window's layers past its device's room, to the nearest layer, summed
    const beyond = (p: Plan) => p.devices.reduce((sum, d) => {
      const ram = d.layersPerToken - d.gpuLayersPerToken;
      return sum + Math.min(ram, Math.round(Math.max(0, ram * bp - d.ramLayerCapacityBytes) / bp));
    }, 0);
    const o = { registerLoadTerms: inst.registerLoadTerms };
    const subsets: Plan[] = [];
    for (let mask = 0; mask < 2 ** (inst.devices.length - 1); mask++) {
      const subset = inst.devices.filter((_, i) => i === 0 || (mask & (1 << (i - 1))) !== 0);
      try { subsets.push(halda(subset, inst.model, { ...o, keepAll: true, overRoomMargin: 0 })); } catch (e) { if (!(e instanceof HaldaError)) throw e; }
    }
    if (subsets.length === 0) continue;
    const least = Math.min(...subsets.map((p) => p.latencyMs));
    const within = subsets.filter((p) => p.latencyMs <= least * 1.15 * (1 + 1e-9));
    const fewest = Math.min(...within.map(beyond));
    const plan = halda(inst.devices, inst.model, o);
    const where = `seed ${seed}: halda ${plan.latencyMs} [${plan.devices.map((d) => d.windowLayers)}] ${beyond(plan)} beyond; fastest ${least}; within 15%: ${within.map((p) => `${p.latencyMs} (${beyond(p)})`).join(", ")}`;
    expect(plan.latencyMs, where).toBeLessThanOrEqual(least * 1.15 * (1 + 1e-9));
    expect(beyond(plan), where).toBe(fewest);
    if (plan.latencyMs > least * (1 + 1e-9)) {
      moved++;
      expect(plan.notes.some((n) => n.includes("rather than the fastest-priced")), where).toBe(true);
    }
    planned++;
  }
  // The instances must sometimes trade price for room, or the check means little.
  expect(planned).toBeGreaterThan(200);
  expect(moved).toBeGreaterThan(3);
  console.log(`over-room margin: ${planned} planned, ${moved} took a subset priced above the fastest for fewer layers beyond the rooms`);
});

test("faithful mode's best subset is the best of its plans over every subset (the bound assumes no compute buffers there)", () => {
  let checked = 0;
  for (let seed = 9100; seed < 9140; seed++) {
    const inst = randomInstance(mulberry32(seed), 4, 24, undefined, { headOverloaded: seed % 2 === 1 });
    const o = { mode: "prima" as const, registerLoadTerms: inst.registerLoadTerms };
    let least = Infinity;
    for (let mask = 0; mask < 2 ** (inst.devices.length - 1); mask++) {
      const subset = inst.devices.filter((_, i) => i === 0 || (mask & (1 << (i - 1))) !== 0);
      try { least = Math.min(least, halda(subset, inst.model, { ...o, keepAll: true }).latencyMs); } catch (e) { if (!(e instanceof HaldaError)) throw e; }
    }
    if (least === Infinity) continue;
    const plan = halda(inst.devices, inst.model, { ...o, selection: "best", overRoomMargin: 0 });
    expect(rel(plan.latencyMs, least), `seed ${seed}`).toBeLessThan(1e-9);
    checked++;
  }
  expect(checked).toBeGreaterThan(25);
});
