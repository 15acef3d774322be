#include "ops.h"

#include <math.h>
#include <pthread.h>

#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define PRIMA_X86 1
static inline float hsum256(__m256 v) __attribute__((target("avx2")));
#endif

void prima_rmsnorm(const float *x, const float *w, float *y, int n, float eps) {
  double sum = 0.0;
  for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
  const float scale = 1.0f / sqrtf((float)(sum / n) + eps);
  for (int i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
}

void prima_rope_row(float *cos_out, float *sin_out, int pos, int rope_dims, float base, float freq_scale,
                    const float *freq_factors) {
  const int half = rope_dims / 2;
  const float theta_scale = powf(base, -2.0f / (float)rope_dims);
  float theta = (float)pos;
  for (int i = 0; i < half; i++) {
    const float ff = freq_factors ? freq_factors[i] : 1.0f;
    const float t = freq_scale * (theta / ff);
    cos_out[i] = cosf(t);
    sin_out[i] = sinf(t);
    theta *= theta_scale;
  }
}

void prima_rope_table(float *cos_out, float *sin_out, int n_pos, int rope_dims, float base, float freq_scale,
                      const float *freq_factors) {
  const int half = rope_dims / 2;
  for (int p = 0; p < n_pos; p++)
    prima_rope_row(cos_out + (int64_t)p * half, sin_out + (int64_t)p * half, p, rope_dims, base, freq_scale, freq_factors);
}

/* ggml_rope_yarn_corr_dim: the dim whose wavelength turns n_rot times over the original context. */
static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return n_dims * logf(n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

void prima_rope_row_yarn(float *cos_out, float *sin_out, int pos, int rope_dims, float base, float freq_scale,
                         const float *freq_factors, float ext_factor, int n_ctx_orig, float beta_fast, float beta_slow,
                         float mag) {
  const int half = rope_dims / 2;
  const float theta_scale = powf(base, -2.0f / (float)rope_dims);
  const float start = floorf(yarn_corr_dim(rope_dims, n_ctx_orig, beta_fast, base));
  const float end = ceilf(yarn_corr_dim(rope_dims, n_ctx_orig, beta_slow, base));
  const float lo = start > 0 ? start : 0, hi = end < rope_dims - 1 ? end : (float)(rope_dims - 1);
  float theta = (float)pos;
  for (int i = 0; i < half; i++) {
    const float ff = freq_factors ? freq_factors[i] : 1.0f;
    const float extrap = theta / ff, interp = freq_scale * extrap;
    float t = interp;
    if (ext_factor != 0.0f) {
      const float y = (i - lo) / (hi - lo > 0.001f ? hi - lo : 0.001f);
      const float ramp = 1 - (y > 1 ? 1 : y < 0 ? 0 : y);
      const float mix = ramp * ext_factor;
      t = interp * (1 - mix) + extrap * mix;
    }
    cos_out[i] = cosf(t) * mag;
    sin_out[i] = sinf(t) * mag;
    theta *= theta_scale;
  }
}

void prima_rope_table_yarn(float *cos_out, float *sin_out, int n_pos, int rope_dims, float base, float freq_scale,
                           const float *freq_factors, float ext_factor, int n_ctx_orig, float beta_fast, float beta_slow,
                           float mscale) {
  const int half = rope_dims / 2;
  const float mag = ext_factor != 0.0f ? mscale * (1.0f + 0.1f * logf(1.0f / freq_scale)) : mscale;
  for (int p = 0; p < n_pos; p++)
    prima_rope_row_yarn(cos_out + (int64_t)p * half, sin_out + (int64_t)p * half, p, rope_dims, base, freq_scale, freq_factors,
                        ext_factor, n_ctx_orig, beta_fast, beta_slow, mag);
}

void prima_rope_apply(float *x, int n_heads, int head_dim, int rope_dims, int neox, const float *c, const float *s) {
  const int half = rope_dims / 2;
  for (int h = 0; h < n_heads; h++) {
    float *v = x + (int64_t)h * head_dim;
    if (neox) {
      for (int i = 0; i < half; i++) {
        const float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * c[i] - x1 * s[i];
        v[i + half] = x0 * s[i] + x1 * c[i];
      }
    } else {
      for (int i = 0; i < half; i++) {
        const float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c[i] - x1 * s[i];
        v[2 * i + 1] = x0 * s[i] + x1 * c[i];
      }
    }
  }
}

void prima_swiglu_oai(float *a, const float *b, int n, float alpha, float limit) {
  for (int i = 0; i < n; i++) {
    const float x = limit < a[i] ? limit : a[i]; /* std::min's order */
    const float y = b[i] < -limit ? -limit : b[i] > limit ? limit : b[i];
    const float glu = x / (1.f + expf(alpha * (-x)));
    a[i] = glu * (y + 1.f);
  }
}

static void swiglu_scalar(float *a, const float *b, int n) {
  for (int i = 0; i < n; i++) {
    const float g = a[i];
    a[i] = (g / (1.0f + expf(-g))) * b[i];
  }
}

/* sum of exp(x[i] - m), x[i] replaced by exp(x[i] - m) */
static float exp_sum_scalar(float *x, int n, float m) {
  float sum = 0.0f;
  for (int i = 0; i < n; i++) {
    x[i] = expf(x[i] - m);
    sum += x[i];
  }
  return sum;
}

#ifdef PRIMA_X86
/* exp on 8 floats: 2^n * e^r with n = round(x / ln 2), r = x - n ln 2 split in two constants for
 * precision, e^r by Cephes' expf polynomial (about 1 ulp, as libm's expf and ggml's SIMD exp). Inputs
 * below -87.3 give 0 (a subnormal at most: nothing a softmax or SiLU notices), above 88.7 infinity. */
__attribute__((target("avx2,fma"))) static inline __m256 exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.7228f), lo = _mm256_set1_ps(-87.3365f);
  const __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ), under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  /* n is in [-126, 128]: 2^n by building the exponent field; 2^128 overflows to the infinity we want */
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), over);
  return _mm256_andnot_ps(under, y);
}

__attribute__((target("avx2,fma"))) static void swiglu_avx2(float *a, const float *b, int n) {
  int i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(a + i);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(b + i)));
  }
  swiglu_scalar(a + i, b + i, n - i);
}

__attribute__((target("avx2,fma"))) static float exp_sum_avx2(float *x, int n, float m) {
  int i = 0;
  __m256 acc = _mm256_setzero_ps();
  const __m256 vm = _mm256_set1_ps(m);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  return hsum256(acc) + exp_sum_scalar(x + i, n - i, m);
}
#endif

/* gelu(x) at every F16 value x, rounded to F16: ggml's table, built the same way (one entry more:
 * the AVX2 gather reads 4 bytes at each index) */
static uint16_t gelu_f16[(1 << 16) + 2];

static void gelu_table_init(void) {
  const float sqrt_2_over_pi = 0.79788456080286535587989211986876f, coef_a = 0.044715f;
  for (int i = 0; i < (1 << 16); i++) {
    const float x = prima_fp16_to_fp32((uint16_t)i);
    gelu_f16[i] = prima_fp32_to_fp16(0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * (1.0f + coef_a * x * x))));
  }
}

static void geglu_scalar(float *a, const float *b, int n) {
  for (int i = 0; i < n; i++) {
    const float x = a[i];
    /* beyond +-10 gelu is x or 0 to F16 precision; ggml skips the table there */
    const float g = x <= -10.0f ? 0.0f : x >= 10.0f ? x : prima_fp16_to_fp32(gelu_f16[prima_fp32_to_fp16(x)]);
    a[i] = g * b[i];
  }
}

#ifdef PRIMA_X86
/* The same table read 8 at a time: F16C rounds to nearest even as prima_fp32_to_fp16 does, so the
 * same entries, the same products (the scalar loop's calls were 6% of a gemma3 prompt pass). */
__attribute__((target("avx2,fma,f16c"))) static void geglu_avx2(float *a, const float *b, int n) {
  int i = 0;
  const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i);
    const __m256i idx = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    const __m256i t = _mm256_and_si256(_mm256_i32gather_epi32((const int *)gelu_f16, idx, 2), low16);
    __m256 g = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1)));
    g = _mm256_blendv_ps(g, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LE_OQ));
    g = _mm256_blendv_ps(g, x, _mm256_cmp_ps(x, hi, _CMP_GE_OQ));
    _mm256_storeu_ps(a + i, _mm256_mul_ps(g, _mm256_loadu_ps(b + i)));
  }
  geglu_scalar(a + i, b + i, n - i);
}
#endif

static void (*geglu_impl)(float *, const float *, int) = geglu_scalar;

void prima_geglu(float *a, const float *b, int n) { geglu_impl(a, b, n); }

void prima_geglu_at(int level, float *a, const float *b, int n) {
#ifdef PRIMA_X86
  if ((level == PRIMA_SIMD_AVX2 || level == PRIMA_SIMD_AVX512) && prima_simd_available(PRIMA_SIMD_AVX2)) {
    geglu_avx2(a, b, n);
    return;
  }
#endif
  (void)level;
  geglu_scalar(a, b, n);
}

static void (*swiglu_impl)(float *, const float *, int) = swiglu_scalar;
static float (*exp_sum_impl)(float *, int, float) = exp_sum_scalar;

void prima_swiglu(float *a, const float *b, int n) { swiglu_impl(a, b, n); }
float prima_exp_sum(float *x, int n, float m) { return exp_sum_impl(x, n, m); }

static void attn_scores_scalar(const float *q, int ratio, int d, const uint16_t *k, size_t ks, int n_pos, float scale,
                               float *s) {
  for (int j = 0; j < n_pos; j++) {
    const uint16_t *kj = k + (size_t)j * ks;
    for (int h = 0; h < ratio; h++) {
      float sum = 0.0f;
      for (int i = 0; i < d; i++) sum += q[(size_t)h * d + i] * prima_fp16_to_fp32(kj[i]);
      s[(size_t)h * n_pos + j] = sum * scale;
    }
  }
}

static void attn_accum_scalar(float *acc, const float *p, int ratio, int d, const uint16_t *v, size_t vs, int n_pos) {
  for (int j = 0; j < n_pos; j++) {
    const uint16_t *vj = v + (size_t)j * vs;
    for (int h = 0; h < ratio; h++) {
      const float w = p[(size_t)h * n_pos + j];
      float *a = acc + (size_t)h * d;
      for (int i = 0; i < d; i++) a[i] += w * prima_fp16_to_fp32(vj[i]);
    }
  }
}

#ifdef PRIMA_X86
static inline float hsum256(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

/* head size a multiple of 8, at most 256 */
__attribute__((target("avx2,fma,f16c"))) static void attn_scores_avx2(const float *q, int ratio, int d, const uint16_t *k,
                                                                      size_t ks, int n_pos, float scale, float *s) {
  const int nv = d / 8;
  for (int j = 0; j < n_pos; j++) {
    const uint16_t *kj = k + (size_t)j * ks;
    __m256 kv[32];
    for (int i = 0; i < nv; i++) kv[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kj + 8 * i)));
    for (int h = 0; h < ratio; h++) {
      const float *qh = q + (size_t)h * d;
      __m256 sum = _mm256_mul_ps(kv[0], _mm256_loadu_ps(qh));
      for (int i = 1; i < nv; i++) sum = _mm256_fmadd_ps(kv[i], _mm256_loadu_ps(qh + 8 * i), sum);
      s[(size_t)h * n_pos + j] = hsum256(sum) * scale;
    }
  }
}

__attribute__((target("avx2,fma,f16c"))) static void attn_accum_avx2(float *acc, const float *p, int ratio, int d,
                                                                     const uint16_t *v, size_t vs, int n_pos) {
  const int nv = d / 8;
  for (int j = 0; j < n_pos; j++) {
    const uint16_t *vj = v + (size_t)j * vs;
    __m256 vv[32];
    for (int i = 0; i < nv; i++) vv[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vj + 8 * i)));
    for (int h = 0; h < ratio; h++) {
      const __m256 w = _mm256_set1_ps(p[(size_t)h * n_pos + j]);
      float *a = acc + (size_t)h * d;
      for (int i = 0; i < nv; i++) _mm256_storeu_ps(a + 8 * i, _mm256_fmadd_ps(w, vv[i], _mm256_loadu_ps(a + 8 * i)));
    }
  }
}
#endif


/* The AVX2 attention where the caller's level takes it (as prima_geglu_at), whatever level the
 * process chose: the SIMD check compares each level with scalar through these. */
static int attn_avx2(int level, int d) {
#ifdef PRIMA_X86
  return (level == PRIMA_SIMD_AVX2 || level == PRIMA_SIMD_AVX512) && prima_simd_available(PRIMA_SIMD_AVX2) && d % 8 == 0 && d <= 256;
#else
  (void)level, (void)d;
  return 0;
#endif
}

void prima_attn_scores(const float *q, int ratio, int d, const uint16_t *k, size_t ks, int n_pos, float scale, float *s, int level) {
#ifdef PRIMA_X86
  if (attn_avx2(level, d)) {
    attn_scores_avx2(q, ratio, d, k, ks, n_pos, scale, s);
    return;
  }
#endif
  attn_scores_scalar(q, ratio, d, k, ks, n_pos, scale, s);
}

void prima_attn_accum(float *acc, const float *p, int ratio, int d, const uint16_t *v, size_t vs, int n_pos, int level) {
#ifdef PRIMA_X86
  if (attn_avx2(level, d)) {
    attn_accum_avx2(acc, p, ratio, d, v, vs, n_pos);
    return;
  }
#endif
  attn_accum_scalar(acc, p, ratio, d, v, vs, n_pos);
}

void prima_scale(float *x, int n, float s) {
  for (int i = 0; i < n; i++) x[i] *= s;
}

void prima_softcap(float *x, int n, float cap) {
  const float inv = 1.0f / cap;
  for (int i = 0; i < n; i++) x[i] = tanhf(x[i] * inv) * cap;
}

void prima_add(float *x, const float *y, int n) {
  for (int i = 0; i < n; i++) x[i] += y[i];
}

void prima_ops_select(int level) {
#ifdef PRIMA_X86
  if (level == PRIMA_SIMD_AVX2 || level == PRIMA_SIMD_AVX512) {
    swiglu_impl = swiglu_avx2;
    exp_sum_impl = exp_sum_avx2;
    geglu_impl = geglu_avx2;
  }
#endif
  (void)level;
}

void prima_ops_init(void) {
  static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;
  pthread_once(&gelu_once, gelu_table_init);
  prima_kernels_init(); /* which selects the ops above */
}
