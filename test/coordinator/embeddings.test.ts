// serve's embeddings as clients use them: the official `openai` client's embeddings.create (which asks
// for base64 and decodes it), the `ollama` client's embed and embeddings, llama-server's /embedding and
// /embeddings; the vectors against llama.cpp's (node-llama-cpp's embedding context on the same file,
// L2-normalized as llama-server and Ollama give them), within the bound engine/embedding.test.ts
// measures; on one device, on a ring and with --parallel, the same vectors.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Ollama } from "ollama";
import type { Llama } from "node-llama-cpp";
import { killAll } from "../ring/cluster.js";
import { LocalModel, LocalPipeline, normalizeEmbedding, poolRows } from "../../engine/index.js";
import { Tokenizer, kv } from "../../model/index.js";
import { generateModel } from "../../modelgen/index.js";
import { tempDir } from "../helpers/temp.js";
import { join } from "node:path";
import { loadOracle } from "../engine/oracle-harness.js";
import { MODEL, joinWorker, startServe, until, type Served } from "./serve-harness.js";

const TEXTS = ["Once upon a time there was a little dog.", "The sun", "Tim and Sue went to the park."];
const E = 64; // stories260K's embedding width

afterAll(() => killAll());

function cosine(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let dot = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return dot / Math.sqrt(na * nb);
}

function l2(v: ArrayLike<number>): number[] {
  const n = Math.sqrt(Array.from(v).reduce((a, x) => a + x * x, 0));
  return Array.from(v, (x) => x / n);
}

async function post(url: string, path: string, body: unknown): Promise<{ status: number; json: any }> {
  const r = await fetch(`${url}${path}`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  return { status: r.status, json: await r.json() };
}

describe("serve: embeddings", () => {
  let s: Served;
  let llama: Llama;
  let ollama: Ollama;
  const reference = new Map<string, number[]>();
  beforeAll(async () => {
    [s, llama] = await Promise.all([startServe(["--ctx", "256", "--parallel", "1"]), loadOracle()]);
    ollama = new Ollama({ host: s.url });
    const model = await llama.loadModel({ modelPath: MODEL, gpuLayers: 0 });
    const ctx = await model.createEmbeddingContext({ contextSize: 256, threads: 1 });
    for (const t of TEXTS) reference.set(t, l2((await ctx.getEmbeddingFor(t)).vector));
    await ctx.dispose();
    await model.dispose();
  }, 120_000);
  afterAll(async () => {
    s.proc.child.kill("SIGKILL");
    await llama?.dispose();
  });

  it("the openai client: one input and several, llama.cpp's vectors L2-normalized, usage counting every token", async () => {
    expect(s.proc.stderr).toMatch(/embeddings: last pooling \(the default: the file has no llama\.pooling_type\)/);
    const one = await s.client.embeddings.create({ model: "text-embedding-3-small", input: TEXTS[0] });
    expect(one.object).toBe("list");
    expect(one.model).toBe("text-embedding-3-small");
    expect(one.data).toHaveLength(1);
    const v = one.data[0].embedding;
    expect(v).toHaveLength(E);
    expect(Math.abs(v.reduce((a, x) => a + x * x, 0) - 1)).toBeLessThan(1e-5);
    expect(cosine(v, reference.get(TEXTS[0])!)).toBeGreaterThan(0.9999);
    const many = await s.client.embeddings.create({ model: "m", input: TEXTS });
    expect(many.data.map((d) => d.index)).toEqual([0, 1, 2]);
    TEXTS.forEach((t, i) => expect(cosine(many.data[i].embedding, reference.get(t)!), t).toBeGreaterThan(0.9999));
    // each input is its own pass from position 0: the same vector alone or in a list
    expect(many.data[0].embedding).toEqual(v);
    const counts = await Promise.all(TEXTS.map(async (t) => (await post(s.url, "/tokenize", { content: t, add_special: true })).json.tokens.length as number));
    expect(many.usage).toEqual({ prompt_tokens: counts.reduce((a, b) => a + b), total_tokens: counts.reduce((a, b) => a + b) });
  });

  it("float and base64 carry the same floats; token ids embed as the text they spell", async () => {
    const b64 = await post(s.url, "/v1/embeddings", { input: TEXTS[1], encoding_format: "base64" });
    const flt = await post(s.url, "/v1/embeddings", { input: TEXTS[1], encoding_format: "float" });
    expect(b64.status).toBe(200);
    const buf = Buffer.from(b64.json.data[0].embedding as string, "base64");
    const decoded = Array.from({ length: buf.length / 4 }, (_, i) => buf.readFloatLE(i * 4));
    expect(decoded).toEqual(flt.json.data[0].embedding);
    const ids = (await post(s.url, "/tokenize", { content: TEXTS[1], add_special: true })).json.tokens as number[];
    const byIds = await post(s.url, "/v1/embeddings", { input: ids });
    expect(byIds.json.data[0].embedding).toEqual(flt.json.data[0].embedding);
    const lists = await post(s.url, "/v1/embeddings", { input: [ids, ids.slice(0, 2)] });
    expect(lists.json.data).toHaveLength(2);
    expect(lists.json.data[0].embedding).toEqual(flt.json.data[0].embedding);
    expect(lists.json.usage.prompt_tokens).toBe(ids.length + 2);
  });

  it("Ollama's embed (normalized) and embeddings (as the model gives it), through the ollama client", async () => {
    const r = await ollama.embed({ model: "nomic-embed-text", input: TEXTS });
    expect(r.model).toBe("nomic-embed-text");
    expect(r.embeddings).toHaveLength(3);
    const openai = await s.client.embeddings.create({ model: "m", input: TEXTS, encoding_format: "float" });
    r.embeddings.forEach((e, i) => expect(e).toEqual(openai.data[i].embedding));
    expect(r.prompt_eval_count).toBe(openai.usage.prompt_tokens);
    expect(r.total_duration).toBeGreaterThan(0);
    const legacy = await ollama.embeddings({ model: "x", prompt: TEXTS[0] });
    expect(Math.abs(legacy.embedding.reduce((a, x) => a + x * x, 0) - 1)).toBeGreaterThan(1e-3); // not normalized
    l2(legacy.embedding).forEach((x, i) => expect(x).toBeCloseTo(openai.data[0].embedding[i], 5));
    expect((await ollama.embed({ model: "x", input: [] })).embeddings).toEqual([]);
    // truncate: the first tokens of a long input (default), or a 400 naming it
    const long = TEXTS[2].repeat(40);
    const cut = await ollama.embed({ model: "x", input: long, options: { num_ctx: 8 } });
    const ids = (await post(s.url, "/tokenize", { content: long, add_special: true })).json.tokens as number[];
    expect(cut.prompt_eval_count).toBe(8);
    expect(cut.embeddings[0]).toEqual((await s.client.embeddings.create({ model: "m", input: ids.slice(0, 8), encoding_format: "float" })).data[0].embedding);
    const refused = await post(s.url, "/api/embed", { model: "x", input: long, truncate: false, options: { num_ctx: 8 } });
    expect(refused.status).toBe(400);
    expect(refused.json.error).toMatch(/^input: has \d+ tokens, more than the context of 8, and truncate is false/);
  });

  it("llama-server's /embedding and /embeddings: [{index, embedding: [vector]}], embd_normalize as common_embd_normalize", async () => {
    const legacy = await ollama.embeddings({ model: "x", prompt: TEXTS[0] });
    for (const path of ["/embedding", "/embeddings"]) {
      const r = await post(s.url, path, { content: TEXTS[0] });
      expect(r.status).toBe(200);
      expect(r.json).toHaveLength(1);
      expect(r.json[0].index).toBe(0);
      expect(r.json[0].embedding).toHaveLength(1);
      expect(cosine(r.json[0].embedding[0], reference.get(TEXTS[0])!)).toBeGreaterThan(0.9999);
    }
    const raw = await post(s.url, "/embedding", { input: TEXTS[0], embd_normalize: -1 });
    expect(raw.json[0].embedding[0]).toEqual(legacy.embedding);
    const mixed = await post(s.url, "/embedding", { input: ["a", [1, 2, 3]] });
    expect(mixed.json.map((x: { index: number }) => x.index)).toEqual([0, 1]);
  });

  it("refusals name the field: dimensions, an unknown field, a bad format, an empty or too long input, a bad token", async () => {
    const cases: [string, unknown, RegExp][] = [
      ["/v1/embeddings", { input: "x", dimensions: 32 }, /^dimensions: this model's embeddings have 64 dimensions/],
      ["/v1/embeddings", { input: "x", truncate: true }, /^truncate: not supported/],
      ["/v1/embeddings", { input: "x", encoding_format: "int8" }, /^encoding_format: must be "float" or "base64"/],
      ["/v1/embeddings", { input: [] }, /^input: must not be empty/],
      ["/v1/embeddings", {}, /^input: is required/],
      ["/v1/embeddings", { input: "This is a test ".repeat(200) }, /^input: is too large to process: \d+ tokens, more than the context of 256/],
      ["/v1/embeddings", { input: [5, 99999] }, /^input\[1\]: must be token ids/],
      ["/v1/embeddings", { input: [{ text: "x" }] }, /^input\[0\]: must be a string, token ids/],
    ];
    for (const [path, body, message] of cases) {
      const r = await post(s.url, path, body);
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(r.json.error.message, JSON.stringify(body)).toMatch(message);
    }
    const dims = await s.client.embeddings.create({ model: "m", input: "x", dimensions: E });
    expect(dims.data[0].embedding).toHaveLength(E);
    const llama = await post(s.url, "/embedding", { prompt: "x" });
    expect(llama.status).toBe(400);
    expect(llama.json.error).toMatchObject({ code: 400, message: expect.stringMatching(/^prompt: not supported/) });
    const ol = await post(s.url, "/api/embed", { model: "x", input: "x", options: { flux: 1 } });
    expect(ol.json.error).toMatch(/^options\.flux: not supported/);
    expect((await fetch(`${s.url}/v1/embeddings`)).status).toBe(405);
  });

  it("an embedding between two turns of a client leaves its generation as it was (the KV it overwrote is nobody's cache)", async () => {
    const body = { prompt: "Once upon a time", max_tokens: 8, temperature: 0 };
    const first = await s.client.completions.create(body);
    await s.client.embeddings.create({ model: "m", input: "The little dog ran to the tree and sat down." });
    const again = await s.client.completions.create(body);
    expect(again.choices[0].text).toBe(first.choices[0].text);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/prima_requests_total\{outcome="ok"\} \d+/);
  });

  it("on a ring (a worker runs the first layers) and with --parallel 2, the same vectors as one device", async () => {
    const alone = await s.client.embeddings.create({ model: "m", input: TEXTS, encoding_format: "float" });
    // the ring pools by mean over an input of several batches: every batch's rows come back to the head
    const long = `${TEXTS[2]} `.repeat(8);
    const r = await startServe(["--ctx", "256", "--batch", "16", "--pooling", "mean", "--min-workers", "1", "--layer-windows", "alpha=3,head=2"], { waitReady: false });
    const w = joinWorker(r.clusterPort, "alpha");
    const p = await startServe(["--ctx", "256", "--parallel", "2"]);
    try {
      await until(`${r.url}/health`, (st) => st === 200);
      await until<{ plan: { ringOrder: string[] } | null }>(`${r.url}/api/state`, (_, st) => (st.plan?.ringOrder.length ?? 0) === 2);
      const inputs = [...TEXTS, long];
      const onRing = await r.client.embeddings.create({ model: "m", input: inputs, encoding_format: "float" });
      expect(onRing.usage.prompt_tokens).toBeGreaterThan(3 * 16);
      const local = await localMean(inputs, 16);
      inputs.forEach((t, i) => expect(onRing.data[i].embedding, t).toEqual(local[i]));
      // both at once: two slots
      const [a, b] = await Promise.all([0, 1].map(() => p.client.embeddings.create({ model: "m", input: TEXTS, encoding_format: "float" })));
      TEXTS.forEach((_, i) => {
        expect(a.data[i].embedding).toEqual(alone.data[i].embedding);
        expect(b.data[i].embedding).toEqual(alone.data[i].embedding);
      });
      expect(w.child.exitCode).toBeNull();
    } finally {
      w.child.kill("SIGKILL");
      r.proc.child.kill("SIGKILL");
      p.proc.child.kill("SIGKILL");
    }
  }, 120_000);
});

/** Mean-pooled, L2-normalized vectors of one device in this process (the same engine functions). */
async function localMean(texts: string[], batch: number): Promise<number[][]> {
  const m = LocalModel.open(MODEL, { threads: 1 });
  const tok = Tokenizer.fromGguf(m.gguf);
  const p = new LocalPipeline(m, 256, batch);
  try {
    const out: number[][] = [];
    for (const t of texts) {
      const ids = tok.encode(t, { addSpecial: true, parseSpecial: true });
      const rows = m.embed(ids);
      await p.forward(rows, 0, ids.length);
      out.push(Array.from(normalizeEmbedding(poolRows(m, rows, ids.length, "mean")[0], 2)));
    }
    return out;
  } finally {
    p.close();
    m.close();
  }
}

describe("serve --pooling none", () => {
  it("llama-server's /embedding gives each token's row, not normalized; the OpenAI and Ollama endpoints refuse by name", async () => {
    const s = await startServe(["--ctx", "128", "--parallel", "1", "--pooling", "none"]);
    try {
      const ids = (await post(s.url, "/tokenize", { content: "hello hello hello", add_special: true })).json.tokens as number[];
      const r = await post(s.url, "/embedding", { input: "hello hello hello" });
      expect(r.status).toBe(200);
      expect(r.json[0].embedding).toHaveLength(ids.length);
      for (const row of r.json[0].embedding as number[][]) expect(Math.abs(row.reduce((a, x) => a + x * x, 0) - 1)).toBeGreaterThan(1e-3);
      const oai = await post(s.url, "/v1/embeddings", { input: "x" });
      expect(oai.status).toBe(400);
      expect(oai.json.error.message).toMatch(/^pooling none gives one vector per token/);
      expect((await post(s.url, "/api/embed", { model: "x", input: "x" })).json.error).toMatch(/^pooling none/);
    } finally {
      s.proc.child.kill("SIGKILL");
    }
  }, 60_000);
});

describe("a model whose embeddings this engine cannot compute", () => {
  it("gets a 400 naming why: attention that is not causal, rank pooling; generations still work", async () => {
    const dir = tempDir("prima-embed-refused-");
    for (const [key, value, message] of [
      ["llama.attention.causal", kv.bool("llama.attention.causal", false), /^this model gives no embeddings: the model's attention is not causal \(llama\.attention\.causal = false\)/],
      ["llama.pooling_type", kv.u32("llama.pooling_type", 4), /^this model gives no embeddings: llama\.pooling_type = 4 \(rank\) scores pairs with a classifier head/],
    ] as const) {
      const model = join(dir, `${key}.gguf`);
      await generateModel({ shape: "tiny-llama", type: "F32", out: model, seed: 3, extraMetadata: [value] });
      const s = await startServe(["--ctx", "64", "--embeddings"], { model });
      try {
        expect(s.proc.stderr).toMatch(/embeddings are refused: /);
        const r = await post(s.url, "/v1/embeddings", { input: "hi" });
        expect(r.status, key).toBe(400);
        expect(r.json.error.message, key).toMatch(message);
        expect((await post(s.url, "/api/embed", { model: "x", input: "hi" })).json.error).toMatch(message);
        expect((await s.client.completions.create({ prompt: "hi", max_tokens: 2 })).choices).toHaveLength(1);
      } finally {
        s.proc.child.kill("SIGKILL");
      }
    }
  }, 120_000);
});
