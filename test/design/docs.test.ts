// What users read holds to the code: every flag a command's --help names and every environment
// variable the code reads is documented in README.md or docs/CLI.md, and every relative link in the
// pages a user or developer reads points at a file that exists.
import { spawnSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { describe, expect, it } from "vitest";
import { root } from "../helpers/process.js";

const USER_DOCS = ["README.md", "docs/CLI.md"];
const PAGES = ["README.md", "BENCHMARKS.md", "docs/CLI.md", "docs/API.md", "docs/DESIGN.md", "docs/BENCHMARK-NOTES.md", "docs/HALDA.md", "deploy/README.md", "bench/history/README.md"];
const NOT_SOURCE = new Set(["node_modules", "dist", "build", "test", ".cache", ".git"]);

const userDocs = () => USER_DOCS.map((p) => readFileSync(join(root, p), "utf8")).join("\n");

/** Is `name` (a flag or a variable) written in `text` as a word of its own (not part of a longer one)? */
function mentions(text: string, name: string): boolean {
  const escaped = name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  return new RegExp(`(?<![\\w-])${escaped}(?![\\w-])`).test(text);
}

function help(cli: string, args: readonly string[]): string {
  // spawnSync waits for the process to end (the limit only stops a hung one). Some commands print
  // their help as a usage error (exit code 2, on stderr), so both streams are read, whatever the code.
  const r = spawnSync(process.execPath, [join(root, "dist", cli), ...args], { encoding: "utf8", timeout: 120_000 });
  const text = `${r.stdout}${r.stderr}`;
  expect(text, `${cli} ${args.join(" ")}`).toMatch(/usage: prima-/);
  return text;
}

function longFlags(text: string): string[] {
  return [...new Set(text.match(/(?<![\w-])--[a-z][a-z0-9-]*/g) ?? [])];
}

function sourceFiles(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    if (NOT_SOURCE.has(e.name)) continue;
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...sourceFiles(p));
    else if (/\.(ts|c|cc|h)$/.test(e.name) && !e.name.endsWith(".d.ts")) out.push(p);
  }
  return out;
}

describe("the documentation holds to the code", () => {
  it("documents every flag of every command's --help", () => {
    const commands = help("coordinator/cli.js", ["--help"]).match(/^ {2}([a-z-]+) {2,}/gm)?.map((l) => l.trim()) ?? [];
    expect(commands).toContain("serve");
    const texts = [...commands.map((c) => help("coordinator/cli.js", [c, "--help"])), help("worker/cli.js", ["--help"])];
    const flags = [...new Set(texts.flatMap(longFlags))];
    expect(flags).toContain("--layer-windows");
    const docs = userDocs();
    expect(flags.filter((f) => !mentions(docs, f)), "document these flags in README.md or docs/CLI.md").toEqual([]);
  });

  it("documents every environment variable the code reads", () => {
    const names = new Set<string>();
    for (const file of sourceFiles(root)) {
      const text = readFileSync(file, "utf8");
      for (const m of text.matchAll(/\benv(?:\.|\[")([A-Z][A-Z0-9_]+)/g)) names.add(m[1]);
      for (const m of text.matchAll(/getenv\("([A-Z][A-Z0-9_]+)"\)/g)) names.add(m[1]);
      for (const m of text.matchAll(/"(PRIMA_[A-Z0-9_]+)"/g)) names.add(m[1]);
    }
    expect(names).toContain("PRIMA_TOKEN");
    const docs = userDocs();
    expect([...names].filter((n) => !mentions(docs, n)), "document these variables in docs/CLI.md").toEqual([]);
  });

  it("links only to files that exist", () => {
    const broken: string[] = [];
    for (const page of PAGES) {
      const text = readFileSync(join(root, page), "utf8");
      for (const m of text.matchAll(/\]\(([^)\s#]+)(?:#[^)]*)?\)/g)) {
        const target = m[1];
        if (/^[a-z]+:/.test(target)) continue; // http:, mailto: and the like
        if (!existsSync(join(root, dirname(page), target))) broken.push(`${page} -> ${target}`);
      }
    }
    expect(broken).toEqual([]);
  });
});
