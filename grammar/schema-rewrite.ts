// The schema as the engine is given it. XGrammar reads a subschema by its strongest keyword and drops
// the others silently: a "$ref", "const" or "enum", "anyOf"/"oneOf", "allOf" or "pattern" outranks
// its siblings, and keywords for a type it is not told ("minLength" with no "type") are ignored. So
// each schema is rewritten into one the engine reads whole: allOf merged into its parent, siblings of
// anyOf/oneOf pushed into each branch, enum values filtered by type, the type inferred from the
// keywords present. Every rewrite keeps to a subset of the values the schema allows; where none
// can, the keyword is refused by name (SchemaError), as checkSchema refuses what the engine lacks.
import { SchemaError } from "./schema-check.js";
import { enginePattern } from "./json-pattern.js";
import { FORMAT_PATTERNS } from "./schema-formats.js";
import { KIND, VALIDATION, has, validationKeys, type Json } from "./schema-keywords.js";
import { checkDisjoint } from "./schema-oneof.js";
import { integerPlaceholder } from "./integer-range.js";

const BOUNDS = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];
/** Bounds past this lose whole numbers to floating point (and the engine's ranges go wrong). */
const SAFE = 2 ** 53;
/** Characters a JSON string holds as they are: the class for strings with only a length. */
const PLAIN = '[^"\\\\\\x00-\\x1f]';

interface Ctx {
  readonly root: unknown;
  /** References inlined so far (each inlining may bring more: bounded). */
  inlined: number;
}

const pointerPart = (k: string) => k.replace(/~/g, "~0").replace(/\//g, "~1");

/**
 * The schema as the engine is given it (a schema checkSchema accepted), or a SchemaError naming the
 * keyword no rewrite can keep. Also: FORMAT_PATTERNS in place of formats, patterns narrowed to what
 * a JSON string holds unescaped, and a number with bounds written as a whole number within them
 * (the engine's decimal ranges let 1.2 through for a maximum of 1, and its integer ranges are wrong
 * too: integer-range.ts writes them).
 */
export function forEngine(schema: unknown): unknown {
  return rewrite(schema, "#", { root: schema, inlined: 0 });
}

/** A combination that no value satisfies (an anyOf branch it happens in is dropped). */
class NoValue extends SchemaError {}

function rewrite(schema: unknown, at: string, ctx: Ctx): unknown {
  if (typeof schema !== "object" || schema === null || Array.isArray(schema)) return schema;
  let o: Json = { ...(schema as Json) };
  const combined = Array.isArray(o.allOf) || (typeof o.$ref === "string" && validationKeys(o).length > 1) ||
    ((has(o, "anyOf") || has(o, "oneOf")) && validationKeys(o).length > 1);
  if (!combined) return rewriteOwn(o, at, ctx);
  // Below a combination the schema is no longer the one written: a refusal names the place combined.
  try {
    return rewriteOwn(combine(o, at, ctx), at, ctx);
  } catch (e) {
    if (!(e instanceof SchemaError) || e.at === at) throw e;
    const Again = e instanceof NoValue ? NoValue : SchemaError;
    throw new Again(e.keyword, at, `combining its subschemas (allOf, $ref, or keywords beside anyOf/oneOf): ${e.message}`);
  }
}

/** allOf merged in, a $ref beside other keywords inlined, siblings of anyOf/oneOf pushed into each
 * branch (a branch no value can then match is dropped). */
function combine(o: Json, at: string, ctx: Ctx): Json {
  if (Array.isArray(o.allOf)) {
    const parts = o.allOf as unknown[];
    delete o.allOf;
    parts.forEach((p, i) => (o = merge(o, p, `${at}/allOf/${i}`, ctx)));
  }
  if (typeof o.$ref === "string" && validationKeys(o).length > 1) o = inline(o, at, ctx);
  if (has(o, "anyOf") && has(o, "oneOf")) throw new SchemaError("oneOf", at, "\"anyOf\" and \"oneOf\" together are not supported");
  const union = has(o, "anyOf") ? "anyOf" : has(o, "oneOf") ? "oneOf" : undefined;
  if (union) {
    const siblings = Object.fromEntries(validationKeys(o).filter((k) => k !== union).map((k) => [k, o[k]]));
    if (Object.keys(siblings).length > 0) {
      let lastNoValue: NoValue | undefined;
      const branches = (o[union] as unknown[]).flatMap((b, i) => {
        try {
          return [merge(siblings, b, `${at}/${union}/${i}`, ctx)];
        } catch (e) {
          if (!(e instanceof NoValue)) throw e;
          lastNoValue = e;
          return [];
        }
      });
      if (branches.length === 0) throw lastNoValue!;
      o[union] = branches;
      for (const k of Object.keys(siblings)) delete o[k];
    }
  }
  return o;
}

const ANNOTATIONS = ["title", "description", "$comment", "examples", "default", "deprecated", "readOnly", "writeOnly", "$schema"];

function rewriteOwn(o: Json, at: string, ctx: Ctx): Json {
  // Annotations constrain nothing: without them the same schema from two clients (LangChain titles
  // every subschema, the AI SDK names the draft) is one grammar, compiled once (constraint.ts's key).
  for (const k of ANNOTATIONS) delete o[k];
  if (has(o, "oneOf")) checkDisjoint(o.oneOf as unknown[], at, ctx.root);
  if (has(o, "const") || has(o, "enum")) o = valuesOnly(o, at);
  if (o.type === undefined && !["$ref", "enum", "const", "anyOf", "oneOf"].some((k) => has(o, k))) {
    const kinds = [...new Set(Object.keys(o).map((k) => KIND[k]).filter((k) => k !== undefined))];
    if (kinds.length > 0) o.type = kinds.length === 1 ? kinds[0] : kinds;
  }
  // With no allOf and no siblings of anyOf left, the unevaluated are the additional.
  if (has(o, "unevaluatedProperties")) {
    if (!has(o, "additionalProperties")) o.additionalProperties = o.unevaluatedProperties;
    delete o.unevaluatedProperties;
  }
  if (has(o, "unevaluatedItems")) {
    if (!has(o, "items")) o.items = o.unevaluatedItems;
    delete o.unevaluatedItems;
  }
  const kinds = typeof o.type === "string" ? [o.type] : Array.isArray(o.type) ? (o.type as string[]) : [];
  if (kinds.includes("object")) o = objectRule(o, at, ctx);
  // The engine takes a missing "items" or "additionalProperties" as false (none): with a minimum
  // count it then refuses the schema, so they are said to be any.
  if (kinds.includes("array") && (o.minItems as number) > 0 && !has(o, "items") && !has(o, "prefixItems")) o.items = true;
  if (kinds.includes("object") && (o.minProperties as number) > 0 && !has(o, "additionalProperties") && !has(o, "patternProperties")) o.additionalProperties = true;
  for (const k of ["properties", "$defs", "definitions"]) {
    if (has(o, k)) o[k] = Object.fromEntries(Object.entries(o[k] as Json).map(([n, s]) => [n, rewrite(s, `${at}/${k}/${pointerPart(n)}`, ctx)]));
  }
  if (has(o, "patternProperties")) {
    o.patternProperties = Object.fromEntries(Object.entries(o.patternProperties as Json).map(([p, s]) =>
      [enginePattern(p, at, "patternProperties"), rewrite(s, `${at}/patternProperties/${pointerPart(p)}`, ctx)]));
  }
  for (const k of ["additionalProperties", "items"]) if (has(o, k)) o[k] = rewrite(o[k], `${at}/${k}`, ctx);
  for (const k of ["prefixItems", "anyOf", "oneOf"]) if (has(o, k)) o[k] = (o[k] as unknown[]).map((s, i) => rewrite(s, `${at}/${k}/${i}`, ctx));
  const types = typeof o.type === "string" ? [o.type] : Array.isArray(o.type) ? (o.type as string[]) : [];
  if (types.includes("number") || types.includes("integer")) o = wholeNumbers(o, at);
  if (types.includes("string")) o = stringRule(o, at);
  return o;
}

/** The schema with its $ref's target merged in (siblings of $ref are otherwise dropped by the engine). */
function inline(o: Json, at: string, ctx: Ctx): Json {
  const ref = o.$ref as string;
  if (++ctx.inlined > 64) throw new SchemaError("$ref", at, "references nest too deeply to combine with the keywords beside them");
  let target: unknown = ctx.root;
  for (const part of ref.slice(2).split("/").filter((p, i) => i > 0 || p !== "")) {
    const key = decodeURIComponent(part).replace(/~1/g, "/").replace(/~0/g, "~");
    target = typeof target === "object" && target !== null ? (target as Json)[key] : undefined;
  }
  if (target === undefined) throw new SchemaError("$ref", at, `the reference ${JSON.stringify(ref)} points at nothing`);
  const rest = { ...o };
  delete rest.$ref;
  return merge(rest, target, at, ctx);
}

/** A schema both a and b hold for (a subset of the values both allow), or a SchemaError. */
function merge(a: Json, b: unknown, at: string, ctx: Ctx, nested = false): Json {
  // Two subschemas of one value (not a schema and its own allOf/anyOf/$ref): a's unevaluated* would
  // see only a's properties and items.
  for (const k of ["unevaluatedProperties", "unevaluatedItems"]) {
    if (nested && has(a, k)) throw new SchemaError(k, at, `"${k}" in a subschema combined with another is not supported`);
  }
  if (b === true) return a;
  if (b === false || typeof b !== "object" || b === null || Array.isArray(b)) throw new NoValue("schema", at, "combines with a schema that allows no value");
  let other = { ...(b as Json) };
  // Its unevaluated* would see only its own properties and items, not those merged beside them.
  for (const k of ["unevaluatedProperties", "unevaluatedItems"]) {
    if (has(other, k)) throw new SchemaError(k, at, `"${k}" in a subschema applied in place (allOf, $ref, anyOf/oneOf with keywords beside) is not supported`);
  }
  if (Array.isArray(other.allOf)) {
    const parts = other.allOf as unknown[];
    delete other.allOf;
    parts.forEach((p, i) => (other = merge(other, p, `${at}/allOf/${i}`, ctx)));
  }
  if (typeof other.$ref === "string" && validationKeys(a).length > 0) other = inline(other, at, ctx);
  let out = { ...a };
  if (typeof out.$ref === "string" && validationKeys(other).length > 0) out = inline(out, at, ctx);
  for (const [k, v] of Object.entries(other)) {
    const u = out[k];
    if (u === undefined || JSON.stringify(u) === JSON.stringify(v)) {
      out[k] = v;
      continue;
    }
    const refuse = (): never => {
      throw new SchemaError(k, at, `two different "${k}" to combine (allOf, or keywords beside anyOf/oneOf) are not supported`);
    };
    switch (k) {
      case "type": {
        const list = (t: unknown) => (Array.isArray(t) ? (t as string[]) : [t as string]);
        const both = list(u).flatMap((x) => list(v).flatMap((y) => (x === y ? [x] : (x === "integer" && y === "number") || (x === "number" && y === "integer") ? ["integer"] : [])));
        if (both.length === 0) throw new NoValue("type", at, "combines types that have no value in common");
        out.type = both.length === 1 ? both[0] : [...new Set(both)];
        break;
      }
      case "required":
        out.required = [...new Set([...(u as string[]), ...(v as string[])])];
        break;
      case "properties": {
        const p = { ...(u as Json) };
        for (const [n, s] of Object.entries(v as Json)) p[n] = n in p ? mergeAny(p[n], s, `${at}/properties/${pointerPart(n)}`, ctx) : s;
        out.properties = p;
        break;
      }
      case "additionalProperties": case "items": case "unevaluatedProperties": case "unevaluatedItems":
        out[k] = mergeAny(u, v, `${at}/${k}`, ctx);
        break;
      case "minLength": case "minItems": case "minProperties": case "minimum": case "exclusiveMinimum":
        out[k] = Math.max(u as number, v as number);
        break;
      case "maxLength": case "maxItems": case "maxProperties": case "maximum": case "exclusiveMaximum":
        out[k] = Math.min(u as number, v as number);
        break;
      case "enum": {
        const keep = new Set((v as unknown[]).map((x) => JSON.stringify(x)));
        out.enum = (u as unknown[]).filter((x) => keep.has(JSON.stringify(x)));
        if ((out.enum as unknown[]).length === 0) throw new NoValue("enum", at, "combines enums with no value in common");
        break;
      }
      case "$defs": case "definitions":
        for (const n of Object.keys(v as Json)) if (n in (u as Json) && JSON.stringify((u as Json)[n]) !== JSON.stringify((v as Json)[n])) refuse();
        out[k] = { ...(u as Json), ...(v as Json) };
        break;
      default:
        if (VALIDATION.has(k)) refuse();
      // an annotation: the first is kept
    }
  }
  // An "items" with no "prefixItems" beside it holds for every item, also those the other side's
  // prefixItems describe.
  for (const [x, y] of [[a, other], [other, a]] as const) {
    if (has(x, "items") && !has(x, "prefixItems") && has(y, "prefixItems") && Array.isArray(y.prefixItems)) {
      out.prefixItems = (y.prefixItems as unknown[]).map((p, i) => mergeAny(p, x.items, `${at}/prefixItems/${i}`, ctx));
    }
  }
  // A property one side names may be one the other side's additionalProperties or patternProperties govern.
  for (const [x, y] of [[a, other], [other, a]] as const) {
    if (!has(x, "additionalProperties") && !has(x, "patternProperties")) continue;
    const named = new Set(Object.keys((x.properties as Json | undefined) ?? {}));
    const extra = [...Object.keys((y.properties as Json | undefined) ?? {}), ...((y.required as string[] | undefined) ?? [])].filter((n) => !named.has(n));
    if (extra.length > 0) throw new SchemaError(has(x, "additionalProperties") ? "additionalProperties" : "patternProperties", at, `combines with a schema naming the property ${JSON.stringify(extra[0])}, which is not supported`);
  }
  return out;
}

function mergeAny(a: unknown, b: unknown, at: string, ctx: Ctx): unknown {
  if (a === true) return b;
  if (b === true) return a;
  if (a === false || b === false) return false;
  return merge(a as Json, b, at, ctx, true);
}

/** const or enum: the engine writes one of the values and drops the rest, so the values are kept
 * that have the schema's type, and any other keyword beside them is refused. */
function valuesOnly(o: Json, at: string): Json {
  const beside = validationKeys(o).filter((k) => k !== "type" && k !== "enum" && k !== "const");
  if (beside.length > 0) throw new SchemaError(beside[0], at, `"${beside[0]}" beside "enum" or "const" is not supported`);
  let values = has(o, "const") ? [o.const] : (o.enum as unknown[]);
  if (has(o, "const") && has(o, "enum")) values = values.filter((v) => (o.enum as unknown[]).some((e) => JSON.stringify(e) === JSON.stringify(v)));
  const types = o.type === undefined ? undefined : Array.isArray(o.type) ? (o.type as string[]) : [o.type as string];
  const kept = types ? values.filter((v) => types.some((t) => hasType(v, t))) : values;
  if (kept.length === 0) throw new NoValue(has(o, "const") ? "const" : "enum", at, "has no value of the schema's type");
  const out = Object.fromEntries(Object.entries(o).filter(([k]) => !VALIDATION.has(k)));
  out.enum = kept;
  return out;
}

function hasType(v: unknown, t: string): boolean {
  switch (t) {
    case "null": return v === null;
    case "boolean": return typeof v === "boolean";
    case "string": return typeof v === "string";
    case "number": return typeof v === "number";
    case "integer": return typeof v === "number" && Number.isInteger(v);
    case "array": return Array.isArray(v);
    case "object": return typeof v === "object" && v !== null && !Array.isArray(v);
  }
  return false;
}

function wholeNumbers(o: Json, at: string): Json {
  const num = (k: string) => (typeof o[k] === "number" ? (o[k] as number) : undefined);
  if (!BOUNDS.some((k) => num(k) !== undefined)) return o;
  for (const k of BOUNDS) if (Math.abs(num(k) ?? 0) > SAFE) throw new SchemaError(k, at, `"${k}" beyond ±2^53 is not supported`);
  const lo = Math.max(num("minimum") !== undefined ? Math.ceil(num("minimum")!) : -Infinity, num("exclusiveMinimum") !== undefined ? Math.floor(num("exclusiveMinimum")!) + 1 : -Infinity);
  const hi = Math.min(num("maximum") !== undefined ? Math.floor(num("maximum")!) : Infinity, num("exclusiveMaximum") !== undefined ? Math.ceil(num("exclusiveMaximum")!) - 1 : Infinity);
  if (lo > hi) throw new NoValue("minimum", at, "the bounds leave no whole number (the decoder writes whole numbers for bounded numbers)");
  // The integers go as a placeholder the engine's thread swaps for their rule (integer-range.ts).
  const range = { const: integerPlaceholder(lo, hi) };
  const others = (typeof o.type === "string" ? [o.type] : (o.type as string[])).filter((t) => t !== "number" && t !== "integer");
  if (others.length === 0) return range;
  const rest: Json = { ...o, type: others.length === 1 ? others[0] : others };
  for (const k of BOUNDS) delete rest[k];
  return { anyOf: [range, rest] };
}

/** Formats as patterns; a pattern (which outranks lengths and formats in the engine) made safe. */
function stringRule(o: Json, at: string): Json {
  const out = { ...o };
  const lengths = has(o, "minLength") || has(o, "maxLength");
  if (typeof out.format === "string" && FORMAT_PATTERNS[out.format] !== undefined) {
    if (has(out, "pattern")) throw new SchemaError("format", at, "\"format\" beside \"pattern\" is not supported");
    out.pattern = FORMAT_PATTERNS[out.format];
    delete out.format;
  }
  if (has(out, "pattern")) {
    if (lengths) throw new SchemaError(has(o, "minLength") ? "minLength" : "maxLength", at, "a length beside \"pattern\" or \"format\" is not supported");
    out.pattern = enginePattern(out.pattern as string, at);
  } else if (lengths) {
    out.pattern = `^${PLAIN}{${(o.minLength as number | undefined) ?? 0},${(o.maxLength as number | undefined) ?? ""}}$`;
    delete out.minLength;
    delete out.maxLength;
  }
  return out;
}

/** XGrammar writes only the required properties it finds in "properties", and gives a property that
 * matches patterns its "properties" schema alone (or one pattern's): so each is given every schema
 * that applies to it, and patterns that might both match one name are refused. */
function objectRule(o: Json, at: string, ctx: Ctx): Json {
  const out = { ...o };
  const patterns = Object.entries((o.patternProperties as Json | undefined) ?? {});
  const prefixes = patterns.map(([p]) => literalPrefix(p));
  for (let i = 0; i < patterns.length; i++) {
    for (let j = i + 1; j < patterns.length; j++) {
      const x = prefixes[i], y = prefixes[j];
      if (x === undefined || y === undefined || x.startsWith(y) || y.startsWith(x)) {
        throw new SchemaError("patternProperties", at, `patterns that may both match one property name (${JSON.stringify(patterns[i][0])}, ${JSON.stringify(patterns[j][0])}) are not supported`);
      }
    }
  }
  const matching = (name: string) => patterns.filter(([p]) => {
    try {
      return new RegExp(p, "u").test(name);
    } catch {
      throw new SchemaError("patternProperties", at, `the pattern ${JSON.stringify(p.slice(0, 80))} is not a valid regular expression`);
    }
  });
  const props: Json = { ...((o.properties as Json | undefined) ?? {}) };
  for (const [name, s] of Object.entries(props)) {
    let merged = s;
    for (const [p, ps] of matching(name)) merged = mergeAny(merged, ps, `${at}/patternProperties/${pointerPart(p)}`, ctx);
    props[name] = merged;
  }
  for (const name of (o.required as string[] | undefined) ?? []) {
    if (name in props) continue;
    const m = matching(name);
    const s = m.length > 0 ? m[0][1] : o.additionalProperties ?? true;
    if (s === false) throw new NoValue("required", at, `requires ${JSON.stringify(name)}, which the schema does not allow`);
    props[name] = s;
  }
  if (Object.keys(props).length > 0) out.properties = props;
  // With patternProperties the engine drops properties and required: the named properties are kept
  // and no others allowed (a subset of what the schema allows).
  if (patterns.length > 0 && Object.keys(props).length > 0) {
    delete out.patternProperties;
    out.additionalProperties = false;
  }
  return out;
}

/** The text every match of an anchored pattern starts with ("^x-" gives "x-"), or undefined. */
function literalPrefix(p: string): string | undefined {
  if (!p.startsWith("^")) return undefined;
  const m = /^[^\\.[\](){}*+?|^$]*/.exec(p.slice(1))![0];
  // A quantifier after the last literal makes it optional.
  const next = p[1 + m.length];
  const prefix = next === "*" || next === "?" || next === "{" ? m.slice(0, -1) : m;
  return prefix.length > 0 ? prefix : undefined;
}
