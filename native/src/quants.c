/* The scalar reference of every kernel: half/bfloat16 conversions, dequantizers, weight quantizers
 * equal to llama.cpp's quantize_row_*_ref byte for byte (the model generator writes with them),
 * activation quantizers equal to what ggml's CPU backend feeds its dots, and the fused dots.
 * SIMD twins (quants_avx2.c, quants_neon.c) must give the same integer parts and the same float
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

/* Activation quantizers: what ggml's x86 CPU backend (quantize_row_q8_0/q8_1 with AVX) feeds its dots:
 * id = 127/amax and round half to even. They differ from the _ref weight quantizers only at ties and
 * in the last bit of id, so the activations (and dots) equal llama.cpp's on this platform. */
static void quantize_act_q8_0(const float *x, void *vy, int64_t n) {
  block_q8_0 *y = vy;
  for (int64_t i = 0; i < n / QK32; i++, x += QK32) {
    float amax = 0;
    for (int j = 0; j < QK32; j++) amax = MAX(amax, fabsf(x[j]));
    const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
    y[i].d = F2H(d);
    for (int j = 0; j < QK32; j++) y[i].qs[j] = (int8_t)nearest_int(x[j] * id);
  }
}

static void quantize_act_q8_1(const float *x, void *vy, int64_t n) {
  block_q8_1 *y = vy;
  for (int64_t i = 0; i < n / QK32; i++, x += QK32) {
    float amax = 0;
    for (int j = 0; j < QK32; j++) amax = MAX(amax, fabsf(x[j]));
    const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
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

/* ---------------------------------------------------------------- the level */

void prima_scalar_fns(prima_level_fns *f) {
  memset(f, 0, sizeof *f);
  f->dequantize[PRIMA_F32] = dequantize_f32;
  f->dequantize[PRIMA_F16] = dequantize_f16;
  f->dequantize[PRIMA_BF16] = dequantize_bf16;
  f->dequantize[PRIMA_Q8_0] = dequantize_q8_0;
  f->dequantize[PRIMA_Q8_1] = dequantize_q8_1;
  f->dequantize[PRIMA_Q8_K] = dequantize_q8_K;

  f->dot[PRIMA_F32] = dot_f32;
  f->dot[PRIMA_F16] = dot_f16;
  f->dot[PRIMA_BF16] = dot_bf16;
  f->dot[PRIMA_Q8_0] = dot_q8_0;

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
  q[PRIMA_Q8_0] = quantize_q8_0_ref;
}
