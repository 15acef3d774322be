/* Element-wise and row operations of the forward pass (everything but the weight matmuls). */
#ifndef PRIMA_OPS_H
#define PRIMA_OPS_H

#include <stddef.h>
#include <stdint.h>

/* y = x / rms(x) * w, the sum of squares in double as llama.cpp does. y may equal x. */
void prima_rmsnorm(const float *x, const float *w, float *y, int n, float eps);

/* cos/sin table for positions [0, n_pos): theta_i = pos * scale * base^(-2i/dims) / factor_i,
 * built with the same float recurrence as ggml's rope cache so angles match bit for bit. */
void prima_rope_table(float *cos_out, float *sin_out, int n_pos, int rope_dims, float base, float freq_scale,
                      const float *freq_factors);
/* The same with YaRN (ggml's rope_yarn, ext_factor != 0): theta = interp * (1 - mix) + extrap * mix with
 * mix = ramp(i) * ext_factor over the correction dims of beta_fast / beta_slow at n_ctx_orig, and cos
 * and sin times mscale * (1 + 0.1 ln(1 / freq_scale)). */
void prima_rope_table_yarn(float *cos_out, float *sin_out, int n_pos, int rope_dims, float base, float freq_scale,
                           const float *freq_factors, float ext_factor, int n_ctx_orig, float beta_fast, float beta_slow,
                           float mscale);
/* One row of prima_rope_table: the angles of position pos (negative: a rotation backwards, as a KV shift's). */
void prima_rope_row(float *cos_out, float *sin_out, int pos, int rope_dims, float base, float freq_scale,
                    const float *freq_factors);
/* One row of the YaRN table with its magnitude given whole (mag: the table's mscale * (1 + 0.1 ln(1 / freq_scale));
 * 1 for a rotation by a delta, as a KV shift's, whose key already carries it once). */
void prima_rope_row_yarn(float *cos_out, float *sin_out, int pos, int rope_dims, float base, float freq_scale,
                         const float *freq_factors, float ext_factor, int n_ctx_orig, float beta_fast, float beta_slow,
                         float mag);
/* Rotates the first rope_dims of each of n_heads heads (head_dim apart) at one position. */
void prima_rope_apply(float *x, int n_heads, int head_dim, int rope_dims, int neox, const float *cos_row,
                      const float *sin_row);

/* a[i] = silu(a[i]) * b[i] */
void prima_swiglu(float *a, const float *b, int n);
/* a[i] = x * sigmoid(alpha x) * (y + 1), x = min(a[i], limit), y = clamp(b[i], -limit, limit): ggml's
 * swiglu_oai, term for term */
void prima_swiglu_oai(float *a, const float *b, int n, float alpha, float limit);
/* a[i] = gelu(a[i]) * b[i], gelu the tanh approximation read from an F16 table as ggml's CPU
 * backend does (GGML_GELU_FP16), so that both round alike */
void prima_geglu(float *a, const float *b, int n);
/* The same at a given SIMD level (tests compare levels; a level the CPU lacks runs the scalar loop) */
void prima_geglu_at(int level, float *a, const float *b, int n);
/* x[i] = exp(x[i] - m); returns their sum (the softmax numerators of a row whose max is m) */
float prima_exp_sum(float *x, int n, float m);

/* Attention over a block of cached positions for the `ratio` query heads that share one KV head.
 * scores: s[h * n_pos + j] = scale * dot(q[h], K row j), K rows F16 and k_stride elements apart.
 * accum:  acc[h] += sum_j p[h * n_pos + j] * V row j. */
void prima_attn_scores(const float *q, int ratio, int d, const uint16_t *k, size_t k_stride, int n_pos, float scale,
                       float *s, int level);
void prima_attn_accum(float *acc, const float *p, int ratio, int d, const uint16_t *v, size_t v_stride, int n_pos, int level);
void prima_scale(float *x, int n, float s);
/* x = cap * tanh(x / cap), as ggml computes it (scale by 1/cap, tanh, scale by cap). */
void prima_softcap(float *x, int n, float cap);
void prima_add(float *x, const float *y, int n);

/* The GELU table, and the kernels' init (which selects the ops' SIMD paths). */
void prima_ops_init(void);
/* Called once by prima_kernels_init with the level it chose: swiglu, geglu and exp_sum follow it (the
 * attention scores and sums take the caller's level instead). */
void prima_ops_select(int level);

#endif
