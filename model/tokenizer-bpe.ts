// Byte-level BPE as llama.cpp's llm_tokenizer_bpe_session: pre-tokenize into words, map each word's
// UTF-8 bytes to GPT-2's byte characters, then repeatedly merge the adjacent pair with the lowest
// merge rank (leftmost first on ties). A priority queue keeps long words O(n log n).
//
// llama.cpp compares symbol texts; since every merge's parts and result are tokens (checked when the
// vocabulary loads), symbols can carry token ids instead: a symbol that is not a token can never
// take part in a merge, exactly as in llama.cpp.

import { MergeHeap } from "./tokenizer-heap.js";
import { pretokenize } from "./tokenizer-pretokenize.js";
import { codepointsOf, gpt2Bytes, pushUtf8 } from "./tokenizer-unicode.js";
import type { Vocab } from "./tokenizer-vocab.js";

const WORD_CACHE_LIMIT = 1 << 16;
const CACHED_WORD_MAX_BYTES = 256;
/** Words longer than this get their own buffers, so one huge word does not keep them allocated. */
const SHARED_BUFFER_MAX = 4096;

export class BpeEncoder {
  private readonly heap = new MergeHeap();
  private readonly cache = new Map<string, readonly number[]>();
  /** Token id of each single byte character, -1 if it is not a token. */
  private readonly byteId = new Int32Array(256);
  private id: Int32Array;
  private len: Int32Array;
  private prev: Int32Array;
  private next: Int32Array;

  constructor(private readonly vocab: Vocab, capacity = 64) {
    if (!vocab.splitter) throw new Error("BpeEncoder needs a BPE vocabulary");
    for (let b = 0; b < 256; b++) this.byteId[b] = vocab.tokenToId.get(gpt2Bytes.byteToChar[b]) ?? -1;
    this.id = new Int32Array(capacity);
    this.len = new Int32Array(capacity);
    this.prev = new Int32Array(capacity);
    this.next = new Int32Array(capacity);
  }

  /** Appends the ids of `text` (no special-token parsing) to `out`. */
  encode(text: string, out: number[]): void {
    const cpts = codepointsOf(text);
    const words = pretokenize(this.vocab.splitter!, cpts);
    const bytes: number[] = [];
    let pos = 0;
    for (const n of words) {
      bytes.length = 0;
      for (let k = pos; k < pos + n; k++) pushUtf8(cpts[k], bytes);
      pos += n;
      let word = "";
      for (const b of bytes) word += gpt2Bytes.byteToChar[b];
      let ids = this.cache.get(word);
      if (!ids) {
        ids = this.encodeWord(word, bytes);
        if (word.length <= CACHED_WORD_MAX_BYTES) {
          if (this.cache.size >= WORD_CACHE_LIMIT) this.cache.clear();
          this.cache.set(word, ids);
        }
      }
      for (const id of ids) out.push(id);
    }
  }

  /** `word` is `bytes` as GPT-2 byte characters (one UTF-16 unit per byte). */
  private encodeWord(word: string, bytes: readonly number[]): readonly number[] {
    const { tokenToId, mergeResult } = this.vocab;
    if (this.vocab.ignoreMerges) {
      const whole = tokenToId.get(word);
      if (whole !== undefined) return [whole];
    }
    const n = bytes.length;
    if (n > SHARED_BUFFER_MAX && n > this.len.length) return new BpeEncoder(this.vocab, n).encodeWord(word, bytes);
    if (this.len.length < n) {
      const cap = Math.min(SHARED_BUFFER_MAX, n * 2);
      this.id = new Int32Array(cap);
      this.len = new Int32Array(cap);
      this.prev = new Int32Array(cap);
      this.next = new Int32Array(cap);
    }
    const { id, len, prev, next, heap } = this;
    for (let i = 0; i < n; i++) {
      id[i] = this.byteId[bytes[i]];
      len[i] = 1;
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    heap.clear();
    for (let i = 1; i < n; i++) this.tryAdd(i - 1, i);

    while (heap.pop()) {
      const l = heap.topLeft;
      const r = heap.topRight;
      // A queued pair is stale when either side has grown or been absorbed since (texts only grow).
      if (len[l] === 0 || len[r] === 0 || len[l] + len[r] !== heap.topSize) continue;
      id[l] = mergeResult[heap.topKey];
      len[l] += len[r];
      len[r] = 0;
      next[l] = next[r];
      if (next[r] >= 0) prev[next[r]] = l;
      this.tryAdd(prev[l], l);
      this.tryAdd(l, next[l]);
    }

    // A symbol without a token is a single byte character no merge could use. llama.cpp then looks
    // up each byte of its UTF-8 as a one-byte token, which can only be the same failed lookup, so
    // the byte is dropped.
    const ids: number[] = [];
    for (let i = 0; i !== -1 && n > 0; i = next[i]) if (id[i] >= 0) ids.push(id[i]);
    return ids;
  }

  private tryAdd(l: number, r: number): void {
    if (l < 0 || r < 0) return;
    const idL = this.id[l];
    const idR = this.id[r];
    if (idL < 0 || idR < 0) return;
    const rank = this.vocab.mergeRank.get(idL, idR);
    if (rank < 0) return;
    this.heap.push(rank, l, r, this.len[l] + this.len[r]);
  }
}
