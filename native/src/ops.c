#include "ops.h"

#include <math.h>

#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define PRIMA_X86 1
#endif

void prima_rmsnorm(const float *x, const float *w, float *y, int n, float eps) {
  double sum = 0.0;
  for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
  const float scale = 1.0f / sqrtf((float)(sum / n) + eps);
  for (int i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
}

void prima_rope_table(float *cos_out, float *sin_out, int n_pos, int rope_dims, float base, float freq_scale,
                      const float *freq_factors) {
  const int half = rope_dims / 2;
  const float theta_scale = powf(base, -2.0f / (float)rope_dims);
  for (int p = 0; p < n_pos; p++) {
    float theta = (float)p;
    for (int i = 0; i < half; i++) {
      const float ff = freq_factors ? freq_factors[i] : 1.0f;
      const float t = freq_scale * (theta / ff);
      cos_out[(int64_t)p * half + i] = cosf(t);
      sin_out[(int64_t)p * half + i] = sinf(t);
      theta *= theta_scale;
    }
  }
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

void prima_swiglu(float *a, const float *b, int n) {
  for (int i = 0; i < n; i++) {
    const float g = a[i];
    a[i] = (g / (1.0f + expf(-g))) * b[i];
  }
}

static void acc_f16_scalar(float *acc, const uint16_t *v, int n, float ms, float vs) {
  for (int i = 0; i < n; i++) acc[i] = acc[i] * ms + vs * prima_fp16_to_fp32(v[i]);
}

#ifdef PRIMA_X86
__attribute__((target("avx2,fma,f16c"))) static void acc_f16_avx2(float *acc, const uint16_t *v, int n, float ms, float vs) {
  const __m256 vms = _mm256_set1_ps(ms), vvs = _mm256_set1_ps(vs);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i)));
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vv, vvs, _mm256_mul_ps(_mm256_loadu_ps(acc + i), vms)));
  }
  for (; i < n; i++) acc[i] = acc[i] * ms + vs * prima_fp16_to_fp32(v[i]);
}
#endif

static void (*acc_f16_impl)(float *, const uint16_t *, int, float, float) = acc_f16_scalar;

void prima_acc_f16(float *acc, const uint16_t *v, int n, float ms, float vs) { acc_f16_impl(acc, v, n, ms, vs); }

void prima_scale(float *x, int n, float s) {
  for (int i = 0; i < n; i++) x[i] *= s;
}

void prima_add(float *x, const float *y, int n) {
  for (int i = 0; i < n; i++) x[i] += y[i];
}

void prima_ops_init(void) {
#ifdef PRIMA_X86
  if (prima_simd_level() >= PRIMA_SIMD_AVX2) acc_f16_impl = acc_f16_avx2;
#endif
}
