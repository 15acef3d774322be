// The grammar engine's thread: XGrammar (WebAssembly) with one vocabulary, its compiled grammars (the
// last MAX_CACHED) and each generation's matcher. It runs here, not on the main thread, because a
// compile takes seconds on a large vocabulary and would stop the event loop (streams, /health, the
// control plane's heartbeats) for that long. Requests are served one at a time, in order.
import { withIntegerRanges } from "./integer-range.js";
import { parentPort } from "node:worker_threads";
import { EngineFailure, engineCall, xgrammar, type XGrammar } from "./xgrammar.js";
import type * as XG from "@mlc-ai/web-xgrammar";

/** What the engine compiles: the main thread has checked the schemas and made them the engine's own. */
export type EngineSpec =
  | { readonly kind: "json-object" }
  | { readonly kind: "json-schema"; readonly schema: string }
  | { readonly kind: "grammar"; readonly grammar: string }
  /** Each {type: "json_schema", json_schema} in it holds the engine's schema as a JSON string. */
  | { readonly kind: "structural-tag"; readonly tag: unknown };

export type EngineRequest =
  | { readonly op: "init"; readonly vocab: string[]; readonly type: "byte_fallback" | "byte_level"; readonly vocabSize: number; readonly stops: number[]; readonly bytes: Uint8Array; readonly ends: Int32Array }
  | { readonly op: "compile"; readonly key: string; readonly spec: EngineSpec }
  /** Compiles (or finds) the grammar, makes matcher `mid` and writes its first mask to `mask`. */
  | { readonly op: "start"; readonly key: string; readonly spec: EngineSpec; readonly mid: number; readonly json: boolean; readonly mask: SharedArrayBuffer }
  /** Accepts the token, then (unless the output is complete) writes the next mask, so that it is
   * computed while the main thread runs the model. */
  | { readonly op: "step"; readonly mid: number; readonly token: number }
  | { readonly op: "mask"; readonly mid: number }
  | { readonly op: "free"; readonly mid: number };

/** id 0: no answer wanted. */
export interface EngineMessage { readonly id: number; readonly req: EngineRequest }
export type EngineReply =
  | { readonly id: number; readonly ok: true; readonly masked: boolean; readonly terminated: boolean }
  /** grammar: the engine refused the grammar (the client's fault, not the engine's). */
  | { readonly id: number; readonly ok: false; readonly error: string; readonly grammar: boolean };

/** JSON on one line with ", " and ": ", as Python's json.dumps: no run-away whitespace from a small model. */
const JSON_LAYOUT = { anyWhitespace: false, indent: -1, separators: [", ", ": "] as [string, string] };
const MAX_CACHED = 64;

class Refused extends Error {}
/** The engine aborted: this thread ends once it has answered. */
let moduleBroken = false;

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
 * [p]: after a sequence that still needs p continuation bytes; the JSON ones also leave out control
 * characters.
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

interface Matcher {
  readonly m: XG.GrammarMatcher;
  readonly mask: Int32Array;
  readonly json: boolean;
  /** UTF-8 continuation bytes the output still needs. */
  pending: number;
}

interface Vocab {
  readonly xg: XGrammar;
  readonly compiler: XG.GrammarCompiler;
  readonly pieces: Uint8Array[];
  readonly utf8: Int32Array[];
  readonly utf8Json: Int32Array[];
}

let vocab: Vocab | undefined;
const cache = new Map<string, XG.CompiledGrammar>();
const matchers = new Map<number, Matcher>();

async function init(r: Extract<EngineRequest, { op: "init" }>): Promise<void> {
  const xg = await xgrammar();
  const info = await engineCall("the vocabulary", () => xg.TokenizerInfo.createTokenizerInfo(r.vocab, r.type, false, r.vocabSize, r.stops));
  const compiler = await xg.GrammarCompiler.createGrammarCompiler(info, false);
  const pieces: Uint8Array[] = [];
  for (let id = 0, start = 0; id < r.vocabSize; id++) pieces.push(r.bytes.subarray(start, (start = r.ends[id])));
  vocab = { xg, compiler, pieces, ...validBytes(pieces) };
}

/** The tag with each JSON Schema in it as a grammar in JSON_LAYOUT (structural tags take no layout,
 * and their default lets a small model write whitespace without end). */
async function withLayout(xg: XGrammar, tag: unknown): Promise<unknown> {
  if (Array.isArray(tag)) return Promise.all(tag.map((t) => withLayout(xg, t)));
  if (typeof tag !== "object" || tag === null) return tag;
  const o = tag as Record<string, unknown>;
  if (o.type === "json_schema" && typeof o.json_schema === "string") {
    const L = JSON_LAYOUT, schema = o.json_schema;
    const grammar = await engineCall("the schema", () => xg.Testings._jsonSchemaToEBNF(schema, L.anyWhitespace, L.indent, L.separators, true));
    return { type: "grammar", grammar: withIntegerRanges(grammar) };
  }
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(o)) out[k] = await withLayout(xg, v);
  return out;
}

async function compile(key: string, spec: EngineSpec): Promise<XG.CompiledGrammar> {
  const v = vocab!;
  let g = cache.get(key);
  if (g) {
    cache.delete(key); // kept as the most recent
    cache.set(key, g);
    return g;
  }
  const c = v.compiler, L = JSON_LAYOUT;
  try {
    switch (spec.kind) {
      case "json-object":
        g = await engineCall("JSON", () => c.compileJSONSchema('{"type":"object"}', L.anyWhitespace, L.indent, L.separators, false));
        break;
      case "json-schema": {
        // The schema as grammar text, compiled as such: bounded integers come as placeholders whose
        // rules go in here. (compileJSONSchema lets a space through "[^ a]" where the same grammar
        // text compiled holds.)
        const ebnf = await engineCall("the schema", () => v.xg.Testings._jsonSchemaToEBNF(spec.schema, L.anyWhitespace, L.indent, L.separators, true));
        g = await engineCall("the schema", () => c.compileGrammar(withIntegerRanges(ebnf), "root"));
        break;
      }
      case "grammar":
        g = await engineCall("the grammar", () => c.compileGrammar(spec.grammar, "root"));
        break;
      case "structural-tag": {
        const tag = await withLayout(v.xg, spec.tag);
        g = await engineCall("the tool-call format", () => c.compileStructuralTag(JSON.stringify(tag)));
        break;
      }
    }
  } catch (e) {
    if (e instanceof EngineFailure && e.broken) moduleBroken = true;
    throw new Refused((e as Error).message);
  }
  cache.set(key, g);
  while (cache.size > MAX_CACHED) {
    const oldest = cache.keys().next().value!;
    cache.get(oldest)!.dispose();
    cache.delete(oldest);
  }
  return g;
}

async function writeMask(s: Matcher): Promise<void> {
  const v = vocab!;
  const mask = await engineCall("the mask", () => s.m.getNextTokenBitmask());
  const valid = (s.json ? v.utf8Json : v.utf8)[s.pending];
  for (let w = 0; w < s.mask.length; w++) s.mask[w] = (mask[w] ?? 0) & (valid[w] ?? 0);
}

function matcher(mid: number): Matcher {
  const s = matchers.get(mid);
  if (!s) throw new Error(`no matcher ${mid} in the grammar engine`);
  return s;
}

async function serve(req: EngineRequest): Promise<{ masked: boolean; terminated: boolean }> {
  const none = { masked: false, terminated: false };
  if (req.op === "init") {
    await init(req);
    return none;
  }
  if (!vocab) throw new Error("the grammar engine has no vocabulary");
  switch (req.op) {
    case "compile":
      await compile(req.key, req.spec);
      return none;
    case "start": {
      const g = await compile(req.key, req.spec);
      const m = await engineCall("the matcher", () => vocab!.xg.GrammarMatcher.createGrammarMatcher(g));
      const s: Matcher = { m, mask: new Int32Array(req.mask), json: req.json, pending: 0 };
      matchers.set(req.mid, s);
      await writeMask(s);
      return { masked: true, terminated: false };
    }
    case "step": {
      const s = matcher(req.mid);
      if (!s.m.acceptToken(req.token)) throw new Error(`the constraint refused token ${req.token}, which its own mask allowed`);
      s.pending = pendingAfter(s.pending, vocab.pieces[req.token] ?? new Uint8Array(0));
      // After an end token nothing follows: no mask is computed unless asked for.
      if (s.m.isTerminated()) return { masked: false, terminated: true };
      await writeMask(s);
      return { masked: true, terminated: false };
    }
    case "mask": {
      const s = matcher(req.mid);
      await writeMask(s);
      return { masked: true, terminated: s.m.isTerminated() };
    }
    case "free":
      matchers.get(req.mid)?.m.dispose();
      matchers.delete(req.mid);
      return none;
  }
}

const port = parentPort!;
let queue = Promise.resolve();
port.on("message", ({ id, req }: EngineMessage) => {
  queue = queue.then(async () => {
    let reply: EngineReply;
    try {
      reply = { id, ok: true, ...(await serve(req)) };
    } catch (e) {
      if (e instanceof EngineFailure && e.broken) moduleBroken = true;
      reply = { id, ok: false, error: (e as Error).message ?? String(e), grammar: e instanceof Refused };
    }
    if (id !== 0) port.postMessage(reply);
    // A module that aborted is not used again: the thread ends (its generations fail, saying so) and
    // the next request starts a fresh one.
    if (moduleBroken) process.exit(1);
  });
});
