/* Every SIMD level this build and CPU have, against the scalar twin, in plain C: used to run the NEON
 * kernels under qemu-aarch64 (test/native/simd.test.ts cross-compiles it with the kernel sources).
 * Also prints a hash of every reference quantizer's output, so runs on different architectures can
 * be compared with each other (and, through the x86 run, with llama.cpp). Exit status 1 on failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "attn_tile.h"
#include "kv_cache.h"
#include "sparse_attn.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 16);
}
static float normal(void) {
  float u = (rnd() + 1.0f) / 4294967296.0f, v = rnd() / 4294967296.0f;
  return sqrtf(-2 * logf(u)) * cosf(6.2831853f * v);
}

/* A KV cache of n_pos positions of random rows (d <= 256), K in type kt and V in vt. */
static void fill_kv(int kt, uint8_t *K, size_t kr, int vt, uint8_t *V, size_t vr, int d, int n_pos) {
  float row[256];
  for (int p = 0; p < n_pos; p++) {
    for (int i = 0; i < d; i++) row[i] = normal();
    prima_kv_store(kt, row, K + p * kr, d);
    for (int i = 0; i < d; i++) row[i] = normal();
    prima_kv_store(vt, row, V + p * vr, d);
  }
}

static int failures = 0, checks = 0;
#define CHECK(cond, ...)                 \
  do {                                   \
    checks++;                            \
    if (!(cond)) {                       \
      failures++;                        \
      if (failures < 30) {               \
        printf("FAIL: " __VA_ARGS__);    \
        printf("\n");                    \
      }                                  \
    }                                    \
  } while (0)

static const int TYPES[] = {PRIMA_F32, PRIMA_F16, PRIMA_BF16, PRIMA_Q4_0, PRIMA_Q4_1, PRIMA_Q5_0, PRIMA_Q5_1,
                            PRIMA_Q8_0, PRIMA_Q2_K, PRIMA_Q3_K, PRIMA_Q4_K, PRIMA_Q5_K, PRIMA_Q6_K, PRIMA_IQ4_NL, PRIMA_IQ4_XS,
                            PRIMA_MXFP4};
#define NTYPES (int)(sizeof TYPES / sizeof TYPES[0])

/* Q2_K .. Q6_K: the dots with VNNI's own grouping at the AVX-512 level (kernels.h) */
static int k_quant(int type) { return type >= PRIMA_Q2_K && type <= PRIMA_Q6_K; }

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}


/* Whether the CPU's own float -> half conversion (vcvtps2ph) rounds ties to even, as IEEE and every
 * real F16C CPU do. bochs 2.7 rounds them away from zero (at every level): under it, a level's F16
 * activation bytes may differ from scalar by one at exact ties, and only there. */
#if defined(__x86_64__)
__attribute__((target("f16c"))) static int cpu_f16_ties_even(void) {
  if (!__builtin_cpu_supports("f16c")) return 1;
  const __m128i h = _mm_cvtps_ph(_mm_set1_ps(1.0f + 1.0f / 2048), _MM_FROUND_TO_NEAREST_INT); /* between 1 and 1+2^-10 */
  return _mm_extract_epi16(h, 0) == 0x3c00;
}
#else
static int cpu_f16_ties_even(void) { return 1; }
#endif

/* Halves a and b are neighbours and x lies exactly between them. */
static int f16_tie_between(float x, uint16_t a, uint16_t b) {
  if (a == b || (a > b ? a - b : b - a) != 1) return 0;
  return ((double)prima_fp16_to_fp32(a) + prima_fp16_to_fp32(b)) / 2 == (double)x;
}

/* The level's activation bytes equal scalar's, or (F16 on a CPU that rounds ties away) differ only at
 * exact ties. Returns the first byte that differs otherwise, or n. */
static size_t act_mismatch(int act_type, const float *x, const uint8_t *mine, const uint8_t *want, size_t n, int ties_even) {
  for (size_t at = 0; at < n; at++) {
    if (mine[at] == want[at]) continue;
    if (act_type != PRIMA_F16 || ties_even) return at;
    const size_t e = at / 2;
    uint16_t a, b;
    memcpy(&a, mine + 2 * e, 2);
    memcpy(&b, want + 2 * e, 2);
    if (!f16_tie_between(x[e], a, b)) return at;
  }
  return n;
}

int main(void) {
  prima_kernels_init();
  /* 1. reference quantizers: a hash over all types, on awkward data (zeros, constants, outliers) */
  uint64_t h = 0xcbf29ce484222325ull;
  for (int ti = 0; ti < NTYPES; ti++) {
    const prima_type_kernels *k = prima_kernels_at(TYPES[ti], PRIMA_SIMD_SCALAR);
    const int n = 256 * 6;
    float *x = malloc(n * sizeof(float));
    for (int i = 0; i < n; i++) x[i] = 0.02f * normal();
    for (int i = 0; i < 256; i++) x[i] = 0;
    for (int i = 256; i < 512; i++) x[i] = 0.013f;
    x[600] = 0.9f;
    for (int i = 768; i < 1024; i++) x[i] *= 1e-6f;
    uint8_t *q = calloc(1, prima_row_bytes(k->type, n));
    k->quantize_ref(x, q, n);
    h = fnv(h, q, prima_row_bytes(k->type, n));
    free(q);
    free(x);
  }
  printf("quantize_ref hash %016llx\n", (unsigned long long)h);

  /* 2. half-precision rounding ties (the float exactly between two halves, normal and subnormal) go to
   * the even half at every level, as the scalar conversion does */
  const int ties_even = cpu_f16_ties_even();
  if (!ties_even) printf("this CPU rounds vcvtps2ph ties away from even (an emulator): F16 ties not compared\n");
  for (int level = 1; level < 4 && ties_even; level++) {
    if (!prima_simd_available(level)) continue;
    enum { NT = 64 };
    float x[NT];
    uint16_t want[NT], got[NT];
    for (int i = 0; i < NT; i++) {
      const int e = -24 + (i % 40);                                      /* unit in the last place of the half */
      x[i] = ldexpf((float)(2 * (int)(rnd() % 2048) + 1), e - 1) * (i % 3 ? 1 : -1); /* odd multiple of half an ulp */
    }
    prima_act_quantizer_at(PRIMA_F16, PRIMA_SIMD_SCALAR)(x, want, NT);
    prima_act_quantizer_at(PRIMA_F16, level)(x, got, NT);
    for (int i = 0; i < NT; i++)
      CHECK(got[i] == want[i], "F16 tie %.9g: %s %04x, scalar %04x", x[i], prima_simd_name(level), got[i], want[i]);
  }

  /* 2. each SIMD level against scalar */
  for (int level = 1; level < 4; level++) {
    if (!prima_simd_available(level)) continue;
    printf("level %s\n", prima_simd_name(level));
    for (int ti = 0; ti < NTYPES; ti++) {
      const prima_type_kernels *ks = prima_kernels_at(TYPES[ti], PRIMA_SIMD_SCALAR);
      const prima_type_kernels *kv = prima_kernels_at(TYPES[ti], level);
      CHECK(kv->dot_simd == level, "%s has no %s dot", ks->name, prima_simd_name(level));
      const int quantized = ks->block_elems > 1;
      for (int blocks = 1; blocks <= 5; blocks += 2) {
        const int n = blocks * (ks->block_elems == 256 ? 256 : 32) + (quantized ? 0 : 3); /* odd float lengths */
        const size_t wbytes = prima_row_bytes(ks->type, n), abytes = prima_row_bytes(ks->act_type, n);
        const size_t stride = abytes + 48;
        float *x = malloc(n * sizeof(float));
        uint8_t *w = malloc(wbytes), *acts = calloc(PRIMA_MAX_NC, stride);
        for (int i = 0; i < n; i++) x[i] = 0.02f * normal();
        ks->quantize_ref(x, w, n);
        for (int c = 0; c < PRIMA_MAX_NC; c++) {
          for (int i = 0; i < n; i++) x[i] = normal();
          prima_act_quantizer_at(ks->act_type, PRIMA_SIMD_SCALAR)(x, acts + c * stride, n);
          /* the level's activation quantizer must give the same bytes */
          uint8_t *mine = malloc(abytes);
          prima_act_quantizer_at(ks->act_type, level)(x, mine, n);
          const size_t at = act_mismatch(ks->act_type, x, mine, acts + c * stride, abytes, ties_even);
          CHECK(at == abytes, "%s act quantizer differs at %s: byte %zu (%02x, scalar %02x; x[%zu] = %.9g)", ks->name,
                prima_simd_name(level), at, at < abytes ? mine[at] : 0, at < abytes ? acts[c * stride + at] : 0,
                at / 2, ks->block_elems == 1 ? x[at / 2] : 0.0f);
          free(mine);
        }
        float *deq_s = malloc(n * sizeof(float)), *deq_v = malloc(n * sizeof(float));
        ks->dequantize(w, deq_s, n);
        kv->dequantize(w, deq_v, n);
        CHECK(memcmp(deq_s, deq_v, n * sizeof(float)) == 0, "%s dequantize differs", ks->name);
        for (int nc = 1; nc <= PRIMA_MAX_NC; nc++) {
          float want[PRIMA_MAX_NC], got[PRIMA_MAX_NC];
          ks->dot(n, w, acts, stride, nc, want);
          kv->dot(n, w, acts, stride, nc, got);
          for (int c = 0; c < nc; c++) {
            /* tolerance: float-summation order, relative to sum |w_i a_i| */
            float *af = malloc(n * sizeof(float));
            prima_dequantizer_at(ks->act_type, PRIMA_SIMD_SCALAR)(acts + c * stride, af, n);
            double abs = 0;
            for (int i = 0; i < n; i++) abs += fabs((double)deq_s[i] * af[i]);
            free(af);
            /* NEON combines the exact integer block sums in the scalar float order: bit-identical */
            if (level == PRIMA_SIMD_NEON && quantized)
              CHECK(memcmp(&got[c], &want[c], 4) == 0, "%s n=%d nc=%d row %d: neon %.9g != scalar %.9g", ks->name, n, nc, c, got[c], want[c]);
            CHECK(fabs((double)got[c] - want[c]) <= 1e-5 * abs + 1e-30, "%s n=%d nc=%d row %d: %s %.9g scalar %.9g",
                  ks->name, n, nc, c, prima_simd_name(level), got[c], want[c]);
          }
          /* AVX-512 sums the quantized dots' integer lanes into AVX2's 8 and then rounds as AVX2 does:
           * bit-identical, so the two x86 levels give the same greedy tokens; with VNNI the K-quant dots
           * group each lane's products otherwise (kernels.h), the other types still equal AVX2 */
          if (level == PRIMA_SIMD_AVX512 && quantized && prima_simd_available(PRIMA_SIMD_AVX2) &&
              !(prima_avx512_vnni() && k_quant(TYPES[ti]))) {
            float avx2[PRIMA_MAX_NC];
            prima_kernels_at(TYPES[ti], PRIMA_SIMD_AVX2)->dot(n, w, acts, stride, nc, avx2);
            for (int c = 0; c < nc; c++)
              CHECK(memcmp(&got[c], &avx2[c], 4) == 0, "%s n=%d nc=%d row %d: avx512 %.9g != avx2 %.9g", ks->name, n, nc, c,
                    got[c], avx2[c]);
          }
        }
        { /* the rows kernel (decode's matrix-vector product): each row equals the level's dot bit for bit */
          enum { NR = 3 };
          uint8_t *m = malloc(wbytes * NR);
          for (int r = 0; r < NR; r++) {
            for (int i = 0; i < n; i++) x[i] = 0.02f * normal();
            ks->quantize_ref(x, m + r * wbytes, n);
          }
          float rows[NR];
          prima_dot_rows(kv, n, m, wbytes, NR, acts, rows);
          for (int r = 0; r < NR; r++) {
            float one;
            kv->dot(n, m + r * wbytes, acts, 0, 1, &one);
            CHECK(memcmp(&one, &rows[r], sizeof one) == 0, "%s n=%d row %d: %s rows kernel %.9g != its dot %.9g", ks->name, n, r,
                  prima_simd_name(level), rows[r], one);
          }
          free(m);
        }
        { /* the gemm (a prompt's product): each row and token equals the level's dot (nc = 1) bit for bit,
           * over whole and partial panels of rows and tiles of tokens, and adds into out when asked */
          enum { NR = 11, NT = 13, OS = NR + 2 };
          uint8_t *m = malloc(wbytes * NR), *ta = malloc(stride * NT);
          for (int r = 0; r < NR; r++) {
            for (int i = 0; i < n; i++) x[i] = 0.02f * normal();
            ks->quantize_ref(x, m + r * wbytes, n);
          }
          for (int t = 0; t < NT; t++) {
            for (int i = 0; i < n; i++) x[i] = (1 + t % 3) * normal();
            prima_act_quantizer_at(ks->act_type, level)(x, ta + t * stride, n);
          }
          float out[NT * OS], sum[NT * OS], init[NT * OS];
          for (int i = 0; i < NT * OS; i++) init[i] = sum[i] = out[i] = normal();
          prima_gemm(kv, n, m, wbytes, NR, ta, stride, NT, out, OS, 0);
          prima_gemm(kv, n, m, wbytes, NR, ta, stride, NT, sum, OS, 1);
          for (int r = 0; r < NR; r++)
            for (int t = 0; t < NT; t++) {
              float one;
              kv->dot(n, m + r * wbytes, ta + t * stride, 0, 1, &one);
              const float added = init[t * OS + r] + one;
              CHECK(memcmp(&added, &sum[t * OS + r], sizeof one) == 0, "%s n=%d row %d token %d: %s gemm accumulate %.9g != %.9g",
                    ks->name, n, r, t, prima_simd_name(level), sum[t * OS + r], added);
              CHECK(memcmp(&one, &out[t * OS + r], sizeof one) == 0, "%s n=%d row %d token %d: %s gemm %.9g != its dot %.9g", ks->name,
                    n, r, t, prima_simd_name(level), out[t * OS + r], one);
            }
          free(m);
          free(ta);
        }
        free(deq_s);
        free(deq_v);
        free(x);
        free(w);
        free(acts);
      }
    }
  }
  /* 5. attention over F16 and quantized KV caches (kv_cache.c): each level's (its F16 scores and sums,
   * its Q8_0 dots on K, its V accumulation) against the scalar one, within float summation order */
  {
    const int kv_types[3] = {PRIMA_F16, PRIMA_Q8_0, PRIMA_Q4_0};
    const int d = 128, ratio = 2, n_pos = 200;
    for (int level = 1; level < 4; level++) {
      if (!prima_simd_available(level)) continue;
      for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
          const int kt = kv_types[a], vt = kv_types[b];
          const size_t kr = prima_row_bytes(kt, d), vr = prima_row_bytes(vt, d);
          uint8_t *K = malloc(kr * n_pos), *V = malloc(vr * n_pos);
          float q[256], out_s[256], out_l[256];
          fill_kv(kt, K, kr, vt, V, vr, d, n_pos);
          for (int i = 0; i < ratio * d; i++) q[i] = 2 * normal();
          void *scratch = aligned_alloc(64, (prima_kv_attend_scratch_bytes(ratio, d) + 63) & ~(size_t)63);
          const prima_kv_head kh = {kt, K, kr, 0}, vh = {vt, V, vr, 0};
          prima_kv_attend(&kh, &vh, q, ratio, d, 0, n_pos, 0.088f, 0, NULL, out_s, scratch, PRIMA_SIMD_SCALAR);
          prima_kv_attend(&kh, &vh, q, ratio, d, 0, n_pos, 0.088f, 0, NULL, out_l, scratch, level);
          float err = 0, mag = 0;
          for (int i = 0; i < ratio * d; i++) {
            err = fmaxf(err, fabsf(out_s[i] - out_l[i]));
            mag = fmaxf(mag, fabsf(out_s[i]));
          }
          CHECK(err <= 1e-5f * mag, "kv attention K %s V %s: %s differs from scalar by %g of %g", prima_type_name(kt), prima_type_name(vt),
                prima_simd_name(level), err, mag);
          free(scratch);
          free(K);
          free(V);
        }
    }
  }
  /* 5b. a batch's tiled attention over an F16 cache (attn_tile.c) at each level that takes it, against
   * each token's scalar attention, within float summation order */
  {
    const int d = 128, ratio = 2, pos0 = 100, n_tok = 40, n_pos = pos0 + n_tok;
    const size_t row = prima_row_bytes(PRIMA_F16, d), qdim = (size_t)ratio * d;
    uint8_t *K = malloc(row * n_pos), *V = malloc(row * n_pos);
    float *q = malloc(sizeof(float) * qdim * n_tok), *out_s = malloc(sizeof(float) * qdim * n_tok), *out_l = malloc(sizeof(float) * qdim * n_tok);
    fill_kv(PRIMA_F16, K, row, PRIMA_F16, V, row, d, n_pos);
    for (size_t i = 0; i < qdim * n_tok; i++) q[i] = 2 * normal();
    /* the tile rounds Q to F16 with vcvtps2ph, scalar in software: under an emulator that rounds ties
     * away, a Q exactly between two halves would round apart, so it moves one float step off the tie */
    if (!ties_even)
      for (size_t i = 0; i < qdim * n_tok; i++) {
        const uint16_t lo = prima_fp32_to_fp16(q[i]);
        if (f16_tie_between(q[i], lo, lo + 1) || f16_tie_between(q[i], lo, lo - 1)) q[i] = nextafterf(q[i], 0);
      }
    const prima_kv_head kh = {PRIMA_F16, K, row, 0}, vh = {PRIMA_F16, V, row, 0};
    const size_t sb = prima_kv_tile_scratch_bytes(ratio, d) > prima_kv_attend_scratch_bytes(ratio, d) ? prima_kv_tile_scratch_bytes(ratio, d)
                                                                                                       : prima_kv_attend_scratch_bytes(ratio, d);
    void *scratch = aligned_alloc(64, (sb + 63) & ~(size_t)63);
    for (int t = 0; t < n_tok; t++)
      prima_kv_attend(&kh, &vh, q + t * qdim, ratio, d, 0, pos0 + t + 1, 0.088f, 0, NULL, out_s + t * qdim, scratch, PRIMA_SIMD_SCALAR);
    for (int level = 1; level < 4; level++) {
      if (!prima_simd_available(level) || !prima_kv_tile_ok(&kh, &vh, d, level)) continue;
      for (int t0 = 0; t0 < n_tok; t0 += prima_kv_tile_tokens(ratio)) {
        const int nt = n_tok - t0 < prima_kv_tile_tokens(ratio) ? n_tok - t0 : prima_kv_tile_tokens(ratio);
        prima_kv_attend_tile(&kh, &vh, q + t0 * qdim, qdim, nt, pos0 + t0, 0, ratio, d, 0.088f, 0, NULL, out_l + t0 * qdim, scratch);
      }
      float err = 0, mag = 0;
      for (size_t i = 0; i < qdim * n_tok; i++) {
        err = fmaxf(err, fabsf(out_s[i] - out_l[i]));
        mag = fmaxf(mag, fabsf(out_s[i]));
      }
      CHECK(err <= 1e-5f * mag, "tiled F16 attention: %s differs from scalar by %g of %g", prima_simd_name(level), err, mag);
    }
    free(scratch);
    free(K);
    free(V);
    free(q);
    free(out_s);
    free(out_l);
  }
  /* 6. sparse attention (sparse_attn.c): a query beyond its window (sinks, rungs, landmarks and the
   * window through each level's kernels) against the scalar one */
  {
    const int types[3] = {PRIMA_F16, PRIMA_Q8_0, PRIMA_Q4_0};
    const int d = 64, ratio = 2, i = 700;
    const prima_sparse_cfg c = {128, 4, 1, 64};
    for (int level = 1; level < 4; level++) {
      if (!prima_simd_available(level)) continue;
      for (int a = 0; a < 3; a++) {
        const int kt = types[a], vt = types[(a + 1) % 3];
        const size_t kr = prima_row_bytes(kt, d), vr = prima_row_bytes(vt, d);
        uint8_t *K = malloc(kr * (i + 1)), *V = malloc(vr * (i + 1));
        float q[128], out_s[128], out_l[128], lm_k[10 * 64], lm_v[10 * 64];
        fill_kv(kt, K, kr, vt, V, vr, d, i + 1);
        for (int e = 0; e < ratio * d; e++) q[e] = 2 * normal();
        const prima_kv_head kh = {kt, K, kr, 0}, vh = {vt, V, vr, 0};
        for (int b = 0; b < 10; b++) prima_sparse_landmark(&kh, &vh, b * 64, 64, d, lm_k + b * d, lm_v + b * d);
        void *scratch = aligned_alloc(64, (prima_kv_attend_scratch_bytes(ratio, d) + 63) & ~(size_t)63);
        prima_sparse_attend(&c, &kh, &vh, lm_k, lm_v, q, ratio, d, i, 0.125f, 0, NULL, out_s, scratch, PRIMA_SIMD_SCALAR);
        prima_sparse_attend(&c, &kh, &vh, lm_k, lm_v, q, ratio, d, i, 0.125f, 0, NULL, out_l, scratch, level);
        float err = 0, mag = 0;
        for (int e = 0; e < ratio * d; e++) {
          err = fmaxf(err, fabsf(out_s[e] - out_l[e]));
          mag = fmaxf(mag, fabsf(out_s[e]));
        }
        CHECK(err <= 1e-5f * mag, "sparse attention K %s V %s: %s differs from scalar by %g of %g", prima_type_name(kt), prima_type_name(vt),
              prima_simd_name(level), err, mag);
        free(scratch);
        free(K);
        free(V);
      }
    }
  }
  printf("checked %d, failed %d\n", checks, failures);
  return failures ? 1 : 0;
}
