// Constrained decoding without a model: over the shipped model's vocabulary, a seeded random walk
// through the tokens each mask allows must give text that parses and validates against the schema
// (ajv), and an end token must be allowed exactly where the text so far is a complete valid value.
// Keywords the engine does not enforce are refused by name, and hostile schemas cost little.
import { describe, expect, it } from "vitest";
import { GrammarSet, SchemaError, checkSchema, closingStart, forEngine } from "../../dist/grammar/index.js";
import { takes, tok, walk } from "./walk.js";

describe("schemas the engine cannot honour are refused by keyword", () => {
  it("names the keyword and where it is", () => {
    const cases: [unknown, string, RegExp][] = [
      [{ not: { type: "string" } }, "not", /#: .*"not"/],
      [{ type: "object", properties: { a: { type: "array", uniqueItems: true } } }, "uniqueItems", /#\/properties\/a/],
      [{ type: "integer", multipleOf: 3 }, "multipleOf", /multipleOf/],
      [{ type: "string", format: "credit-card" }, "format", /credit-card/],
      [{ $ref: "https://example.com/x.json" }, "$ref", /within the schema/],
      [{ type: "string", maxLength: 1e9 }, "maxLength", /0 to 4096/],
      [{ type: "wizard" }, "type", /JSON types/],
      [{ enum: [] }, "enum", /non-empty/],
    ];
    for (const [schema, keyword, message] of cases) {
      let err: unknown;
      try {
        checkSchema(schema);
      } catch (e) {
        err = e;
      }
      expect(err, keyword).toBeInstanceOf(SchemaError);
      expect((err as SchemaError).keyword, JSON.stringify(schema)).toBe(keyword);
      expect((err as SchemaError).message).toMatch(message);
    }
  });

  it("bounds hostile schemas: deep nesting, very many subschemas, a huge text", () => {
    let deep: unknown = { type: "integer" };
    for (let i = 0; i < 10_000; i++) deep = { type: "array", items: deep };
    expect(() => checkSchema(deep)).toThrow(/deeper than 32/);
    const wide = { type: "object", properties: Object.fromEntries(Array.from({ length: 3000 }, (_, i) => [`p${i}`, { type: "integer" }])) };
    expect(() => checkSchema(wide)).toThrow(/more than 2000 subschemas/);
    expect(() => checkSchema({ type: "string", description: "x".repeat(100_000) })).toThrow(/bytes/);
    let hidden: unknown = 1;
    for (let i = 0; i < 100_000; i++) hidden = [hidden];
    expect(() => checkSchema({ type: "string", "x-deep": hidden })).toThrow(/nests too deeply/);
    // Annotations and keywords JSON Schema does not know are left alone, as the standard says.
    expect(() => checkSchema({ type: "string", title: "t", "x-vendor": { not: 1 }, examples: ["a"] })).not.toThrow();
  });
});

describe("what the engine reads of a schema", () => {
  it("leaves annotations out (LangChain's titles, the AI SDK's $schema), so clients' copies of one schema share a grammar; properties named like annotations stay", () => {
    const bare = { type: "object", properties: { title: { type: "string" }, description: { type: "integer" }, tags: { type: "array", items: { type: "string" } } }, required: ["title"] };
    const annotated = {
      $schema: "http://json-schema.org/draft-07/schema#", title: "Book", description: "a book", examples: [{}], $comment: "x",
      type: "object", required: ["title"],
      properties: {
        title: { type: "string", title: "Title", default: "" }, description: { type: "integer", description: "pages", deprecated: false },
        tags: { type: "array", title: "Tags", items: { type: "string", readOnly: true, writeOnly: false } },
      },
    };
    const engine = forEngine(bare) as { properties: Record<string, unknown> };
    expect(forEngine(annotated)).toEqual(engine);
    expect(Object.keys(engine.properties)).toEqual(["title", "description", "tags"]);
    // The client's own schema is left as it was.
    expect(annotated.title).toBe("Book");
  });
});

describe("constrained decoding over the shipped model's vocabulary", () => {
  it("JSON mode gives an object; a GBNF grammar is followed; an engine error is a GrammarError with its reason", async () => {
    const set = await GrammarSet.forTokenizer(tok);
    const json = await set.constraint({ kind: "json-object" });
    const a = await walk(json, 7, closingStart(200), 200);
    json.dispose();
    expect(a.ended).toBe(true);
    const v = JSON.parse(a.text) as unknown;
    expect(typeof v === "object" && v !== null && !Array.isArray(v)).toBe(true);

    const g = await set.constraint({ kind: "grammar", grammar: 'root ::= "yes" | "no" | "maybe " [a-z]+' });
    const b = await walk(g, 8, 20, 40);
    g.dispose();
    expect(b.text).toMatch(/^(yes|no|maybe [a-z]+)$/);

    await expect(set.constraint({ kind: "grammar", grammar: "root ::= undefined_rule" })).rejects.toThrow(/Rule "undefined_rule" is not defined/);
    await expect(set.constraint({ kind: "json-schema", schema: { type: "string", pattern: "(?<=a)b" } })).rejects.toThrow(/lookaround/);
    // The engine aborts on a class ending at U+1680: its thread is replaced, the next request served.
    await expect(set.constraint({ kind: "grammar", grammar: "root ::= [^a\u167f-\u1680]" })).rejects.toThrow(/the engine failed/);
    // The engine is still usable after refusing.
    const again = await set.constraint({ kind: "json-schema", schema: { enum: ["x"] } });
    expect((await walk(again, 9, 10, 10)).text).toBe('"x"');
    again.dispose();
  });

  it("bounded integers take exactly the whole numbers within the bounds (the engine's own ranges do not)", async () => {
    const set = await GrammarSet.forTokenizer(tok);
    const ranges: [number | undefined, number | undefined][] = [[0, 120], [5, undefined], [-5, undefined], [undefined, -5], [15, 300], [-120, -3], [7, 7], [-1, 1], [99, 1001]];
    for (const [lo, hi] of ranges) {
      const schema = { type: "integer", ...(lo !== undefined && { minimum: lo }), ...(hi !== undefined && { maximum: hi }) };
      for (let n = (lo ?? (hi ?? 0) - 150) - 30; n <= (hi ?? (lo ?? 0) + 150) + 30; n++) {
        const c = await set.constraint({ kind: "json-schema", schema });
        expect(await takes(c, String(n)), `${n} for ${JSON.stringify(schema)}`).toBe((lo === undefined || n >= lo) && (hi === undefined || n <= hi));
        c.dispose();
      }
      // Nor a bare sign, a leading zero or "-0".
      for (const text of ["-", "01", "-0", "00"]) {
        const c = await set.constraint({ kind: "json-schema", schema });
        expect(await takes(c, text), `${text} for ${JSON.stringify(schema)}`).toBe(false);
        c.dispose();
      }
    }
    set.close();
  }, 300_000);
});
