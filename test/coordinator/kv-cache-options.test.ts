// --cache-type-k/-v as run, chat, serve and perplexity read them: llama.cpp's names and short flags,
// f16 by default, anything else refused by name.
import { describe, expect, it } from "vitest";
import { parseClusterArgs } from "../../coordinator/args.js";
import { parsePerplexityArgs } from "../../coordinator/perplexity-command.js";
import { kvCacheNativeType, kvCacheTypeOf, KV_CACHE_TYPES } from "../../model/index.js";

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
