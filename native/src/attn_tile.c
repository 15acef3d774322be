#include "attn_tile.h"

#include <math.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define PRIMA_X86 1
#endif

/* A tile: up to TILE_ROWS query heads against TILE_POS cached positions at a time. Its scratch (Q,
 * K and V blocks as F32, scores, accumulators) is ~150 KB at d = 128: within a core's L2. */
#define TILE_ROWS 64
#define TILE_POS 64

int prima_kv_tile_tokens(int ratio) { return ratio >= TILE_ROWS ? 1 : TILE_ROWS / ratio; }

static int rows_padded(int ratio) { return (prima_kv_tile_tokens(ratio) * ratio + 3) & ~3; }

size_t prima_kv_tile_scratch_bytes(int ratio, int d) {
  const size_t rp = (size_t)rows_padded(ratio);
  const size_t floats = rp * d /* Q */ + 2 * (size_t)TILE_POS * d /* K, V */ + rp * TILE_POS /* S */ + rp * d /* acc */ + 2 * rp /* M, L */;
  return (sizeof(float) * floats + sizeof(int) * rp + 63) & ~(size_t)63;
}

int prima_kv_tile_ok(const prima_kv_head *k, const prima_kv_head *v, int d, int simd) {
#ifdef PRIMA_X86
  return k->type == PRIMA_F16 && v->type == PRIMA_F16 && d % 16 == 0 && d <= 256 && simd >= PRIMA_SIMD_AVX2 &&
         simd != PRIMA_SIMD_NEON && prima_simd_available(PRIMA_SIMD_AVX2);
#else
  (void)k, (void)v, (void)d, (void)simd;
  return 0;
#endif
}

#ifdef PRIMA_X86
/* The sums of a, b, c and e (8 lanes each) as one 4-lane vector. */
__attribute__((target("avx2"))) static inline __m128 sum4(__m256 a, __m256 b, __m256 c, __m256 e) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, e));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* nb rows of d F16 elements (stride elements apart) as F32 rows of d, rows nb..np zero. */
__attribute__((target("avx2,f16c"))) static void block_to_f32(const uint16_t *src, size_t stride, int nb, int np, int d, float *dst) {
  for (int j = 0; j < nb; j++)
    for (int i = 0; i < d; i += 8)
      _mm256_storeu_ps(dst + (size_t)j * d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + (size_t)j * stride + i))));
  memset(dst + (size_t)nb * d, 0, sizeof(float) * (size_t)(np - nb) * d);
}

/* S[r][j] = scale * Q[r]·K[j] for rp rows (a multiple of 4) and np positions (a multiple of 4):
 * two rows by four positions at a time, eight accumulators of 8 lanes. */
__attribute__((target("avx2,fma"))) static void tile_scores(const float *Q, int rp, int d, const float *K, int np, float scale, float *S) {
  const __m128 vs = _mm_set1_ps(scale);
  for (int r = 0; r < rp; r += 2) {
    const float *q0 = Q + (size_t)r * d, *q1 = q0 + d;
    for (int j = 0; j < np; j += 4) {
      const float *k0 = K + (size_t)j * d, *k1 = k0 + d, *k2 = k1 + d, *k3 = k2 + d;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
      for (int i = 0; i < d; i += 8) {
        const __m256 x = _mm256_loadu_ps(q0 + i), y = _mm256_loadu_ps(q1 + i);
        __m256 kv = _mm256_loadu_ps(k0 + i);
        a0 = _mm256_fmadd_ps(x, kv, a0), b0 = _mm256_fmadd_ps(y, kv, b0);
        kv = _mm256_loadu_ps(k1 + i);
        a1 = _mm256_fmadd_ps(x, kv, a1), b1 = _mm256_fmadd_ps(y, kv, b1);
        kv = _mm256_loadu_ps(k2 + i);
        a2 = _mm256_fmadd_ps(x, kv, a2), b2 = _mm256_fmadd_ps(y, kv, b2);
        kv = _mm256_loadu_ps(k3 + i);
        a3 = _mm256_fmadd_ps(x, kv, a3), b3 = _mm256_fmadd_ps(y, kv, b3);
      }
      _mm_storeu_ps(S + (size_t)r * TILE_POS + j, _mm_mul_ps(sum4(a0, a1, a2, a3), vs));
      _mm_storeu_ps(S + (size_t)(r + 1) * TILE_POS + j, _mm_mul_ps(sum4(b0, b1, b2, b3), vs));
    }
  }
}

/* acc[r] += sum_j P[r][j] * V[j] over positions [j0, j1) for rows r0..r0+3, 16 columns at a time: eight
 * accumulators of 8 lanes held over the positions. */
__attribute__((target("avx2,fma"))) static void accum4(float *acc, const float *P, int r0, int d, const float *V, int j0, int j1) {
  const float *p0 = P + (size_t)r0 * TILE_POS, *p1 = p0 + TILE_POS, *p2 = p1 + TILE_POS, *p3 = p2 + TILE_POS;
  for (int i = 0; i < d; i += 16) {
    float *c0 = acc + (size_t)r0 * d + i, *c1 = c0 + d, *c2 = c1 + d, *c3 = c2 + d;
    __m256 a0 = _mm256_loadu_ps(c0), a1 = _mm256_loadu_ps(c0 + 8), b0 = _mm256_loadu_ps(c1), b1 = _mm256_loadu_ps(c1 + 8);
    __m256 e0 = _mm256_loadu_ps(c2), e1 = _mm256_loadu_ps(c2 + 8), f0 = _mm256_loadu_ps(c3), f1 = _mm256_loadu_ps(c3 + 8);
    for (int j = j0; j < j1; j++) {
      const float *vj = V + (size_t)j * d + i;
      const __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8);
      __m256 w = _mm256_broadcast_ss(p0 + j);
      a0 = _mm256_fmadd_ps(w, v0, a0), a1 = _mm256_fmadd_ps(w, v1, a1);
      w = _mm256_broadcast_ss(p1 + j);
      b0 = _mm256_fmadd_ps(w, v0, b0), b1 = _mm256_fmadd_ps(w, v1, b1);
      w = _mm256_broadcast_ss(p2 + j);
      e0 = _mm256_fmadd_ps(w, v0, e0), e1 = _mm256_fmadd_ps(w, v1, e1);
      w = _mm256_broadcast_ss(p3 + j);
      f0 = _mm256_fmadd_ps(w, v0, f0), f1 = _mm256_fmadd_ps(w, v1, f1);
    }
    _mm256_storeu_ps(c0, a0), _mm256_storeu_ps(c0 + 8, a1), _mm256_storeu_ps(c1, b0), _mm256_storeu_ps(c1 + 8, b1);
    _mm256_storeu_ps(c2, e0), _mm256_storeu_ps(c2 + 8, e1), _mm256_storeu_ps(c3, f0), _mm256_storeu_ps(c3 + 8, f1);
  }
}

/* The same for rows r0 and r0 + 1 (a tile's last pair; one token's heads when decoding), 32 columns at a time.
 * Each element's sum is accum4's: the same products in the same order. */
__attribute__((target("avx2,fma"))) static void accum2(float *acc, const float *P, int r0, int d, const float *V, int j0, int j1) {
  const float *p0 = P + (size_t)r0 * TILE_POS, *p1 = p0 + TILE_POS;
  for (int i = 0; i < d; i += 16) {
    float *c0 = acc + (size_t)r0 * d + i, *c1 = c0 + d;
    __m256 a0 = _mm256_loadu_ps(c0), a1 = _mm256_loadu_ps(c0 + 8), b0 = _mm256_loadu_ps(c1), b1 = _mm256_loadu_ps(c1 + 8);
    for (int j = j0; j < j1; j++) {
      const float *vj = V + (size_t)j * d + i;
      const __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8);
      __m256 w = _mm256_broadcast_ss(p0 + j);
      a0 = _mm256_fmadd_ps(w, v0, a0), a1 = _mm256_fmadd_ps(w, v1, a1);
      w = _mm256_broadcast_ss(p1 + j);
      b0 = _mm256_fmadd_ps(w, v0, b0), b1 = _mm256_fmadd_ps(w, v1, b1);
    }
    _mm256_storeu_ps(c0, a0), _mm256_storeu_ps(c0 + 8, a1), _mm256_storeu_ps(c1, b0), _mm256_storeu_ps(c1 + 8, b1);
  }
}

/* acc += P V for rp rows (a multiple of 2), skipping groups with no active row; positions [j0, j1)
 * hold every active row's visible ones (the others' weights are exact zeros: adding them changes nothing). */
static void tile_accum(float *acc, const float *P, const int *active, int rp, int d, const float *V, int j0, int j1) {
  int r = 0;
  for (; r + 4 <= rp; r += 4)
    if (active[r] | active[r + 1] | active[r + 2] | active[r + 3]) accum4(acc, P, r, d, V, j0, j1);
  if (r < rp && (active[r] | active[r + 1])) accum2(acc, P, r, d, V, j0, j1);
}

/* Q rounded to F16 and back, as llama.cpp rounds Q against an F16 cache (round to nearest even). */
__attribute__((target("avx2,f16c"))) static void round_q(const float *q, float *dst, int n) {
  for (int i = 0; i < n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(q + i), _MM_FROUND_TO_NEAREST_INT)));
}
#endif

void prima_kv_attend_tile(const prima_kv_head *k, const prima_kv_head *v, const float *q, size_t q_stride, int n_tok, int pos0,
                          int window, int ratio, int d, float scale, float softcap, const float *sink, float *out, void *scratch) {
#ifdef PRIMA_X86
  const int R = n_tok * ratio, rp = (R + 1) & ~1;
  float *Q = scratch, *Kf = Q + (size_t)rp * d, *Vf = Kf + (size_t)TILE_POS * d, *S = Vf + (size_t)TILE_POS * d;
  float *acc = S + (size_t)rp * TILE_POS, *M = acc + (size_t)rp * d, *L = M + rp;
  int *active = (int *)(L + rp);
  for (int t = 0; t < n_tok; t++) round_q(q + (size_t)t * q_stride, Q + (size_t)t * ratio * d, ratio * d);
  memset(Q + (size_t)R * d, 0, sizeof(float) * (size_t)(rp - R) * d);
  memset(acc, 0, sizeof(float) * (size_t)rp * d);
  /* a sink is one more score in the softmax (its exp counts in the sum) with no value: start from it */
  for (int r = 0; r < rp; r++) {
    M[r] = r < R && sink ? sink[r % ratio] : -INFINITY;
    L[r] = r < R && sink ? 1.0f : 0.0f;
    active[r] = 0;
  }
  /* token t sees [lo(t), pos0 + t + 1): the tile reads the union, each row masks the rest. Blocks end at
   * multiples of TILE_POS (and of a ring's cells), wherever the tile starts: a row's blocks, and so its
   * sums, are the same in any tile (decoded alone or in a prompt's batch: the same bits). */
  const int hi_end = pos0 + n_tok;
  const int lo_start = window > 0 && pos0 + 1 > window ? pos0 + 1 - window : 0;
  for (int p0 = lo_start, nb; p0 < hi_end; p0 += nb) {
    nb = TILE_POS - p0 % TILE_POS;
    if (nb > hi_end - p0) nb = hi_end - p0;
    /* a ring's rows are contiguous up to its end: a block stops there (K and V share the ring) */
    const int row = k->cells > 0 ? p0 % k->cells : p0;
    if (k->cells > 0 && nb > k->cells - row) nb = k->cells - row;
    const int np = (nb + 3) & ~3;
    block_to_f32((const uint16_t *)(k->base + (size_t)row * k->stride), k->stride / sizeof(uint16_t), nb, np, d, Kf);
    block_to_f32((const uint16_t *)(v->base + (size_t)row * v->stride), v->stride / sizeof(uint16_t), nb, np, d, Vf);
    tile_scores(Q, rp, d, Kf, np, scale, S);
    int j0 = nb, j1 = 0;
    for (int r = 0; r < rp; r++) {
      float *s = S + (size_t)r * TILE_POS;
      const int t = r / ratio, hi = pos0 + t + 1, lo = window > 0 && hi > window ? hi - window : 0;
      const int a = lo > p0 ? lo - p0 : 0, b = hi - p0 < nb ? hi - p0 : nb;
      active[r] = r < R && a < b;
      if (!active[r]) {
        memset(s, 0, sizeof(float) * (size_t)nb);
        continue;
      }
      j0 = a < j0 ? a : j0;
      j1 = b > j1 ? b : j1;
      /* the online softmax's step over this row's visible scores, as kv_cache.c's softmax_step */
      if (softcap > 0) prima_softcap(s + a, b - a, softcap);
      float mb = s[a];
      for (int j = a + 1; j < b; j++) mb = s[j] > mb ? s[j] : mb;
      const float mnew = mb > M[r] ? mb : M[r];
      const float ms = expf(M[r] - mnew);
      L[r] = L[r] * ms + prima_exp_sum(s + a, b - a, mnew);
      if (ms != 1.0f) prima_scale(acc + (size_t)r * d, d, ms);
      M[r] = mnew;
      memset(s, 0, sizeof(float) * (size_t)a);
      memset(s + b, 0, sizeof(float) * (size_t)(nb - b));
    }
    if (j0 < j1) tile_accum(acc, S, active, rp, d, Vf, j0, j1);
  }
  for (int r = 0; r < R; r++) {
    const float inv = 1.0f / L[r];
    float *o = out + (size_t)(r / ratio) * q_stride + (size_t)(r % ratio) * d;
    for (int i = 0; i < d; i++) o[i] = acc[(size_t)r * d + i] * inv;
  }
#else
  (void)k, (void)v, (void)q, (void)q_stride, (void)n_tok, (void)pos0, (void)window, (void)ratio, (void)d, (void)scale, (void)softcap,
      (void)sink, (void)out, (void)scratch;
#endif
}
