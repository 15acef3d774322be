/* NEON (AArch64, baseline ARMv8.0: no dot-product extension needed) twins of quants.c's dots.
 *
 * Each dot decodes a weight block once into signed int8 levels and uses them for each of the nc
 * activation rows: vmull_s8 products (exact in int16), pairwise-accumulated into int32, times the
 * group scale. The per-block integer sums equal the scalar twin's, and the float combination is the
 * scalar one, so the quantized dots give the scalar results bit for bit. Activation quantizers and
 * dequantizers use the scalar reference (the table falls back to it). */
#include <arm_neon.h>
#include <string.h>

#include "quants.h"

/* The float combination must round exactly like the scalar twin's: no fused multiply-add contraction
 * (AArch64 compilers contract a*b+c by default). */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define ACT_ROW(c) ((const uint8_t *)a + (size_t)(c) * as)

ALWAYS_INLINE float h2f(prima_half h) { return prima_fp16_to_fp32(h); }

/* sum of 16 int8 x int8 products, as 4 int32 lanes (exact) */
ALWAYS_INLINE int32x4_t dot16(int8x16_t q, int8x16_t x) {
  const int16x8_t lo = vmull_s8(vget_low_s8(q), vget_low_s8(x));
  const int16x8_t hi = vmull_high_s8(q, x);
  return vpadalq_s16(vpaddlq_s16(lo), hi);
}

/* One function per nc (so each gets its own register allocation and loop layout: sharing one body
 * measured ~15% slower at nc = 1), and a dispatcher on the run-time nc. */
#define NC_FN(kernel, k)                                                                                    \
  static __attribute__((noinline)) void kernel##_##k(int n, const void *w, const void *a, size_t as, float *out) { \
    kernel##_nc(n, w, a, as, k, out);                                                                       \
  }
#define DISPATCH_NC(kernel) PRIMA_DISPATCH_NC(kernel)

/* ---------------------------------------------------------------- float formats */

ALWAYS_INLINE float32x4_t load4_f32(const uint8_t *p) { return vld1q_f32((const float *)p); }
ALWAYS_INLINE float32x4_t load4_f16(const uint8_t *p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p)));
}
ALWAYS_INLINE float32x4_t load4_bf16(const uint8_t *p) {
  return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p), 16));
}
ALWAYS_INLINE float load1_f32(const void *p, int i) { return ((const float *)p)[i]; }
ALWAYS_INLINE float load1_f16(const void *p, int i) { return h2f(((const uint16_t *)p)[i]); }
ALWAYS_INLINE float load1_bf16(const void *p, int i) { return prima_bf16_to_fp32(((const uint16_t *)p)[i]); }

#define FLOAT_DOT(NAME, ESIZE, LOAD4, LOAD1)                                                           \
  ALWAYS_INLINE void NAME##_nc(int n, const void *w, const void *a, size_t as, const int NC, float *out) { \
    float32x4_t acc0[PRIMA_MAX_NC], acc1[PRIMA_MAX_NC];                                                \
    for (int c = 0; c < NC; c++) acc0[c] = acc1[c] = vdupq_n_f32(0);                                   \
    const uint8_t *wb = w;                                                                             \
    int i = 0;                                                                                         \
    for (; i + 8 <= n; i += 8) {                                                                       \
      const float32x4_t w0 = LOAD4(wb + (size_t)i * ESIZE), w1 = LOAD4(wb + (size_t)(i + 4) * ESIZE); \
      for (int c = 0; c < NC; c++) {                                                                   \
        acc0[c] = vfmaq_f32(acc0[c], w0, LOAD4(ACT_ROW(c) + (size_t)i * ESIZE));                       \
        acc1[c] = vfmaq_f32(acc1[c], w1, LOAD4(ACT_ROW(c) + (size_t)(i + 4) * ESIZE));                 \
      }                                                                                                \
    }                                                                                                  \
    for (int c = 0; c < NC; c++) {                                                                     \
      float s = vaddvq_f32(vaddq_f32(acc0[c], acc1[c]));                                               \
      for (int j = i; j < n; j++) s += LOAD1(w, j) * LOAD1(ACT_ROW(c), j);                             \
      out[c] = s;                                                                                      \
    }                                                                                                  \
  }                                                                                                    \
  DISPATCH_NC(NAME)

FLOAT_DOT(dot_f32, 4, load4_f32, load1_f32)
FLOAT_DOT(dot_f16, 2, load4_f16, load1_f16)
FLOAT_DOT(dot_bf16, 2, load4_bf16, load1_bf16)

/* ---------------------------------------------------------------- 32-element blocks */

/* The 32 levels of a block as two int8x16 (elements 0..15, 16..31), offset already subtracted. */
typedef struct { int8x16_t lo, hi; } levels32;

ALWAYS_INLINE levels32 nibbles32(const uint8_t *qs, int offset) {
  const uint8x16_t b = vld1q_u8(qs);
  const int8x16_t off = vdupq_n_s8((int8_t)offset);
  levels32 l = {vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0F))), off),
                vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b, 4)), off)};
  return l;
}

/* Bit j of qh (little-endian uint32) -> 0x10 in byte j, as two int8x16. */
ALWAYS_INLINE levels32 fifth_bits32(const uint8_t *qh4) {
  uint32_t qh;
  memcpy(&qh, qh4, 4);
  static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t mask = vld1q_u8(bit);
  const uint8x16_t b01 = vcombine_u8(vdup_n_u8((uint8_t)qh), vdup_n_u8((uint8_t)(qh >> 8)));
  const uint8x16_t b23 = vcombine_u8(vdup_n_u8((uint8_t)(qh >> 16)), vdup_n_u8((uint8_t)(qh >> 24)));
  const uint8x16_t sixteen = vdupq_n_u8(0x10);
  levels32 l = {vreinterpretq_s8_u8(vandq_u8(vtstq_u8(b01, mask), sixteen)),
                vreinterpretq_s8_u8(vandq_u8(vtstq_u8(b23, mask), sixteen))};
  return l;
}

ALWAYS_INLINE int isum32(levels32 q, const int8_t *x) {
  return vaddvq_s32(vaddq_s32(dot16(q.lo, vld1q_s8(x)), dot16(q.hi, vld1q_s8(x + 16))));
}

ALWAYS_INLINE levels32 decode_q4_0(const block_q4_0 *b) { return nibbles32(b->qs, 8); }
ALWAYS_INLINE levels32 decode_q4_1(const block_q4_1 *b) { return nibbles32(b->qs, 0); }
ALWAYS_INLINE levels32 decode_q5_0(const block_q5_0 *b) {
  levels32 q = nibbles32(b->qs, 0), h = fifth_bits32(b->qh);
  const int8x16_t sixteen = vdupq_n_s8(16);
  levels32 l = {vsubq_s8(vorrq_s8(q.lo, h.lo), sixteen), vsubq_s8(vorrq_s8(q.hi, h.hi), sixteen)};
  return l;
}
ALWAYS_INLINE levels32 decode_q5_1(const block_q5_1 *b) {
  levels32 q = nibbles32(b->qs, 0), h = fifth_bits32(b->qh);
  levels32 l = {vorrq_s8(q.lo, h.lo), vorrq_s8(q.hi, h.hi)};
  return l;
}
ALWAYS_INLINE levels32 decode_q8_0(const block_q8_0 *b) {
  levels32 l = {vld1q_s8(b->qs), vld1q_s8(b->qs + 16)};
  return l;
}

/* acc += isum * (d_w * d_a), the scalar twin's float order */
#define SIGNED32_DOT(NAME, BLOCK, DECODE, SCALE)                                                            \
  ALWAYS_INLINE void NAME##_nc(int n, const void *vw, const void *a, size_t as, const int NC, float *out) { \
    const BLOCK *w = vw;                                                                               \
    float acc[PRIMA_MAX_NC] = {0};                                                                     \
    for (int i = 0; i < n / QK32; i++) {                                                               \
      const levels32 q = DECODE(&w[i]);                                                                \
      const float d = SCALE(&w[i]);                                                                    \
      for (int c = 0; c < NC; c++) {                                                                   \
        const block_q8_0 *x = (const block_q8_0 *)ACT_ROW(c) + i;                                      \
        acc[c] += (float)isum32(q, x->qs) * (d * h2f(x->d));                                           \
      }                                                                                                \
    }                                                                                                  \
    for (int c = 0; c < NC; c++) out[c] = acc[c];                                                      \
  }                                                                                                    \
  DISPATCH_NC(NAME)

#define MIN32_DOT(NAME, BLOCK, DECODE)                                                                 \
  ALWAYS_INLINE void NAME##_nc(int n, const void *vw, const void *a, size_t as, const int NC, float *out) { \
    const BLOCK *w = vw;                                                                               \
    float acc[PRIMA_MAX_NC] = {0}, accm[PRIMA_MAX_NC] = {0};                                           \
    for (int i = 0; i < n / QK32; i++) {                                                               \
      const levels32 q = DECODE(&w[i]);                                                                \
      const float d = h2f(w[i].d), m = h2f(w[i].m);                                                    \
      for (int c = 0; c < NC; c++) {                                                                   \
        const block_q8_1 *x = (const block_q8_1 *)ACT_ROW(c) + i;                                      \
        acc[c] += (float)isum32(q, x->qs) * (d * h2f(x->d));                                           \
        accm[c] += m * h2f(x->s);                                                                      \
      }                                                                                                \
    }                                                                                                  \
    for (int c = 0; c < NC; c++) out[c] = acc[c] + accm[c];                                            \
  }                                                                                                    \
  DISPATCH_NC(NAME)

/* IQ4_NL: each nibble looked up in the 16-value grid (tbl). */
ALWAYS_INLINE levels32 iq4_levels32(const uint8_t *qs) {
  const int8x16_t grid = vld1q_s8(PRIMA_IQ4NL_VALUES);
  const uint8x16_t b = vld1q_u8(qs);
  levels32 l = {vqtbl1q_s8(grid, vandq_u8(b, vdupq_n_u8(0x0F))), vqtbl1q_s8(grid, vshrq_n_u8(b, 4))};
  return l;
}
ALWAYS_INLINE levels32 decode_iq4_nl(const block_iq4_nl *b) { return iq4_levels32(b->qs); }

/* MXFP4: the same lookup in E2M1's grid; its scale is an E8M0 power of two. */
ALWAYS_INLINE levels32 decode_mxfp4(const block_mxfp4 *b) {
  const int8x16_t grid = vld1q_s8(PRIMA_MXFP4_VALUES);
  const uint8x16_t q = vld1q_u8(b->qs);
  levels32 l = {vqtbl1q_s8(grid, vandq_u8(q, vdupq_n_u8(0x0F))), vqtbl1q_s8(grid, vshrq_n_u8(q, 4))};
  return l;
}

#define HALF_SCALE(b) h2f((b)->d)
#define E8M0_SCALE(b) prima_e8m0_half((b)->e)
SIGNED32_DOT(dot_iq4_nl, block_iq4_nl, decode_iq4_nl, HALF_SCALE)
SIGNED32_DOT(dot_q4_0, block_q4_0, decode_q4_0, HALF_SCALE)
SIGNED32_DOT(dot_q5_0, block_q5_0, decode_q5_0, HALF_SCALE)
SIGNED32_DOT(dot_q8_0, block_q8_0, decode_q8_0, HALF_SCALE)
SIGNED32_DOT(dot_mxfp4, block_mxfp4, decode_mxfp4, E8M0_SCALE)
MIN32_DOT(dot_q4_1, block_q4_1, decode_q4_1)
MIN32_DOT(dot_q5_1, block_q5_1, decode_q5_1)

/* ---------------------------------------------------------------- K-quants
 * Per super-block: decode 32 elements at a time into int8 levels (two int8x16 = two 16-groups),
 * accumulate scale * dot16 into an int32x4 per row; min terms from bsums in scalar integers. */

ALWAYS_INLINE const block_q8_K *act_k(const void *a, size_t as, int c, int i) {
  return (const block_q8_K *)((const uint8_t *)a + (size_t)c * as) + i;
}

/* K-quant dot skeleton: for each 32-element slot s (0..7) of the block, DECODE sets lo/hi (elements
 * 32s..32s+15, 32s+16..32s+31) and sc_lo/sc_hi (their group scales). */
#define K_DOT(NAME, BLOCK, PREP, DECODE, MINSUM, DW)                                                   \
  ALWAYS_INLINE void NAME##_nc(int n, const void *vw, const void *a, size_t as, const int NC, float *out) { \
    const BLOCK *w = vw;                                                                               \
    float acc[PRIMA_MAX_NC] = {0};                                                                     \
    for (int i = 0; i < n / QK_K; i++) {                                                               \
      const BLOCK *b = &w[i];                                                                          \
      PREP                                                                                             \
      int32x4_t sumi[PRIMA_MAX_NC];                                                                    \
      for (int c = 0; c < NC; c++) sumi[c] = vdupq_n_s32(0);                                           \
      for (int s = 0; s < 8; s++) {                                                                    \
        int8x16_t lo, hi;                                                                              \
        int sc_lo, sc_hi;                                                                              \
        DECODE                                                                                         \
        for (int c = 0; c < NC; c++) {                                                                 \
          const int8_t *xq = act_k(a, as, c, i)->qs + 32 * s;                                          \
          sumi[c] = vmlaq_n_s32(sumi[c], dot16(lo, vld1q_s8(xq)), sc_lo);                              \
          sumi[c] = vmlaq_n_s32(sumi[c], dot16(hi, vld1q_s8(xq + 16)), sc_hi);                         \
        }                                                                                              \
      }                                                                                                \
      for (int c = 0; c < NC; c++) {                                                                   \
        const block_q8_K *x = act_k(a, as, c, i);                                                      \
        const int isum = vaddvq_s32(sumi[c]);                                                          \
        MINSUM                                                                                         \
        acc[c] += DW;                                                                                  \
      }                                                                                                \
    }                                                                                                  \
    for (int c = 0; c < NC; c++) out[c] = acc[c];                                                      \
  }                                                                                                    \
  DISPATCH_NC(NAME)

/* Q4_K: slot s = chunk s/2, low nibbles for even s, high for odd; one scale per slot. */
#define Q4K_PREP                                                                                       \
  uint8_t sc[8], mn[8];                                                                                \
  for (int g = 0; g < 8; g++) prima_k4_scale_min(g, b->scales, &sc[g], &mn[g]);                        \
  const float d = h2f(b->d), dmin = h2f(b->dmin);
#define Q4K_DECODE                                                                                     \
  {                                                                                                    \
    const uint8_t *qs = b->qs + 32 * (s / 2);                                                          \
    const uint8x16_t b0 = vld1q_u8(qs), b1 = vld1q_u8(qs + 16);                                        \
    const uint8x16_t m4 = vdupq_n_u8(0x0F);                                                            \
    lo = vreinterpretq_s8_u8((s & 1) ? vshrq_n_u8(b0, 4) : vandq_u8(b0, m4));                          \
    hi = vreinterpretq_s8_u8((s & 1) ? vshrq_n_u8(b1, 4) : vandq_u8(b1, m4));                          \
    sc_lo = sc_hi = sc[s];                                                                             \
  }
#define K4_MINSUM                                                                                      \
  int msum = 0;                                                                                        \
  for (int g = 0; g < 8; g++) msum += mn[g] * (x->bsums[2 * g] + x->bsums[2 * g + 1]);
#define K4_DW ((x->d * d) * (float)isum - (x->d * dmin) * (float)msum)

/* Q5_K: as Q4_K plus the fifth bit: bit s of qh[l] for element 32s + l. */
#define Q5K_DECODE                                                                                     \
  Q4K_DECODE                                                                                           \
  {                                                                                                    \
    const uint8x16_t bit = vdupq_n_u8((uint8_t)(1 << s)), sixteen = vdupq_n_u8(0x10);                  \
    lo = vorrq_s8(lo, vreinterpretq_s8_u8(vandq_u8(vtstq_u8(vld1q_u8(b->qh), bit), sixteen)));         \
    hi = vorrq_s8(hi, vreinterpretq_s8_u8(vandq_u8(vtstq_u8(vld1q_u8(b->qh + 16), bit), sixteen)));    \
  }

K_DOT(dot_q4_K, block_q4_K, Q4K_PREP, Q4K_DECODE, K4_MINSUM, K4_DW)
K_DOT(dot_q5_K, block_q5_K, Q4K_PREP, Q5K_DECODE, K4_MINSUM, K4_DW)

/* Q6_K: slot s = half s/4, k = s%4: low nibble of ql[64h + 32(k&1) + l] (k < 2) or its high nibble,
 * plus bits 2k..2k+1 of qh[32h + l], minus 32; groups 2s and 2s+1. */
#define Q6K_PREP const float d = h2f(b->d);
#define Q6K_DECODE                                                                                     \
  {                                                                                                    \
    const int h = s / 4, k = s % 4;                                                                    \
    const uint8_t *ql = b->ql + 64 * h + 32 * (k & 1), *qh = b->qh + 32 * h;                           \
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);                                        \
    const uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16);                                        \
    const uint8x16_t h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16);                                        \
    const int8x16_t shift = vdupq_n_s8((int8_t)(-2 * k));                                              \
    const uint8x16_t v0 = vorrq_u8(k < 2 ? vandq_u8(l0, m4) : vshrq_n_u8(l0, 4),                       \
                                   vshlq_n_u8(vandq_u8(vshlq_u8(h0, shift), m3), 4));                  \
    const uint8x16_t v1 = vorrq_u8(k < 2 ? vandq_u8(l1, m4) : vshrq_n_u8(l1, 4),                       \
                                   vshlq_n_u8(vandq_u8(vshlq_u8(h1, shift), m3), 4));                  \
    lo = vsubq_s8(vreinterpretq_s8_u8(v0), vdupq_n_s8(32));                                            \
    hi = vsubq_s8(vreinterpretq_s8_u8(v1), vdupq_n_s8(32));                                            \
    sc_lo = b->scales[2 * s];                                                                          \
    sc_hi = b->scales[2 * s + 1];                                                                      \
  }
#define NO_MINSUM
#define K_DW ((x->d * d) * (float)isum)

K_DOT(dot_q6_K, block_q6_K, Q6K_PREP, Q6K_DECODE, NO_MINSUM, K_DW)

/* Q2_K and Q3_K: slot s = half s/4, shift 2*(s%4) of qs[32h + l]; groups 2s and 2s+1. */
#define Q2K_PREP const float d = h2f(b->d), dmin = h2f(b->dmin);
#define TWO_BIT_LEVELS                                                                                 \
  {                                                                                                    \
    const uint8_t *qs = b->qs + 32 * (s / 4);                                                          \
    const int8x16_t shift = vdupq_n_s8((int8_t)(-2 * (s % 4)));                                        \
    const uint8x16_t m3 = vdupq_n_u8(3);                                                               \
    lo = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vld1q_u8(qs), shift), m3));                             \
    hi = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vld1q_u8(qs + 16), shift), m3));                        \
  }
#define Q2K_DECODE                                                                                     \
  TWO_BIT_LEVELS                                                                                       \
  sc_lo = b->scales[2 * s] & 0xF;                                                                      \
  sc_hi = b->scales[2 * s + 1] & 0xF;
#define Q2K_MINSUM                                                                                     \
  int msum = 0;                                                                                        \
  for (int g = 0; g < 16; g++) msum += (b->scales[g] >> 4) * x->bsums[g];

K_DOT(dot_q2_K, block_q2_K, Q2K_PREP, Q2K_DECODE, Q2K_MINSUM, K4_DW)

/* Q3_K: levels -4..3 = 2 low bits - 4 where bit (4h + s%4) of hmask[l] is clear. */
#define Q3K_PREP                                                                                       \
  int8_t sc[16];                                                                                       \
  prima_q3k_scales(b->scales, sc);                                                                     \
  const float d = h2f(b->d);
#define Q3K_DECODE                                                                                     \
  TWO_BIT_LEVELS                                                                                       \
  {                                                                                                    \
    const uint8x16_t bit = vdupq_n_u8((uint8_t)(1 << (4 * (s / 4) + s % 4)));                          \
    const uint8x16_t four = vdupq_n_u8(4);                                                             \
    /* subtract 4 where the high bit is clear */                                                       \
    lo = vsubq_s8(lo, vreinterpretq_s8_u8(vbicq_u8(four, vtstq_u8(vld1q_u8(b->hmask), bit))));         \
    hi = vsubq_s8(hi, vreinterpretq_s8_u8(vbicq_u8(four, vtstq_u8(vld1q_u8(b->hmask + 16), bit))));    \
    sc_lo = sc[2 * s];                                                                                 \
    sc_hi = sc[2 * s + 1];                                                                             \
  }

K_DOT(dot_q3_K, block_q3_K, Q3K_PREP, Q3K_DECODE, NO_MINSUM, K_DW)

/* IQ4_XS: slot s = group s, its grid levels (as IQ4_NL's block) and signed 6-bit scale. */
#define IQ4XS_PREP const float d = h2f(b->d);
#define IQ4XS_DECODE                                                                                   \
  {                                                                                                    \
    const levels32 l = iq4_levels32(b->qs + 16 * s);                                                   \
    lo = l.lo;                                                                                         \
    hi = l.hi;                                                                                         \
    sc_lo = sc_hi = prima_iq4xs_scale(b, s);                                                           \
  }

K_DOT(dot_iq4_xs, block_iq4_xs, IQ4XS_PREP, IQ4XS_DECODE, NO_MINSUM, K_DW)

/* ---------------------------------------------------------------- the level */

void prima_neon_fns(prima_level_fns *f) {
  memset(f, 0, sizeof *f);
  PRIMA_SET_DOTS(f);
}
