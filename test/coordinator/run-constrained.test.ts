// `prima-coord run --json-schema FILE` and `--grammar FILE` on the shipped model: the output is valid
// JSON for the schema (ajv) or follows the grammar, at temperature 0 and 1; a schema the decoder
// cannot honour, or both flags, end the run with a message naming the problem, not a stack.
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { root } from "../helpers/process.js";
import { tempDir } from "../helpers/temp.js";
import { schemaErrors } from "../grammar/validate.js";
import { MODEL } from "./serve-harness.js";

const dir = tempDir("prima-run-constrained-");
const SCHEMA = {
  type: "object",
  properties: {
    count: { type: "integer", minimum: 5, maximum: 120 },
    word: { type: "string", pattern: "^\\S+$" },
    tags: { type: "array", items: { enum: ["a", "b"] }, maxItems: 3 },
  },
  required: ["count", "word", "tags"],
  additionalProperties: false,
};

function run(args: string[]) {
  const r = spawnSync(process.execPath, [`${root}dist/coordinator/cli.js`, "run", MODEL, "--threads", "1", ...args], { cwd: root, encoding: "utf8", timeout: 60_000 });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

function file(name: string, text: string): string {
  const f = join(dir, name);
  writeFileSync(f, text);
  return f;
}

describe("prima-coord run with a constraint", () => {
  it("--json-schema: valid JSON for the schema at temperature 0 and 1, and the constraint's time reported", () => {
    const schema = file("schema.json", JSON.stringify(SCHEMA));
    for (const temp of ["0", "1"]) {
      const r = run(["--json", "--json-schema", schema, "--temp", temp, "-n", "200"]);
      expect(r.code, r.err).toBe(0);
      const report = JSON.parse(r.out.split("\n").find((l) => l.startsWith("{"))!) as { text: string; stop_reason: string; constraint_ms_per_token?: number };
      expect(report.stop_reason, report.text).toBe("end");
      expect(schemaErrors(SCHEMA, JSON.parse(report.text)), report.text).toBe("");
      expect(report.constraint_ms_per_token).toBeGreaterThan(0);
    }
  }, 120_000);

  it("--grammar: the text follows the GBNF grammar", () => {
    const grammar = file("yes-no.gbnf", 'root ::= ("yes" | "no") ", because " [a-z ]{1,20} "."\n');
    for (const temp of ["0", "1"]) {
      const r = run(["--grammar", grammar, "--temp", temp, "-n", "60"]);
      expect(r.code, r.err).toBe(0);
      expect(r.out.trim()).toMatch(/^(yes|no), because [a-z ]{1,20}\.$/);
    }
  }, 120_000);

  it("a schema it cannot honour, a file that is not JSON, or both flags: a message naming the problem", () => {
    const cases: [string[], RegExp][] = [
      [["--json-schema", file("not.json", '{"type": "object", "properties": {"a": {"not": {}}}}')], /#\/properties\/a: the keyword "not"/],
      [["--json-schema", file("broken.json", "{ nope")], /--json-schema: not JSON/],
      [["--json-schema", file("s.json", "{}"), "--grammar", file("g.gbnf", 'root ::= "x"')], /not both/],
      [["--grammar", file("bad.gbnf", "root ::= undefined_rule")], /undefined_rule/],
    ];
    for (const [args, message] of cases) {
      const r = run([...args, "-n", "5"]);
      expect(r.code, r.err).not.toBe(0);
      expect(r.err, r.err).toMatch(message);
      expect(r.err).not.toMatch(/\n\s+at /); // no stack
    }
  }, 120_000);
});
