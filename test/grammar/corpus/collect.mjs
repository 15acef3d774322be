// Rebuilds the schema corpus's fixtures from git snapshots of their sources (test data, run by hand):
//   node test/grammar/corpus/collect.mjs JSON-Schema-Test-Suite.git schemastore.git
// Each argument is a git directory; the schemas are read at its HEAD with `git show`, and each entry
// records the commit and path it came from.
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const [suiteGit, storeGit] = process.argv.slice(2);
if (!suiteGit || !storeGit) throw new Error("usage: collect.mjs <JSON-Schema-Test-Suite git dir> <schemastore git dir>");
const git = (dir, ...args) => execFileSync("git", ["--git-dir", dir, ...args], { encoding: "utf8", maxBuffer: 64 << 20 });
const here = (name) => fileURLToPath(new URL(name, import.meta.url));
const save = (name, corpus) => writeFileSync(here(name), JSON.stringify(corpus, null, 1) + "\n");

// JSON-Schema-Test-Suite: every test group of draft 2020-12 (the required and the optional ones,
// formats included), its schema and its test instances with the suite's verdicts (which treat
// "format" as an annotation: the test asks ajv too).
{
  const commit = git(suiteGit, "rev-parse", "HEAD").trim();
  const files = git(suiteGit, "ls-tree", "-r", "--name-only", "HEAD", "tests/draft2020-12").split("\n").filter((f) => f.endsWith(".json"));
  const schemas = [];
  for (const path of files.sort()) {
    const groups = JSON.parse(git(suiteGit, "show", `HEAD:${path}`));
    groups.forEach((g, i) => {
      const file = path.replace("tests/draft2020-12/", "");
      schemas.push({ name: `${file} #${i}: ${g.description}`, source: `${path}#${i}`, schema: g.schema, instances: g.tests.map((t) => ({ data: t.data, valid: t.valid })) });
    });
  }
  save("json-schema-test-suite.json", {
    source: `json-schema-org/JSON-Schema-Test-Suite at ${commit} (https://github.com/json-schema-org/JSON-Schema-Test-Suite): every test group under tests/draft2020-12, with its test instances`,
    licence: "MIT, Copyright (c) 2012 Julian Berman; used here as test data",
    schemas,
  });
  console.log(`JSON-Schema-Test-Suite: ${schemas.length} schemas`);
}

// SchemaStore: configuration-file schemas used by editors. Those of 1 to 16 KB under
// src/schemas/json, every third in name order (a spread of small and mid-sized real schemas).
{
  const commit = git(storeGit, "rev-parse", "HEAD").trim();
  const rows = git(storeGit, "ls-tree", "-l", "HEAD", "src/schemas/json/").split("\n").filter(Boolean);
  const picked = rows
    .map((r) => r.split(/\s+/))
    .filter(([, , , size, path]) => path.endsWith(".json") && +size >= 1000 && +size <= 16000)
    .map(([, , , , path]) => path)
    .sort()
    .filter((_, i) => i % 3 === 0);
  const schemas = [];
  for (const path of picked) {
    let schema;
    try {
      schema = JSON.parse(git(storeGit, "show", `HEAD:${path}`));
    } catch {
      continue; // not plain JSON (comments)
    }
    schemas.push({ name: path.replace("src/schemas/json/", ""), source: path, schema });
  }
  save("schemastore.json", {
    source: `SchemaStore/schemastore at ${commit} (https://github.com/SchemaStore/schemastore): the schemas of 1 to 16 KB under src/schemas/json, every third in name order`,
    licence: "Apache-2.0 (SchemaStore's licence; individual schemas may carry their authors' terms); used here as test data",
    schemas,
  });
  console.log(`SchemaStore: ${schemas.length} schemas`);
}
