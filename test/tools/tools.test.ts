// Tool calls: each model family's format is read back from a reply however it is cut into pieces,
// and the grammar of each format, walked at random over the shipped vocabulary, only ever yields
// calls that parse, name a given tool, and whose arguments validate against its schema (ajv).
import { describe, expect, it } from "vitest";
import { Rng } from "../../dist/engine/index.js";
import { GrammarSet, closingStart } from "../../dist/grammar/index.js";
import { Tokenizer } from "../../dist/model/index.js";
import { FORMATS, HarmonyParser, ToolCallParser, detectFormat, toolGrammar, type CallFormat, type FormatName, type ReplyEvent, type ToolDef } from "../../dist/tools/index.js";
import { schemaErrors } from "../grammar/validate.js";

const TOOLS: ToolDef[] = [
  { name: "get_weather", description: "weather now", parameters: { type: "object", properties: { city: { type: "string", maxLength: 20 }, unit: { enum: ["c", "f"] } }, required: ["city", "unit"], additionalProperties: false } },
  { name: "add", parameters: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } }, required: ["a", "b"], additionalProperties: false } },
];
const NAMES = TOOLS.map((t) => t.name);

/** Feeds text in pieces of `size` characters; returns the content, the calls and the events. */
function parse(f: CallFormat, text: string, size: number) {
  const p = f.name === "harmony" ? new HarmonyParser(NAMES) : new ToolCallParser(f, NAMES);
  const events: ReplyEvent[] = [];
  for (let i = 0; i < text.length; i += size) events.push(...p.push(text.slice(i, i + size)));
  const end = p.finish();
  events.push(...end.events);
  return { content: end.content, calls: p.calls, events };
}

describe("reading calls back", () => {
  const replies: [FormatName, string, string | null][] = [
    ["hermes", 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "P \\"}\\n</tool_call>", "unit": "c"}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', "Let me look."],
    ["llama3", '{"name": "add", "parameters": {"a": 1, "b": 2}}', null],
    ["mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]', null],
    ["harmony", '<|channel|>final<|message|>Let me look.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "P \\"}<|end|>", "unit": "c"}', "Let me look."],
    ["generic", '{"tool_call": {"name": "add", "arguments": {"a": 1, "b": 2}}}\n{"tool_call": {"name": "get_weather", "arguments": {"city": "x", "unit": "f"}}}', null],
  ];
  for (const [name, text, content] of replies) {
    it(`${name}: the same calls and content whatever the pieces`, () => {
      const whole = parse(FORMATS[name], text, text.length);
      expect(whole.content).toBe(content);
      expect(whole.calls.length).toBeGreaterThan(0);
      for (const c of whole.calls) {
        expect(NAMES).toContain(c.name);
        const tool = TOOLS.find((t) => t.name === c.name)!;
        expect(schemaErrors(tool.parameters, JSON.parse(c.arguments))).toBe("");
      }
      for (const size of [1, 2, 3, 7]) {
        const cut = parse(FORMATS[name], text, size);
        expect(cut.content).toBe(content);
        expect(cut.calls.map((c) => [c.name, c.arguments])).toEqual(whole.calls.map((c) => [c.name, c.arguments]));
        // Streamed: each call's start once (with its id), then its arguments, in order.
        const starts = cut.events.filter((e) => e.kind === "call");
        expect(starts.map((e) => (e as { index: number }).index)).toEqual(whole.calls.map((_, i) => i));
        for (const [i, c] of cut.calls.entries()) {
          const pieces = cut.events.filter((e) => e.kind === "arguments" && e.index === i).map((e) => (e as { text: string }).text).join("");
          expect(pieces).toBe(c.arguments);
        }
      }
    });
  }

  it("text with no call is content; the generic format's text reply is unwrapped", () => {
    expect(parse(FORMATS.hermes, "Hello <tool_c there", 2)).toMatchObject({ content: "Hello <tool_c there", calls: [] });
    expect(parse(FORMATS.generic, '{"response": "Hi \\"you\\""}', 3)).toMatchObject({ content: 'Hi "you"', calls: [] });
  });

  it("finds the format in the template", () => {
    expect(detectFormat("{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>").name).toBe("hermes");
    expect(detectFormat("{%- if tools %}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]").name).toBe("mistral");
    expect(detectFormat("{%- if tools %}<|start_header_id|>ipython<|python_tag|>{% endif %}").name).toBe("llama3");
    expect(detectFormat("{% for m in messages %}{{ m.content }}{% endfor %}").name).toBe("generic");
    expect(detectFormat(undefined).name).toBe("generic");
  });
});

describe("the grammar of each format over the shipped vocabulary", () => {
  it("only ever yields calls to given tools with valid arguments (required, named, auto; one or many)", async () => {
    const tok = Tokenizer.fromGguf("models/stories260K.gguf");
    const set = await GrammarSet.forTokenizer(tok);
    const BUDGET = 600;
    let seed = 1;
    for (const name of ["hermes", "llama3", "mistral", "harmony", "generic"] as FormatName[]) {
      for (const choice of ["required", { name: "add" }, "auto"] as const) {
        for (const parallel of [true, false]) {
          const f = FORMATS[name];
          const c = await set.constraint({ kind: "structural-tag", tag: toolGrammar(f, TOOLS, choice, parallel) });
          const rng = new Rng(seed++);
          const ids: number[] = [];
          let ended = false;
          for (let step = 0; step < BUDGET && !ended; step++) {
            const m = await c.nextMask();
            const ok: number[] = [];
            for (let i = 0; i < tok.nVocab; i++) if ((m[i >> 5] >>> (i & 31)) & 1) ok.push(i);
            let id = ok[Math.floor(rng.next() * ok.length)];
            if (step >= closingStart(BUDGET)) {
              const l = new Float32Array(tok.nVocab).fill(-Infinity);
              for (const t of ok) l[t] = 0;
              id = c.pickClosing(l);
            }
            expect(c.accept(id)).toBe(true);
            if (id === tok.eos) ended = true;
            else ids.push(id);
          }
          c.dispose();
          const what = `${name} ${JSON.stringify(choice)} parallel=${parallel}`;
          expect(ended, what).toBe(true);
          const text = tok.decode(ids);
          const r = parse(f, text, 5);
          if (choice !== "auto") expect(r.calls.length, `${what}: ${text}`).toBeGreaterThan(0);
          if (!parallel || !f.parallel) expect(r.calls.length, `${what}: ${text}`).toBeLessThanOrEqual(1);
          for (const call of r.calls) {
            if (typeof choice === "object") expect(call.name).toBe(choice.name);
            const tool = TOOLS.find((t) => t.name === call.name)!;
            expect(schemaErrors(tool.parameters, JSON.parse(call.arguments)), `${what}: ${text}`).toBe("");
          }
        }
      }
    }
  });
});
