// The model generator against llama.cpp: llama.cpp loads and runs every generated type; our reader
// reads back the shapes and types intended; and llama.cpp's own quantizer (llama_model_quantize,
// what llama-quantize runs), given our F32 file, writes exactly the tensor types and bytes we write
// for the same file type.
import { spawnSync } from "node:child_process";
import { closeSync, existsSync, mkdtempSync, openSync, readSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { getLlama, LlamaLogLevel, type Llama } from "node-llama-cpp";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { describeModel, readGguf, metaNumber, metaString, type GgufFile } from "../../model/index.js";
import { GgmlTypeId } from "../../native/kernels.js";
import { generateModel, ModelGenError, padHeads } from "../../modelgen/index.js";
import { FILE_TYPES, FILE_TYPE_NAMES, modelShapeByName, planTensors, type FileTypeName, type ModelShape } from "../../model/index.js";
import { parseMakeModelArgs } from "../../coordinator/make-model-command.js";
import { ORACLE_THREADS } from "../engine/oracle-harness.js";

const root = join(import.meta.dirname, "..", "..");
const dir = mkdtempSync(join(tmpdir(), "prima-modelgen-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const tiny = modelShapeByName("tiny-llama")!;
const tinyQwen = modelShapeByName("tiny-qwen2")!;
const small = modelShapeByName("small-llama")!;
// experts: the router stays F32, the 3-D expert tensors take their layer's ffn rules, 8 experts more
// bits on attention
const qwenMoe = modelShapeByName("tiny-qwen3moe")!;
const mixtral = modelShapeByName("tiny-mixtral")!;

function tensorBytes(f: GgufFile, name: string): Buffer {
  const t = f.tensors.find((x) => x.name === name)!;
  const b = Buffer.alloc(t.nBytes);
  const fd = openSync(f.path, "r");
  try {
    readSync(fd, b, 0, t.nBytes, t.offset);
  } finally {
    closeSync(fd);
  }
  return b;
}

let n = 0;
async function make(shape: ModelShape, type: string, pure = false, seed = 7) {
  const out = join(dir, `${shape.name}-${type}${pure ? "-pure" : ""}-${n++}.gguf`);
  const r = await generateModel({ shape, type, pure, out, seed });
  return { ...r, file: readGguf(out) };
}

// ---------------------------------------------------------------- our reader, and llama.cpp loading

let llama: Llama;
beforeAll(async () => {
  llama = await getLlama({ gpu: false, build: "never", skipDownload: true, logLevel: LlamaLogLevel.disabled, maxThreads: ORACLE_THREADS });
}, 120_000);

/** llama.cpp loads the file and evaluates a few tokens (every weight is used); returns the first
 * generated token and its probability, which must be a number (no NaN from a bad block). */
async function llamaRuns(path: string): Promise<{ token: number; confidence: number }> {
  const model = await llama.loadModel({ modelPath: path, gpuLayers: 0 });
  try {
    const ctx = await model.createContext({ contextSize: 64, batchSize: 8 });
    try {
      const tokens = model.tokenize("Once upon a time").slice(0, 4);
      for await (const out of ctx.getSequence().evaluateWithMetadata(tokens, { confidence: true }, { temperature: 0 })) {
        return { token: out.token, confidence: out.confidence };
      }
      throw new Error("llama.cpp generated nothing");
    } finally {
      await ctx.dispose();
    }
  } finally {
    await model.dispose();
  }
}

async function expectRuns(path: string, label: string): Promise<void> {
  const r = await llamaRuns(path);
  expect(Number.isFinite(r.confidence) && r.confidence > 0 && r.confidence <= 1, `${label}: confidence ${r.confidence}`).toBe(true);
}

describe("generated files", () => {
  const types: [FileTypeName, boolean][] = [
    ...FILE_TYPE_NAMES.map((t): [FileTypeName, boolean] => [t, false]),
    ["Q2_K", true], ["Q4_K_M", true], ["Q4_1", true],
  ];

  it("every file type: our reader sees the planned tensors, llama.cpp loads and runs it", async () => {
    for (const [type, pure] of types) {
      const r = await make(tiny, type, pure);
      const label = `${type}${pure ? " pure" : ""}`;
      expect(r.file.tensors.map((t) => [t.name, [...t.dims], t.type]), label)
        .toEqual(r.tensors.map((t) => [t.name, [...t.dims], t.type]));
      expect(metaNumber(r.file, "general.file_type"), label).toBe(FILE_TYPES[type].ftype);
      const d = describeModel(r.file);
      expect(d.hparams, label).toMatchObject({ arch: "llama", nEmbd: 256, nLayers: 2, nHead: 4, nHeadKv: 2, nFf: 512, nVocab: 512 });
      if (pure) {
        const quantized = r.tensors.filter((t) => t.dims.length === 2);
        expect(new Set(quantized.map((t) => t.type)), label).toEqual(new Set([FILE_TYPES[type].base]));
      }
      await expectRuns(r.path, label);
    }
  }, 180_000); // a file per type (or case), each loaded by llama.cpp: longer than one test's default

  it("qwen2: QKV biases, tied embeddings (no output.weight), read and run", async () => {
    for (const type of ["Q4_K_M", "F16", "Q8_0"]) {
      const r = await make(tinyQwen, type);
      const names = r.file.tensors.map((t) => t.name);
      expect(names).toContain("blk.0.attn_q.bias");
      expect(names).toContain("blk.1.attn_v.bias");
      expect(names).not.toContain("output.weight");
      const d = describeModel(r.file);
      expect(d.hparams).toMatchObject({ arch: "qwen2", hasQkvBias: true, tiedEmbeddings: true, ropeNeox: true });
      await expectRuns(r.path, `qwen2 ${type}`);
    }
  });

  it("the full shapes of the newer families, cut to 2 layers: read back as their family, and llama.cpp runs them", async () => {
    const cut = (name: string): ModelShape => ({ ...modelShapeByName(name)!, name: `${name}-cut`, nLayers: 2, nVocab: 512, defaultVocab: "stories260K" });
    for (const name of ["qwen3-0.6b", "gemma3-1b"]) {
      const shape = cut(name);
      const r = await make(shape, "Q4_K_M");
      const d = describeModel(r.file);
      expect(d.hparams).toMatchObject({ arch: shape.arch, nEmbd: shape.nEmbd, headDimK: shape.headDim, nHead: shape.nHead, nHeadKv: shape.nHeadKv });
      // gemma3's pattern of 6 slides every layer of the first five; qwen3 has no window
      expect(d.hparams.layerWindow).toEqual(shape.arch === "gemma3" ? [512, 512] : [0, 0]);
      expect(d.tensors.layers[1].qNorm?.dims).toEqual([shape.headDim]);
      await expectRuns(r.path, name);
    }
  }, 120_000);

  it("norms are 1.0 and weights have the asked spread", async () => {
    const r = await make(tiny, "F32");
    const norm = new Float32Array(tensorBytes(r.file, "blk.0.attn_norm.weight").buffer.slice(0));
    expect([...norm].every((v) => v === 1)).toBe(true);
    const buf = tensorBytes(r.file, "blk.1.ffn_up.weight");
    const w = new Float32Array(buf.buffer, buf.byteOffset, buf.length / 4);
    let s = 0, s2 = 0;
    for (const v of w) { s += v; s2 += v * v; }
    const mean = s / w.length, std = Math.sqrt(s2 / w.length - mean * mean);
    expect(Math.abs(mean)).toBeLessThan(0.001);
    expect(std).toBeGreaterThan(0.019);
    expect(std).toBeLessThan(0.021);
  });

  it("writes the bundled vocabulary, padded to the shape's size", async () => {
    const r = await make(tiny, "Q8_0");
    expect(metaString(r.file, "tokenizer.ggml.model")).toBe("llama");
    const padded = await generateModel({ shape: { ...tiny, name: "tiny-600", nVocab: 600 }, type: "Q8_0", out: join(dir, "pad.gguf") });
    const f = readGguf(padded.path);
    const tokens = f.metadata.get("tokenizer.ggml.tokens")!.value as { items: readonly string[] };
    expect(tokens.items.length).toBe(600);
    expect(tokens.items[599]).toBe("[PAD599]");
    await expectRuns(padded.path, "padded vocabulary");
  });
});

// ---------------------------------------------------------------- against llama_model_quantize

const libDir = join(root, "node_modules", "@node-llama-cpp", "linux-x64", "bins", "linux-x64");
const llamaSrc = join(root, "node_modules", "node-llama-cpp", "llama", "llama.cpp");
const quantizeReason = process.platform !== "linux" || process.arch !== "x64"
  ? `llama_model_quantize oracle needs the linux-x64 prebuilt libllama (this is ${process.platform}-${process.arch})`
  : !existsSync(join(libDir, "libllama.v0.5.0.so")) ? `libllama not found in ${libDir}`
  : !existsSync(join(llamaSrc, "include", "llama.h")) ? `llama.h not found under ${llamaSrc}` : null;
if (quantizeReason) console.warn(`modelgen.test: skipping the llama_model_quantize comparison: ${quantizeReason}`);

describe.skipIf(quantizeReason !== null)("against llama.cpp's quantizer", () => {
  let exe = "";
  beforeAll(() => {
    exe = join(dir, "llama_quantize");
    const cc = spawnSync("gcc", ["-O1", "-std=gnu11", `-I${join(llamaSrc, "include")}`, `-I${join(llamaSrc, "ggml", "include")}`,
      "-o", exe, join(root, "test", "modelgen", "llama_quantize.c"), "-ldl"], { encoding: "utf8" });
    expect(cc.status, cc.stderr).toBe(0);
  });

  function llamaQuantize(input: string, output: string, type: FileTypeName, pure: boolean): void {
    const r = spawnSync(exe, [libDir, input, output, String(FILE_TYPES[type].ftype), pure ? "1" : "0"], {
      encoding: "utf8", env: { ...process.env, LD_LIBRARY_PATH: libDir },
    });
    expect(r.status, r.stderr.slice(-2000)).toBe(0);
  }

  const cases: [ModelShape, FileTypeName, boolean][] = [
    [tiny, "Q4_K_M", false], [tiny, "Q2_K", false], [tiny, "Q4_0", false], [tiny, "Q5_1", false],
    [small, "Q4_K_M", false], [small, "Q5_K_M", false], [small, "Q4_K_S", false], [small, "Q3_K_M", false],
    [small, "Q3_K_L", false], [small, "Q2_K", false], [small, "Q6_K", false], [small, "Q8_0", false],
    [small, "Q3_K_S", true], [tinyQwen, "Q4_K_M", false], [tinyQwen, "Q5_0", false],
    [tiny, "IQ4_NL", false], [small, "IQ4_XS", false], [tinyQwen, "IQ4_XS", false],
    [qwenMoe, "Q4_K_M", false], [qwenMoe, "Q2_K", false], [qwenMoe, "Q8_0", true], [mixtral, "Q4_K_M", false], [mixtral, "Q3_K_M", false],
  ];

  it("types and bytes of every tensor equal llama.cpp's for the same file type", async () => {
    const f32 = new Map<string, string>();
    for (const [shape, type, pure] of cases) {
      const label = `${shape.name} ${type}${pure ? " pure" : ""}`;
      if (!f32.has(shape.name)) f32.set(shape.name, (await make(shape, "F32", false, 11)).path);
      const theirsPath = join(dir, `llama-${shape.name}-${type}-${pure}.gguf`);
      llamaQuantize(f32.get(shape.name)!, theirsPath, type, pure);
      const theirs = readGguf(theirsPath);
      const ours = await make(shape, type, pure, 11);
      const byName = new Map(theirs.tensors.map((t) => [t.name, t]));
      expect(theirs.tensors.length, label).toBe(ours.file.tensors.length);
      for (const t of ours.file.tensors) {
        const o = byName.get(t.name);
        expect(o, `${label}: llama.cpp has no ${t.name}`).toBeDefined();
        expect([o!.type, [...o!.dims]], `${label}: ${t.name} type/dims`).toEqual([t.type, [...t.dims]]);
        expect(tensorBytes(ours.file, t.name).equals(tensorBytes(theirs, t.name)), `${label}: ${t.name} bytes`).toBe(true);
      }
      expect(metaNumber(theirs, "general.file_type"), label).toBe(FILE_TYPES[type].ftype);
    }
  }, 180_000); // a file per type (or case), each loaded by llama.cpp: longer than one test's default

  it("the mix a big shape gets (types only, no file written) follows llama.cpp's rules", () => {
    // TinyLlama-1.1B Q4_K_M as llama-quantize types it: attn_v and ffn_down Q6_K in layers 0-1,
    // 4, 7, 10, 13, 16, 19-21 (use_more_bits), the rest Q4_K, output Q6_K, token_embd Q4_K.
    const plan = planTensors(modelShapeByName("tinyllama-1.1b")!, "Q4_K_M");
    const typeOf = (name: string) => plan.find((t) => t.name === name)!.type;
    const six = [0, 1, 4, 7, 10, 13, 16, 19, 20, 21];
    for (let i = 0; i < 22; i++) {
      const want = six.includes(i) ? GgmlTypeId.Q6_K : GgmlTypeId.Q4_K;
      expect(typeOf(`blk.${i}.attn_v.weight`), `layer ${i} attn_v`).toBe(want);
      expect(typeOf(`blk.${i}.ffn_down.weight`), `layer ${i} ffn_down`).toBe(want);
      expect(typeOf(`blk.${i}.attn_q.weight`)).toBe(GgmlTypeId.Q4_K);
    }
    expect(typeOf("output.weight")).toBe(GgmlTypeId.Q6_K);
    expect(typeOf("token_embd.weight")).toBe(GgmlTypeId.Q4_K);
    expect(typeOf("blk.0.attn_norm.weight")).toBe(GgmlTypeId.F32);
    // qwen2.5-0.5b: 896 is no multiple of 256, so its K-quant rows fall back (Q4_K -> Q5_0, Q6_K -> Q8_0)
    const q = planTensors(modelShapeByName("qwen2.5-0.5b")!, "Q4_K_M");
    expect(q.find((t) => t.name === "token_embd.weight")!.type).toBe(GgmlTypeId.Q8_0);
    expect(q.find((t) => t.name === "blk.5.attn_q.weight")!.type).toBe(GgmlTypeId.Q5_0);
    // 4864 = 19 x 256: ffn_down keeps K-quants (layer 6 of 24 is not a use_more_bits layer, 5 is)
    expect(q.find((t) => t.name === "blk.6.ffn_down.weight")!.type).toBe(GgmlTypeId.Q4_K);
    expect(q.find((t) => t.name === "blk.5.ffn_down.weight")!.type).toBe(GgmlTypeId.Q6_K);
  });
});

// ---------------------------------------------------------------- bad input

describe("bad input", () => {
  it("generateModel names the problem", async () => {
    const out = join(dir, "bad.gguf");
    await expect(generateModel({ shape: "no-such-shape", type: "Q4_K_M", out })).rejects.toThrow(/unknown shape "no-such-shape"/);
    await expect(generateModel({ shape: "tiny-llama", type: "Q9_X", out })).rejects.toThrow(/unknown file type "Q9_X"/);
    await expect(generateModel({ shape: { ...tiny, nHead: 3 }, type: "F16", out })).rejects.toThrow(/not a multiple of heads/);
    await expect(generateModel({ shape: { ...tiny, nVocab: 100 }, type: "F16", out })).rejects.toThrow(/more than the shape's vocabulary size/);
    await expect(generateModel({ shape: "tiny-llama", type: "F16", out, seed: -1 })).rejects.toThrow(ModelGenError);
    expect(existsSync(out)).toBe(false);
  });

  it("padHeads refuses what it cannot pad, by name", async () => {
    const out = join(dir, "padded.gguf");
    const shipped = join(root, "models/stories260K.gguf");
    expect(() => padHeads(shipped, out, 12)).toThrow(/head size 12 is not a multiple \(2x or more\) of the model's 8/);
    expect(() => padHeads(shipped, out, 8)).toThrow(/not a multiple \(2x or more\)/);
    const qwen = join(dir, "pad-qwen2.gguf");
    await generateModel({ shape: "tiny-qwen2", type: "F32", out: qwen, seed: 3 });
    expect(() => padHeads(qwen, out, 128)).toThrow(/needs a llama model \(RoPE on adjacent pairs\).*"qwen2"/);
    const q8 = join(dir, "pad-q8.gguf");
    await generateModel({ shape: "tiny-llama", type: "Q8_0", out: q8, seed: 3, pure: true });
    expect(() => padHeads(q8, out, 128)).toThrow(/attn_q.weight is not F32/);
    expect(existsSync(out)).toBe(false);
  });

  it("make-model's argument parser refuses bad arguments with a message", () => {
    expect(() => parseMakeModelArgs(["--shape", "tiny-llama", "--out", "x"])).toThrow(/--type is required/);
    expect(() => parseMakeModelArgs(["--type", "Q8_0", "--out", "x"])).toThrow(/--shape/);
    expect(() => parseMakeModelArgs(["--shape", "nope", "--type", "Q8_0", "--out", "x"])).toThrow(/unknown shape/);
    expect(() => parseMakeModelArgs(["--dims", "0", "--type", "Q8_0", "--out", "x"])).toThrow(/--dims must be a positive/);
    expect(() => parseMakeModelArgs(["--shape", "tiny-llama", "--type", "Q8_0", "--out", "x", "--vocab", "klingon"])).toThrow(/unknown vocabulary/);
    expect(() => parseMakeModelArgs(["--arch", "falcon", "--type", "Q8_0", "--out", "x"])).toThrow(/--arch must be one of llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, mistral3, phi3, gpt-oss \(got "falcon"\)/);
    // a custom gpt-oss keeps its window, YaRN and experts; it has no dense feed-forward to fall back to
    const oss = parseMakeModelArgs(["--arch", "gpt-oss", "--dims", "512", "--type", "MXFP4_MOE", "--out", "x"]);
    expect(oss !== "help" && oss.shape).toMatchObject({ arch: "gpt-oss", nEmbd: 512, qkvBias: true, tiedEmbeddings: false, slidingWindow: 4, ropeYarnFactor: 32, nExpert: 8 });
    expect(() => parseMakeModelArgs(["--shape", "tiny-gpt-oss", "--experts", "0", "--type", "Q8_0", "--out", "x"])).toThrow(/gpt-oss has no dense feed-forward/);
    const g = parseMakeModelArgs(["--shape", "tiny-gemma3", "--layers", "7", "--type", "Q8_0", "--out", "x"]);
    if (g !== "help") expect(g.shape).toMatchObject({ arch: "gemma3", nLayers: 7, headDim: 128, slidingWindow: 4, tiedEmbeddings: true });
    expect(() => parseMakeModelArgs(["--shape", "tiny-llama", "--type", "Q8_0", "--out", "x", "--weight-std", "0"])).toThrow(/--weight-std must be a positive/);
    expect(parseMakeModelArgs(["--shape", "tiny-llama", "--type", "Q8_0", "--out", "x", "--weight-std", "0.05"])).toMatchObject({ weightStd: 0.05 });
    const moe = parseMakeModelArgs(["--shape", "tiny-llama", "--experts", "4", "--experts-used", "2", "--type", "Q8_0", "--out", "x"]);
    if (moe !== "help") expect(moe.shape).toMatchObject({ arch: "llama", nExpert: 4, nExpertUsed: 2 });
    const dense = parseMakeModelArgs(["--shape", "tiny-mixtral", "--experts", "0", "--type", "Q8_0", "--out", "x"]);
    if (dense !== "help") expect(dense.shape.nExpert).toBeUndefined();
    const a = parseMakeModelArgs(["--dims", "512", "--layers", "3", "--heads", "8", "--kv-heads", "2", "--ffn", "768", "--type", "Q8_0", "--out", "x"]);
    expect(a).not.toBe("help");
    if (a !== "help") expect(a.shape).toMatchObject({ nEmbd: 512, nLayers: 3, nHead: 8, nHeadKv: 2, nFf: 768, arch: "llama" });
  });
});
