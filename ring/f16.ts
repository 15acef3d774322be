// IEEE half <-> float conversions for f16 activation payloads, bit-exact with ggml's
// ggml_fp32_to_fp16 / ggml_fp16_to_fp32 (and F16C's vcvtps2ph with round-to-nearest-even):
// rounding ties to even, overflow to infinity from 65520 up, subnormal halves both ways, every
// float NaN written as the half quiet NaN 0x7E00 with its sign, and half NaNs read back quiet.
//
// Plain JS on the float's bit pattern: half -> float is one table load (256 KiB table, built on
// first use), float -> half a few integer operations; both run at hundreds of millions of values/s
// under V8. native/ has C twins (fp32ToHalf/halfToFp32) but ring/ may not import native/ (DESIGN's
// dependency direction), and at these rates the conversion is far cheaper than the network.

/** Half bits (0..0xFFFF) of the float whose IEEE bits are `x` (as a uint32). */
function halfBitsOfFloatBits(x: number): number {
  const sign = (x >>> 16) & 0x8000;
  const a = x & 0x7fffffff;
  if (a >= 0x38800000) {
    // |f| >= 2^-14: a normal half, or too large for one.
    if (a >= 0x477ff000) return sign | (a > 0x7f800000 ? 0x7e00 : 0x7c00); // >= 65520 -> inf; NaN
    // Rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest, ties to even: adding
    // 0xFFF plus the kept lowest bit carries exactly when the dropped part is > half, or == half and
    // the kept part is odd. A carry out of the mantissa bumps the exponent, which is also right.
    return sign | ((a - 0x38000000 + 0x0fff + ((a >>> 13) & 1)) >>> 13);
  }
  if (a <= 0x33000000) return sign; // <= 2^-25 (half the smallest subnormal; the tie goes to even 0)
  // Subnormal half: the value in units of 2^-24, rounded to nearest, ties to even.
  const shift = 126 - (a >>> 23); // 14..24 for exponents 102..112
  const m = (a & 0x7fffff) | 0x800000;
  let q = m >>> shift;
  const rem = m & ((1 << shift) - 1);
  const half = 1 << (shift - 1);
  if (rem > half || (rem === half && (q & 1) === 1)) q++;
  return sign | q; // q may reach 0x400, which is the smallest normal half: still the right encoding
}

/** IEEE bits (uint32) of the float equal to the half with bits `h`. */
function floatBitsOfHalfBits(h: number): number {
  const sign = (h & 0x8000) << 16;
  const exp = (h >>> 10) & 0x1f;
  let mant = h & 0x3ff;
  if (exp === 31) {
    // Infinity; or NaN with its payload, made quiet (bit 22) as ggml's conversion and F16C do.
    return (sign | 0x7f800000 | (mant << 13) | (mant !== 0 ? 0x400000 : 0)) >>> 0;
  }
  if (exp !== 0) return (sign | ((exp + 112) << 23) | (mant << 13)) >>> 0;
  if (mant === 0) return sign >>> 0;
  // Subnormal half (mant x 2^-24): normalize into a float's implicit leading one.
  let floatExp = 113; // float exponent of 2^-14, the subnormals' scale before normalizing
  while ((mant & 0x400) === 0) {
    mant <<= 1;
    floatExp--;
  }
  return (sign | (floatExp << 23) | ((mant & 0x3ff) << 13)) >>> 0;
}

let halfToFloatTable: Uint32Array | null = null;

function table(): Uint32Array {
  if (halfToFloatTable) return halfToFloatTable;
  const t = new Uint32Array(65536);
  for (let h = 0; h < 65536; h++) t[h] = floatBitsOfHalfBits(h);
  return (halfToFloatTable = t);
}

function checkLengths(what: string, srcLength: number, dstLength: number): void {
  if (srcLength !== dstLength) {
    throw new RangeError(`${what}: destination holds ${dstLength} values, source ${srcLength}`);
  }
}

/** Floats -> IEEE halves (round to nearest even, as ggml/F16C). Returns `dst`. */
export function f32ToF16(src: Float32Array, dst: Uint16Array = new Uint16Array(src.length)): Uint16Array {
  checkLengths("f32ToF16", src.length, dst.length);
  // Read the floats' bit patterns: a Float32Array's offset is always 4-aligned, so this view is legal.
  const bits = new Uint32Array(src.buffer, src.byteOffset, src.length);
  const n = bits.length;
  for (let i = 0; i < n; i++) dst[i] = halfBitsOfFloatBits(bits[i]);
  return dst;
}

/** IEEE halves -> floats (exact; NaNs keep their payload, made quiet). Returns `dst`. */
export function f16ToF32(src: Uint16Array, dst: Float32Array = new Float32Array(src.length)): Float32Array {
  checkLengths("f16ToF32", src.length, dst.length);
  const t = table();
  // Write bit patterns, not numbers: storing a NaN through a Float32Array may canonicalize its payload.
  const out = new Uint32Array(dst.buffer, dst.byteOffset, dst.length);
  const n = out.length;
  for (let i = 0; i < n; i++) out[i] = t[src[i]];
  return dst;
}
