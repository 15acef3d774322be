// The grammar engine runs in its own thread: while a schema compiles for Qwen2's 151k vocabulary (and
// while that vocabulary is set up) the main event loop keeps turning, as a server's streams, /health
// and heartbeats need; a thread that dies or does not answer in time is an error saying so, and the
// next request gets a fresh one.
import { spawnSync } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { GrammarSet } from "../../dist/grammar/index.js";
import { Tokenizer, bundledVocab } from "../../dist/model/index.js";

/** A schema that takes the engine seconds for a large vocabulary (patterns, formats, bounded strings). */
function bigSchema(salt: string): unknown {
  const props: Record<string, unknown> = {};
  for (let i = 0; i < 6; i++) {
    props[`name${i}_${salt}`] = { type: "string", maxLength: 40 };
    props[`mail${i}`] = { type: "string", format: "email" };
    props[`zip${i}`] = { type: "string", pattern: "^[0-9]{5}(-[0-9]{4})?$" };
    props[`age${i}`] = { type: "integer", minimum: 0, maximum: 120 };
    props[`tags${i}`] = { type: "array", items: { type: "string", maxLength: 20 }, maxItems: 4 };
  }
  return { type: "object", properties: props, required: Object.keys(props), additionalProperties: false };
}

/** Runs f with a 50 ms interval beside it: how long f took, and the longest the loop went without a tick. */
async function beside<T>(f: () => Promise<T>): Promise<{ value: T; ms: number; maxGap: number; ticks: number }> {
  let last = performance.now(), maxGap = 0, ticks = 0;
  const timer = setInterval(() => {
    const now = performance.now();
    maxGap = Math.max(maxGap, now - last);
    last = now;
    ticks++;
  }, 50);
  const t0 = performance.now();
  try {
    const value = await f();
    const end = performance.now();
    return { value, ms: end - t0, maxGap: Math.max(maxGap, end - last), ticks };
  } finally {
    clearInterval(timer);
  }
}

describe("the grammar engine's thread", () => {
  const qwen = Tokenizer.fromMetadata(bundledVocab("qwen2").metadata);
  let set: GrammarSet;
  let setup: Awaited<ReturnType<typeof beside<GrammarSet>>>;

  beforeAll(async () => {
    setup = await beside(() => GrammarSet.forTokenizer(qwen));
    set = setup.value;
  });
  afterAll(() => set?.close());

  it("leaves the event loop turning while a large schema compiles for a 151k vocabulary", async () => {
    const r = await beside(() => set.compile({ kind: "json-schema", schema: bigSchema("a") }));
    // On the main thread the loop would stand still for the whole compile (a gap as long as it);
    // here no gap comes near half of it. The compile itself must take long enough to tell.
    expect(r.ms, "the compile was too quick for the test to tell anything").toBeGreaterThan(500);
    expect(r.maxGap, `longest gap ${r.maxGap.toFixed(0)} ms in a ${r.ms.toFixed(0)} ms compile, ${r.ticks} ticks`).toBeLessThan(r.ms / 2);
    // Setting up the vocabulary reads it on this thread, in slices, and builds it in the engine's.
    expect(setup.maxGap, `longest gap ${setup.maxGap.toFixed(0)} ms in a ${setup.ms.toFixed(0)} ms setup`).toBeLessThan(setup.ms / 2);
  });

  it("a thread that does not answer in time is an error naming it; the next request gets a fresh thread", async () => {
    const waitMs = set.waitMs;
    set.waitMs = 1; // far below a compile's time for this vocabulary
    try {
      await expect(set.compile({ kind: "json-schema", schema: bigSchema("b") })).rejects.toThrow(/grammar engine did not answer within 0\.0 s \(compiling the json-schema\)/);
    } finally {
      set.waitMs = waitMs;
    }
    const c = await set.constraint({ kind: "json-schema", schema: { enum: ["yes", "no"] } });
    try {
      const mask = await c.nextMask();
      const allowed: number[] = [];
      for (let i = 0; i < qwen.nVocab; i++) if ((mask[i >> 5] >>> (i & 31)) & 1) allowed.push(i);
      expect(allowed.length).toBeGreaterThan(0);
      expect(allowed.every((id) => qwen.decode([id]).startsWith('"'))).toBe(true);
    } finally {
      c.dispose();
    }
  });

  it("a thread that dies fails the generations on it with the reason; the next request gets a fresh thread", async () => {
    const tok = Tokenizer.fromGguf("models/stories260K.gguf");
    const small = await GrammarSet.forTokenizer(tok);
    try {
      const c = await small.constraint({ kind: "json-object" });
      const first = await c.nextMask();
      let id = 0;
      while (((first[id >> 5] >>> (id & 31)) & 1) === 0) id++;
      // The thread ends as a crash would end it.
      const thread = await (small as unknown as { thread: Promise<{ worker: { terminate(): Promise<number> } }> }).thread;
      await thread.worker.terminate();
      expect(c.accept(id)).toBe(true);
      await expect(c.nextMask()).rejects.toThrow(/grammar engine's thread exited/);
      c.dispose();
      const again = await small.constraint({ kind: "json-schema", schema: { enum: ["x"] } });
      expect((await again.nextMask()).some((w) => w !== 0)).toBe(true);
      again.dispose();
    } finally {
      small.close();
    }
  });

  it("does not keep a process up once its work is done (a CLI run ends)", () => {
    const script = `
      import { GrammarSet } from "./dist/grammar/index.js";
      import { Tokenizer } from "./dist/model/index.js";
      const set = await GrammarSet.forTokenizer(Tokenizer.fromGguf("models/stories260K.gguf"));
      const c = await set.constraint({ kind: "json-object" });
      const m = await c.nextMask();
      let id = 0;
      while (((m[id >> 5] >>> (id & 31)) & 1) === 0) id++;
      c.accept(id);
      await c.nextMask();
      c.dispose();
      console.log("done");`;
    // The limit only bounds a failure (a process that never ends); a healthy one ends in about a second.
    const r = spawnSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8", timeout: 60_000 });
    expect(r.stdout.trim(), r.stderr).toBe("done");
    expect(r.signal, "the process did not end by itself").toBeNull();
    expect(r.status).toBe(0);
  });
});
