// SentencePiece-style tokenization as llama.cpp's llm_tokenizer_spm_session: start from single
// characters, repeatedly merge the adjacent pair whose concatenation is the highest-scoring token
// (leftmost first on ties), then fall back to byte tokens for characters that are not tokens.

import { MergeHeap } from "./tokenizer-heap.js";
import { TokenizerError, type Vocab } from "./tokenizer-vocab.js";
import { utf8Bytes } from "./tokenizer-unicode.js";

const HEX = "0123456789ABCDEF";

/** llama_vocab::byte_to_token for SentencePiece vocabularies: <0xXX>, else the byte itself. */
export function spmByteToken(vocab: Vocab, byte: number): number {
  const id = vocab.tokenToId.get(`<0x${HEX[byte >> 4]}${HEX[byte & 15]}>`);
  if (id !== undefined) return id;
  const raw = byte < 0x80 ? vocab.tokenToId.get(String.fromCharCode(byte)) : undefined;
  if (raw === undefined) {
    throw new TokenizerError(`the vocabulary has no token for byte 0x${HEX[byte >> 4]}${HEX[byte & 15]} (no <0x..> byte tokens)`);
  }
  return raw;
}

export class SpmEncoder {
  private readonly heap = new MergeHeap();
  private start = new Int32Array(64);
  private len = new Int32Array(64);
  private prev = new Int32Array(64);
  private next = new Int32Array(64);

  constructor(private readonly vocab: Vocab) {}

  /** Appends the ids of `text` (spaces already escaped to U+2581) to `out`. */
  encode(text: string, out: number[]): void {
    if (text.length === 0) return;
    if (this.start.length < text.length) {
      const cap = text.length * 2;
      this.start = new Int32Array(cap);
      this.len = new Int32Array(cap);
      this.prev = new Int32Array(cap);
      this.next = new Int32Array(cap);
    }
    const { start, len, prev, next, heap } = this;
    let n = 0;
    for (let i = 0; i < text.length; ) {
      const c = text.charCodeAt(i);
      const w = c >= 0xd800 && c <= 0xdbff && i + 1 < text.length ? 2 : 1;
      start[n] = i;
      len[n] = w;
      prev[n] = n - 1;
      next[n] = n + 1;
      n++;
      i += w;
    }
    next[n - 1] = -1;

    heap.clear();
    for (let i = 1; i < n; i++) this.tryAdd(text, i - 1, i);

    while (heap.pop()) {
      const l = heap.topLeft;
      const r = heap.topRight;
      // Skip pairs whose symbols changed since they were queued.
      if (len[l] === 0 || len[r] === 0 || len[l] + len[r] !== heap.topSize) continue;
      len[l] += len[r];
      len[r] = 0;
      next[l] = next[r];
      if (next[r] >= 0) prev[next[r]] = l;
      this.tryAdd(text, prev[l], l);
      this.tryAdd(text, l, next[l]);
    }

    for (let i = 0; i !== -1; i = next[i]) {
      const id = this.vocab.tokenToId.getRange(text, start[i], start[i] + len[i]);
      if (id >= 0) {
        out.push(id);
      } else {
        for (const b of utf8Bytes(text.substring(start[i], start[i] + len[i]))) out.push(spmByteToken(this.vocab, b));
      }
    }
  }

  private tryAdd(text: string, l: number, r: number): void {
    if (l < 0 || r < 0) return;
    const size = this.len[l] + this.len[r];
    const id = this.vocab.tokenToId.getRange(text, this.start[l], this.start[l] + size);
    if (id < 0) return;
    // Highest score first: the heap pops the smallest key.
    this.heap.push(-this.vocab.scores[id], l, r, size);
  }
}
