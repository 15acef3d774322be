// oneOf, which wants exactly one branch to match: the engine writes any branch, so a oneOf is taken
// only where no value can match two.
import { SchemaError } from "./schema-check.js";
import { has, validationKeys, type Json } from "./schema-keywords.js";

/** The schema a $ref-only schema stands for (followed a few times), else the schema. */
function target(s: unknown, root: unknown): unknown {
  for (let i = 0; i < 8 && typeof s === "object" && s !== null && typeof (s as Json).$ref === "string" && validationKeys(s as Json).length === 1; i++) {
    let t: unknown = root;
    for (const part of ((s as Json).$ref as string).slice(2).split("/").filter((p, k) => k > 0 || p !== "")) t = typeof t === "object" && t !== null ? (t as Json)[part] : undefined;
    s = t;
  }
  return s;
}

/** The values a schema allows, when it lists them (const or enum), as JSON text. */
function valuesOf(s: unknown): string[] | undefined {
  if (typeof s !== "object" || s === null) return undefined;
  const o = s as Json;
  if (has(o, "const")) return [JSON.stringify(o.const)];
  return Array.isArray(o.enum) ? (o.enum as unknown[]).map((v) => JSON.stringify(v)) : undefined;
}

/** The JSON types a schema allows, when plain to see (undefined: any, or not known). */
function typesOf(s: unknown, root: unknown, depth = 0): Set<string> | undefined {
  s = target(s, root);
  if (typeof s !== "object" || s === null || depth > 8) return undefined;
  const o = s as Json;
  if (has(o, "const") || has(o, "enum")) {
    const values = has(o, "const") ? [o.const] : (o.enum as unknown[]);
    return new Set(values.map((v) => (v === null ? "null" : Array.isArray(v) ? "array" : typeof v === "number" ? (Number.isInteger(v) ? "integer" : "number") : typeof v)));
  }
  if (typeof o.type === "string") return new Set([o.type]);
  if (Array.isArray(o.type)) return new Set(o.type as string[]);
  const union = (has(o, "anyOf") ? o.anyOf : o.oneOf) as unknown[] | undefined;
  if (Array.isArray(union)) {
    const sets = union.map((b) => typesOf(b, root, depth + 1));
    return sets.every((x) => x !== undefined) ? new Set(sets.flatMap((x) => [...x!])) : undefined;
  }
  return undefined;
}

/** oneOf wants exactly one branch to match; the engine writes any. Accepted when no value can match
 * two branches: their types differ, or they are objects told apart by a required property's values. */
export function checkDisjoint(branches: unknown[], at: string, root: unknown): void {
  const refuse = (): never => {
    throw new SchemaError("oneOf", at, "\"oneOf\" whose branches may overlap is not supported (the decoder cannot keep a value from matching two); use anyOf");
  };
  const sets = branches.map((b) => typesOf(b, root));
  const overlap = (x: Set<string>, y: Set<string>) =>
    [...x].some((t) => y.has(t) || (t === "integer" && y.has("number")) || (t === "number" && y.has("integer")));
  // Branches that list their values, no value in two.
  const values = branches.map((b) => valuesOf(target(b, root)));
  if (values.every((v) => v !== undefined) && new Set(values.flat()).size === values.flat().length) return;
  let disjoint = sets.every((s) => s !== undefined);
  for (let i = 0; disjoint && i < sets.length; i++) for (let j = i + 1; disjoint && j < sets.length; j++) if (overlap(sets[i]!, sets[j]!)) disjoint = false;
  if (disjoint) return;
  // Objects with a discriminator: a property every branch requires, with values no two share.
  const objects = branches.map((b) => target(b, root)).map((b) => (typeof b === "object" && b !== null ? (b as Json) : undefined));
  if (objects.some((o) => o === undefined || o.type !== "object")) refuse();
  const first = (objects[0]!.required as string[] | undefined) ?? [];
  for (const p of first) {
    const seen = new Set<string>();
    let ok = true;
    for (const o of objects) {
      const prop = target((o!.properties as Json | undefined)?.[p], root) as Json | undefined;
      const values = prop && has(prop, "const") ? [prop.const] : prop && Array.isArray(prop.enum) ? (prop.enum as unknown[]) : undefined;
      if (!((o!.required as string[] | undefined) ?? []).includes(p) || !values) {
        ok = false;
        break;
      }
      for (const v of values) {
        const key = JSON.stringify(v);
        if (seen.has(key)) ok = false;
        seen.add(key);
      }
    }
    if (ok) return;
  }
  refuse();
}
