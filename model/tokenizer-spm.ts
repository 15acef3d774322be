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
  constructor(private readonly vocab: Vocab) {}

  /** Appends the ids of `text` (spaces already escaped to U+2581) to `out`. */
  encode(text: string, out: number[]): void {
    if (text.length === 0) return;
    // Per call, so a long prompt's buffers do not stay allocated.
    const start = new Int32Array(text.length);
    const len = new Int32Array(text.length);
    const prev = new Int32Array(text.length);
    const next = new Int32Array(text.length);
    const heap = new MergeHeap();
    const { tokenToId, scores } = this.vocab;
    const tryAdd = (l: number, r: number) => {
      if (l < 0 || r < 0) return;
      const size = len[l] + len[r];
      const id = tokenToId.getRange(text, start[l], start[l] + size);
      // Highest score first: the heap pops the smallest key.
      if (id >= 0) heap.push(-scores[id], l, r, size);
    };

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
    for (let i = 1; i < n; i++) tryAdd(i - 1, i);

    while (heap.pop()) {
      const l = heap.topLeft;
      const r = heap.topRight;
      // Skip pairs whose symbols changed since they were queued.
      if (len[l] === 0 || len[r] === 0 || len[l] + len[r] !== heap.topSize) continue;
      len[l] += len[r];
      len[r] = 0;
      next[l] = next[r];
      if (next[r] >= 0) prev[next[r]] = l;
      tryAdd(prev[l], l);
      tryAdd(l, next[l]);
    }

    for (let i = 0; i !== -1; i = next[i]) {
      const id = tokenToId.getRange(text, start[i], start[i] + len[i]);
      if (id >= 0) {
        out.push(id);
      } else {
        for (const b of utf8Bytes(text.substring(start[i], start[i] + len[i]))) out.push(spmByteToken(this.vocab, b));
      }
    }
  }
}
