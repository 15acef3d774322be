// Grammars for one model's vocabulary, and the per-request matcher the sampler asks which tokens may
// come next. The vocabulary goes to the engine as the tokenizer stores it (SentencePiece's "▁" and
// <0xNN> byte tokens, or GPT-2's byte-level text) so the engine decodes every token to its bytes the
// way the detokenizer does; control and unknown tokens, which print nothing, go as "" and so are never
// allowed; the end-of-generation tokens are allowed only where the value is complete.
import type { TokenConstraint } from "../engine/index.js";
import { TokenAttr, type Tokenizer } from "../model/index.js";
import { checkSchema } from "./schema-check.js";
import { forEngine } from "./schema-rewrite.js";
import { EngineRefusal, EngineThread, type StepAnswer } from "./engine-thread.js";
import type { EngineRequest, EngineSpec } from "./engine-worker.js";

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

/** How long any request to the engine's thread may take (a compile for a 151k vocabulary on a loaded
 * host takes up to ~10 s, and a mask can wait behind one). */
const DEFAULT_WAIT_MS = 120_000;

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
}

/** What the engine's thread needs to start (kept, so that a fresh thread can replace a failed one). */
type InitRequest = Extract<EngineRequest, { op: "init" }>;

/** The grammars of one vocabulary. The engine runs in its own thread (engine-worker.ts), which keeps
 * the compiled grammars (the last 64) and the matchers; this side checks schemas and keeps, per
 * generation, what pickClosing needs. */
export class GrammarSet {
  /** The limit on every request to the engine's thread, ms. */
  waitMs: number;
  private thread: Promise<EngineThread> | undefined;
  private nextMatcher = 1;

  private constructor(private readonly init: InitRequest, readonly vocabSize: number, private readonly vocab: Vocab, waitMs: number) {
    this.waitMs = waitMs;
  }

  static async forTokenizer(tok: Tokenizer, vocabSize = tok.nVocab, o: { waitMs?: number } = {}): Promise<GrammarSet> {
    const type = tok.model === "llama" ? "byte_fallback" : tok.model === "gpt2" ? "byte_level" : null;
    if (type === null) throw new GrammarError(`constrained decoding needs a SentencePiece or byte-level BPE vocabulary (this one is "${tok.model}")`);
    const vocab: string[] = new Array(vocabSize);
    const pieces: Uint8Array[] = [];
    for (let id = 0; id < vocabSize; id++) {
      // A 151k vocabulary takes a while to read: let the event loop turn meanwhile.
      if ((id & 8191) === 8191) await new Promise((r) => setImmediate(r));
      if (id >= tok.nVocab) {
        vocab[id] = "";
        pieces.push(new Uint8Array(0));
      } else {
        const attr = tok.tokenAttributes(id);
        vocab[id] = attr & (TokenAttr.CONTROL | TokenAttr.UNKNOWN | TokenAttr.UNUSED) ? "" : tok.tokenText(id);
        pieces.push(tok.tokenPiece(id));
      }
    }
    // The pieces in one buffer, for the engine's thread; this side keeps views of it.
    const ends = new Int32Array(vocabSize);
    let total = 0;
    for (let id = 0; id < vocabSize; id++) ends[id] = total += pieces[id].length;
    const bytes = new Uint8Array(total);
    for (let id = 0; id < vocabSize; id++) {
      bytes.set(pieces[id], ends[id] - pieces[id].length);
      pieces[id] = bytes.subarray(ends[id] - pieces[id].length, ends[id]);
    }
    const stops = tok.eogTokens.filter((id) => id < vocabSize);
    const stopSet = new Uint8Array(vocabSize);
    for (const id of stops) stopSet[id] = 1;
    const set = new GrammarSet({ op: "init", vocab, type, vocabSize, stops, bytes, ends }, vocabSize, { pieces, stops: stopSet }, o.waitMs ?? DEFAULT_WAIT_MS);
    await set.engine();
    return set;
  }

  /** The engine's thread, started with the vocabulary; a fresh one if the last failed. */
  private async engine(): Promise<EngineThread> {
    const current = this.thread;
    if (current) {
      const t = await current.catch(() => undefined);
      if (t && !t.failure) return t;
      if (this.thread !== current) return this.engine(); // another caller is starting one
    }
    const started = (async () => {
      const t = new EngineThread();
      try {
        await t.call(this.init, "reading the vocabulary", this.waitMs);
      } catch (e) {
        t.fail("the vocabulary was refused");
        throw e instanceof EngineRefusal ? new GrammarError(e.message) : e;
      }
      return t;
    })();
    this.thread = started;
    return started;
  }

  /** Ends the engine's thread (a later request starts a fresh one). */
  close(): void {
    void this.thread?.then((t) => t.fail("the grammar set was closed"), () => {});
  }

  /** The cache key and what the engine compiles; throws SchemaError for a schema it cannot honour. */
  private prepare(spec: ConstraintSpec): { key: string; engineSpec: EngineSpec } {
    switch (spec.kind) {
      case "json-object":
        return { key: "o", engineSpec: spec };
      case "json-schema": {
        checkSchema(spec.schema);
        // Keyed by what the engine reads: schemas that differ only in annotations share a grammar.
        const schema = JSON.stringify(forEngine(spec.schema));
        return { key: `s${schema}`, engineSpec: { kind: "json-schema", schema } };
      }
      case "grammar":
        return { key: `g${spec.grammar}`, engineSpec: spec };
      case "structural-tag":
        return { key: `t${JSON.stringify(spec.tag)}`, engineSpec: { kind: "structural-tag", tag: engineTag(spec.tag) } };
    }
  }

  /** Compiles (or finds) the grammar in the engine's thread; throws SchemaError for a schema it cannot
   * honour, GrammarError for one the engine refuses. */
  async compile(spec: ConstraintSpec): Promise<void> {
    const { key, engineSpec } = this.prepare(spec);
    await this.onLiveThread((t) => t.call({ op: "compile", key, spec: engineSpec }, `compiling the ${spec.kind}`, this.waitMs));
  }

  /** Runs f on the engine's thread; once more on a fresh thread if that one exited under it (it
   * does after the engine aborts on another request). A refusal is a GrammarError. */
  private async onLiveThread<T>(f: (t: EngineThread) => Promise<T>): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      const t = await this.engine();
      try {
        return await f(t);
      } catch (e) {
        if (e instanceof EngineRefusal || !/exited/.test(t.failure?.message ?? "") || attempt > 0) refused(e);
      }
    }
  }

  /** A fresh matcher for one generation (its grammar compiled first if it is not cached). */
  async constraint(spec: ConstraintSpec): Promise<GrammarConstraint> {
    const { key, engineSpec } = this.prepare(spec);
    const mask = new SharedArrayBuffer(Math.ceil(this.vocabSize / 32) * 4);
    return this.onLiveThread(async (t) => {
      const mid = this.nextMatcher++;
      const first = await t.call({ op: "start", key, spec: engineSpec, mid, json: spec.kind !== "grammar", mask }, `compiling the ${spec.kind}`, this.waitMs);
      return new GrammarConstraint(t, mid, new Int32Array(mask), this.vocabSize, this.vocab, first, () => this.waitMs);
    });
  }
}

function refused(e: unknown): never {
  throw e instanceof EngineRefusal ? new GrammarError(e.message) : e;
}

/** The tag with each JSON Schema in it checked and made the engine's (a JSON string, which the
 * engine's thread turns into a grammar). */
function engineTag(tag: unknown): unknown {
  if (Array.isArray(tag)) return tag.map(engineTag);
  if (typeof tag !== "object" || tag === null) return tag;
  const o = tag as Record<string, unknown>;
  if (o.type === "json_schema" && "json_schema" in o) {
    checkSchema(o.json_schema);
    return { ...o, json_schema: JSON.stringify(forEngine(o.json_schema)) };
  }
  return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, engineTag(v)]));
}

/** One generation's place in its grammar (engine's TokenConstraint). Dispose it when done.
 * The matcher lives in the engine's thread, which writes each mask into a buffer shared with this
 * side: accept() sends the token and the thread computes the next mask at once, while the model
 * runs; mask() waits for it (one message each way per token). */
export class GrammarConstraint implements TokenConstraint {
  /** Time spent waiting for and applying masks and accepting tokens, and the steps. */
  ms = 0;
  steps = 0;
  private disposed = false;
  /** The thread's answer to the last request: the next mask is in `words` once it has come. */
  private answer: Promise<StepAnswer>;
  /** `words` holds the mask of this step (accept() checks the token against it). */
  private fresh = false;
  private terminated = false;

  /** The JSON text so far: inside a string, after a backslash (for pickClosing). */
  private inString = false;
  private escaped = false;
  /** First bytes pickClosing chose, and how often. */
  private readonly tried = new Map<number, number>();
  private lastFirst: number | undefined;

  constructor(private readonly thread: EngineThread, private readonly mid: number, private readonly words: Int32Array, readonly vocabSize: number,
    private readonly vocab: Vocab, first: StepAnswer, private readonly waitMs: () => number) {
    this.answer = Promise.resolve(first);
  }

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
    const mask = (await this.allowed()).slice();
    this.ms += performance.now() - t;
    this.steps++;
    return mask;
  }

  private async allowed(): Promise<Int32Array> {
    if (this.disposed) throw new Error("the constraint was disposed");
    let a = await this.answer;
    if (!a.masked) a = await this.ask({ op: "mask", mid: this.mid }, "a mask");
    this.terminated = a.terminated;
    this.fresh = true;
    return this.words;
  }

  private ask(req: EngineRequest, what: string): Promise<StepAnswer> {
    this.answer = this.thread.call(req, what, this.waitMs());
    // Its failure is reported by the next mask(); until then it is not an unhandled rejection.
    this.answer.catch(() => {});
    return this.answer;
  }

  /** False for a token the current mask forbids. A token the engine refuses all the same (it never
   * has) fails the next mask(). */
  accept(id: number): boolean {
    const t = performance.now();
    if (this.disposed) return false;
    if (this.fresh && ((this.words[id >> 5] >>> (id & 31)) & 1) === 0) {
      this.ms += performance.now() - t;
      return false;
    }
    this.fresh = false;
    void this.ask({ op: "step", mid: this.mid, token: id }, "the mask after a token");
    for (const byte of this.vocab.pieces[id] ?? []) {
      if (this.escaped) this.escaped = false;
      else if (this.inString && byte === BACKSLASH) this.escaped = true;
      else if (byte === QUOTE) this.inString = !this.inString;
    }
    this.ms += performance.now() - t;
    return true;
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

  /** The output so far was a complete value (only an end token may follow), as of the last mask. */
  get complete(): boolean {
    return this.terminated;
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.thread.post({ op: "free", mid: this.mid });
  }
}
