// Hash tables for vocabularies of 100k+ tokens and merges: open addressing over typed arrays, and
// lookups of a substring without allocating it. A Map of strings costs several times more to build
// and to query with freshly cut strings, which dominated loading a Llama 3 vocabulary.

const FNV_OFFSET = 0x811c9dc5 | 0;
const FNV_PRIME = 0x01000193;

function hashRange(h: number, s: string, start: number, end: number): number {
  for (let i = start; i < end; i++) h = Math.imul(h ^ s.charCodeAt(i), FNV_PRIME);
  return h;
}

function capacityFor(n: number): number {
  let cap = 16;
  while (cap < n * 2) cap *= 2;
  return cap;
}

/** Token text -> id. */
export class TokenTable {
  private readonly slots: Int32Array;
  private readonly mask: number;

  /** `tokens` must be unique; `duplicate` reports the first repeated text (index, earlier index). */
  constructor(private readonly tokens: readonly string[], duplicate: (id: number, earlier: number) => never) {
    const cap = capacityFor(tokens.length);
    this.mask = cap - 1;
    this.slots = new Int32Array(cap).fill(-1);
    for (let id = 0; id < tokens.length; id++) {
      const t = tokens[id];
      let h = hashRange(FNV_OFFSET, t, 0, t.length) & this.mask;
      for (;;) {
        const other = this.slots[h];
        if (other < 0) break;
        if (tokens[other] === t) duplicate(id, other);
        h = (h + 1) & this.mask;
      }
      this.slots[h] = id;
    }
  }

  get size(): number {
    return this.tokens.length;
  }

  get(text: string): number | undefined {
    const id = this.getRange(text, 0, text.length);
    return id < 0 ? undefined : id;
  }

  has(text: string): boolean {
    return this.getRange(text, 0, text.length) >= 0;
  }

  /** Id of s[start, end), or -1. */
  getRange(s: string, start: number, end: number): number {
    return this.getConcat(s, start, end, end, end);
  }

  /** Id of s[a, b) + s[c, d), or -1. */
  getConcat(s: string, a: number, b: number, c: number, d: number): number {
    const len = b - a + (d - c);
    let h = hashRange(hashRange(FNV_OFFSET, s, a, b), s, c, d) & this.mask;
    for (;;) {
      const id = this.slots[h];
      if (id < 0) return -1;
      const t = this.tokens[id];
      if (t.length === len && sameText(t, s, a, b, c, d)) return id;
      h = (h + 1) & this.mask;
    }
  }
}

function sameText(t: string, s: string, a: number, b: number, c: number, d: number): boolean {
  let k = 0;
  for (let i = a; i < b; i++) if (t.charCodeAt(k++) !== s.charCodeAt(i)) return false;
  for (let i = c; i < d; i++) if (t.charCodeAt(k++) !== s.charCodeAt(i)) return false;
  return true;
}

/** (left id, right id) -> value, for BPE merge ranks. The first value set for a pair wins. */
export class PairTable {
  private readonly left: Int32Array;
  private readonly right: Int32Array;
  private readonly value: Int32Array;
  private readonly mask: number;

  constructor(maxEntries: number) {
    const cap = capacityFor(maxEntries);
    this.mask = cap - 1;
    this.left = new Int32Array(cap).fill(-1);
    this.right = new Int32Array(cap);
    this.value = new Int32Array(cap);
  }

  private slot(l: number, r: number): number {
    let h = Math.imul(l, 0x9e3779b1) ^ r;
    h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
    return (h ^ (h >>> 13)) & this.mask;
  }

  /** Sets the value unless the pair already has one. */
  setIfAbsent(l: number, r: number, v: number): void {
    let h = this.slot(l, r);
    for (;;) {
      if (this.left[h] < 0) {
        this.left[h] = l;
        this.right[h] = r;
        this.value[h] = v;
        return;
      }
      if (this.left[h] === l && this.right[h] === r) return;
      h = (h + 1) & this.mask;
    }
  }

  /** The value of the pair, or -1. */
  get(l: number, r: number): number {
    let h = this.slot(l, r);
    for (;;) {
      const k = this.left[h];
      if (k < 0) return -1;
      if (k === l && this.right[h] === r) return this.value[h];
      h = (h + 1) & this.mask;
    }
  }
}
