// --cache-type-k/-v as run, chat, serve and perplexity read them: llama.cpp's names and short flags,
// f16 by default, anything else refused by name.
import { describe, expect, it } from "vitest";
import { parseClusterArgs } from "../../coordinator/args.js";
import { parsePerplexityArgs } from "../../coordinator/perplexity-command.js";
import { DEFAULT_SPARSE_ATTENTION, attentionSpec, kvCacheNativeType, kvCacheTypeOf, KV_CACHE_TYPES, parseAttentionSpec } from "../../model/index.js";

const cluster = (argv: string[]) => parseClusterArgs(["m.gguf", ...argv], {}, "help", "run").cluster.kvCacheTypes;

describe("--cache-type-k / --cache-type-v", () => {
  it("f16 unless told; llama.cpp's long and short names; the rotated types", () => {
    expect(cluster([])).toEqual({ k: "f16", v: "f16" });
    expect(cluster(["--cache-type-k", "q8_0", "--cache-type-v", "q4_0"])).toEqual({ k: "q8_0", v: "q4_0" });
    expect(cluster(["-ctk", "Q4_0", "-ctv", "q8_0-rot", "-c", "256"])).toEqual({ k: "q4_0", v: "q8_0-rot" });
    expect(parsePerplexityArgs(["m.gguf", "-f", "t.txt", "-ctk", "q8_0"]).kvCacheTypes).toEqual({ k: "q8_0", v: "f16" });
  });

  it("refuses other names by name", () => {
    expect(() => cluster(["-ctk", "q5_1"])).toThrow(/--cache-type-k "q5_1": llama.cpp has this cache type, prima does not/);
    expect(() => cluster(["--cache-type-v", "q4_0-hadamard"])).toThrow(/"q4_0-hadamard" is not a KV cache type: the rotated ones are q8_0-rot and q4_0-rot/);
    expect(() => cluster(["--cache-type-v", "\u001b[31mred"])).toThrow(/--cache-type-v "\\u001b\[31mred" is not a KV cache type/);
    expect(() => parsePerplexityArgs(["m.gguf", "-f", "t.txt", "-ctv", "int8"])).toThrow(/--cache-type-v "int8" is not a KV cache type/);
  });

  it("each type has its own native type argument", () => {
    for (const t of KV_CACHE_TYPES) expect(kvCacheTypeOf(kvCacheNativeType(t))).toBe(t);
    expect(new Set(KV_CACHE_TYPES.map(kvCacheNativeType)).size).toBe(KV_CACHE_TYPES.length);
  });
});

describe("--attention and the --sparse-* settings", () => {
  it("dense unless told; sparse with the defaults or the settings given, in run and perplexity", () => {
    expect(cluster([]).attention).toBeUndefined();
    expect(cluster(["--attention", "dense"]).attention).toBeUndefined();
    expect(cluster(["--attention", "sparse"]).attention).toEqual(DEFAULT_SPARSE_ATTENTION);
    expect(cluster(["--attention", "sparse", "--sparse-window", "256", "--sparse-sinks", "0", "--sparse-log-stride", "off", "--sparse-block", "0"]).attention)
      .toEqual({ window: 256, sinks: 0, logStride: false, block: 0 });
    expect(parsePerplexityArgs(["m.gguf", "-f", "t.txt", "--attention", "sparse", "--sparse-window", "32"]).kvCacheTypes.attention)
      .toEqual({ ...DEFAULT_SPARSE_ATTENTION, window: 32 });
  });

  it("refuses bad values by name", () => {
    expect(() => cluster(["--attention", "sparse", "--sparse-window", "0"])).toThrow(/--attention sparse: the window must be/);
    expect(() => cluster(["--attention", "sparse", "--sparse-window", "1.5"])).toThrow(/--sparse-window "1.5" is not a whole number/);
    expect(() => cluster(["--attention", "sparse", "--sparse-log-stride", "yes"])).toThrow(/--sparse-log-stride "yes": use on or off/);
    expect(() => cluster(["--sparse-block", "8"])).toThrow(/--sparse-block needs --attention sparse/);
    expect(() => cluster(["--attention", "\u001b[31mx"])).toThrow(/--attention "\\u001b\[31mx": use dense or sparse/);
  });

  it("the settings reach a worker as a spec it reads back; a spec it cannot read is refused by name", () => {
    const a = { window: 77, sinks: 3, logStride: false, block: 9 };
    expect(parseAttentionSpec(attentionSpec(a))).toEqual(a);
    expect(parseAttentionSpec(attentionSpec(undefined))).toBeUndefined();
    expect(() => parseAttentionSpec("sparse:window=0,sinks=1,log-stride=1,block=8")).toThrow(/sparse attention: the window/);
    expect(() => parseAttentionSpec("lsh:buckets=8")).toThrow(/attention "lsh:buckets=8" is not "dense" or sparse settings/);
  });
});
