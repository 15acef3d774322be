// ajv, set up once for the tests: JSON Schema 2020-12 (prefixItems, $defs) with its formats; and the
// schema corpora (test/grammar/corpus/, each file saying where its schemas come from).
import { Ajv2020, type ValidateFunction } from "ajv/dist/2020.js";
import addFormatsModule from "ajv-formats";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const addFormats = addFormatsModule as unknown as (ajv: Ajv2020) => Ajv2020;
// Schemas from the wild do not all pass the meta-schema (a "deprecated" that is not a boolean): ajv
// validates with them all the same.
const ajv = addFormats(new Ajv2020({ strict: false, allErrors: true, validateSchema: false }));
const compiled = new WeakMap<object, ValidateFunction>();

function validator(schema: unknown): ValidateFunction {
  const key = typeof schema === "object" && schema !== null ? schema : { schema };
  let v = compiled.get(key);
  if (!v) {
    // Drafts are read as 2020-12; ids (also nested ones) would clash with schemas compiled before.
    const s = withoutIds(schema);
    ajv.removeSchema();
    v = ajv.compile(s as object);
    compiled.set(key, v);
  }
  return v;
}

const VALUES = new Set(["const", "enum", "default", "examples"]);
const MAPS = new Set(["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"]);

/** The schema without "$schema", "$id" or draft 4's "id" (which ajv 8 refuses), in every subschema. */
function withoutIds(s: unknown): unknown {
  if (Array.isArray(s)) return s.map(withoutIds);
  if (typeof s !== "object" || s === null) return s;
  return Object.fromEntries(Object.entries(s).filter(([k, v]) => !(k === "$schema" || k === "$id" || (k === "id" && typeof v === "string")))
    .map(([k, v]) => [k, VALUES.has(k) ? v : MAPS.has(k) && typeof v === "object" && v !== null
      ? Object.fromEntries(Object.entries(v).map(([n, x]) => [n, withoutIds(x)])) : withoutIds(v)]));
}

/** The errors of value against schema ("" when it is valid). */
export function schemaErrors(schema: unknown, value: unknown): string {
  const validate = validator(schema);
  return validate(value) ? "" : ajv.errorsText(validate.errors);
}

export interface CorpusEntry {
  readonly name: string;
  /** Where in its source the schema is (a file path, a test group). */
  readonly source?: string;
  readonly schema: unknown;
  /** Instances the source tests the schema with, and whether it finds them valid. */
  readonly instances?: readonly { readonly data: unknown; readonly valid: boolean }[];
}

export interface Corpus {
  readonly source: string;
  readonly licence?: string;
  readonly schemas: readonly CorpusEntry[];
}

const load = (file: string) => JSON.parse(readFileSync(fileURLToPath(new URL(`./corpus/${file}`, import.meta.url)), "utf8")) as Corpus;

/** Written for prima's tests; names starting "refused" are expected to be refused. */
export const CORPUS = load("hand-written.json").schemas;

/** All the corpora, by name. */
export const CORPORA: Readonly<Record<string, Corpus>> = {
  "hand-written": load("hand-written.json"),
  "JSON-Schema-Test-Suite": load("json-schema-test-suite.json"),
  SchemaStore: load("schemastore.json"),
};
