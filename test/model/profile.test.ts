// The model profile from a GGUF header alone: bytes and FLOPs derived by hand from the
// hyper-parameters (HALDA.md §1.2) on the shipped stories260K (all F32), and on synthetic tensor
// tables of the llama3-8b, llama3-70b and qwen2.5-0.5b shapes typed as llama-quantize types Q4_K_M.

import { describe, expect, test } from "vitest";
import {
  describeModel, modelProfile, modelShapeByName, readGguf, syntheticModelDescription,
  type ModelProfile, type ModelShape,
} from "../../model/index.js";

const sum = (r: Readonly<Record<string, number>>) => Object.values(r).reduce((s, x) => s + x, 0);

/** F32 extras per layer (norms, RoPE, softmax, SiLU and gate, residual, QKV bias adds). */
function f32Extras(E: number, H: number, Hkv: number, d: number, nFf: number, nKv: number, bias: boolean): number {
  const q = H * d, kv = Hkv * d;
  return 2 * (4 * E + 1) + 2.5 * (q + kv) + 7 * H * nKv + 9 * nFf + E + (bias ? q + 2 * kv : 0);
}

describe("stories260K.gguf (F32)", () => {
  const desc = describeModel(readGguf("models/stories260K.gguf"));
  const hp = desc.hparams;
  const nCtx = 256;
  const p = modelProfile(desc, { nCtx });
  const E = hp.nEmbd, q = hp.nHead * hp.headDimK, kv = hp.nHeadKv * hp.headDimK, F = hp.nFf, V = hp.nVocab;

  test("bytes per layer, input, output and KV", () => {
    const layerElems = 2 * E + E * q + 2 * E * kv + q * E + 3 * E * F; // two norms and seven matrices
    expect(p.layerBytes).toBe(4 * layerElems);
    expect(p.layerBytesEach).toEqual(new Array(hp.nLayers).fill(4 * layerElems));
    expect(p.inputBytes).toBe(4 * E * V);
    expect(hp.tiedEmbeddings).toBe(false); // stories260K has its own output.weight
    expect(p.outputBytes).toBe(4 * E * V + 4 * E);
    expect(p.kvBytesPerTokenLayer).toBe(2 * 2 * kv);
    expect(p.weightBytesTotal).toBe(hp.nLayers * 4 * layerElems + 4 * E * V + 4 * E + (hp.tiedEmbeddings ? 0 : 4 * E * V));
    // The whole file is header plus these tensors (and alignment padding).
    expect(p.weightBytesTotal).toBeLessThanOrEqual(desc.fileBytes);
    expect(p.weightBytesTotal).toBeGreaterThan(desc.fileBytes * 0.9);
  });

  test("FLOPs per layer and of the output layer", () => {
    const nKv = nCtx; // nPredict defaults to nCtx; 256 is a multiple of the 32-token pad
    expect(p.nKvForFlops).toBe(nKv);
    const matmul = 2 * (E * q + 2 * E * kv + q * E + 3 * E * F);
    expect(p.layerFlops.F32).toBeCloseTo(matmul + f32Extras(E, hp.nHead, hp.nHeadKv, hp.headDimK, F, nKv, false), 6);
    expect(p.layerFlops.F16).toBe(4 * hp.headDimK * hp.nHead * nKv);
    expect(Object.keys(p.layerFlops).sort()).toEqual(["F16", "F32"]);
    expect(p.outputFlops.F32).toBe(2 * E * V + 4 * E + 1 + 5 * V);
  });

  test("the attention cache length follows nPredict, padded and capped", () => {
    expect(modelProfile(desc, { nCtx: 1024, nPredict: 100 }).nKvForFlops).toBe(128);
    expect(modelProfile(desc, { nCtx: 1024, nPredict: 100, flashAttention: true }).nKvForFlops).toBe(256);
    expect(modelProfile(desc, { nCtx: 64, nPredict: 100 }).nKvForFlops).toBe(64);
    expect(() => modelProfile(desc, { nCtx: 0 })).toThrow(/nCtx/);
  });
});

// Q4_K_M as llama-quantize assigns it (llama-quant.cpp): attn_v and ffn_down get Q6_K on the
// "more bits" layers; the output matrix gets Q6_K; llama3-70b-like models get Q5_K for the other
// attn_v; rows that do not split into 256-blocks fall back (Q4_K -> Q5_0, Q6_K -> Q8_0, output -> Q8_0).
const bytesPer: Record<string, number> = { F32: 4, Q4_K: 144 / 256, Q5_K: 176 / 256, Q6_K: 210 / 256, Q5_0: 22 / 32, Q8_0: 34 / 32 };
const moreBits = (i: number, n: number) => i < Math.floor(n / 8) || i >= Math.floor((7 * n) / 8) || (i - Math.floor(n / 8)) % 3 === 2;

function expectedQ4KM(s: ModelShape): { layerBytes: number; inputBytes: number; outputBytes: number; q6Flops: number; matmulFlops: number } {
  const E = s.nEmbd, d = E / s.nHead, kv = s.nHeadKv * d, F = s.nFf;
  const t = (name: string, rowElems: number) => {
    const blk = name.endsWith("_0") ? 32 : name.endsWith("_K") ? 256 : 1;
    if (rowElems % blk === 0) return name;
    return name === "Q4_K" ? "Q5_0" : name === "Q6_K" ? "Q8_0" : name;
  };
  const is70B = s.nLayers === 80 && s.nHead !== s.nHeadKv;
  let bytes = 0, q6 = 0;
  for (let i = 0; i < s.nLayers; i++) {
    const vType = t(moreBits(i, s.nLayers) ? "Q6_K" : is70B ? "Q5_K" : "Q4_K", E);
    const downType = t(moreBits(i, s.nLayers) ? "Q6_K" : "Q4_K", F);
    const base = t("Q4_K", E);
    bytes += 2 * E * 4 + (s.qkvBias ? 4 * (E + 2 * kv) : 0);
    bytes += E * E * bytesPer[base] * 2 + E * kv * bytesPer[t("Q4_K", E)] + E * kv * bytesPer[vType];
    bytes += 2 * E * F * bytesPer[base] + F * E * bytesPer[downType];
    if (vType === "Q6_K") q6 += 2 * E * kv;
    if (downType === "Q6_K") q6 += 2 * F * E;
  }
  const outType = E % 256 === 0 ? "Q6_K" : "Q8_0";
  const embdType = s.tiedEmbeddings ? outType : t("Q4_K", E);
  return {
    layerBytes: bytes / s.nLayers,
    inputBytes: E * s.nVocab * bytesPer[embdType],
    outputBytes: E * 4 + E * s.nVocab * bytesPer[outType],
    q6Flops: q6 / s.nLayers,
    matmulFlops: 2 * (2 * E * E + 2 * E * kv + 3 * E * F),
  };
}

describe("synthetic Q4_K_M tensor tables", () => {
  const nCtx = 1024;
  for (const name of ["llama3-8b", "llama3-70b", "qwen2.5-0.5b"]) {
    test(name, () => {
      const shape = modelShapeByName(name)!;
      const p: ModelProfile = modelProfile(syntheticModelDescription(shape, "Q4_K_M"), { nCtx });
      const x = expectedQ4KM(shape);
      const d = shape.nEmbd / shape.nHead;
      expect(p.nLayers).toBe(shape.nLayers);
      expect(p.layerBytes).toBeCloseTo(x.layerBytes, 6);
      expect(p.inputBytes).toBe(x.inputBytes);
      expect(p.outputBytes).toBe(x.outputBytes);
      expect(p.kvBytesPerTokenLayer).toBe(4 * shape.nHeadKv * d);
      expect((p.layerFlops.Q6_K ?? 0)).toBeCloseTo(x.q6Flops, 3);
      const weightFlops = sum(p.layerFlops) - p.layerFlops.F32 - p.layerFlops.F16;
      expect(weightFlops).toBeCloseTo(x.matmulFlops, 3);
      expect(p.layerFlops.F16).toBe(4 * d * shape.nHead * nCtx);
      expect(p.layerFlops.F32).toBeCloseTo(f32Extras(shape.nEmbd, shape.nHead, shape.nHeadKv, d, shape.nFf, nCtx, shape.qkvBias), 6);
    });
  }

  test("llama3-8b matches HALDA.md's F-8B fixture bytes", () => {
    // the original Halda specification's §7 (docs/HALDA.md §6) lists b, b', b_i and b_o of Llama 3-8B Q4_K_M; our typing must reproduce them.
    const p = modelProfile(syntheticModelDescription(modelShapeByName("llama3-8b")!, "Q4_K_M"), { nCtx: 1024 });
    expect(p.layerBytes).toBe(130_826_240);
    expect(p.layerBytes + p.kvBytesPerTokenLayer * 1024).toBe(135_020_544);
    expect(p.inputBytes).toBe(295_501_824);
    expect(p.outputBytes).toBe(430_956_544);
  });

  test("llama3-70b differs from HALDA.md's F-70B by llama-quantize's 70B attn_v rule only", () => {
    // HALDA.md's F-70B (b = 512,720,896) leaves the non-"more bits" attn_v at Q4_K; llama-quantize
    // gives them Q5_K on 80-layer GQA llamas: 40 layers x E·kv·(176−144)/256 bytes more, averaged.
    const s = modelShapeByName("llama3-70b")!;
    const p = modelProfile(syntheticModelDescription(s, "Q4_K_M"), { nCtx: 1024 });
    const kv = s.nHeadKv * (s.nEmbd / s.nHead);
    expect(p.layerBytes - 512_720_896).toBe((40 * s.nEmbd * kv * (176 - 144)) / 256 / 80);
    expect(p.inputBytes).toBe(591_003_648);
    expect(p.outputBytes).toBe(861_913_088);
  });

  test("qwen2.5-0.5b's 896-wide rows fall back to 32-blocks", () => {
    const d = syntheticModelDescription(modelShapeByName("qwen2.5-0.5b")!, "Q4_K_M");
    const typeName = (t: { type: number }) => ({ 0: "F32", 6: "Q5_0", 8: "Q8_0", 12: "Q4_K", 14: "Q6_K" } as Record<number, string>)[t.type];
    expect(typeName(d.tensors.tokenEmbd)).toBe("Q8_0");
    expect(d.tensors.output).toBe(d.tensors.tokenEmbd);
    expect(typeName(d.tensors.layers[0].wq)).toBe("Q5_0");
    expect(typeName(d.tensors.layers[0].wv)).toBe("Q8_0"); // layer 0 is a "more bits" layer: Q6_K -> Q8_0
    expect(typeName(d.tensors.layers[0].wDown)).toBe("Q6_K"); // 4864 = 19 x 256
    expect(typeName(d.tensors.layers[4].wDown)).toBe("Q4_K");
    expect(typeName(d.tensors.layers[0].bq!)).toBe("F32");
  });

  test("pure types and tied embeddings", () => {
    const s = modelShapeByName("qwen2.5-0.5b")!;
    const f16 = modelProfile(syntheticModelDescription(s, "F16"), { nCtx: 512 });
    const E = s.nEmbd, kv = s.nHeadKv * (E / s.nHead);
    expect(f16.layerBytes).toBe(2 * (2 * E * E + 2 * E * kv + 3 * E * s.nFf) + 4 * (2 * E + E + 2 * kv));
    expect(f16.outputBytes).toBe(2 * E * s.nVocab + 4 * E); // output = token_embd when tied
    expect(f16.weightBytesTotal).toBe(s.nLayers * f16.layerBytes + 2 * E * s.nVocab + 4 * E); // counted once
  });
});

describe("mixtures of experts: all experts in the layer's bytes, k of them in a token's reads", () => {
  test.each([["qwen3-30b-a3b", 128, 8, "Q4_K_M"], ["mixtral-8x7b", 8, 2, "Q4_K_M"], ["gpt-oss-20b", 32, 4, "MXFP4_MOE"]] as const)("%s %s", (name, n, k, type) => {
    const shape = modelShapeByName(name)!;
    const desc = syntheticModelDescription(shape, type);
    const p = modelProfile(desc, { nCtx: 1024 });
    const x = p.moe!;
    expect([x.nExpert, x.nExpertUsed]).toEqual([n, k]);
    let experts = 0;
    for (const l of desc.tensors.layers) for (const t of [l.ffnGateExps!, l.ffnUpExps!, l.ffnDownExps!]) experts += t.nBytes;
    expect(x.expertBytes).toBeCloseTo(experts / (shape.nLayers * n), 6);
    expect(x.activeLayerBytes).toBeCloseTo(p.layerBytes - (n - k) * x.expertBytes, 3);
    expect(x.activeLayerBytes).toBeLessThan(p.layerBytes);
    expect(x.routing).toBe("uniform");
    expect(x.routingShare).toEqual(new Array(n).fill(1 / n));
    // gpt-oss-20b's release mix: an expert is three 2880 x 2880 MXFP4 matrices (17 bytes per 32 weights)
    if (type === "MXFP4_MOE") expect(x.expertBytes).toBe((3 * 2880 * 2880 * 17) / 32);
  });

  test("a dense model has no moe part", () => {
    expect(modelProfile(syntheticModelDescription(modelShapeByName("llama3-8b")!, "Q4_K_M"), { nCtx: 1024 }).moe).toBeUndefined();
  });
});
