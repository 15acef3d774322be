/* Block layouts of every weight and activation type, byte for byte as GGUF files and ggml hold them,
 * and the kernels of each SIMD level (quants.c is the scalar reference; quants_x86.c and quants_neon.c
 * are its twins). kernels.c assembles them into the table of kernels.h. */
#ifndef PRIMA_QUANTS_H
#define PRIMA_QUANTS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Elements per block: the small formats use 32, the K-quants 256 ("super-blocks"). */
#define QK32 32
#define QK_K 256
/* K-quant scale bytes of Q4_K/Q5_K: 8 six-bit scales and 8 six-bit mins packed into 12 bytes. */
#define K_SCALE_BYTES 12

typedef uint16_t prima_half; /* IEEE binary16 bits */

/* Q4_0: x = d * (q - 8), q in 0..15. Byte j holds element j (low nibble) and j+16 (high nibble). */
typedef struct { prima_half d; uint8_t qs[QK32 / 2]; } block_q4_0;
/* Q4_1: x = d * q + m. */
typedef struct { prima_half d, m; uint8_t qs[QK32 / 2]; } block_q4_1;
/* Q5_0: x = d * (q - 16); bit 4 of element j is bit j of qh (little-endian uint32). */
typedef struct { prima_half d; uint8_t qh[4]; uint8_t qs[QK32 / 2]; } block_q5_0;
/* Q5_1: x = d * q + m. */
typedef struct { prima_half d, m; uint8_t qh[4]; uint8_t qs[QK32 / 2]; } block_q5_1;
/* Q8_0: x = d * q (weights and the activations of Q4_0/Q5_0/Q8_0). */
typedef struct { prima_half d; int8_t qs[QK32]; } block_q8_0;
/* Q8_1: activations of Q4_1/Q5_1; s = d * sum(qs) carries the block sum for the weights' min term. */
typedef struct { prima_half d, s; int8_t qs[QK32]; } block_q8_1;

/* Q2_K: 16 groups of 16; scales[j] low nibble = scale, high nibble = min; x = d*sc*q - dmin*m.
 * qs: 2 bits each, byte l of a 128-element half holds elements l, l+32, l+64, l+96. */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; prima_half d, dmin; } block_q2_K;
/* Q3_K: 16 groups of 16, 6-bit signed scales (offset 32) packed in 12 bytes; x = d*(sc-32)*(q-4*!hbit). */
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; prima_half d; } block_q3_K;
/* Q4_K: 8 groups of 32; x = d*sc*q - dmin*m with 6-bit sc, m. qs byte l of a 64-element chunk holds
 * element l (low nibble) and l+32 (high nibble). */
typedef struct { prima_half d, dmin; uint8_t scales[K_SCALE_BYTES]; uint8_t qs[QK_K / 2]; } block_q4_K;
/* Q5_K: as Q4_K plus a fifth bit per element in qh (bit 2c / 2c+1 for chunk c's low / high halves). */
typedef struct { prima_half d, dmin; uint8_t scales[K_SCALE_BYTES]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
/* Q6_K: 16 groups of 16, int8 scales; x = d*sc*(q-32), q = 4 low bits in ql, 2 high bits in qh. */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; prima_half d; } block_q6_K;
/* IQ4_NL: x = d * PRIMA_IQ4NL_VALUES[q], q in 0..15, nibbles placed as Q4_0's. */
typedef struct { prima_half d; uint8_t qs[QK32 / 2]; } block_iq4_nl;
/* IQ4_XS: 8 groups of 32, x = d * (ls - 32) * PRIMA_IQ4NL_VALUES[q] with a 6-bit ls per group (low 4 bits
 * in scales_l, nibble g%2 of byte g/2; high 2 bits at bit 2g of scales_h); group g's nibbles are
 * qs[16g..16g+15] placed as Q4_0's. */
typedef struct { prima_half d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;
/* MXFP4 (gpt-oss's experts): x = 2^(e-128) * PRIMA_MXFP4_VALUES[q], the doubled E2M1 levels halved through
 * the shared E8M0 exponent e; nibbles placed as Q4_0's. */
typedef struct { uint8_t e; uint8_t qs[QK32 / 2]; } block_mxfp4;
/* Q8_K: activations of every K-quant; float scale and per-16 sums of the quants (for the min terms). */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;

/* Decodes the 6-bit scale and min of group j (0..7) of a Q4_K/Q5_K block. */
static inline void prima_k4_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

/* The 16 levels of the IQ4 formats (ggml's kvalues_iq4nl): a non-uniform grid, denser near zero. */
static const int8_t PRIMA_IQ4NL_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* E2M1's 8 magnitudes and their negatives, doubled to integers (ggml's kvalues_mxfp4). */
static const int8_t PRIMA_MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* An E8M0 scale halved (ggml_e8m0_to_fp32_half): 2^(e-128), the two smallest as the subnormals they are. */
static inline float prima_e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (uint32_t)0x00200000 << e : (uint32_t)(e - 1) << 23;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* The signed scale ls - 32 (-32..31) of group g (0..7) of an IQ4_XS block. */
static inline int prima_iq4xs_scale(const block_iq4_xs *b, int g) {
  return (((b->scales_l[g / 2] >> (4 * (g % 2))) & 0xF) | (((b->scales_h >> (2 * g)) & 3) << 4)) - 32;
}

/* Decodes the 16 signed 6-bit scales of a Q3_K block (values -32..31). */
static inline void prima_q3k_scales(const uint8_t *s, int8_t out[16]) {
  for (int j = 0; j < 16; j++) {
    int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
    int hi = (s[8 + (j % 4)] >> (2 * (j / 4))) & 3;
    out[j] = (int8_t)((lo | (hi << 4)) - 32);
  }
}

/* One implementation level: per type its dequantizer and dot (NULL where the level has none, so the
 * table falls back to the scalar one), plus the activation quantizers. Indexed by prima_type. */
typedef struct {
  prima_dequantize_fn dequantize[PRIMA_TYPE_COUNT];
  prima_dot_fn dot[PRIMA_TYPE_COUNT];
  prima_dot_rows_fn dot_rows[PRIMA_TYPE_COUNT]; /* only next to that level's own dot of the type */
  prima_dot_fn dot_stream[PRIMA_TYPE_COUNT];    /* likewise: that dot with the rows kernel's prefetch */
  prima_gemm_fn gemm[PRIMA_TYPE_COUNT];         /* likewise; a prompt kernel where blocking rows pays */
  prima_quantize_fn act_quantize[PRIMA_TYPE_COUNT];
} prima_level_fns;

/* Every weight type, as X(TYPE, name): each level defines dot_<name> (and AVX2 dot_<name>_rows) for
 * all of them and registers them with PRIMA_SET_DOTS(f) / PRIMA_SET_DOT_ROWS(f) (and x86's
 * dot_<name>_stream with PRIMA_SET_DOT_STREAM(f)). */
#define PRIMA_WEIGHT_TYPES(X)                                                                           \
  X(F32, f32) X(F16, f16) X(BF16, bf16) X(Q4_0, q4_0) X(Q4_1, q4_1) X(Q5_0, q5_0) X(Q5_1, q5_1)           \
  X(Q8_0, q8_0) X(Q2_K, q2_K) X(Q3_K, q3_K) X(Q4_K, q4_K) X(Q5_K, q5_K) X(Q6_K, q6_K)                    \
  X(IQ4_NL, iq4_nl) X(IQ4_XS, iq4_xs) X(MXFP4, mxfp4)
#define PRIMA_SET_DOT_(T, name) fns_->dot[PRIMA_##T] = dot_##name;
#define PRIMA_SET_DOT_ROWS_(T, name) fns_->dot_rows[PRIMA_##T] = dot_##name##_rows;
#define PRIMA_SET_DOT_STREAM_(T, name) fns_->dot_stream[PRIMA_##T] = dot_##name##_stream;
#define PRIMA_SET_DOTS(f)                \
  do {                                   \
    prima_level_fns *fns_ = (f);         \
    PRIMA_WEIGHT_TYPES(PRIMA_SET_DOT_)   \
  } while (0)
#define PRIMA_SET_DOT_ROWS(f)             \
  do {                                    \
    prima_level_fns *fns_ = (f);          \
    PRIMA_WEIGHT_TYPES(PRIMA_SET_DOT_ROWS_) \
  } while (0)
#define PRIMA_SET_DOT_STREAM(f)             \
  do {                                      \
    prima_level_fns *fns_ = (f);            \
    PRIMA_WEIGHT_TYPES(PRIMA_SET_DOT_STREAM_) \
  } while (0)

/* A SIMD level's dot for nc = 1..8 activation columns, one function each (so the column loops
 * unroll), and the dispatcher over nc. The level defines NC_FN(kernel, k) first. */
#define PRIMA_NC_EACH(M, kernel) M(kernel, 1) M(kernel, 2) M(kernel, 3) M(kernel, 4) M(kernel, 5) M(kernel, 6) M(kernel, 7) M(kernel, 8)
/* A dispatcher `name`(n, w, a, as, nc, out) over the functions name_1 .. name_8 (8 for nc > 8). */
#define PRIMA_NC_DISPATCHER(name)                                                            \
  static void name(int n, const void *w, const void *a, size_t as, int nc, float *out) {   \
    switch (nc) {                                                                            \
    case 1: name##_1(n, w, a, as, out); break;                                               \
    case 2: name##_2(n, w, a, as, out); break;                                               \
    case 3: name##_3(n, w, a, as, out); break;                                               \
    case 4: name##_4(n, w, a, as, out); break;                                               \
    case 5: name##_5(n, w, a, as, out); break;                                               \
    case 6: name##_6(n, w, a, as, out); break;                                               \
    case 7: name##_7(n, w, a, as, out); break;                                               \
    default: name##_8(n, w, a, as, out); break;                                              \
    }                                                                                        \
  }
#define PRIMA_DISPATCH_NC(kernel) PRIMA_NC_EACH(NC_FN, kernel) PRIMA_NC_DISPATCHER(kernel)

void prima_scalar_fns(prima_level_fns *f);
/* Only the weight quantizers that must equal llama.cpp byte for byte; scalar only (the model generator). */
void prima_scalar_quantize_ref(prima_quantize_fn q[PRIMA_TYPE_COUNT]);
#if defined(__x86_64__) || defined(_M_X64)
/* quants_x86.c, compiled once per level: AVX2, AVX-512 (F/BW/DQ/VL), AVX-512 with VNNI. */
void prima_avx2_fns(prima_level_fns *f);
void prima_avx512_fns(prima_level_fns *f);
void prima_avx512vnni_fns(prima_level_fns *f);
#endif
#if defined(__aarch64__) && defined(PRIMA_HAVE_NEON)
void prima_neon_fns(prima_level_fns *f);
#endif

#ifdef __cplusplus
}
#endif
#endif
