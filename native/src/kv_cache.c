#include "kv_cache.h"

#include <math.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"
#include "quants.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define PRIMA_X86 1
#endif

/* Blocked online softmax: scores for ATT_BLOCK cached positions at a time, one rescale of the
 * accumulators per block instead of per position. */
#define ATT_BLOCK 128

int prima_kv_type_ok(int type) { return type == PRIMA_F16 || type == PRIMA_Q8_0 || type == PRIMA_Q4_0; }

const char *prima_kv_type_problem(int type, int head_dim) {
  if (!prima_kv_type_ok(type)) return "is not a KV cache type (f16, q8_0 or q4_0)";
  if (head_dim % prima_type_block_elems(type) != 0) return "has blocks of 32 elements, which do not divide the model's head size";
  return NULL;
}

void prima_kv_store(int type, const float *x, void *dst, int n) {
  if (type == PRIMA_Q4_0) prima_kernels(PRIMA_Q4_0)->quantize_ref(x, dst, n);
  else prima_act_quantizer(type)(x, dst, n); /* F16: round to nearest even; Q8_0: quantize_row_q8_0 */
}

int prima_kv_rotation_chunk(int head_dim, int is_k) {
  if (head_dim <= 0 || head_dim % 64 != 0) return 0;
  if (!is_k) return 64; /* llama.cpp: smaller rotations seem better for V */
  int n = 64;
  while (head_dim % (2 * n) == 0) n *= 2;
  return n;
}

void prima_hadamard(float *x, int n, int chunk) {
  const float c = (float)(1.0 / (double)sqrtf((float)chunk)); /* ggml_gen_hadamard's entry */
  for (int base = 0; base + chunk <= n; base += chunk) {
    float *v = x + base;
    for (int h = 1; h < chunk; h *= 2)
      for (int i = 0; i < chunk; i += 2 * h)
        for (int j = i; j < i + h; j++) {
          const float a = v[j], b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
    for (int i = 0; i < chunk; i++) v[i] *= c;
  }
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t prima_kv_attend_scratch_bytes(int ratio, int d) {
  const size_t floats = (size_t)ratio * (2 * (size_t)d + 2 + ATT_BLOCK);
  return align64(sizeof(float) * floats) + align64(prima_row_bytes(PRIMA_Q8_0, (int64_t)ratio * d)) /* 0 when d is no whole number of blocks */;
}

/* ---- V accumulation on quantized blocks: acc[h] += sum_j p[h * n_pos + j] * d_b * q_b ------------ */

/* Levels of one 32-element block as floats times its scale: (float)q * d is exact (8 and 11 bits). */
static inline void levels_q8_0(const block_q8_0 *b, float *x) {
  const float d = prima_fp16_to_fp32(b->d);
  for (int i = 0; i < QK32; i++) x[i] = (float)b->qs[i] * d;
}
static inline void levels_q4_0(const block_q4_0 *b, float *x) {
  const float d = prima_fp16_to_fp32(b->d);
  for (int i = 0; i < QK32 / 2; i++) {
    x[i] = (float)((b->qs[i] & 0xF) - 8) * d;
    x[i + 16] = (float)((b->qs[i] >> 4) - 8) * d;
  }
}

static void accum_quant_scalar(int type, float *acc, const float *p, int ratio, int d, const uint8_t *v, size_t vs, int n_pos) {
  const int nblk = d / QK32;
  const size_t bb = type == PRIMA_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0);
  float x[QK32];
  for (int j = 0; j < n_pos; j++) {
    const uint8_t *vj = v + (size_t)j * vs;
    for (int ib = 0; ib < nblk; ib++) {
      if (type == PRIMA_Q8_0) levels_q8_0((const block_q8_0 *)(vj + ib * bb), x);
      else levels_q4_0((const block_q4_0 *)(vj + ib * bb), x);
      for (int h = 0; h < ratio; h++) {
        const float w = p[(size_t)h * n_pos + j];
        float *a = acc + (size_t)h * d + (size_t)ib * QK32;
        for (int i = 0; i < QK32; i++) a[i] += x[i] * w;
      }
    }
  }
}

#ifdef PRIMA_X86
/* A Q8_0 or Q4_0 block's 32 levels as int8 (elements 0..15 in lo, 16..31 in hi) and its scale: what
 * the AVX2 and AVX-512 V accumulations below both read. */
__attribute__((target("avx2,f16c"))) static inline float kv_block_levels(int type, const uint8_t *blk, __m128i *lo, __m128i *hi) {
  if (type == PRIMA_Q8_0) {
    const block_q8_0 *b = (const block_q8_0 *)blk;
    *lo = _mm_loadu_si128((const __m128i *)b->qs);
    *hi = _mm_loadu_si128((const __m128i *)(b->qs + 16));
    return prima_fp16_to_fp32(b->d);
  }
  const block_q4_0 *b = (const block_q4_0 *)blk;
  const __m128i raw = _mm_loadu_si128((const __m128i *)b->qs), m4 = _mm_set1_epi8(0xF), eight = _mm_set1_epi8(8);
  *lo = _mm_sub_epi8(_mm_and_si128(raw, m4), eight);
  *hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), eight);
  return prima_fp16_to_fp32(b->d);
}

/* The scalar's arithmetic in 8 lanes: the same products, accumulated with a fused multiply-add (each
 * element's sum is the scalar's up to that rounding; AVX-512 below gives the AVX2 twin's bits). */
__attribute__((target("avx2,fma,f16c"))) static void accum_quant_avx2(int type, float *acc, const float *p, int ratio, int d,
                                                                      const uint8_t *v, size_t vs, int n_pos) {
  const int nblk = d / QK32;
  const size_t bb = type == PRIMA_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0);
  for (int j = 0; j < n_pos; j++) {
    const uint8_t *vj = v + (size_t)j * vs;
    for (int ib = 0; ib < nblk; ib++) {
      __m128i lo, hi; /* elements 0..15 and 16..31 as int8 */
      const float dh = kv_block_levels(type, vj + ib * bb, &lo, &hi);
      const __m256 dv = _mm256_set1_ps(dh);
      __m256 x[4];
      x[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), dv);
      x[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), dv);
      x[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), dv);
      x[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), dv);
      for (int h = 0; h < ratio; h++) {
        const __m256 w = _mm256_set1_ps(p[(size_t)h * n_pos + j]);
        float *a = acc + (size_t)h * d + (size_t)ib * QK32;
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(a + 8 * i, _mm256_fmadd_ps(x[i], w, _mm256_loadu_ps(a + 8 * i)));
      }
    }
  }
}

/* The same in 16 lanes: a block is two vectors. */
__attribute__((target("avx512f,avx2,fma,f16c"))) static void accum_quant_avx512(int type, float *acc, const float *p, int ratio, int d,
                                                                               const uint8_t *v, size_t vs, int n_pos) {
  const int nblk = d / QK32;
  const size_t bb = type == PRIMA_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0);
  for (int j = 0; j < n_pos; j++) {
    const uint8_t *vj = v + (size_t)j * vs;
    for (int ib = 0; ib < nblk; ib++) {
      __m128i lo, hi; /* elements 0..15 and 16..31 as int8 */
      const float dh = kv_block_levels(type, vj + ib * bb, &lo, &hi);
      const __m512 dv = _mm512_set1_ps(dh);
      const __m512 x0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), dv);
      const __m512 x1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), dv);
      for (int h = 0; h < ratio; h++) {
        const __m512 w = _mm512_set1_ps(p[(size_t)h * n_pos + j]);
        float *a = acc + (size_t)h * d + (size_t)ib * QK32;
        _mm512_storeu_ps(a, _mm512_fmadd_ps(x0, w, _mm512_loadu_ps(a)));
        _mm512_storeu_ps(a + 16, _mm512_fmadd_ps(x1, w, _mm512_loadu_ps(a + 16)));
      }
    }
  }
}
#endif

static void accum_quant(int type, float *acc, const float *p, int ratio, int d, const uint8_t *v, size_t vs, int n_pos, int simd) {
#ifdef PRIMA_X86
  if (simd == PRIMA_SIMD_AVX512 && prima_simd_available(PRIMA_SIMD_AVX512)) {
    accum_quant_avx512(type, acc, p, ratio, d, v, vs, n_pos);
    return;
  }
  if ((simd == PRIMA_SIMD_AVX2 || simd == PRIMA_SIMD_AVX512) && prima_simd_available(PRIMA_SIMD_AVX2)) {
    accum_quant_avx2(type, acc, p, ratio, d, v, vs, n_pos);
    return;
  }
#endif
  (void)simd;
  accum_quant_scalar(type, acc, p, ratio, d, v, vs, n_pos);
}

/* ---- attention ----------------------------------------------------------------------------- */

void prima_kv_attn_begin(prima_kv_attn *a, const prima_kv_head *k, const prima_kv_head *v, const float *q_in, int ratio, int d,
                         float scale, float softcap, const float *sink, void *scratch, int simd) {
  a->k = k;
  a->v = v;
  a->q_in = q_in;
  a->ratio = ratio;
  a->d = d;
  a->scale = scale;
  a->softcap = softcap;
  a->simd = simd;
  a->q = scratch;
  a->acc = a->q + (size_t)ratio * d;
  a->M = a->acc + (size_t)ratio * d;
  a->S = a->M + ratio;
  a->s = a->S + ratio;
  a->q8 = (uint8_t *)scratch + align64(sizeof(float) * (size_t)ratio * (2 * (size_t)d + 2 + ATT_BLOCK));
  a->q8_row = prima_row_bytes(PRIMA_Q8_0, d);
  a->kk = NULL;
  a->raw = NULL;
  a->raw_stride = 0;
  if (k->type == PRIMA_F16) {
    /* llama.cpp rounds Q to F16 against an F16 cache; so do we, for the same scores. */
    for (int i = 0; i < ratio * d; i++) a->q[i] = prima_fp16_to_fp32(prima_fp32_to_fp16(q_in[i]));
  } else {
    /* and to Q8_0 against a quantized one (the vec_dot_type of Q8_0 and Q4_0) */
    a->kk = prima_kernels_at(k->type, simd);
    if (!a->kk) a->kk = prima_kernels(k->type);
    prima_quantize_fn qz = prima_act_quantizer_at(PRIMA_Q8_0, simd);
    (qz ? qz : prima_act_quantizer(PRIMA_Q8_0))(q_in, a->q8, (int64_t)ratio * d);
  }
  /* a sink is one more score in the softmax (its exp counts in the sum) with no value: start from it */
  for (int h = 0; h < ratio; h++) {
    a->M[h] = sink ? sink[h] : -INFINITY;
    a->S[h] = sink ? 1.0f : 0.0f;
  }
  memset(a->acc, 0, sizeof(float) * (size_t)ratio * d);
}

/* The online softmax's step over nb new scores per head (s: ratio x nb): the running maxima and sums
 * move on, the accumulators are rescaled, and s becomes the weights exp(s - max). */
static void softmax_step(prima_kv_attn *a, int nb) {
  for (int h = 0; h < a->ratio; h++) {
    float *sh = a->s + (size_t)h * nb;
    float mb = sh[0];
    for (int j = 1; j < nb; j++) mb = sh[j] > mb ? sh[j] : mb;
    const float mnew = mb > a->M[h] ? mb : a->M[h];
    const float ms = expf(a->M[h] - mnew);
    const float sum = prima_exp_sum(sh, nb, mnew);
    a->S[h] = a->S[h] * ms + sum;
    if (ms != 1.0f) prima_scale(a->acc + (size_t)h * a->d, a->d, ms);
    a->M[h] = mnew;
  }
}

void prima_kv_attn_range(prima_kv_attn *a, int lo, int hi) {
  const prima_kv_head *k = a->k, *v = a->v;
  const int ratio = a->ratio, d = a->d;
  for (int p0 = lo, nb; p0 < hi; p0 += nb) {
    nb = hi - p0 < ATT_BLOCK ? hi - p0 : ATT_BLOCK;
    /* a ring's rows are contiguous up to its end: a block stops there (K and V share the ring) */
    const int row = k->cells > 0 ? p0 % k->cells : p0;
    if (k->cells > 0 && nb > k->cells - row) nb = k->cells - row;
    const uint8_t *kb = k->base + (size_t)row * k->stride, *vb = v->base + (size_t)row * v->stride;
    if (k->type == PRIMA_F16) {
      prima_attn_scores(a->q, ratio, d, (const uint16_t *)kb, k->stride / sizeof(uint16_t), nb, a->scale, a->s, a->simd);
    } else {
      for (int h = 0; h < ratio; h++) prima_dot_rows(a->kk, d, kb, k->stride, nb, a->q8 + (size_t)h * a->q8_row, a->s + (size_t)h * nb);
      prima_scale(a->s, ratio * nb, a->scale);
    }
    if (a->softcap > 0) prima_softcap(a->s, ratio * nb, a->softcap);
    if (a->raw) /* the scores as the softmax takes them, by position (H2O's statistics) */
      for (int h = 0; h < ratio; h++) memcpy(a->raw + (size_t)h * a->raw_stride + p0, a->s + (size_t)h * nb, sizeof(float) * (size_t)nb);
    softmax_step(a, nb);
    if (v->type == PRIMA_F16) prima_attn_accum(a->acc, a->s, ratio, d, (const uint16_t *)vb, v->stride / sizeof(uint16_t), nb, a->simd);
    else accum_quant(v->type, a->acc, a->s, ratio, d, vb, v->stride, nb, a->simd);
  }
}

void prima_kv_attn_entries(prima_kv_attn *a, const float *kx, const float *vx, int n, float bias) {
  const int ratio = a->ratio, d = a->d;
  for (int e0 = 0, nb; e0 < n; e0 += nb) {
    nb = n - e0 < ATT_BLOCK ? n - e0 : ATT_BLOCK;
    for (int h = 0; h < ratio; h++) {
      const float *qh = a->q_in + (size_t)h * d;
      for (int j = 0; j < nb; j++) {
        const float *kj = kx + (size_t)(e0 + j) * d;
        float dot = 0;
        for (int i = 0; i < d; i++) dot += qh[i] * kj[i];
        a->s[(size_t)h * nb + j] = dot * a->scale;
      }
    }
    if (a->softcap > 0) prima_softcap(a->s, ratio * nb, a->softcap);
    for (int i = 0; i < ratio * nb; i++) a->s[i] += bias;
    softmax_step(a, nb);
    for (int h = 0; h < ratio; h++)
      for (int j = 0; j < nb; j++) {
        const float w = a->s[(size_t)h * nb + j], *vj = vx + (size_t)(e0 + j) * d;
        float *acc = a->acc + (size_t)h * d;
        for (int i = 0; i < d; i++) acc[i] += w * vj[i];
      }
  }
}

void prima_kv_attn_end(prima_kv_attn *a, float *out) {
  for (int h = 0; h < a->ratio; h++) {
    const float inv = 1.0f / a->S[h];
    for (int i = 0; i < a->d; i++) out[(size_t)h * a->d + i] = a->acc[(size_t)h * a->d + i] * inv;
  }
}

void prima_kv_attend(const prima_kv_head *k, const prima_kv_head *v, const float *q_in, int ratio, int d, int lo, int hi,
                     float scale, float softcap, const float *sink, float *out, void *scratch, int simd) {
  prima_kv_attn a;
  prima_kv_attn_begin(&a, k, v, q_in, ratio, d, scale, softcap, sink, scratch, simd);
  prima_kv_attn_range(&a, lo, hi);
  prima_kv_attn_end(&a, out);
}
