// Grammars for one model's vocabulary, and the per-request matcher the sampler asks which tokens may
// come next. The vocabulary goes to the engine as the tokenizer stores it (SentencePiece's "▁" and
// <0xNN> byte tokens, or GPT-2's byte-level text) so the engine decodes every token to its bytes the
// way the detokenizer does; control and unknown tokens, which print nothing, go as "" and so are never
// allowed; the end-of-generation tokens are allowed only where the value is complete.
import type { TokenConstraint } from "../engine/index.js";
import { TokenAttr, type Tokenizer } from "../model/index.js";
import { checkSchema } from "./schema-check.js";
import { engineCall, xgrammar, type XGrammar } from "./xgrammar.js";
import type * as XG from "@mlc-ai/web-xgrammar";

/** What the output must be. */
export type ConstraintSpec =
  /** Any JSON object (OpenAI's JSON mode). */
  | { readonly kind: "json-object" }
  /** A value valid for this JSON Schema (checked by checkSchema first). */
  | { readonly kind: "json-schema"; readonly schema: unknown }
  /** llama.cpp's GBNF, as XGrammar's EBNF reads it (root rule "root"). */
  | { readonly kind: "grammar"; readonly grammar: string }
  /** XGrammar's structural tag (tool calls: free text, then tagged JSON from a trigger on). */
  | { readonly kind: "structural-tag"; readonly tag: unknown };

export class GrammarError extends Error {
  override name = "GrammarError";
}

/** JSON on one line with ", " and ": ", as Python's json.dumps: no run-away whitespace from a small model. */
const JSON_LAYOUT = { anyWhitespace: false, indent: -1, separators: [", ", ": "] as [string, string] };
const MAX_CACHED = 64;

/** Where a constrained reply of maxTokens starts closing its value (Sampler's closeAfter): a quarter
 * of the budget is kept for it, from 8 to 128 tokens. */
export function closingStart(maxTokens: number): number {
  return maxTokens - Math.min(128, Math.max(8, Math.floor(maxTokens / 4)));
}

/** The grammars of one vocabulary, compiled once each (the last MAX_CACHED kept). */
export class GrammarSet {
  private readonly cache = new Map<string, Promise<XG.CompiledGrammar>>();

  private constructor(private readonly xg: XGrammar, private readonly compiler: XG.GrammarCompiler, readonly vocabSize: number, readonly closeRank: Uint8Array) {}

  static async forTokenizer(tok: Tokenizer, vocabSize = tok.nVocab): Promise<GrammarSet> {
    const xg = await xgrammar();
    const type = tok.model === "llama" ? "byte_fallback" : tok.model === "gpt2" ? "byte_level" : null;
    if (type === null) throw new GrammarError(`constrained decoding needs a SentencePiece or byte-level BPE vocabulary (this one is "${tok.model}")`);
    const vocab: string[] = new Array(vocabSize);
    for (let id = 0; id < vocabSize; id++) {
      if (id >= tok.nVocab) vocab[id] = "";
      else {
        const attr = tok.tokenAttributes(id);
        vocab[id] = attr & (TokenAttr.CONTROL | TokenAttr.UNKNOWN | TokenAttr.UNUSED) ? "" : tok.tokenText(id);
      }
    }
    const stops = tok.eogTokens.filter((id) => id < vocabSize);
    const info = await engineCall("the vocabulary", () => xg.TokenizerInfo.createTokenizerInfo(vocab, type, false, vocabSize, stops));
    const compiler = await xg.GrammarCompiler.createGrammarCompiler(info, false);
    // How directly each token ends a JSON value, for a reply that must close within its budget: an end
    // token; else a quote (it closes the string it is in, or opens one the next quote closes); else a
    // closing bracket (the shorter the better within these: no ", " that opens more); else the longest
    // (text the grammar forces, such as a tool call's opening, goes by in fewer tokens).
    const rank = new Uint8Array(vocabSize).fill(255);
    for (let id = 0; id < Math.min(vocabSize, tok.nVocab); id++) {
      const piece = tok.tokenPiece(id);
      const first = piece[0];
      const kind = first === 0x22 ? 1 : first === 0x7d || first === 0x5d ? 2 : 3;
      const len = Math.min(piece.length, 63);
      rank[id] = kind * 64 + (kind === 3 ? 63 - len : len);
    }
    for (const id of stops) rank[id] = 0;
    return new GrammarSet(xg, compiler, vocabSize, rank);
  }

  /** Compiles (or finds) the grammar; throws SchemaError for a schema it cannot honour, GrammarError
   * for one the engine refuses. */
  compile(spec: ConstraintSpec): Promise<XG.CompiledGrammar> {
    const key = spec.kind === "json-schema" ? `s${checkSchema(spec.schema)}` : spec.kind === "grammar" ? `g${spec.grammar}` : spec.kind === "structural-tag" ? `t${JSON.stringify(spec.tag)}` : "o";
    let p = this.cache.get(key);
    if (p) {
      this.cache.delete(key); // kept as the most recent
      this.cache.set(key, p);
      return p;
    }
    const c = this.compiler, L = JSON_LAYOUT;
    p = (async () => {
      try {
        switch (spec.kind) {
          case "json-object":
            return await engineCall("JSON", () => c.compileJSONSchema('{"type":"object"}', L.anyWhitespace, L.indent, L.separators, false));
          case "json-schema":
            return await engineCall("the schema", () => c.compileJSONSchema(key.slice(1), L.anyWhitespace, L.indent, L.separators, true));
          case "grammar":
            return await engineCall("the grammar", () => c.compileGrammar(spec.grammar, "root"));
          case "structural-tag": {
            const tag = await this.withLayout(spec.tag);
            return await engineCall("the tool-call format", () => c.compileStructuralTag(JSON.stringify(tag)));
          }
        }
      } catch (e) {
        this.cache.delete(key);
        throw new GrammarError((e as Error).message);
      }
    })();
    this.cache.set(key, p);
    while (this.cache.size > MAX_CACHED) {
      const oldest = this.cache.keys().next().value!;
      void this.cache.get(oldest)!.then((g) => g.dispose(), () => {});
      this.cache.delete(oldest);
    }
    return p;
  }

  /** The tag with each JSON Schema in it as a grammar in JSON_LAYOUT (structural tags take no layout,
   * and their default lets a small model write whitespace without end). */
  private async withLayout(tag: unknown): Promise<unknown> {
    if (Array.isArray(tag)) return Promise.all(tag.map((t) => this.withLayout(t)));
    if (typeof tag !== "object" || tag === null) return tag;
    const o = tag as Record<string, unknown>;
    if (o.type === "json_schema" && "json_schema" in o) {
      const schema = checkSchema(o.json_schema);
      const L = JSON_LAYOUT;
      const grammar = await engineCall("the schema", () => this.xg.Testings._jsonSchemaToEBNF(schema, L.anyWhitespace, L.indent, L.separators, true));
      return { type: "grammar", grammar };
    }
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(o)) out[k] = await this.withLayout(v);
    return out;
  }

  /** A fresh matcher for one generation. */
  async constraint(spec: ConstraintSpec): Promise<GrammarConstraint> {
    const g = await this.compile(spec);
    const m = await engineCall("the matcher", () => this.xg.GrammarMatcher.createGrammarMatcher(g));
    return new GrammarConstraint(m, this.vocabSize, this.closeRank);
  }
}

/** One generation's place in its grammar (engine's TokenConstraint). Dispose it when done. */
export class GrammarConstraint implements TokenConstraint {
  /** Time spent computing masks and accepting tokens, and the steps. */
  ms = 0;
  steps = 0;
  private disposed = false;

  constructor(private readonly matcher: XG.GrammarMatcher, readonly vocabSize: number, readonly closeRank: Uint8Array) {}

  async nextMask(): Promise<Int32Array> {
    const t = performance.now();
    const mask = await this.matcher.getNextTokenBitmask();
    this.ms += performance.now() - t;
    this.steps++;
    return mask;
  }

  accept(id: number): boolean {
    const t = performance.now();
    const ok = this.matcher.acceptToken(id);
    this.ms += performance.now() - t;
    return ok;
  }

  /** The output so far is a complete value (only an end token may follow). */
  get complete(): boolean {
    return this.matcher.isTerminated();
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.matcher.dispose();
  }
}
