// Each family's file refuses what it cannot run by name: a missing family tensor or key, a wrong
// shape, a key out of range, a feature prima lacks. Generated files, edited in memory (describeModel
// reads only the header).
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { GgufValueType, describeModel, kv, modelProfile, readGguf, type GgufFile, type GgufKV, type GgufTensorInfo } from "../../model/index.js";
import { generateModel } from "../../modelgen/index.js";
import { tempDir } from "../helpers/temp.js";

const dir = tempDir("prima-families-model-");
const files = new Map<string, GgufFile>();

beforeAll(async () => {
  for (const shape of ["tiny-qwen2", "tiny-qwen3", "tiny-qwen3moe", "tiny-mixtral", "tiny-gemma2", "tiny-gemma3", "tiny-mistral3", "tiny-phi3", "tiny-gpt-oss"]) {
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
    for (const [shape, f] of files) expect(describeModel(f).hparams.arch).toBe(shape === "tiny-mixtral" ? "llama" : shape.replace("tiny-", ""));
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

  it("mixture-of-experts files: experts read as 3-D tensors, a layer's bytes count every expert", () => {
    const d = describeModel(files.get("tiny-qwen3moe")!);
    expect(d.hparams).toMatchObject({ nExpert: 8, nExpertUsed: 2, nFfExp: 256 });
    expect(d.tensors.layers[0].ffnUpExps?.dims).toEqual([256, 256, 8]);
    expect(d.tensors.layers[0].wGate).toBeUndefined();
    // Halda's layer bytes: every blk.0 tensor, all experts included
    const blk0 = files.get("tiny-qwen3moe")!.tensors.filter((t) => t.name.startsWith("blk.0.")).reduce((a, t) => a + t.nBytes, 0);
    expect(modelProfile(d, { nCtx: 64 }).layerBytesEach[0]).toBe(blk0);
    const m = describeModel(files.get("tiny-mixtral")!);
    expect(m.hparams).toMatchObject({ arch: "llama", nExpert: 4, nExpertUsed: 2, nFfExp: 512 });
    expect(m.tensors.layers[1].ffnDownExps?.dims).toEqual([512, 256, 4]);
  });

  it("mixture-of-experts layouts prima does not run are refused by what they need, not a missing tensor", () => {
    const arch = (name: string) => setKey("general.architecture", kv.str("general.architecture", name));
    expect(() => describeModel(edited("tiny-qwen3moe", arch("deepseek2")))).toThrow(/deepseek2.*mixture-of-experts.*multi-head latent attention \(MLA\) and shared experts/);
    expect(() => describeModel(edited("tiny-qwen3moe", arch("qwen2moe")))).toThrow(/qwen2moe.*mixture-of-experts.*shared experts with a sigmoid gate/);
    const shexp = (t: GgufTensorInfo[]) => [...t, { ...t.find((x) => x.name === "blk.0.ffn_norm.weight")!, name: "blk.0.ffn_gate_shexp.weight" }];
    expect(() => describeModel(edited("tiny-mixtral", same, shexp))).toThrow(/shared experts .* not supported/);
    expect(() => describeModel(edited("tiny-qwen3moe", setKey("qwen3moe.expert_shared_count", kv.u32("qwen3moe.expert_shared_count", 1))))).toThrow(/shared experts/);
    expect(() => describeModel(edited("tiny-qwen3moe", setKey("qwen3moe.expert_group_count", kv.u32("qwen3moe.expert_group_count", 4))))).toThrow(/grouped expert selection/);
    expect(() => describeModel(edited("tiny-mixtral", same, without("blk.0.ffn_gate_exps.weight")))).toThrow(/experts without a gate/);
    expect(() => describeModel(edited("tiny-mixtral", (m) => m.filter((x) => x.key !== "llama.expert_count")))).toThrow(/expert tensors .* but no llama.expert_count/);
    expect(() => describeModel(edited("tiny-qwen3", setKey("qwen3.expert_count", kv.u32("qwen3.expert_count", 8))))).toThrow(/qwen3.expert_count = 8: mixture-of-experts layers are not supported for qwen3/);
    expect(() => describeModel(edited("tiny-qwen3moe", setKey("qwen3moe.expert_used_count", kv.u32("qwen3moe.expert_used_count", 9))))).toThrow(/expert_used_count = 9 is out of range/);
  });

  it("gpt-oss: sinks, biases, YaRN and the alternating window read as llama.cpp reads them", () => {
    const d = describeModel(files.get("tiny-gpt-oss")!);
    expect(d.hparams).toMatchObject({
      arch: "gpt-oss", ffnAct: "swiglu-oai", moeGating: "topk-softmax", nExpert: 8, nExpertUsed: 2, nFfExp: 256,
      layerWindow: [4, 0, 4], ropeYarnExtFactor: 1, ropeYarnBetaFast: 32, ropeYarnBetaSlow: 1, nCtxOrig: 4096,
      ropeFreqScale: Math.fround(1 / 32), ropeFreqScaleSwa: Math.fround(1 / 32), hasQkvBias: true,
    });
    // llama.cpp's context cancels YaRN's magnitude in the attention factor that ggml's rope puts back: about 1
    expect(d.hparams.ropeAttnFactor).toBeCloseTo(1, 6);
    // 1/sqrt(rope dims)
    expect(d.hparams.scoreScale).toBe(Math.fround(1 / Math.fround(Math.sqrt(64))));
    const l = d.tensors.layers[2];
    expect(l.attnSinks?.dims).toEqual([8]);
    expect(l.ffnDownExpsB?.dims).toEqual([256, 8]);
    // the file's post_attention_norm is the feed-forward's norm, mapped as ffn_norm for the shared block
    expect(l.ffnNorm.name).toBe("blk.2.ffn_norm.weight");
    expect(l.attnPostNorm).toBeUndefined();
  });

  it("gpt-oss refuses by name what it does not run", () => {
    const g = "tiny-gpt-oss";
    expect(() => describeModel(edited(g, same, without("blk.1.attn_sinks.weight")))).toThrow(/missing tensor blk.1.attn_sinks.weight/);
    expect(() => describeModel(edited(g, same, without("blk.0.ffn_up_exps.bias")))).toThrow(/missing tensor blk.0.ffn_up_exps.bias/);
    expect(() => describeModel(edited(g, same, without("output.weight")))).toThrow(/missing tensor output.weight/);
    expect(() => describeModel(edited(g, (m) => m.filter((x) => x.key !== "gpt-oss.attention.sliding_window")))).toThrow(/missing metadata gpt-oss.attention.sliding_window/);
    expect(() => describeModel(edited(g, (m) => m.filter((x) => x.key !== "gpt-oss.expert_count")))).toThrow(/gpt-oss.expert_count is missing or 0/);
    // a tensor the family does not read (a per-tensor scale, a fused QKV) is refused, not ignored
    const extra = (name: string) => (t: GgufTensorInfo[]) => [...t, { ...t.find((x) => x.name === "blk.0.attn_norm.weight")!, name }];
    expect(() => describeModel(edited(g, same, extra("blk.0.attn_output.scale")))).toThrow(/tensor blk.0.attn_output.scale is not part of the gpt-oss model/);
    expect(() => describeModel(edited(g, same, extra("blk.1.attn_qkv.weight")))).toThrow(/tensor blk.1.attn_qkv.weight is not part/);
    const ffArr = { key: "gpt-oss.expert_feed_forward_length", type: GgufValueType.ARRAY, value: { itemType: GgufValueType.UINT32, items: new Uint32Array([256, 256, 256]) } } as GgufKV;
    expect(() => describeModel(edited(g, setKey(ffArr.key, ffArr)))).toThrow(/gpt-oss.expert_feed_forward_length should be a number/);
    expect(() => describeModel(edited(g, setKey("gpt-oss.rope.scaling.type", kv.str("gpt-oss.rope.scaling.type", "longrope"))))).toThrow(/RoPE scaling type "longrope" is not supported/);
    // YaRN stays gpt-oss's: another family with it is refused as before
    expect(() => describeModel(edited("tiny-qwen3", setKey("qwen3.rope.scaling.type", kv.str("qwen3.rope.scaling.type", "yarn"))))).toThrow(/RoPE scaling type "yarn" is not supported/);
  });
});
