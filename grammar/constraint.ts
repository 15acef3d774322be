// Grammars for one model's vocabulary, and the per-request matcher the sampler asks which tokens may
// come next. The vocabulary goes to the engine as the tokenizer stores it (SentencePiece's "▁" and
// <0xNN> byte tokens, or GPT-2's byte-level text) so the engine decodes every token to its bytes the
// way the detokenizer does; control and unknown tokens, which print nothing, go as "" and so are never
// allowed; the end-of-generation tokens are allowed only where the value is complete.
import type { TokenConstraint } from "../engine/index.js";
import { TokenAttr, type Tokenizer } from "../model/index.js";
import { checkSchema, forEngine } from "./schema-check.js";
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

const QUOTE = 0x22, BACKSLASH = 0x5c, CLOSE_BRACE = 0x7d, CLOSE_BRACKET = 0x5d;

/** What pickClosing needs of the vocabulary: each token's bytes, and which tokens end the output. */
interface Vocab {
  readonly pieces: readonly Uint8Array[];
  readonly stops: Uint8Array;
  /** Bitmasks of the tokens that keep the bytes valid UTF-8: [p] after a sequence that still needs p
   * continuation bytes; the JSON ones also leave out control characters. */
  readonly utf8: readonly Int32Array[];
  readonly utf8Json: readonly Int32Array[];
}

/** Continuation bytes a lead byte wants (-1: a byte that cannot start a sequence). */
function wants(b: number): number {
  if (b < 0x80) return 0;
  if (b >= 0xc2 && b <= 0xdf) return 1;
  if (b >= 0xe0 && b <= 0xef) return 2;
  if (b >= 0xf0 && b <= 0xf4) return 3;
  return -1;
}

/** Leads whose first continuation byte has a narrower range (E0, ED, F0, F4): only whole in a token. */
const NARROW = new Set([0xe0, 0xed, 0xf0, 0xf4]);

/**
 * The engine's matcher is lenient with raw bytes: byte tokens can make invalid UTF-8 (a lone
 * continuation byte, a lead with no end), inside which it may take a quote as part of a character
 * while JSON sees a string end; and it lets control characters into JSON strings that its grammar,
 * as text, refuses. Masking these out keeps every output valid UTF-8 the grammar really matched.
 */
function validBytes(pieces: readonly Uint8Array[]): { utf8: Int32Array[]; utf8Json: Int32Array[] } {
  const words = Math.ceil(pieces.length / 32);
  const utf8 = [0, 1, 2, 3].map(() => new Int32Array(words));
  const utf8Json = [0, 1, 2, 3].map(() => new Int32Array(words));
  for (let id = 0; id < pieces.length; id++) {
    const p = pieces[id];
    if (p.length === 0) {
      for (let k = 0; k < 4; k++) utf8[k][id >> 5] |= 1 << (id & 31), utf8Json[k][id >> 5] |= 1 << (id & 31);
      continue;
    }
    let lead = 0;
    while (lead < p.length && p[lead] >= 0x80 && p[lead] <= 0xbf) lead++;
    // The rest: whole sequences, then perhaps one unfinished at the end.
    let ok = lead <= 3, i = lead;
    while (ok && i < p.length) {
      const need = wants(p[i]);
      if (need < 0) ok = false;
      else {
        let j = 1;
        while (j <= need && i + j < p.length && p[i + j] >= 0x80 && p[i + j] <= 0xbf) j++;
        if (i + j < p.length && j <= need) ok = false; // a sequence cut short by a non-continuation byte
        else if (i + j >= p.length && j <= need && NARROW.has(p[i])) ok = false;
        i += j;
      }
    }
    if (!ok) continue;
    const control = p.some((b) => b < 0x20 && b !== 0x0a);
    // After k pending: a token that starts with exactly k continuation bytes (or is only continuation
    // bytes, at most k of them, when nothing else follows in it).
    for (let k = 0; k < 4; k++) {
      if (!(lead === k || (lead === p.length && lead < k))) continue;
      utf8[k][id >> 5] |= 1 << (id & 31);
      if (!control) utf8Json[k][id >> 5] |= 1 << (id & 31);
    }
  }
  return { utf8, utf8Json };
}

/** Continuation bytes still wanted after these bytes, from `pending` wanted before them. */
function pendingAfter(pending: number, bytes: Uint8Array): number {
  for (const b of bytes) {
    if (pending > 0 && b >= 0x80 && b <= 0xbf) pending--;
    else pending = Math.max(0, wants(b));
  }
  return pending;
}

/** The grammars of one vocabulary, compiled once each (the last MAX_CACHED kept). */
export class GrammarSet {
  private readonly cache = new Map<string, Promise<XG.CompiledGrammar>>();

  private constructor(private readonly xg: XGrammar, private readonly compiler: XG.GrammarCompiler, readonly vocabSize: number, private readonly vocab: Vocab) {}

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
    const pieces: Uint8Array[] = [];
    for (let id = 0; id < vocabSize; id++) pieces.push(id < tok.nVocab ? tok.tokenPiece(id) : new Uint8Array(0));
    const stopSet = new Uint8Array(vocabSize);
    for (const id of stops) stopSet[id] = 1;
    return new GrammarSet(xg, compiler, vocabSize, { pieces, stops: stopSet, ...validBytes(pieces) });
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
          case "json-schema": {
            const schema = JSON.stringify(forEngine(spec.schema));
            return await engineCall("the schema", () => c.compileJSONSchema(schema, L.anyWhitespace, L.indent, L.separators, true));
          }
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
      checkSchema(o.json_schema);
      const schema = JSON.stringify(forEngine(o.json_schema));
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
    return new GrammarConstraint(m, this.vocabSize, this.vocab, spec.kind !== "grammar");
  }
}

/** One generation's place in its grammar (engine's TokenConstraint). Dispose it when done. */
export class GrammarConstraint implements TokenConstraint {
  /** Time spent computing masks and accepting tokens, and the steps. */
  ms = 0;
  steps = 0;
  private disposed = false;

  /** The JSON text so far: inside a string, after a backslash (for pickClosing). */
  private inString = false;
  private escaped = false;
  /** UTF-8 continuation bytes the output still needs. */
  private pending = 0;
  /** First bytes pickClosing chose, and how often. */
  private readonly tried = new Map<number, number>();
  private lastFirst: number | undefined;

  constructor(private readonly matcher: XG.GrammarMatcher, readonly vocabSize: number, private readonly vocab: Vocab, private readonly json: boolean) {}

  /** Masks the logits (Sampler's TokenConstraint); the time counts in ms. */
  async mask(logits: Float32Array): Promise<number> {
    const t = performance.now();
    const mask = await this.allowed();
    let allowed = 0;
    for (let i = 0; i < logits.length; i++) {
      if (((mask[i >> 5] >>> (i & 31)) & 1) === 0) logits[i] = -Infinity;
      else allowed++;
    }
    this.ms += performance.now() - t;
    this.steps++;
    return allowed;
  }

  /** Bit (id & 31) of word (id >> 5) is set for each allowed token (timed as mask()). */
  async nextMask(): Promise<Int32Array> {
    const t = performance.now();
    const mask = await this.allowed();
    this.ms += performance.now() - t;
    this.steps++;
    return mask;
  }

  private async allowed(): Promise<Int32Array> {
    const mask = await this.matcher.getNextTokenBitmask();
    const valid = (this.json ? this.vocab.utf8Json : this.vocab.utf8)[this.pending];
    for (let w = 0; w < mask.length; w++) mask[w] &= valid[w] ?? 0;
    return mask;
  }

  accept(id: number): boolean {
    const t = performance.now();
    const ok = this.matcher.acceptToken(id);
    if (ok) {
      this.pending = pendingAfter(this.pending, this.vocab.pieces[id] ?? new Uint8Array(0));
      for (const byte of this.vocab.pieces[id] ?? []) {
        if (this.escaped) this.escaped = false;
        else if (this.inString && byte === BACKSLASH) this.escaped = true;
        else if (byte === QUOTE) this.inString = !this.inString;
      }
    }
    this.ms += performance.now() - t;
    return ok;
  }

  /**
   * The allowed token that most quickly ends a JSON value: an end token; in a string its closing
   * quote; else a closing bracket, or a quote (that opens a string the next quote closes); the
   * shortest such. Failing those (a string whose format or length wants more; a number; text the
   * grammar forces), not the byte just chosen, punctuation before letters and digits (the "," after
   * a number, the "@" of an email, the "." of a version), the first byte tried least since the last
   * quote or bracket (no byte repeats while another could end the part), the longest.
   */
  pickClosing(logits: Float32Array): number {
    const { pieces, stops } = this.vocab;
    let best = -1, bestKey = Infinity;
    for (let id = 0; id < logits.length && id < pieces.length; id++) {
      if (logits[id] === -Infinity) continue;
      if (stops[id]) return id;
      const p = pieces[id], first = p[0];
      let cls: number;
      if (this.inString) cls = first === QUOTE ? 0 : 2;
      else cls = first === CLOSE_BRACE || first === CLOSE_BRACKET ? 0 : first === QUOTE ? 1 : 2;
      // cls; for cls 2 not the byte just chosen, punctuation first, the byte tried least, the longest
      // (text the grammar forces goes by in fewer tokens); for the others the shortest (no ", " that
      // opens more); then the likeliest.
      let sub = 0, len = Math.min(p.length, 63);
      if (cls === 2) {
        const again = first === this.lastFirst ? 1 : 0;
        const alnum = /[A-Za-z0-9]/.test(String.fromCharCode(first)) ? 1 : 0;
        sub = (again * 2 + alnum) * 512 + Math.min(this.tried.get(first) ?? 0, 511);
        len = 63 - len;
      }
      const key = (cls * 2048 + sub) * 64 + len - logits[id] * 1e-9;
      if (key < bestKey) {
        bestKey = key;
        best = id;
      }
    }
    const first = pieces[best]?.[0];
    // A quote or bracket ends a part (a string, a value): the next part starts with nothing tried.
    if (bestKey < 2 * 2048 * 64 - 1) this.tried.clear();
    else if (first !== undefined) this.tried.set(first, (this.tried.get(first) ?? 0) + 1);
    this.lastFirst = first;
    return best;
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
