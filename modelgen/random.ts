// Seeded normal numbers for weights: one independent stream per (seed, tensor name), so a tensor's
// values do not depend on which other tensors a file holds or on its type (an F32 file and a Q4_K_M
// file of the same seed hold the same weights before quantization).

/** 32-bit FNV-1a of a string, mixed with the seed. */
function hashSeed(seed: number, name: string): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/** xoshiro128** seeded through splitmix32, Box-Muller for pairs of normals. */
export class NormalStream {
  private s0: number;
  private s1: number;
  private s2: number;
  private s3: number;
  private spare = 0;
  private hasSpare = false;

  constructor(seed: number, name: string) {
    let x = hashSeed(seed, name);
    const next = () => {
      x = (x + 0x9e3779b9) >>> 0;
      let z = x;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
      return (z ^ (z >>> 16)) >>> 0;
    };
    this.s0 = next(); this.s1 = next(); this.s2 = next(); this.s3 = next() | 1;
  }

  /** The next 32 random bits. */
  private next32(): number {
    const r = Math.imul(this.rotl(Math.imul(this.s1, 5), 7), 9) >>> 0;
    const t = this.s1 << 9;
    this.s2 ^= this.s0; this.s3 ^= this.s1; this.s1 ^= this.s2; this.s0 ^= this.s3;
    this.s2 ^= t;
    this.s3 = this.rotl(this.s3, 11);
    return r;
  }

  /** Uniform in (0, 1). */
  private uniform(): number {
    return (this.next32() + 0.5) / 4294967296;
  }

  private rotl(x: number, k: number): number {
    return (x << k) | (x >>> (32 - k));
  }

  /** Fills out with uniform random bytes. */
  bytes(out: Uint8Array): Uint8Array {
    const whole = out.length & ~3;
    const words = new DataView(out.buffer, out.byteOffset, out.byteLength);
    for (let i = 0; i < whole; i += 4) words.setUint32(i, this.next32(), true);
    for (let i = whole; i < out.length; i++) out[i] = this.next32() & 255;
    return out;
  }

  /** Fills out with normal values of the given standard deviation. */
  fill(out: Float32Array, std: number): Float32Array {
    let i = 0;
    if (this.hasSpare && out.length) { out[i++] = this.spare * std; this.hasSpare = false; }
    for (; i < out.length; i += 2) {
      const r = Math.sqrt(-2 * Math.log(this.uniform())), a = 2 * Math.PI * this.uniform();
      out[i] = r * Math.cos(a) * std;
      if (i + 1 < out.length) out[i + 1] = r * Math.sin(a) * std;
      else { this.spare = r * Math.sin(a); this.hasSpare = true; }
    }
    return out;
  }
}
