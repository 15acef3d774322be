/* The scalar reference of every kernel: half/bfloat16 conversions, dequantizers, weight quantizers
 * equal to llama.cpp's quantize_row_*_ref byte for byte (the model generator writes with them),
 * activation quantizers equal to what ggml's CPU backend feeds its dots, and the fused dots.
 * SIMD twins (quants_x86.c, quants_neon.c) must give the same integer parts and the same float
 * result up to summation order; tests compare them on random blocks. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "quants.h"

/* The quantizers must round exactly like ggml's portable C: no fused multiply-add contraction. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---------------------------------------------------------------- half and bfloat16 */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float prima_fp16_to_fp32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  if (exp == 0) {
    /* zero or subnormal: mant * 2^-24 is exact in float */
    float v = (float)mant * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7F800000u | (mant << 13));
  return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

/* Round to nearest, ties to even (as F16C's vcvtps2ph and ggml's portable conversion do). */
uint16_t prima_fp32_to_fp16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) return sign | 0x7E00;           /* NaN */
  if (x >= 0x477FF000u) return sign | 0x7C00;          /* >= 65520 rounds to infinity */
  if (x >= 0x38800000u) {                              /* normal half */
    uint32_t h = (x - 0x38000000u) >> 13, rem = x & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return sign | (uint16_t)h;
  }
  if (x < 0x33000000u) return sign;                    /* below half the smallest subnormal */
  /* subnormal half: units of 2^-24 */
  uint32_t e = x >> 23, m = (x & 0x7FFFFFu) | 0x800000u;
  uint32_t shift = 126 - e, q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) q++;
  return sign | (uint16_t)q;
}

float prima_bf16_to_fp32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

/* Ties to even; NaN stays a quiet NaN (as ggml_compute_fp32_to_bf16). */
uint16_t prima_fp32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 64);
  return (uint16_t)((u + (0x7FFFu + ((u >> 16) & 1))) >> 16);
}

#define H2F(h) prima_fp16_to_fp32(h)
#define F2H(f) prima_fp32_to_fp16(f)

/* Nearest integer, ties to even, for |v| < 2^22 (ggml's nearest_int: the K-quant quantizers use it). */
static inline int nearest_int(float v) {
  float t = v + 12582912.f;
  int32_t i;
  memcpy(&i, &t, 4);
  return (i & 0x007FFFFF) - 0x00400000;
}

/* ---------------------------------------------------------------- float formats */

static void dequantize_f32(const void *x, float *y, int64_t n) { memcpy(y, x, (size_t)n * 4); }
static void quantize_f32(const float *x, void *y, int64_t n) { memcpy(y, x, (size_t)n * 4); }

static void dequantize_f16(const void *vx, float *y, int64_t n) {
  const uint16_t *x = vx;
  for (int64_t i = 0; i < n; i++) y[i] = H2F(x[i]);
}
static void quantize_f16(const float *x, void *vy, int64_t n) {
  uint16_t *y = vy;
  for (int64_t i = 0; i < n; i++) y[i] = F2H(x[i]);
}
static void dequantize_bf16(const void *vx, float *y, int64_t n) {
  const uint16_t *x = vx;
  for (int64_t i = 0; i < n; i++) y[i] = prima_bf16_to_fp32(x[i]);
}
static void quantize_bf16(const float *x, void *vy, int64_t n) {
  uint16_t *y = vy;
  for (int64_t i = 0; i < n; i++) y[i] = prima_fp32_to_bf16(x[i]);
}

/* The float dots accumulate in double, like ggml's portable vec_dot_f32/f16/bf16. */
static void dot_f32(int n, const void *vw, const void *a, size_t as, int nc, float *out) {
  const float *w = vw;
  for (int c = 0; c < nc; c++) {
    const float *x = (const float *)((const char *)a + c * as);
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)(w[i] * x[i]);
    out[c] = (float)s;
  }
}
static void dot_f16(int n, const void *vw, const void *a, size_t as, int nc, float *out) {
  const uint16_t *w = vw;
  for (int c = 0; c < nc; c++) {
    const uint16_t *x = (const uint16_t *)((const char *)a + c * as);
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)(H2F(w[i]) * H2F(x[i]));
    out[c] = (float)s;
  }
}
static void dot_bf16(int n, const void *vw, const void *a, size_t as, int nc, float *out) {
  const uint16_t *w = vw;
  for (int c = 0; c < nc; c++) {
    const uint16_t *x = (const uint16_t *)((const char *)a + c * as);
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)(prima_bf16_to_fp32(w[i]) * prima_bf16_to_fp32(x[i]));
    out[c] = (float)s;
  }
}

/* ---------------------------------------------------------------- Q8_0 / Q8_1 */

/* Weight quantizer (quantize_row_q8_0_ref): id = 1/d, round half away from zero. */
static void quantize_q8_0_ref(const float *x, void *vy, int64_t n) {
  block_q8_0 *y = vy;
  for (int64_t i = 0; i < n / QK32; i++, x += QK32) {
    float amax = 0;
    for (int j = 0; j < QK32; j++) amax = MAX(amax, fabsf(x[j]));
    const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
    y[i].d = F2H(d);
    for (int j = 0; j < QK32; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
  }
}

/* Activation quantizers: what ggml's CPU backend feeds its dots on this platform, round half to even
 * with id = 127/amax on x86 (quantize_row_q8_0/q8_1 with AVX) and id = 1/d on aarch64 (with NEON).
 * The two differ in the last bit of id, which moves a level at a near tie: with x86's id, aarch64 was
 * 44x the oracle's first-position bound on tiny-llama Q5_0 against llama.cpp's arm64 build. */
#if defined(__aarch64__)
#define ACT_Q8_ID(amax, d) ((d) ? 1.0f / (d) : 0.0f)
#else
#define ACT_Q8_ID(amax, d) ((amax) != 0.0f ? 127.f / (amax) : 0.0f)
#endif
static void quantize_act_q8_0(const float *x, void *vy, int64_t n) {
  block_q8_0 *y = vy;
  for (int64_t i = 0; i < n / QK32; i++, x += QK32) {
    float amax = 0;
    for (int j = 0; j < QK32; j++) amax = MAX(amax, fabsf(x[j]));
    const float d = amax / 127.f, id = ACT_Q8_ID(amax, d);
    y[i].d = F2H(d);
    for (int j = 0; j < QK32; j++) y[i].qs[j] = (int8_t)nearest_int(x[j] * id);
  }
}

static void quantize_act_q8_1(const float *x, void *vy, int64_t n) {
  block_q8_1 *y = vy;
  for (int64_t i = 0; i < n / QK32; i++, x += QK32) {
    float amax = 0;
    for (int j = 0; j < QK32; j++) amax = MAX(amax, fabsf(x[j]));
    const float d = amax / 127.f, id = ACT_Q8_ID(amax, d);
    int sum = 0;
    y[i].d = F2H(d);
    for (int j = 0; j < QK32; j++) {
      y[i].qs[j] = (int8_t)nearest_int(x[j] * id);
      sum += y[i].qs[j];
    }
    y[i].s = F2H(d * (float)sum);
  }
}

/* Q8_K (ggml uses quantize_row_q8_K_ref on every platform): scale -127/max with the sign of the
 * largest magnitude, ties to even, per-16 sums. */
static void quantize_act_q8_K(const float *x, void *vy, int64_t n) {
  block_q8_K *y = vy;
  for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
    float max = 0, amax = 0;
    for (int j = 0; j < QK_K; j++) {
      float ax = fabsf(x[j]);
      if (ax > amax) { amax = ax; max = x[j]; }
    }
    if (!amax) {
      memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < QK_K; j++) y[i].qs[j] = (int8_t)MIN(127, nearest_int(iscale * x[j]));
    for (int g = 0; g < QK_K / 16; g++) {
      int s = 0;
      for (int l = 0; l < 16; l++) s += y[i].qs[16 * g + l];
      y[i].bsums[g] = (int16_t)s;
    }
    y[i].d = 1 / iscale;
  }
}

static void dequantize_q8_0(const void *vx, float *y, int64_t n) {
  const block_q8_0 *x = vx;
  for (int64_t i = 0; i < n / QK32; i++) {
    const float d = H2F(x[i].d);
    for (int j = 0; j < QK32; j++) *y++ = x[i].qs[j] * d;
  }
}

static void dequantize_q8_1(const void *vx, float *y, int64_t n) {
  const block_q8_1 *x = vx;
  for (int64_t i = 0; i < n / QK32; i++) {
    const float d = H2F(x[i].d);
    for (int j = 0; j < QK32; j++) *y++ = x[i].qs[j] * d;
  }
}

static void dequantize_q8_K(const void *vx, float *y, int64_t n) {
  const block_q8_K *x = vx;
  for (int64_t i = 0; i < n / QK_K; i++)
    for (int j = 0; j < QK_K; j++) *y++ = x[i].d * x[i].qs[j];
}

/* Activation row c of a dot call. */
#define ACT(T, c) ((const T *)((const char *)a + (size_t)(c) * as))

static void dot_q8_0(int n, const void *vw, const void *a, size_t as, int nc, float *out) {
  const block_q8_0 *w = vw;
  const int nb = n / QK32;
  for (int c = 0; c < nc; c++) {
    const block_q8_0 *x = ACT(block_q8_0, c);
    float s = 0;
    for (int i = 0; i < nb; i++) {
      int isum = 0;
      for (int j = 0; j < QK32; j++) isum += w[i].qs[j] * x[i].qs[j];
      s += (float)isum * (H2F(w[i].d) * H2F(x[i].d));
    }
    out[c] = s;
  }
}

/* ---------------------------------------------------------------- Q4_0, Q4_1, Q5_0, Q5_1 */

/* The 4-bit formats quantize element j and j+16 of a block into one byte (low, high nibble). */
static void quantize_q4_0_ref(const float *x, void *vy, int64_t n) {
  block_q4_0 *y = vy;
  for (int64_t i = 0; i < n / QK32; i++, x += QK32) {
    float amax = 0, max = 0;
    for (int j = 0; j < QK32; j++)
      if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    const float d = max / -8, id = d ? 1.0f / d : 0.0f;
    y[i].d = F2H(d);
    for (int j = 0; j < QK32 / 2; j++) {
      uint8_t lo = (uint8_t)MIN(15, (int8_t)(x[j] * id + 8.5f));
      uint8_t hi = (uint8_t)MIN(15, (int8_t)(x[j + 16] * id + 8.5f));
      y[i].qs[j] = (uint8_t)(lo | (hi << 4));
    }
  }
}

static void quantize_q4_1_ref(const float *x, void *vy, int64_t n) {
  block_q4_1 *y = vy;
  for (int64_t i = 0; i < n / QK32; i++, x += QK32) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < QK32; j++) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 15, id = d ? 1.0f / d : 0.0f;
    y[i].d = F2H(d);
    y[i].m = F2H(min);
    for (int j = 0; j < QK32 / 2; j++) {
      uint8_t lo = (uint8_t)MIN(15, (int8_t)((x[j] - min) * id + 0.5f));
      uint8_t hi = (uint8_t)MIN(15, (int8_t)((x[j + 16] - min) * id + 0.5f));
      y[i].qs[j] = (uint8_t)(lo | (hi << 4));
    }
  }
}

static void quantize_q5_0_ref(const float *x, void *vy, int64_t n) {
  block_q5_0 *y = vy;
  for (int64_t i = 0; i < n / QK32; i++, x += QK32) {
    float amax = 0, max = 0;
    for (int j = 0; j < QK32; j++)
      if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    const float d = max / -16, id = d ? 1.0f / d : 0.0f;
    y[i].d = F2H(d);
    uint32_t qh = 0;
    for (int j = 0; j < QK32 / 2; j++) {
      uint8_t lo = (uint8_t)MIN(31, (int8_t)(x[j] * id + 16.5f));
      uint8_t hi = (uint8_t)MIN(31, (int8_t)(x[j + 16] * id + 16.5f));
      y[i].qs[j] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
      qh |= (uint32_t)(lo >> 4) << j;
      qh |= (uint32_t)(hi >> 4) << (j + 16);
    }
    memcpy(y[i].qh, &qh, 4);
  }
}

static void quantize_q5_1_ref(const float *x, void *vy, int64_t n) {
  block_q5_1 *y = vy;
  for (int64_t i = 0; i < n / QK32; i++, x += QK32) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < QK32; j++) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 31, id = d ? 1.0f / d : 0.0f;
    y[i].d = F2H(d);
    y[i].m = F2H(min);
    uint32_t qh = 0;
    for (int j = 0; j < QK32 / 2; j++) {
      uint8_t lo = (uint8_t)((x[j] - min) * id + 0.5f);
      uint8_t hi = (uint8_t)((x[j + 16] - min) * id + 0.5f);
      y[i].qs[j] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
      qh |= (uint32_t)((lo >> 4) & 1) << j;
      qh |= (uint32_t)((hi >> 4) & 1) << (j + 16);
    }
    memcpy(y[i].qh, &qh, 4);
  }
}

/* Unsigned 4/5-bit values of one 32-element block, in element order. */
static inline void unpack_nibbles32(const uint8_t *qs, uint8_t q[QK32]) {
  for (int j = 0; j < 16; j++) {
    q[j] = qs[j] & 0xF;
    q[j + 16] = qs[j] >> 4;
  }
}
static inline void unpack_q5(const uint8_t *qs, const uint8_t qh4[4], uint8_t q[QK32]) {
  uint32_t qh;
  memcpy(&qh, qh4, 4);
  unpack_nibbles32(qs, q);
  for (int j = 0; j < QK32; j++) q[j] |= (uint8_t)(((qh >> j) & 1) << 4);
}

static void dequantize_q4_0(const void *vx, float *y, int64_t n) {
  const block_q4_0 *x = vx;
  uint8_t q[QK32];
  for (int64_t i = 0; i < n / QK32; i++) {
    const float d = H2F(x[i].d);
    unpack_nibbles32(x[i].qs, q);
    for (int j = 0; j < QK32; j++) *y++ = (q[j] - 8) * d;
  }
}
static void dequantize_q4_1(const void *vx, float *y, int64_t n) {
  const block_q4_1 *x = vx;
  uint8_t q[QK32];
  for (int64_t i = 0; i < n / QK32; i++) {
    const float d = H2F(x[i].d), m = H2F(x[i].m);
    unpack_nibbles32(x[i].qs, q);
    for (int j = 0; j < QK32; j++) *y++ = q[j] * d + m;
  }
}
static void dequantize_q5_0(const void *vx, float *y, int64_t n) {
  const block_q5_0 *x = vx;
  uint8_t q[QK32];
  for (int64_t i = 0; i < n / QK32; i++) {
    const float d = H2F(x[i].d);
    unpack_q5(x[i].qs, x[i].qh, q);
    for (int j = 0; j < QK32; j++) *y++ = (q[j] - 16) * d;
  }
}
static void dequantize_q5_1(const void *vx, float *y, int64_t n) {
  const block_q5_1 *x = vx;
  uint8_t q[QK32];
  for (int64_t i = 0; i < n / QK32; i++) {
    const float d = H2F(x[i].d), m = H2F(x[i].m);
    unpack_q5(x[i].qs, x[i].qh, q);
    for (int j = 0; j < QK32; j++) *y++ = q[j] * d + m;
  }
}

/* The 32-element dots: per block an exact integer sum of q*a (q offset to signed for the _0 types),
 * scaled by d_w*d_a; the _1 types add m_w * s_a (s_a = d_a * sum(a), stored in the Q8_1 block), summed
 * apart and added last, as every SIMD dot of ggml's does (mixing the two sums per block rounds differently,
 * and on a random-weight model one such rounding flipped an activation's Q8 level: 20x the oracle's bound). */
static inline int isum32(const uint8_t *q, int offset, const int8_t *a) {
  int s = 0;
  for (int j = 0; j < QK32; j++) s += (q[j] - offset) * a[j];
  return s;
}

static void dot_q4_0(int n, const void *vw, const void *a, size_t as, int nc, float *out) {
  const block_q4_0 *w = vw;
  float acc[PRIMA_MAX_NC] = {0};
  uint8_t q[QK32];
  for (int i = 0; i < n / QK32; i++) {
    unpack_nibbles32(w[i].qs, q);
    const float d = H2F(w[i].d);
    for (int c = 0; c < nc; c++) {
      const block_q8_0 *x = ACT(block_q8_0, c) + i;
      acc[c] += (float)isum32(q, 8, x->qs) * (d * H2F(x->d));
    }
  }
  for (int c = 0; c < nc; c++) out[c] = acc[c];
}
static void dot_q5_0(int n, const void *vw, const void *a, size_t as, int nc, float *out) {
  const block_q5_0 *w = vw;
  float acc[PRIMA_MAX_NC] = {0};
  uint8_t q[QK32];
  for (int i = 0; i < n / QK32; i++) {
    unpack_q5(w[i].qs, w[i].qh, q);
    const float d = H2F(w[i].d);
    for (int c = 0; c < nc; c++) {
      const block_q8_0 *x = ACT(block_q8_0, c) + i;
      acc[c] += (float)isum32(q, 16, x->qs) * (d * H2F(x->d));
    }
  }
  for (int c = 0; c < nc; c++) out[c] = acc[c];
}
static void dot_q4_1(int n, const void *vw, const void *a, size_t as, int nc, float *out) {
  const block_q4_1 *w = vw;
  float acc[PRIMA_MAX_NC] = {0}, accm[PRIMA_MAX_NC] = {0};
  uint8_t q[QK32];
  for (int i = 0; i < n / QK32; i++) {
    unpack_nibbles32(w[i].qs, q);
    const float d = H2F(w[i].d), m = H2F(w[i].m);
    for (int c = 0; c < nc; c++) {
      const block_q8_1 *x = ACT(block_q8_1, c) + i;
      acc[c] += (float)isum32(q, 0, x->qs) * (d * H2F(x->d));
      accm[c] += m * H2F(x->s);
    }
  }
  for (int c = 0; c < nc; c++) out[c] = acc[c] + accm[c];
}
static void dot_q5_1(int n, const void *vw, const void *a, size_t as, int nc, float *out) {
  const block_q5_1 *w = vw;
  float acc[PRIMA_MAX_NC] = {0}, accm[PRIMA_MAX_NC] = {0};
  uint8_t q[QK32];
  for (int i = 0; i < n / QK32; i++) {
    unpack_q5(w[i].qs, w[i].qh, q);
    const float d = H2F(w[i].d), m = H2F(w[i].m);
    for (int c = 0; c < nc; c++) {
      const block_q8_1 *x = ACT(block_q8_1, c) + i;
      acc[c] += (float)isum32(q, 0, x->qs) * (d * H2F(x->d));
      accm[c] += m * H2F(x->s);
    }
  }
  for (int c = 0; c < nc; c++) out[c] = acc[c] + accm[c];
}

/* ---------------------------------------------------------------- K-quant weight quantizers
 * These follow llama.cpp's quantize_row_q*_K_ref step by step (same float operations in the same
 * order), because a model file must hold the very bytes llama-quantize would write. */

#define GROUP_MAX_EPS 1e-15f

/* Signed levels for a group, error-weighted by x^2 (Q6_K): a scale search over 19 candidates. */
static float fit_signed_levels(int n, int nmax, const float *x, int8_t *L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; i++) {
    float ax = fabsf(x[i]);
    if (ax > amax) { amax = ax; max = x[i]; }
  }
  if (amax < GROUP_MAX_EPS) {
    for (int i = 0; i < n; i++) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; i++) {
    int l = MAX(-nmax, MIN(nmax - 1, nearest_int(iscale * x[i])));
    L[i] = (int8_t)(l + nmax);
    float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; is++) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; i++) {
      int l = MAX(-nmax, MIN(nmax - 1, nearest_int(iscale * x[i])));
      float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; i++) L[i] = (int8_t)(nmax + MAX(-nmax, MIN(nmax - 1, nearest_int(iscale * x[i]))));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

/* Signed 3-bit levels (Q3_K): start from the max, then up to 5 passes moving single levels while the
 * x^2-weighted fit improves. L comes back offset by nmax. */
static float fit_q3_levels(int n, int nmax, const float *x, int8_t *L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; i++) {
    float ax = fabsf(x[i]);
    if (ax > amax) { amax = ax; max = x[i]; }
  }
  if (amax < GROUP_MAX_EPS) {
    for (int i = 0; i < n; i++) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; i++) {
    int l = MAX(-nmax, MIN(nmax - 1, nearest_int(iscale * x[i])));
    L[i] = (int8_t)l;
    float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int pass = 0; pass < 5; pass++) {
    int changed = 0;
    for (int i = 0; i < n; i++) {
      float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * L[i] * L[i];
        int nl = MAX(-nmax, MIN(nmax - 1, nearest_int(x[i] * sl2 / slx)));
        if (nl != L[i]) {
          slx += w * x[i] * nl;
          sl2 += w * nl * nl;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = (int8_t)nl;
            sumlx = slx;
            suml2 = sl2;
            changed++;
          }
        }
      }
    }
    if (!changed) break;
  }
  for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Unsigned levels with a min (Q2_K, Q4_K, Q5_K): x ~ scale*L - the_min, searching nstep+1 scales
 * around nmax/(max-min) for the least weighted error (absolute when use_mad, else squared). */
static float fit_levels_with_min(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                                 uint8_t *Laux, float rmin, float rdelta, int nstep, int use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; i++) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; i++) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; i++) {
    L[i] = (uint8_t)MAX(0, MIN(nmax, nearest_int(iscale * (x[i] - min))));
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? fabsf(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  for (int is = 0; is <= nstep; is++) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; i++) {
      int l = MAX(0, MIN(nmax, nearest_int(iscale * (x[i] - min))));
      Laux[i] = (uint8_t)l;
      float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; i++) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        memcpy(L, Laux, (size_t)n);
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

/* Packs 2-bit levels: byte l of each 128-element half holds elements l, l+32, l+64, l+96. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
  for (int j = 0; j < QK_K; j += 128)
    for (int l = 0; l < 32; l++)
      qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

static void quantize_q2_K_ref(const float *x, void *vy, int64_t n) {
  block_q2_K *y = vy;
  uint8_t L[QK_K], Laux[16];
  float weights[16], mins[QK_K / 16], scales[QK_K / 16];
  for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 16; j++) {
      for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
      scales[j] = fit_levels_with_min(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 1);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
      float iscale = 15.f / max_scale;
      for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
      y[i].d = F2H(max_scale / 15.f);
    } else {
      for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = 0;
      y[i].d = F2H(0.f);
    }
    if (max_min > 0) {
      float iscale = 15.f / max_min;
      for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] |= (uint8_t)(nearest_int(iscale * mins[j]) << 4);
      y[i].dmin = F2H(max_min / 15.f);
    } else {
      y[i].dmin = F2H(0.f);
    }
    for (int j = 0; j < QK_K / 16; j++) {
      const float d = H2F(y[i].d) * (y[i].scales[j] & 0xF);
      if (!d) continue;
      const float dm = H2F(y[i].dmin) * (y[i].scales[j] >> 4);
      for (int l = 0; l < 16; l++) L[16 * j + l] = (uint8_t)MAX(0, MIN(3, nearest_int((x[16 * j + l] + dm) / d)));
    }
    pack_2bit(L, y[i].qs);
  }
}

static void quantize_q3_K_ref(const float *x, void *vy, int64_t n) {
  block_q3_K *y = vy;
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
    float max_scale = 0, amax = 0;
    for (int j = 0; j < QK_K / 16; j++) {
      scales[j] = fit_q3_levels(16, 4, x + 16 * j, L + 16 * j);
      if (fabsf(scales[j]) > amax) { amax = fabsf(scales[j]); max_scale = scales[j]; }
    }
    memset(y[i].scales, 0, 12);
    if (max_scale) {
      float iscale = -32.f / max_scale;
      for (int j = 0; j < QK_K / 16; j++) {
        int8_t l8 = (int8_t)nearest_int(iscale * scales[j]);
        int l = MAX(-32, MIN(31, l8)) + 32;
        if (j < 8) y[i].scales[j] = (uint8_t)(l & 0xF);
        else y[i].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
        y[i].scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
      }
      y[i].d = F2H(1 / iscale);
    } else {
      y[i].d = F2H(0.f);
    }
    int8_t sc[16];
    prima_q3k_scales(y[i].scales, sc);
    for (int j = 0; j < QK_K / 16; j++) {
      float d = H2F(y[i].d) * sc[j];
      if (!d) continue;
      for (int l = 0; l < 16; l++) L[16 * j + l] = (int8_t)(MAX(-4, MIN(3, nearest_int(x[16 * j + l] / d))) + 4);
    }
    /* high bit of element j goes to bit j/32 of hmask[j%32] */
    memset(y[i].hmask, 0, QK_K / 8);
    for (int j = 0; j < QK_K; j++) {
      if (L[j] > 3) {
        y[i].hmask[j % 32] |= (uint8_t)(1 << (j / 32));
        L[j] -= 4;
      }
    }
    pack_2bit((const uint8_t *)L, y[i].qs);
  }
}

/* Q4_K and Q5_K share the 8-groups-of-32 structure and 6-bit scale/min packing. */
static void pack_k4_scales(const float *scales, const float *mins, float max_scale, float max_min, uint8_t *out) {
  float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < QK_K / 32; j++) {
    uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
    uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
    ls = MIN(63, ls);
    lm = MIN(63, lm);
    if (j < 4) {
      out[j] = ls;
      out[j + 4] = lm;
    } else {
      out[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
      out[j - 4] |= (uint8_t)((ls >> 4) << 6);
      out[j] |= (uint8_t)((lm >> 4) << 6);
    }
  }
}

static void quantize_k4_levels(const float *x, int nmax, float rmin, int nstep, uint8_t L[QK_K], uint8_t *scale_bytes,
                               prima_half *d_out, prima_half *dmin_out) {
  uint8_t Laux[32];
  float weights[32], mins[QK_K / 32], scales[QK_K / 32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < QK_K / 32; j++) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
    float av_x = sqrtf(sum_x2 / 32);
    for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
    scales[j] = fit_levels_with_min(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, 0);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  pack_k4_scales(scales, mins, max_scale, max_min, scale_bytes);
  *d_out = F2H(max_scale / 63.f);
  *dmin_out = F2H(max_min / 63.f);
  for (int j = 0; j < QK_K / 32; j++) {
    uint8_t sc, m;
    prima_k4_scale_min(j, scale_bytes, &sc, &m);
    const float d = H2F(*d_out) * sc;
    if (!d) continue;
    const float dm = H2F(*dmin_out) * m;
    for (int l = 0; l < 32; l++) L[32 * j + l] = (uint8_t)MAX(0, MIN(nmax, nearest_int((x[32 * j + l] + dm) / d)));
  }
}

static void quantize_q4_K_ref(const float *x, void *vy, int64_t n) {
  block_q4_K *y = vy;
  uint8_t L[QK_K];
  for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
    quantize_k4_levels(x, 15, -1.f, 20, L, y[i].scales, &y[i].d, &y[i].dmin);
    for (int c = 0; c < 4; c++)
      for (int l = 0; l < 32; l++) y[i].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + l + 32] << 4));
  }
}

static void quantize_q5_K_ref(const float *x, void *vy, int64_t n) {
  block_q5_K *y = vy;
  uint8_t L[QK_K];
  for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
    quantize_k4_levels(x, 31, -0.5f, 15, L, y[i].scales, &y[i].d, &y[i].dmin);
    memset(y[i].qh, 0, QK_K / 8);
    for (int c = 0; c < 4; c++) {
      for (int l = 0; l < 32; l++) {
        int lo = L[64 * c + l], hi = L[64 * c + l + 32];
        if (lo > 15) { lo -= 16; y[i].qh[l] |= (uint8_t)(1 << (2 * c)); }
        if (hi > 15) { hi -= 16; y[i].qh[l] |= (uint8_t)(2 << (2 * c)); }
        y[i].qs[32 * c + l] = (uint8_t)(lo | (hi << 4));
      }
    }
  }
}

static void quantize_q6_K_ref(const float *x, void *vy, int64_t n) {
  block_q6_K *y = vy;
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
    float max_scale = 0, max_abs_scale = 0;
    for (int g = 0; g < QK_K / 16; g++) {
      scales[g] = fit_signed_levels(16, 32, x + 16 * g, L + 16 * g);
      if (fabsf(scales[g]) > max_abs_scale) { max_abs_scale = fabsf(scales[g]); max_scale = scales[g]; }
    }
    if (max_abs_scale < GROUP_MAX_EPS) {
      memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    float iscale = -128.f / max_scale;
    y[i].d = F2H(1 / iscale);
    for (int g = 0; g < QK_K / 16; g++) y[i].scales[g] = (int8_t)MIN(127, nearest_int(iscale * scales[g]));
    for (int g = 0; g < QK_K / 16; g++) {
      float d = H2F(y[i].d) * y[i].scales[g];
      if (!d) continue;
      for (int l = 0; l < 16; l++) L[16 * g + l] = (int8_t)(MAX(-32, MIN(31, nearest_int(x[16 * g + l] / d))) + 32);
    }
    /* per 128-element half: ql[l] = e[l] | e[l+64]<<4, ql[l+32] = e[l+32] | e[l+96]<<4, qh[l] = 2 high bits x4 */
    for (int h = 0; h < 2; h++) {
      const int8_t *e = L + 128 * h;
      uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
      for (int l = 0; l < 32; l++) {
        ql[l] = (uint8_t)((e[l] & 0xF) | ((e[l + 64] & 0xF) << 4));
        ql[l + 32] = (uint8_t)((e[l + 32] & 0xF) | ((e[l + 96] & 0xF) << 4));
        qh[l] = (uint8_t)((e[l] >> 4) | ((e[l + 32] >> 4) << 2) | ((e[l + 64] >> 4) << 4) | ((e[l + 96] >> 4) << 6));
      }
    }
  }
}

/* ---------------------------------------------------------------- K-quant decoding
 * Each decoder turns one super-block into integer levels and integer group scales; the dequantizer
 * and the reference dot share it, and the SIMD dots must reproduce the same integer sums. */

/* Q2_K: q[e] in 0..3; group g (16 elements) has scale sc[g], min m[g]. */
static inline void decode_q2_K(const block_q2_K *b, uint8_t q[QK_K], uint8_t sc[16], uint8_t m[16]) {
  for (int j = 0; j < QK_K; j += 128)
    for (int s = 0; s < 4; s++)
      for (int l = 0; l < 32; l++) q[j + 32 * s + l] = (b->qs[j / 4 + l] >> (2 * s)) & 3;
  for (int g = 0; g < 16; g++) { sc[g] = b->scales[g] & 0xF; m[g] = b->scales[g] >> 4; }
}

/* Q3_K: q[e] in -4..3 (2 low bits, minus 4 where the high bit is clear); signed group scales. */
static inline void decode_q3_K(const block_q3_K *b, int8_t q[QK_K], int8_t sc[16]) {
  for (int j = 0; j < QK_K; j += 128)
    for (int s = 0; s < 4; s++)
      for (int l = 0; l < 32; l++) {
        int e = j + 32 * s + l;
        int hbit = (b->hmask[l] >> (e / 32)) & 1;
        q[e] = (int8_t)(((b->qs[j / 4 + l] >> (2 * s)) & 3) - (hbit ? 0 : 4));
      }
  prima_q3k_scales(b->scales, sc);
}

/* Q4_K / Q5_K: q[e] in 0..15 / 0..31; group g (32 elements) has 6-bit scale sc[g] and min m[g]. */
static inline void decode_q4_K(const block_q4_K *b, uint8_t q[QK_K], uint8_t sc[8], uint8_t m[8]) {
  for (int c = 0; c < 4; c++)
    for (int l = 0; l < 32; l++) {
      q[64 * c + l] = b->qs[32 * c + l] & 0xF;
      q[64 * c + 32 + l] = b->qs[32 * c + l] >> 4;
    }
  for (int g = 0; g < 8; g++) prima_k4_scale_min(g, b->scales, &sc[g], &m[g]);
}
static inline void decode_q5_K(const block_q5_K *b, uint8_t q[QK_K], uint8_t sc[8], uint8_t m[8]) {
  for (int c = 0; c < 4; c++)
    for (int l = 0; l < 32; l++) {
      q[64 * c + l] = (uint8_t)((b->qs[32 * c + l] & 0xF) | (((b->qh[l] >> (2 * c)) & 1) << 4));
      q[64 * c + 32 + l] = (uint8_t)((b->qs[32 * c + l] >> 4) | (((b->qh[l] >> (2 * c + 1)) & 1) << 4));
    }
  for (int g = 0; g < 8; g++) prima_k4_scale_min(g, b->scales, &sc[g], &m[g]);
}

/* Q6_K: q[e] in -32..31; int8 scale per 16-element group. */
static inline void decode_q6_K(const block_q6_K *b, int8_t q[QK_K]) {
  for (int h = 0; h < 2; h++) {
    const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
    int8_t *e = q + 128 * h;
    for (int l = 0; l < 32; l++) {
      e[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
      e[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      e[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      e[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
  }
}

static void dequantize_q2_K(const void *vx, float *y, int64_t n) {
  const block_q2_K *x = vx;
  uint8_t q[QK_K], sc[16], m[16];
  for (int64_t i = 0; i < n / QK_K; i++) {
    decode_q2_K(&x[i], q, sc, m);
    const float d = H2F(x[i].d), dmin = H2F(x[i].dmin);
    for (int e = 0; e < QK_K; e++) *y++ = d * sc[e / 16] * q[e] - dmin * m[e / 16];
  }
}
static void dequantize_q3_K(const void *vx, float *y, int64_t n) {
  const block_q3_K *x = vx;
  int8_t q[QK_K], sc[16];
  for (int64_t i = 0; i < n / QK_K; i++) {
    decode_q3_K(&x[i], q, sc);
    const float d = H2F(x[i].d);
    for (int e = 0; e < QK_K; e++) *y++ = d * sc[e / 16] * q[e];
  }
}
static void dequantize_q4_K(const void *vx, float *y, int64_t n) {
  const block_q4_K *x = vx;
  uint8_t q[QK_K], sc[8], m[8];
  for (int64_t i = 0; i < n / QK_K; i++) {
    decode_q4_K(&x[i], q, sc, m);
    const float d = H2F(x[i].d), dmin = H2F(x[i].dmin);
    for (int e = 0; e < QK_K; e++) *y++ = d * sc[e / 32] * q[e] - dmin * m[e / 32];
  }
}
static void dequantize_q5_K(const void *vx, float *y, int64_t n) {
  const block_q5_K *x = vx;
  uint8_t q[QK_K], sc[8], m[8];
  for (int64_t i = 0; i < n / QK_K; i++) {
    decode_q5_K(&x[i], q, sc, m);
    const float d = H2F(x[i].d), dmin = H2F(x[i].dmin);
    for (int e = 0; e < QK_K; e++) *y++ = d * sc[e / 32] * q[e] - dmin * m[e / 32];
  }
}
static void dequantize_q6_K(const void *vx, float *y, int64_t n) {
  const block_q6_K *x = vx;
  int8_t q[QK_K];
  for (int64_t i = 0; i < n / QK_K; i++) {
    decode_q6_K(&x[i], q);
    const float d = H2F(x[i].d);
    for (int e = 0; e < QK_K; e++) *y++ = d * x[i].scales[e / 16] * q[e];
  }
}

/* ---------------------------------------------------------------- K-quant dots
 * Per super-block: isum = sum over groups of scale * (integer dot of the group), and for the types
 * with mins msum = sum over groups of min * (sum of the group's activations, from bsums);
 * then acc += (d_a * d_w) * isum - (d_a * dmin_w) * msum. */

static inline int isum_u8(const uint8_t *q, const int8_t *a, int len) {
  int s = 0;
  for (int j = 0; j < len; j++) s += q[j] * a[j];
  return s;
}
static inline int isum_s8(const int8_t *q, const int8_t *a, int len) {
  int s = 0;
  for (int j = 0; j < len; j++) s += q[j] * a[j];
  return s;
}

static void dot_q2_K(int n, const void *vw, const void *a, size_t as, int nc, float *out) {
  const block_q2_K *w = vw;
  float acc[PRIMA_MAX_NC] = {0};
  uint8_t q[QK_K], sc[16], m[16];
  for (int i = 0; i < n / QK_K; i++) {
    decode_q2_K(&w[i], q, sc, m);
    const float d = H2F(w[i].d), dmin = H2F(w[i].dmin);
    for (int c = 0; c < nc; c++) {
      const block_q8_K *x = ACT(block_q8_K, c) + i;
      int isum = 0, msum = 0;
      for (int g = 0; g < 16; g++) {
        isum += sc[g] * isum_u8(q + 16 * g, x->qs + 16 * g, 16);
        msum += m[g] * x->bsums[g];
      }
      acc[c] += (x->d * d) * (float)isum - (x->d * dmin) * (float)msum;
    }
  }
  for (int c = 0; c < nc; c++) out[c] = acc[c];
}

static void dot_q3_K(int n, const void *vw, const void *a, size_t as, int nc, float *out) {
  const block_q3_K *w = vw;
  float acc[PRIMA_MAX_NC] = {0};
  int8_t q[QK_K], sc[16];
  for (int i = 0; i < n / QK_K; i++) {
    decode_q3_K(&w[i], q, sc);
    const float d = H2F(w[i].d);
    for (int c = 0; c < nc; c++) {
      const block_q8_K *x = ACT(block_q8_K, c) + i;
      int isum = 0;
      for (int g = 0; g < 16; g++) isum += sc[g] * isum_s8(q + 16 * g, x->qs + 16 * g, 16);
      acc[c] += (x->d * d) * (float)isum;
    }
  }
  for (int c = 0; c < nc; c++) out[c] = acc[c];
}

/* Q4_K and Q5_K differ only in how a block decodes to 6-bit-scaled unsigned levels with minimums. */
#define DOT_K_WITH_MIN(T)                                                                        \
  static void dot_##T(int n, const void *vw, const void *a, size_t as, int nc, float *out) {     \
    const block_##T *w = vw;                                                                     \
    float acc[PRIMA_MAX_NC] = {0};                                                               \
    uint8_t q[QK_K], sc[8], m[8];                                                                \
    for (int i = 0; i < n / QK_K; i++) {                                                         \
      decode_##T(&w[i], q, sc, m);                                                               \
      const float d = H2F(w[i].d), dmin = H2F(w[i].dmin);                                        \
      for (int c = 0; c < nc; c++) {                                                             \
        const block_q8_K *x = ACT(block_q8_K, c) + i;                                            \
        int isum = 0, msum = 0;                                                                  \
        for (int g = 0; g < 8; g++) {                                                            \
          isum += sc[g] * isum_u8(q + 32 * g, x->qs + 32 * g, 32);                               \
          msum += m[g] * (x->bsums[2 * g] + x->bsums[2 * g + 1]);                                \
        }                                                                                        \
        acc[c] += (x->d * d) * (float)isum - (x->d * dmin) * (float)msum;                        \
      }                                                                                          \
    }                                                                                            \
    for (int c = 0; c < nc; c++) out[c] = acc[c];                                                \
  }
DOT_K_WITH_MIN(q4_K)
DOT_K_WITH_MIN(q5_K)

static void dot_q6_K(int n, const void *vw, const void *a, size_t as, int nc, float *out) {
  const block_q6_K *w = vw;
  float acc[PRIMA_MAX_NC] = {0};
  int8_t q[QK_K];
  for (int i = 0; i < n / QK_K; i++) {
    decode_q6_K(&w[i], q);
    const float d = H2F(w[i].d);
    for (int c = 0; c < nc; c++) {
      const block_q8_K *x = ACT(block_q8_K, c) + i;
      int isum = 0;
      for (int g = 0; g < 16; g++) isum += w[i].scales[g] * isum_s8(q + 16 * g, x->qs + 16 * g, 16);
      acc[c] += (x->d * d) * (float)isum;
    }
  }
  for (int c = 0; c < nc; c++) out[c] = acc[c];
}

/* ---------------------------------------------------------------- IQ4_NL, IQ4_XS
 * Levels from a fixed non-uniform grid (PRIMA_IQ4NL_VALUES) times a scale per 32 elements; IQ4_XS
 * stores the scales of its 8 groups as 6-bit multiples of one fp16 super-scale. */

/* Index of the grid value nearest x (ggml's best_index_int8: a tie goes to the upper value). */
static inline int iq4_nearest(float x) {
  const int8_t *v = PRIMA_IQ4NL_VALUES;
  if (x <= v[0]) return 0;
  if (x >= v[15]) return 15;
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (x < v[mid]) hi = mid;
    else lo = mid;
  }
  return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

/* Best scale of a 32-element group (quantize_row_iq4_nl_impl without an importance matrix, ntry = 7, as
 * llama-quantize runs it): weights x^2, a start at max/127, then 15 trial scales around it, keeping the
 * least-squares scale of the best assignment. 0 for an all-but-zero group. */
static float iq4_group_scale(const float *xb) {
  const int ntry = 7;
  const int8_t *values = PRIMA_IQ4NL_VALUES;
  float weight[32], amax = 0, max = 0;
  for (int j = 0; j < 32; j++) {
    weight[j] = xb[j] * xb[j];
    const float ax = fabsf(xb[j]);
    if (ax > amax) { amax = ax; max = xb[j]; }
  }
  if (amax < GROUP_MAX_EPS) return 0;
  float d = -max / values[0], id = 1 / d, sumqx = 0, sumq2 = 0;
  for (int j = 0; j < 32; j++) {
    const float q = values[iq4_nearest(id * xb[j])], w = weight[j];
    sumqx += w * q * xb[j];
    sumq2 += w * q * q;
  }
  d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
  float best = d * sumqx;
  for (int itry = -ntry; itry <= ntry; itry++) {
    id = (itry + values[0]) / max;
    sumqx = sumq2 = 0;
    for (int j = 0; j < 32; j++) {
      const float q = values[iq4_nearest(id * xb[j])], w = weight[j];
      sumqx += w * q * xb[j];
      sumq2 += w * q * q;
    }
    if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
      d = sumqx / sumq2;
      best = d * sumqx;
    }
  }
  return d;
}

/* Nibbles of 32 levels as Q4_0 places them: byte j = level j | level j+16 << 4. */
static inline void pack_nibbles32(const uint8_t L[32], uint8_t qs[16]) {
  for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
}

/* What llama-quantize writes (quantize_iq4_nl, ntry = 7); ggml's quantize_row_iq4_nl_ref skips the scale
 * search (ntry = -1) and is not what any file holds, so the model generator follows the former. */
static void quantize_iq4_nl_ref(const float *x, void *vy, int64_t n) {
  block_iq4_nl *y = vy;
  uint8_t L[QK32];
  for (int64_t i = 0; i < n / QK32; i++, x += QK32) {
    const float d = iq4_group_scale(x);
    y[i].d = F2H(d);
    const float id = d ? 1 / d : 0;
    for (int j = 0; j < QK32; j++) L[j] = (uint8_t)iq4_nearest(id * x[j]);
    pack_nibbles32(L, y[i].qs);
  }
}

/* quantize_row_iq4_xs_ref (= quantize_iq4_xs without an importance matrix): the groups' best scales,
 * then one super-scale d = -max/32 (max: the group scale of largest magnitude) and 6-bit group scales,
 * and levels requantized against each group's rounded scale. */
static void quantize_iq4_xs_ref(const float *x, void *vy, int64_t n) {
  block_iq4_xs *y = vy;
  uint8_t L[32];
  float scales[QK_K / 32];
  for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
    float max_scale = 0, amax_scale = 0;
    for (int g = 0; g < QK_K / 32; g++) {
      scales[g] = iq4_group_scale(x + 32 * g);
      if (fabsf(scales[g]) > amax_scale) { amax_scale = fabsf(scales[g]); max_scale = scales[g]; }
    }
    const float d = -max_scale / 32, id = d ? 1 / d : 0.f;
    y[i].d = F2H(d);
    y[i].scales_h = 0;
    for (int g = 0; g < QK_K / 32; g++) {
      const int l = MAX(-32, MIN(31, nearest_int(id * scales[g])));
      const float dl = d * l, idl = dl ? 1 / dl : 0.f;
      for (int j = 0; j < 32; j++) L[j] = (uint8_t)iq4_nearest(idl * x[32 * g + j]);
      pack_nibbles32(L, y[i].qs + 16 * g);
      const int ls = l + 32;
      if (g % 2 == 0) y[i].scales_l[g / 2] = (uint8_t)(ls & 0xF);
      else y[i].scales_l[g / 2] |= (uint8_t)((ls & 0xF) << 4);
      y[i].scales_h |= (uint16_t)((ls >> 4) << (2 * g));
    }
  }
}

static void dequantize_iq4_nl(const void *vx, float *y, int64_t n) {
  const block_iq4_nl *x = vx;
  uint8_t q[QK32];
  for (int64_t i = 0; i < n / QK32; i++) {
    const float d = H2F(x[i].d);
    unpack_nibbles32(x[i].qs, q);
    for (int j = 0; j < QK32; j++) *y++ = d * PRIMA_IQ4NL_VALUES[q[j]];
  }
}

static void dequantize_iq4_xs(const void *vx, float *y, int64_t n) {
  const block_iq4_xs *x = vx;
  uint8_t q[QK32];
  for (int64_t i = 0; i < n / QK_K; i++) {
    const float d = H2F(x[i].d);
    for (int g = 0; g < QK_K / 32; g++) {
      const float dl = d * prima_iq4xs_scale(&x[i], g);
      unpack_nibbles32(x[i].qs + 16 * g, q);
      for (int j = 0; j < QK32; j++) *y++ = dl * PRIMA_IQ4NL_VALUES[q[j]];
    }
  }
}

/* The 32 signed levels of a group. */
static inline void iq4_levels32(const uint8_t *qs, int8_t q[QK32]) {
  for (int j = 0; j < 16; j++) {
    q[j] = PRIMA_IQ4NL_VALUES[qs[j] & 0xF];
    q[j + 16] = PRIMA_IQ4NL_VALUES[qs[j] >> 4];
  }
}

/* One block of 32 signed levels with its scale d against block i of each column's Q8_0 activations:
 * (float)isum * (d * d_a) into acc, the order IQ4_NL's and MXFP4's scalar dots share. */
static inline void dot_levels32_q8_0(const int8_t *q, float d, int i, const void *a, size_t as, int nc, float *acc) {
  for (int c = 0; c < nc; c++) {
    const block_q8_0 *x = ACT(block_q8_0, c) + i;
    int isum = 0;
    for (int j = 0; j < QK32; j++) isum += q[j] * x->qs[j];
    acc[c] += (float)isum * (d * H2F(x->d));
  }
}

/* As Q4_0: per block (float)isum * (d_w * d_a). */
static void dot_iq4_nl(int n, const void *vw, const void *a, size_t as, int nc, float *out) {
  const block_iq4_nl *w = vw;
  float acc[PRIMA_MAX_NC] = {0};
  int8_t q[QK32];
  for (int i = 0; i < n / QK32; i++) {
    iq4_levels32(w[i].qs, q);
    dot_levels32_q8_0(q, H2F(w[i].d), i, a, as, nc, acc);
  }
  for (int c = 0; c < nc; c++) out[c] = acc[c];
}

/* As Q6_K: isum = sum over groups of (ls - 32) * group dot (|isum| < 8 * 32 * 32 * 127 * 127 < 2^31). */
static void dot_iq4_xs(int n, const void *vw, const void *a, size_t as, int nc, float *out) {
  const block_iq4_xs *w = vw;
  float acc[PRIMA_MAX_NC] = {0};
  int8_t q[QK_K];
  int sc[QK_K / 32];
  for (int i = 0; i < n / QK_K; i++) {
    for (int g = 0; g < QK_K / 32; g++) {
      iq4_levels32(w[i].qs + 16 * g, q + 32 * g);
      sc[g] = prima_iq4xs_scale(&w[i], g);
    }
    const float d = H2F(w[i].d);
    for (int c = 0; c < nc; c++) {
      const block_q8_K *x = ACT(block_q8_K, c) + i;
      int isum = 0;
      for (int g = 0; g < QK_K / 32; g++) isum += sc[g] * isum_s8(q + 32 * g, x->qs + 32 * g, 32);
      acc[c] += (x->d * d) * (float)isum;
    }
  }
  for (int c = 0; c < nc; c++) out[c] = acc[c];
}

/* ---------------------------------------------------------------- MXFP4
 * gpt-oss's expert weights: 32 E2M1 levels (doubled to integers) and one E8M0 power-of-two scale. */

/* The level whose value is nearest x, the first on a tie (best_index_mxfp4). */
static inline int mxfp4_nearest(float x, float d) {
  int best = 0;
  float best_err = fabsf(PRIMA_MXFP4_VALUES[0] * d - x);
  for (int i = 1; i < 16; i++) {
    const float err = fabsf(PRIMA_MXFP4_VALUES[i] * d - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return best;
}

/* quantize_row_mxfp4_ref: the exponent puts the largest magnitude in the top two levels (4..6 of 6). */
static void quantize_mxfp4_ref(const float *x, void *vy, int64_t n) {
  block_mxfp4 *y = vy;
  for (int64_t i = 0; i < n / QK32; i++, x += QK32) {
    float amax = 0.0f;
    for (int j = 0; j < QK32; j++)
      if (amax < fabsf(x[j])) amax = fabsf(x[j]);
    const uint8_t e = amax > 0.0f ? (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0;
    const float d = prima_e8m0_half(e);
    y[i].e = e;
    for (int j = 0; j < QK32 / 2; j++) y[i].qs[j] = (uint8_t)(mxfp4_nearest(x[j], d) | (mxfp4_nearest(x[j + 16], d) << 4));
  }
}

static void dequantize_mxfp4(const void *vx, float *y, int64_t n) {
  const block_mxfp4 *x = vx;
  uint8_t q[QK32];
  for (int64_t i = 0; i < n / QK32; i++) {
    const float d = prima_e8m0_half(x[i].e);
    unpack_nibbles32(x[i].qs, q);
    for (int j = 0; j < QK32; j++) *y++ = PRIMA_MXFP4_VALUES[q[j]] * d;
  }
}

/* As IQ4_NL with the E8M0 scale: per block (float)isum * (d_w * d_a). */
static void dot_mxfp4(int n, const void *vw, const void *a, size_t as, int nc, float *out) {
  const block_mxfp4 *w = vw;
  float acc[PRIMA_MAX_NC] = {0};
  int8_t q[QK32];
  for (int i = 0; i < n / QK32; i++) {
    for (int j = 0; j < 16; j++) {
      q[j] = PRIMA_MXFP4_VALUES[w[i].qs[j] & 0xF];
      q[j + 16] = PRIMA_MXFP4_VALUES[w[i].qs[j] >> 4];
    }
    dot_levels32_q8_0(q, prima_e8m0_half(w[i].e), i, a, as, nc, acc);
  }
  for (int c = 0; c < nc; c++) out[c] = acc[c];
}

/* ---------------------------------------------------------------- the level */

void prima_scalar_fns(prima_level_fns *f) {
  memset(f, 0, sizeof *f);
#define SET_DEQUANTIZE(T, name) f->dequantize[PRIMA_##T] = dequantize_##name;
  PRIMA_WEIGHT_TYPES(SET_DEQUANTIZE)
#undef SET_DEQUANTIZE
  f->dequantize[PRIMA_Q8_1] = dequantize_q8_1;
  f->dequantize[PRIMA_Q8_K] = dequantize_q8_K;

  PRIMA_SET_DOTS(f);

  f->act_quantize[PRIMA_F32] = quantize_f32;
  f->act_quantize[PRIMA_F16] = quantize_f16;
  f->act_quantize[PRIMA_BF16] = quantize_bf16;
  f->act_quantize[PRIMA_Q8_0] = quantize_act_q8_0;
  f->act_quantize[PRIMA_Q8_1] = quantize_act_q8_1;
  f->act_quantize[PRIMA_Q8_K] = quantize_act_q8_K;
}

void prima_scalar_quantize_ref(prima_quantize_fn q[PRIMA_TYPE_COUNT]) {
  memset(q, 0, sizeof(prima_quantize_fn) * PRIMA_TYPE_COUNT);
  q[PRIMA_F32] = quantize_f32;
  q[PRIMA_F16] = quantize_f16;
  q[PRIMA_BF16] = quantize_bf16;
  q[PRIMA_Q4_0] = quantize_q4_0_ref;
  q[PRIMA_Q4_1] = quantize_q4_1_ref;
  q[PRIMA_Q5_0] = quantize_q5_0_ref;
  q[PRIMA_Q5_1] = quantize_q5_1_ref;
  q[PRIMA_Q8_0] = quantize_q8_0_ref;
  q[PRIMA_Q2_K] = quantize_q2_K_ref;
  q[PRIMA_Q3_K] = quantize_q3_K_ref;
  q[PRIMA_Q4_K] = quantize_q4_K_ref;
  q[PRIMA_Q5_K] = quantize_q5_K_ref;
  q[PRIMA_Q6_K] = quantize_q6_K_ref;
  q[PRIMA_IQ4_NL] = quantize_iq4_nl_ref;
  q[PRIMA_IQ4_XS] = quantize_iq4_xs_ref;
  q[PRIMA_MXFP4] = quantize_mxfp4_ref;
}
