// The map holds: docs/DESIGN.md draws which folder may import which (its `arrows` block), and this test
// reads every import in the tree against it. It fails on an import the page does not allow, on an arrow
// the page draws that no code uses any more, on a folder missing from the page, and on an import that
// reaches past another folder's index.ts.
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, normalize, relative, sep } from "node:path";
import { describe, expect, it } from "vitest";
import { root } from "../helpers/process.js";

/** Top-level folders that are not code of the product or its benchmarks. */
const NOT_CODE = new Set(["node_modules", "dist", "build", "test", "docs", "models", "protos", "deploy", ".cache", ".ci", ".git"]);

function drawnArrows(): Map<string, Set<string>> {
  const page = readFileSync(join(root, "docs/DESIGN.md"), "utf8");
  const block = /```arrows\n([\s\S]*?)```/.exec(page);
  if (!block) throw new Error("docs/DESIGN.md has no ```arrows block");
  const arrows = new Map<string, Set<string>>();
  for (const line of block[1].split("\n").map((l) => l.trim()).filter(Boolean)) {
    const m = /^([\w-]+)\s*->\s*(.*)$/.exec(line);
    if (!m) throw new Error(`docs/DESIGN.md arrows: cannot read "${line}"`);
    arrows.set(m[1], new Set(m[2].split(",").map((s) => s.trim()).filter(Boolean)));
  }
  return arrows;
}

function codeFolders(): string[] {
  return readdirSync(root).filter((d) => !NOT_CODE.has(d) && statSync(join(root, d)).isDirectory() &&
    readdirSync(join(root, d), { recursive: true }).some((f) => String(f).endsWith(".ts")));
}

function tsFiles(dir: string): string[] {
  return (readdirSync(dir, { recursive: true }) as string[]).filter((f) => f.endsWith(".ts") && !f.endsWith(".d.ts")).map((f) => join(dir, f));
}

interface CrossImport { readonly file: string; readonly spec: string; readonly from: string; readonly to: string; readonly target: string }

function crossImports(folders: readonly string[]): CrossImport[] {
  const out: CrossImport[] = [];
  const known = new Set(folders);
  for (const from of folders) {
    for (const file of tsFiles(join(root, from))) {
      const src = readFileSync(file, "utf8");
      for (const m of src.matchAll(/(?:\bfrom\s*|\bimport\s*\(\s*|\bimport\s+)["'](\.{1,2}\/[^"']+)["']/g)) {
        const target = relative(root, normalize(join(dirname(file), m[1])));
        const to = target.split(sep)[0];
        if (to !== from && known.has(to)) out.push({ file: relative(root, file), spec: m[1], from, to, target });
      }
    }
  }
  return out;
}

describe("the design page's map", () => {
  const arrows = drawnArrows();
  const folders = codeFolders();
  const imports = crossImports(folders);

  it("names every folder of code, and only those", () => {
    expect([...arrows.keys()].sort()).toEqual([...folders].sort());
  });

  it("allows every import between folders", () => {
    const undrawn = imports.filter((i) => !arrows.get(i.from)?.has(i.to)).map((i) => `${i.file} imports ${i.spec} (${i.from} -> ${i.to})`);
    expect(undrawn, "add the arrow to docs/DESIGN.md, or import through a folder below").toEqual([]);
  });

  it("draws no arrow that the code no longer has", () => {
    const used = new Set(imports.map((i) => `${i.from} -> ${i.to}`));
    const stale = [...arrows].flatMap(([from, tos]) => [...tos].map((to) => `${from} -> ${to}`)).filter((a) => !used.has(a));
    expect(stale, "remove these arrows from docs/DESIGN.md").toEqual([]);
  });

  it("reaches another folder only through its index.ts", () => {
    const bypass = imports.filter((i) => i.target !== join(i.to, "index.js")).map((i) => `${i.file} imports ${i.spec}`);
    expect(bypass).toEqual([]);
    for (const f of folders) expect(existsSync(join(root, f, "index.ts")), `${f}/index.ts`).toBe(true);
  });
});
