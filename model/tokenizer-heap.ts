// A binary min-heap of merge candidates ordered by (key, left): the order llama.cpp's priority
// queues pop bigrams in (best rank or score first, then leftmost). Parallel typed arrays, no objects.

export class MergeHeap {
  private key = new Float64Array(64);
  private left = new Int32Array(64);
  private right = new Int32Array(64);
  private size = new Int32Array(64);
  length = 0;

  // Popped values, valid until the next pop.
  topKey = 0;
  topLeft = 0;
  topRight = 0;
  topSize = 0;

  clear(): void {
    this.length = 0;
  }

  private less(i: number, j: number): boolean {
    const ki = this.key[i];
    const kj = this.key[j];
    return ki < kj || (ki === kj && this.left[i] < this.left[j]);
  }

  private swap(i: number, j: number): void {
    const k = this.key[i]; this.key[i] = this.key[j]; this.key[j] = k;
    const l = this.left[i]; this.left[i] = this.left[j]; this.left[j] = l;
    const r = this.right[i]; this.right[i] = this.right[j]; this.right[j] = r;
    const s = this.size[i]; this.size[i] = this.size[j]; this.size[j] = s;
  }

  private grow(): void {
    const n = this.key.length * 2;
    const k = new Float64Array(n); k.set(this.key); this.key = k;
    const l = new Int32Array(n); l.set(this.left); this.left = l;
    const r = new Int32Array(n); r.set(this.right); this.right = r;
    const s = new Int32Array(n); s.set(this.size); this.size = s;
  }

  push(key: number, left: number, right: number, size: number): void {
    if (this.length === this.key.length) this.grow();
    let i = this.length++;
    this.key[i] = key;
    this.left[i] = left;
    this.right[i] = right;
    this.size[i] = size;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!this.less(i, parent)) break;
      this.swap(i, parent);
      i = parent;
    }
  }

  /** Removes the smallest entry into top*; returns false when empty. */
  pop(): boolean {
    if (this.length === 0) return false;
    this.topKey = this.key[0];
    this.topLeft = this.left[0];
    this.topRight = this.right[0];
    this.topSize = this.size[0];
    const last = --this.length;
    if (last > 0) {
      this.key[0] = this.key[last];
      this.left[0] = this.left[last];
      this.right[0] = this.right[last];
      this.size[0] = this.size[last];
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        if (l >= last) break;
        const r = l + 1;
        const m = r < last && this.less(r, l) ? r : l;
        if (!this.less(m, i)) break;
        this.swap(i, m);
        i = m;
      }
    }
    return true;
  }
}
