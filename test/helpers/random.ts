// Seeded randomness for tests: the same inputs on every run, so a failure can be replayed.

/** mulberry32: uniform in [0, 1). */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Normal floats from a fixed sequence (xorshift32 into Box-Muller), `scale` times N(0, 1). */
export function normalFloats(seed: number): (n: number, scale?: number) => Float32Array {
  let s = seed;
  const u = () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return ((s >>> 0) + 1) / 4294967297;
  };
  const normal = () => Math.sqrt(-2 * Math.log(u())) * Math.cos(2 * Math.PI * u());
  return (n, scale = 1) => Float32Array.from({ length: n }, () => normal() * scale);
}
