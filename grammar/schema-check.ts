// Which JSON Schemas the engine honours. XGrammar quietly ignores keywords it has no rule for (a
// schema with "not" would yield output that breaks it), so every keyword that constrains a value is
// checked here against the ones it honours, and any other is refused by name. Annotations and
// keywords unknown to JSON Schema are ignored, as the standard says. The walk is bounded (depth,
// size, counts) so a hostile schema costs little and never reaches the engine.

export class SchemaError extends Error {
  override name = "SchemaError";
  /** The keyword at fault, and where ("#/properties/a"). */
  constructor(readonly keyword: string, readonly at: string, message: string) {
    super(`${at}: ${message}`);
  }
}

export const SCHEMA_LIMITS = { depth: 32, subschemas: 2000, bytes: 64 << 10, count: 4096, enum: 1000 };

/** Formats the engine has a grammar for; any other is refused rather than left unchecked. */
export const FORMATS = new Set([
  "date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uri-reference",
  "json-pointer", "relative-json-pointer", "uuid",
]);

const TYPES = new Set(["string", "number", "integer", "boolean", "object", "array", "null"]);
/** Validation keywords the engine leaves unenforced. */
const REFUSED = new Set([
  "not", "if", "then", "else", "uniqueItems", "contains", "minContains", "maxContains", "dependentRequired", "dependentSchemas",
  "dependencies", "multipleOf", "$dynamicRef", "$recursiveRef", "additionalItems",
  // With it the engine drops the additionalProperties schema.
  "propertyNames",
]);
const COUNTS = ["minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"];
const MAP_OF_SCHEMAS = ["properties", "patternProperties", "$defs", "definitions"];
const ONE_SCHEMA = ["additionalProperties", "unevaluatedProperties", "unevaluatedItems", "items"];
const LIST_OF_SCHEMAS = ["anyOf", "oneOf", "allOf", "prefixItems"];

type Json = Record<string, unknown>;

/** Whether a "#/..." pointer goes only through subschemas the walk below reads (so its target was
 * checked, and is rewritten for the engine). */
function readSubschema(ref: string): boolean {
  // The engine resolves neither escapes ("~0", "%22") nor empty names, nor array indices.
  if (/[~%]/.test(ref) || ref.includes("//") || ref.endsWith("/")) return false;
  const parts = ref.slice(2).split("/").filter((p, i) => i > 0 || p !== "");
  for (let i = 0; i < parts.length; i++) {
    const k = parts[i];
    if (MAP_OF_SCHEMAS.includes(k)) i++;
    else if (!ONE_SCHEMA.includes(k)) return false;
  }
  return true;
}

/** Throws SchemaError naming the first keyword the engine cannot honour; returns the schema as text. */
export function checkSchema(schema: unknown): string {
  let seen = 0;
  const walk = (s: unknown, at: string, depth: number): void => {
    if (++seen > SCHEMA_LIMITS.subschemas) throw new SchemaError("schema", at, `has more than ${SCHEMA_LIMITS.subschemas} subschemas`);
    if (depth > SCHEMA_LIMITS.depth) throw new SchemaError("schema", at, `nests deeper than ${SCHEMA_LIMITS.depth} levels`);
    if (s === true) return;
    // The engine takes false only where it means "nothing more" (no other properties, items).
    if (s === false) {
      if (/\/(additionalProperties|items|unevaluatedProperties|unevaluatedItems)$/.test(at)) return;
      throw new SchemaError("schema", at, "a false schema (one no value matches) is only supported as additionalProperties or items");
    }
    if (typeof s !== "object" || s === null || Array.isArray(s)) throw new SchemaError("schema", at, "a schema must be an object or a boolean");
    const o = s as Json;
    for (const k of Object.keys(o)) {
      if (REFUSED.has(k)) throw new SchemaError(k, at, `the keyword "${k}" is not supported by the constrained decoder`);
    }
    const t = o.type;
    for (const name of Array.isArray(t) ? t : t === undefined ? [] : [t]) {
      if (typeof name !== "string" || !TYPES.has(name)) throw new SchemaError("type", at, `"type" must name JSON types (got ${JSON.stringify(name)})`);
    }
    if (o.format !== undefined && (typeof o.format !== "string" || !FORMATS.has(o.format))) {
      throw new SchemaError("format", at, `the format ${JSON.stringify(o.format)} is not supported (supported: ${[...FORMATS].join(", ")})`);
    }
    if (o.$ref !== undefined && (typeof o.$ref !== "string" || !(o.$ref === "#" || o.$ref.startsWith("#/")))) {
      throw new SchemaError("$ref", at, "only references within the schema (\"#/...\") are supported");
    }
    if (typeof o.$ref === "string" && !readSubschema(o.$ref)) {
      throw new SchemaError("$ref", at, `${JSON.stringify(o.$ref.slice(0, 200))} points into something other than subschemas (properties, items, $defs, ...), which the decoder does not read`);
    }
    for (const k of COUNTS) {
      const v = o[k];
      if (v !== undefined && (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > SCHEMA_LIMITS.count)) {
        throw new SchemaError(k, at, `"${k}" must be a whole number from 0 to ${SCHEMA_LIMITS.count}`);
      }
    }
    for (const k of ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]) {
      if (o[k] !== undefined && (typeof o[k] !== "number" || !Number.isFinite(o[k]))) throw new SchemaError(k, at, `"${k}" must be a number`);
    }
    if (o.enum !== undefined && (!Array.isArray(o.enum) || o.enum.length === 0 || o.enum.length > SCHEMA_LIMITS.enum)) {
      throw new SchemaError("enum", at, `"enum" must be a non-empty array of at most ${SCHEMA_LIMITS.enum} values`);
    }
    if (o.required !== undefined && (!Array.isArray(o.required) || !o.required.every((r) => typeof r === "string"))) {
      throw new SchemaError("required", at, "\"required\" must be an array of property names");
    }
    const oddName = (Array.isArray(o.required) ? (o.required as string[]) : []).find((n) => /["\\\x00-\x1f]/.test(n));
    if (oddName !== undefined) throw new SchemaError("required", at, `the property name ${JSON.stringify(oddName.slice(0, 80))} (with a quote, backslash or control character) is not supported`);
    if (o.pattern !== undefined && typeof o.pattern !== "string") throw new SchemaError("pattern", at, "\"pattern\" must be a string");
    for (const k of MAP_OF_SCHEMAS) {
      const m = o[k];
      if (m === undefined) continue;
      if (typeof m !== "object" || m === null || Array.isArray(m)) throw new SchemaError(k, at, `"${k}" must be an object of schemas`);
      // The engine's grammar breaks on names with a quote, a backslash or a control character.
      if (k === "properties") {
        const bad = Object.keys(m).find((n) => /["\\\x00-\x1f]/.test(n));
        if (bad !== undefined) throw new SchemaError(k, at, `the property name ${JSON.stringify(bad.slice(0, 80))} (with a quote, backslash or control character) is not supported`);
      }
      for (const [name, sub] of Object.entries(m)) walk(sub, `${at}/${k}/${name.replace(/~/g, "~0").replace(/\//g, "~1")}`, depth + 1);
    }
    for (const k of ONE_SCHEMA) {
      if (o[k] === undefined) continue;
      if (k === "items" && Array.isArray(o[k])) throw new SchemaError("items", at, "\"items\" as an array (draft 4 tuples) is not supported; use prefixItems");
      walk(o[k], `${at}/${k}`, depth + 1);
    }
    for (const k of LIST_OF_SCHEMAS) {
      const l = o[k];
      if (l === undefined) continue;
      if (!Array.isArray(l) || l.length === 0) throw new SchemaError(k, at, `"${k}" must be a non-empty array of schemas`);
      l.forEach((sub, i) => walk(sub, `${at}/${k}/${i}`, depth + 1));
    }
  };
  walk(schema, "#", 0);
  let text: string | undefined;
  try {
    text = JSON.stringify(schema);
  } catch {
    // Nesting under keys the walk does not follow can still be deep enough to overflow the stack.
    throw new SchemaError("schema", "#", "nests too deeply");
  }
  if (text === undefined) throw new SchemaError("schema", "#", "is not JSON");
  if (text.length > SCHEMA_LIMITS.bytes) throw new SchemaError("schema", "#", `is ${text.length} bytes; at most ${SCHEMA_LIMITS.bytes}`);
  return text;
}
