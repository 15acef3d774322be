// ajv, set up once for the tests: JSON Schema 2020-12 (prefixItems, $defs) with its formats.
import { Ajv2020 } from "ajv/dist/2020.js";
import addFormatsModule from "ajv-formats";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const addFormats = addFormatsModule as unknown as (ajv: Ajv2020) => Ajv2020;
const ajv = addFormats(new Ajv2020({ strict: false, allErrors: true }));

/** The errors of value against schema ("" when it is valid). */
export function schemaErrors(schema: unknown, value: unknown): string {
  const s = typeof schema === "object" && schema !== null ? { ...(schema as Record<string, unknown>) } : schema;
  // Drafts are read as 2020-12; an $id would clash with the same schema compiled before.
  if (typeof s === "object" && s !== null) for (const k of ["$schema", "$id"]) delete (s as Record<string, unknown>)[k];
  const validate = ajv.compile(s as object);
  return validate(value) ? "" : ajv.errorsText(validate.errors);
}

export interface CorpusEntry {
  readonly name: string;
  readonly schema: unknown;
}

export const CORPUS = (JSON.parse(readFileSync(fileURLToPath(new URL("./schema-corpus.json", import.meta.url)), "utf8")) as { schemas: CorpusEntry[] }).schemas;
