// The schema corpora (test/grammar/corpus/: hand-written ones, every draft 2020-12 test group of the
// JSON-Schema-Test-Suite, and real configuration schemas from SchemaStore) over the shipped model's
// vocabulary. Prints the share the decoder accepts. Each accepted schema: a seeded random walk through
// what the masks allow gives text that ajv finds valid, an end token is allowed only where the text
// so far is a complete valid value, and no instance of the source's tests that ajv finds invalid is
// taken by the grammar. Each refused one: a SchemaError naming a keyword found at the location it
// gives (remote $refs refused as "$ref"), before the engine sees it.
import { describe, expect, it } from "vitest";
import { GrammarSet, SchemaError, closingStart, type GrammarConstraint } from "../../dist/grammar/index.js";
import { dumps, takes, tok, walk } from "./walk.js";
import { CORPORA, schemaErrors, type CorpusEntry } from "./validate.js";

const MAX_STEPS = 600;

/** Schemas where the walk's closing picks (the sampler's, at the end of a reply's budget) go round
 * without ending the value: pickClosing tries bytes one at a time and does not search, so a pattern
 * whose way out is a literal ("\\w+\\.dll") can hold it. The text so far is still a valid prefix
 * (a reply would end with finish_reason "length"). Listed so that a change either way is seen. */
const CLOSER_LOOPS = new Set(["BizTalkServerApplicationSchema.json"]);

/** The value at a JSON pointer ("#/properties/a~1b") in the schema, or undefined. */
function atPointer(schema: unknown, pointer: string): unknown {
  let v = schema;
  for (const part of pointer.replace(/^#/, "").split("/").slice(1)) {
    const key = part.replace(/~1/g, "/").replace(/~0/g, "~");
    if (typeof v !== "object" || v === null || !(key in v)) return undefined;
    v = (v as Record<string, unknown>)[key];
  }
  return v;
}

/** Whether the key occurs in any object within v. */
function hasKey(v: unknown, key: string): boolean {
  if (Array.isArray(v)) return v.some((x) => hasKey(x, key));
  if (typeof v !== "object" || v === null) return false;
  return key in v || Object.values(v).some((x) => hasKey(x, key));
}

/** Whether the schema has a $ref outside itself anywhere (a remote one, or relative to an $id). */
function hasRemoteRef(s: unknown): boolean {
  if (Array.isArray(s)) return s.some(hasRemoteRef);
  if (typeof s !== "object" || s === null) return false;
  const ref = (s as Record<string, unknown>).$ref;
  if (typeof ref === "string" && ref !== "#" && !ref.startsWith("#/")) return true;
  return Object.values(s).some(hasRemoteRef);
}

interface Census {
  accepted: number;
  total: number;
  refusedBy: Map<string, number>;
  /** Instances valid by ajv that the grammar takes, of those tried. */
  validTaken: number;
  validTried: number;
}

async function check(set: GrammarSet, entry: CorpusEntry, seed: number, census: Census): Promise<void> {
  census.total++;
  const what = `${entry.name} (${entry.source ?? "hand-written"})`;
  let c: GrammarConstraint;
  try {
    c = await set.constraint({ kind: "json-schema", schema: entry.schema });
  } catch (e) {
    if (e instanceof SchemaError) {
      // The location is in the schema and the keyword there: on it, or (where subschemas were combined,
      // which a $ref may bring from elsewhere) within it. A limit on the schema is named "schema".
      const there = atPointer(entry.schema, e.at);
      expect(there, `${what}: ${e.message}`).not.toBeUndefined();
      if (e.keyword !== "schema") {
        const combines = ["allOf", "anyOf", "oneOf", "$ref"].some((k) => hasKey(there, k));
        const found = Object.keys(there as object).includes(e.keyword) || (combines && hasKey(hasKey(there, "$ref") ? entry.schema : there, e.keyword));
        expect(found, `${what}: ${e.keyword} is not at ${e.at}: ${e.message}`).toBe(true);
      }
      census.refusedBy.set(e.keyword, (census.refusedBy.get(e.keyword) ?? 0) + 1);
    } else {
      // The engine's own refusals name no keyword: none is left in the corpora.
      throw new Error(`${what}: refused by the engine, not by keyword: ${(e as Error).message}`);
    }
    expect(entry.name.startsWith("refused") || entry.source !== undefined, `${what} was refused: ${(e as Error).message}`).toBe(true);
    return;
  }
  expect(hasRemoteRef(entry.schema), `${what} has a remote $ref and was accepted`).toBe(false);
  expect(entry.name.startsWith("refused"), `${what} was expected refused`).toBe(false);
  census.accepted++;
  try {
    // Closing from the sampler's point for a 600-token reply, with room for schemas that require much.
    const { text, ended } = await walk(c, seed, closingStart(MAX_STEPS), 4 * MAX_STEPS, (sofar, allowsEnd) => {
      if (allowsEnd) expect(schemaErrors(entry.schema, JSON.parse(sofar)), `${what}: ${sofar.slice(0, 300)}`).toBe("");
    });
    expect(ended, `${what} ${ended ? "ended, but is listed in CLOSER_LOOPS" : "did not end"}: ${text.slice(-300)}`).toBe(!CLOSER_LOOPS.has(entry.name));
    if (ended) expect(schemaErrors(entry.schema, JSON.parse(text)), `${what}: ${text.slice(0, 300)}`).toBe("");
  } finally {
    c.dispose();
  }
  for (const { data: instance, valid: suiteSays } of entry.instances ?? []) {
    const valid = schemaErrors(entry.schema, instance) === "";
    // Where ajv and the suite disagree on a schema with no "format" (which the suite takes as a
    // note), ajv is wrong (it reads inherited properties such as "toString"): the instance is left out.
    if (!valid && suiteSays && !hasKey(entry.schema, "format")) continue;
    const m = await set.constraint({ kind: "json-schema", schema: entry.schema });
    try {
      const taken = await takes(m, dumps(instance));
      if (valid) {
        census.validTried++;
        if (taken) census.validTaken++;
      } else {
        expect(taken, `${what} takes ${dumps(instance)}, which ajv finds invalid`).toBe(false);
      }
    } finally {
      m.dispose();
    }
  }
}

describe("the schema corpora on the shipped model's vocabulary", () => {
  for (const [name, corpus] of Object.entries(CORPORA)) {
    it(`${name}: every accepted schema yields valid JSON; every refused one is refused by keyword and location`, async () => {
      const set = await GrammarSet.forTokenizer(tok);
      const census: Census = { accepted: 0, total: 0, refusedBy: new Map(), validTaken: 0, validTried: 0 };
      // Every schema is checked; the failures are reported together.
      const failures: string[] = [];
      try {
        for (const [k, entry] of corpus.schemas.entries()) {
          await check(set, entry, 1000 + k, census).catch((e: unknown) => failures.push((e as Error).message.slice(0, 800)));
        }
      } finally {
        set.close();
      }
      const refused = [...census.refusedBy].sort((a, b) => b[1] - a[1]).map(([k, n]) => `${k} ${n}`).join(", ");
      console.log(`${name}: ${census.accepted} of ${census.total} schemas accepted (${((100 * census.accepted) / census.total).toFixed(0)}%); ` +
        `refused by ${refused || "none"}; the grammar takes ${census.validTaken} of the ${census.validTried} valid test instances`);
      expect(failures).toEqual([]);
      expect(census.total).toBe(corpus.schemas.length);
      expect(census.accepted).toBeGreaterThan(0);
    }, 600_000);
  }
});
