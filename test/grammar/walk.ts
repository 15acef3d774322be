// Drives a constraint without a model, over the shipped model's vocabulary: a seeded random walk
// through the tokens each mask allows, and a check whether the grammar takes a given text whole.
import { expect } from "vitest";
import { Rng } from "../../dist/engine/index.js";
import type { GrammarConstraint } from "../../dist/grammar/index.js";
import { Tokenizer } from "../../dist/model/index.js";

export const tok = Tokenizer.fromGguf("models/stories260K.gguf");
export const EOS = tok.eos!;

export function allowed(mask: Int32Array, n: number): number[] {
  const out: number[] = [];
  for (let i = 0; i < n; i++) if ((mask[i >> 5] >>> (i & 31)) & 1) out.push(i);
  return out;
}

/** Random tokens among those allowed; after closeAt steps, the quickest way to close (as the sampler). */
export async function walk(c: GrammarConstraint, seed: number, closeAt: number, maxSteps: number, onStep?: (text: string, allowsEnd: boolean) => void) {
  const rng = new Rng(seed);
  const ids: number[] = [];
  for (let step = 0; step < maxSteps; step++) {
    const ok = allowed(await c.nextMask(), tok.nVocab);
    expect(ok.length).toBeGreaterThan(0);
    onStep?.(tok.decode(ids), ok.includes(EOS));
    let id = ok[Math.floor(rng.next() * ok.length)];
    if (step >= closeAt) {
      const logits = new Float32Array(tok.nVocab).fill(-Infinity);
      for (const t of ok) logits[t] = 0;
      id = c.pickClosing(logits);
    }
    expect(c.accept(id)).toBe(true);
    if (id === EOS) return { text: tok.decode(ids), ended: true };
    ids.push(id);
  }
  return { text: tok.decode(ids), ended: false };
}

/** The byte tokens (<0xNN>) that spell text: any text, with no space prefix. */
const BYTE_TOKENS = Array.from({ length: 256 }, (_, b) => tok.tokenId(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`)!);

/** JSON in the layout the decoder writes (one line, ", " and ": ", as Python's json.dumps). */
export function dumps(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(dumps).join(", ")}]`;
  if (typeof v === "object" && v !== null) return `{${Object.entries(v).map(([k, x]) => `${JSON.stringify(k)}: ${dumps(x)}`).join(", ")}}`;
  return JSON.stringify(v);
}

/** Whether the grammar takes the text whole, then an end token (the constraint is used up). */
export async function takes(c: GrammarConstraint, text: string): Promise<boolean> {
  for (const byte of new TextEncoder().encode(text)) {
    const id = BYTE_TOKENS[byte];
    const mask = await c.nextMask();
    if (((mask[id >> 5] >>> (id & 31)) & 1) === 0) return false;
    c.accept(id);
  }
  const mask = await c.nextMask();
  return ((mask[EOS >> 5] >>> (EOS & 31)) & 1) === 1;
}
