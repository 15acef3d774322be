// Each family's file refuses what it cannot run by name: a missing family tensor or key, a wrong
// shape, a key out of range, a feature prima lacks. Generated files, edited in memory (describeModel
// reads only the header).
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { GgufValueType, describeModel, kv, readGguf, type GgufFile, type GgufKV, type GgufTensorInfo } from "../../model/index.js";
import { generateModel } from "../../modelgen/index.js";
import { tempDir } from "../helpers/temp.js";

const dir = tempDir("prima-families-model-");
const files = new Map<string, GgufFile>();

beforeAll(async () => {
  for (const shape of ["tiny-qwen2", "tiny-qwen3", "tiny-gemma2", "tiny-gemma3", "tiny-mistral3", "tiny-phi3"]) {
    const out = join(dir, `${shape}.gguf`);
    await generateModel({ shape, type: "F32", out, pure: true });
    files.set(shape, readGguf(out));
  }
}, 60_000);

/** The file with its metadata and tensor table edited. */
function edited(shape: string, meta: (m: GgufKV[]) => GgufKV[], tensors: (t: GgufTensorInfo[]) => GgufTensorInfo[] = (t) => t): GgufFile {
  const f = files.get(shape)!;
  return { ...f, metadata: new Map(meta([...f.metadata.values()]).map((m) => [m.key, m])), tensors: tensors([...f.tensors]) };
}
const same = (m: GgufKV[]) => m;
const without = (name: string) => (t: GgufTensorInfo[]) => t.filter((x) => x.name !== name);
const setKey = (key: string, value: GgufKV) => (m: GgufKV[]) => [...m.filter((x) => x.key !== key), value];

describe("family files refuse what they cannot run, by name", () => {
  it("every generated family file reads back as its family", () => {
    for (const [shape, f] of files) expect(describeModel(f).hparams.arch).toBe(shape.replace("tiny-", ""));
  });

  it("a missing family tensor is named", () => {
    expect(() => describeModel(edited("tiny-qwen3", same, without("blk.1.attn_k_norm.weight")))).toThrow(/missing tensor blk.1.attn_k_norm.weight/);
    expect(() => describeModel(edited("tiny-gemma3", same, without("blk.2.post_ffw_norm.weight")))).toThrow(/missing tensor blk.2.post_ffw_norm.weight/);
    expect(() => describeModel(edited("tiny-phi3", same, without("blk.0.attn_qkv.weight")))).toThrow(/missing tensor blk.0.attn_qkv.weight/);
    expect(() => describeModel(edited("tiny-qwen2", same, without("blk.0.attn_q.bias")))).toThrow(/missing tensor blk.0.attn_q.bias/);
  });

  it("a fused tensor of the wrong shape is named with the shape expected", () => {
    const f = edited("tiny-phi3", same, (ts) => ts.map((t) => (t.name === "blk.1.ffn_up.weight" ? { ...t, dims: [256, 512] } : t)));
    expect(() => describeModel(f)).toThrow(/blk.1.ffn_up.weight has shape \[256, 512\], expected \[256, 1024\]/);
  });

  it("keys out of range and features prima lacks are refused by key", () => {
    expect(() => describeModel(edited("tiny-gemma3", setKey("gemma3.attention.sliding_window", kv.i32("gemma3.attention.sliding_window", -4))))).toThrow(/gemma3.attention.sliding_window = -4 is out of range/);
    const shortPattern = { key: "gemma3.attention.sliding_window_pattern", type: GgufValueType.ARRAY, value: { itemType: GgufValueType.BOOL, items: [true] } } as GgufKV;
    expect(() => describeModel(edited("tiny-gemma3", setKey(shortPattern.key, shortPattern)))).toThrow(/sliding_window_pattern has 1 entries for 3 layers/);
    expect(() => describeModel(edited("tiny-mistral3", setKey("mistral3.attention.temperature_scale", kv.f32("mistral3.attention.temperature_scale", 0.1))))).toThrow(/temperature_scale = 0.1.*not supported/);
    expect(() => describeModel(edited("tiny-mistral3", setKey("mistral3.expert_count", kv.u32("mistral3.expert_count", 8))))).toThrow(/mistral3.expert_count = 8: mixture-of-experts/);
    expect(() => describeModel(edited("tiny-phi3", setKey("phi3.rope.scaling.attn_factor", kv.f32("phi3.rope.scaling.attn_factor", -1))))).toThrow(/phi3.rope.scaling.attn_factor -1 is out of range/);
  });

  it("gemma2's head is its embeddings even when the file holds an output.weight, as in llama.cpp", () => {
    const f = edited("tiny-gemma2", same, (ts) => [...ts, { ...ts.find((t) => t.name === "token_embd.weight")!, name: "output.weight" }]);
    const d = describeModel(f);
    expect(d.tensors.output.name).toBe("token_embd.weight");
    expect(d.hparams).toMatchObject({ tiedEmbeddings: true, attnSoftcap: Math.fround(0.5), finalSoftcap: 2, layerWindow: [4, 0, 4] });
  });

  it("a per-layer sliding pattern array is read as llama.cpp reads it", () => {
    const pattern = { key: "gemma3.attention.sliding_window_pattern", type: GgufValueType.ARRAY, value: { itemType: GgufValueType.BOOL, items: [false, true, false] } } as GgufKV;
    expect(describeModel(edited("tiny-gemma3", setKey(pattern.key, pattern))).hparams.layerWindow).toEqual([0, 4, 0]);
    // the number pattern of the generated file: every second layer full
    expect(describeModel(files.get("tiny-gemma3")!).hparams.layerWindow).toEqual([4, 0, 4]);
  });
});
