// Hostile model files (issue #18): each gives a clear error, escaped for a terminal, and the process
// stays up. Bounds: nested arrays, huge strings, names; block_count against the tensors; chat templates.
import { spawnSync } from "node:child_process";
import { closeSync, openSync, readFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { describe, expect, it } from "vitest";
import {
  ChatTemplate, DEFAULT_TEMPLATE_LIMITS, GgufError, GgufValueType, describeModel, kv, readGguf, writeGguf, type GgufKV,
} from "../../model/index.js";
import { root } from "../helpers/process.js";
import { tempDir } from "../helpers/temp.js";

const dir = tempDir("prima-hostile-");
let n = 0;

/** A GGUF v3 header by hand: parts are u32 (number), u64 (bigint) or raw bytes/strings. */
function rawFile(parts: (number | bigint | string | Uint8Array)[], sizeBytes?: number): string {
  const bufs = parts.map((p) => {
    if (typeof p === "number") { const b = Buffer.alloc(4); b.writeUInt32LE(p); return b; }
    if (typeof p === "bigint") { const b = Buffer.alloc(8); b.writeBigUInt64LE(p); return b; }
    return Buffer.from(p);
  });
  const path = join(dir, `h${n++}.gguf`);
  const fd = openSync(path, "w");
  const all = Buffer.concat(bufs);
  writeSync(fd, all, 0, all.length, 0);
  if (sizeBytes && sizeBytes > all.length) writeSync(fd, Buffer.alloc(1), 0, 1, sizeBytes - 1); // sparse
  closeSync(fd);
  return path;
}
const str = (s: string) => [BigInt(Buffer.byteLength(s)), s];
const header = (nTensors: number, nKv: number) => ["GGUF", 3, BigInt(nTensors), BigInt(nKv)];

function failure(path: string): string {
  try {
    readGguf(path);
  } catch (e) {
    expect(e).toBeInstanceOf(GgufError);
    return (e as Error).message;
  }
  throw new Error("expected a GgufError");
}

describe("hostile GGUF headers", () => {
  it("a key with escape sequences is escaped in the error (no screen clearing, no fake line)", () => {
    const key = "\x1b[2J\x1b[Hmodel OK\r\n\u202e";
    const msg = failure(rawFile([...header(0, 1), ...str(key), 99]));
    expect(msg).toContain("\\x1b[2J\\x1b[Hmodel OK\\x0d\\x0a\\u{202e}");
    expect(msg).not.toMatch(/[\x00-\x1f\u202e]/);
  });

  it("a tensor name with control characters, or of 64 bytes or more, is refused", () => {
    const tensor = (name: string) => [...str(name), 1, 4n, 0, 0n];
    expect(failure(rawFile([...header(1, 0), ...tensor("blk.0.\x1b[31mred")]))).toMatch(/tensor #0 name "blk\.0\.\\x1b\[31mred" has control characters/);
    expect(failure(rawFile([...header(1, 0), ...tensor("t".repeat(64))]))).toMatch(/tensor #0 name length is 64, more than the limit 63/);
  });

  it("many nested arrays are refused before they are built", () => {
    const count = 200_000;
    const nested = Buffer.alloc(count * 12); // each: item type u32 0 (UINT8), length u64 0
    const msg = failure(rawFile([...header(0, 1), ...str("x"), GgufValueType.ARRAY, GgufValueType.ARRAY, BigInt(count), nested]));
    expect(msg).toMatch(/key "x": the metadata arrays hold more than \d+ strings, bools and nested arrays/);
  });

  it("arrays nested too deep are refused", () => {
    const deep: (number | bigint)[] = [];
    for (let i = 0; i < 6; i++) deep.push(GgufValueType.ARRAY, 1n);
    deep.push(GgufValueType.UINT8, 0n);
    expect(failure(rawFile([...header(0, 1), ...str("x"), GgufValueType.ARRAY, ...deep]))).toMatch(/nested deeper than 4/);
  });

  it("a string longer than 16 MiB is refused, even when the file holds it", () => {
    const msg = failure(rawFile([...header(0, 1), ...str("general.name"), GgufValueType.STRING, BigInt(20 << 20)], 32 << 20));
    expect(msg).toMatch(/general\.name" length is 20971520, more than the limit 16777216/);
  });

  it("a header of 256 MiB is refused before it costs hundreds of MB (measured in a child process)", () => {
    // Sparse files: the bytes between the pieces are holes (zeros) that take no disk.
    const sparse = (pieces: [number, Buffer][], size: number) => {
      const path = join(dir, `big${n++}.gguf`);
      const fd = openSync(path, "w");
      for (const [at, b] of pieces) writeSync(fd, b, 0, b.length, at);
      writeSync(fd, Buffer.alloc(1), 0, 1, size - 1);
      closeSync(fd);
      return path;
    };
    const bytes = (parts: (number | bigint | string)[]) => Buffer.concat(parts.map((p) => {
      if (typeof p === "number") { const b = Buffer.alloc(4); b.writeUInt32LE(p); return b; }
      if (typeof p === "bigint") { const b = Buffer.alloc(8); b.writeBigUInt64LE(p); return b; }
      return Buffer.from(p);
    }));
    const MiB = 1 << 20;
    // 16 strings of 16 MiB - 64 bytes each, one per key.
    const keys = 16, len = 16 * MiB - 64;
    const head = bytes(header(0, keys));
    const strings: [number, Buffer][] = [[0, head]];
    let at = head.length;
    for (let k = 0; k < keys; k++) {
      const b = bytes([...str(`k${String(k).padStart(2, "0")}`), GgufValueType.STRING, BigInt(len)]);
      strings.push([at, b]);
      at += b.length + len;
    }
    const manyStrings = sparse(strings, at + 64);
    // One array of 64k strings of 4 KiB.
    const items = 65536, item = 4096;
    const arrayHead = bytes([...header(0, 1), ...str("tokenizer.ggml.tokens"), GgufValueType.ARRAY, GgufValueType.STRING, BigInt(items)]);
    const lengths: [number, Buffer][] = [[0, arrayHead]];
    for (let i = 0; i < items; i++) lengths.push([arrayHead.length + i * (8 + item), bytes([BigInt(item)])]);
    const bigArray = sparse(lengths, arrayHead.length + items * (8 + item) + 64);
    // A byte array of 256 MiB.
    const byteArray = sparse([[0, bytes([...header(0, 1), ...str("x"), GgufValueType.ARRAY, GgufValueType.UINT8, BigInt(256 * MiB)])]], 257 * MiB);

    const peak = (files: string[]) => {
      const script = `import(${JSON.stringify(pathToFileURL(join(root, "dist/model/index.js")).href)}).then((m) => {
        const errors = [];
        for (const f of ${JSON.stringify(files)}) {
          try { m.readGguf(f); errors.push("read"); } catch (e) { errors.push(e.message); }
        }
        console.log(JSON.stringify({ errors, maxRssBytes: process.resourceUsage().maxRSS * 1024 }));
      });`;
      const out = spawnSync(process.execPath, ["-e", script], { encoding: "utf8", timeout: 60_000 });
      expect(out.status, out.stderr).toBe(0);
      return JSON.parse(out.stdout) as { errors: string[]; maxRssBytes: number };
    };
    const base = peak([]).maxRssBytes;
    for (const file of [manyStrings, bigArray, byteArray]) {
      const r = peak([file]);
      expect(r.errors[0]).toMatch(/header \(metadata and tensor table\) is larger than 67108864 bytes, the limit/);
      // A real model's header (~20 MB) costs about this much too; the file's 256 MiB never do.
      expect(r.maxRssBytes - base, `${file}: ${r.errors[0]}`).toBeLessThan(160 * MiB);
    }
  });

  it("a block_count that disagrees with the tensors is refused by name", () => {
    const src = readGguf("models/stories260K.gguf");
    const raw = readFileSync("models/stories260K.gguf");
    const withBlocks = (count: number) => {
      const path = join(dir, `b${n++}.gguf`);
      const meta: GgufKV[] = [...src.metadata.values()].map((m) => (m.key === "llama.block_count" ? kv.u32(m.key, count) : m));
      writeGguf(path, meta, src.tensors.map((t) => ({ name: t.name, dims: t.dims, type: t.type, data: raw.subarray(t.offset, t.offset + t.nBytes) })));
      return readGguf(path);
    };
    expect(() => describeModel(withBlocks(3))).toThrow(/llama\.block_count says 3 layers, but the file has tensors of layer 4 \(blk\.4\./);
    expect(() => describeModel(withBlocks(7))).toThrow(/llama\.block_count says 7 layers, but the file has tensors of 5 \(no blk\.5\.\* tensor\)/);
    expect(describeModel(withBlocks(5)).hparams.nLayers).toBe(5);
  });
});

describe("hostile chat templates", () => {
  const messages = [{ role: "user", content: "hi" }];
  const tmpl = (source: string) => new ChatTemplate(source, "<s>", "</s>", false, false);

  it("a loop that never ends, a huge range and a growing string stop with a clear error", () => {
    expect(() => tmpl("{% for i in range(1000000000) %}x{% endfor %}").render(messages)).toThrow(/stopped: range\(\) of 1000000000 items/);
    const nested = tmpl("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
    nested.limits = { ...DEFAULT_TEMPLATE_LIMITS, timeMs: 300 };
    expect(() => nested.render(messages)).toThrow(/stopped: it (took more than \d+ steps|ran longer than 300 ms|did not finish within 300 ms)/);
    expect(() => tmpl("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}").render(messages))
      .toThrow(/stopped: it made a string of more than \d+ characters/);
    expect(() => tmpl("{{ 'a\\nb' | indent(400000000) }}").render(messages)).toThrow(/stopped: repeat\(\) would make 400000000 characters/);
  });

  it("a template that exhausts its worker's heap is stopped; the next render works", () => {
    const hog = tmpl("{% set ns = namespace(l=[], s='x') %}{% for i in range(19) %}{% set ns.s = ns.s + ns.s %}{% endfor %}" +
      "{% for i in range(4000) %}{% set ns.l = ns.l + [(i|string + ns.s) | upper] %}{% endfor %}{{ ns.l | length }}");
    hog.limits = { ...DEFAULT_TEMPLATE_LIMITS, heapMb: 48, timeMs: 1500 };
    expect(() => hog.render(messages)).toThrow(/the chat template was stopped/);
    expect(tmpl("{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}").render(messages)).toBe("[user] hi");
  });
});
