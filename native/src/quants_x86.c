/* x86 twins of quants.c. This one source is compiled once per x86 level, each into its own static
 * library, and a level's functions are only called after kernels.c saw the CPU run that level:
 *   AVX2 + FMA + F16C                      -> prima_avx2_fns
 *   + AVX-512 F/BW/DQ/VL                   -> prima_avx512_fns: the AVX2 code with EVEX's 32 registers
 *                                             (256-bit vectors: 512-bit bodies measured slower, below)
 *   + AVX-512 VNNI                         -> prima_avx512vnni_fns: also vpdpbusd for the 32-element blocks,
 *                                             and for the K-quants vpdpbusd per vector with two vectors'
 *                                             scales in one vpdpwssd (pair_dot_add: other bits than AVX2)
 *
 * Every dot decodes a weight block once and uses it for each of the nc activation rows, with integer
 * products (maddubs: unsigned weight levels x signed activations -> int16 pairs; madd: x group scale
 * -> int32; or VNNI's dpbusd: four products straight into int32). The integer sum of each block equals
 * the scalar twin's exactly; only the float accumulation order differs. Weight levels are kept unsigned
 * (K-quants add their offset through the activations' bsums), so maddubs never saturates:
 * 2 * 63 * 127 < 32767. */
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "quants.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Row c of the activations, as bytes. */
#define ACT_ROW(c) ((const uint8_t *)a + (size_t)(c) * as)

/* Half -> float through a table (filled once by the level's fns): a load, where vcvtph2ps on a scalar
 * costs an insert and a convert on the block's critical path (measured ~25% on the 32-element dots). */
static float f16_table[1 << 16];
ALWAYS_INLINE float h2f(prima_half h) { return f16_table[h]; }
/* a * h2f(h) in every lane, from two broadcast loads and one multiply: the product's bits are those of
 * the scalar a * h2f(h), where a scalar multiply and a register broadcast take two vector ops */
ALWAYS_INLINE __m256 bcast_mul_h(const float *a, prima_half h) {
  return _mm256_mul_ps(_mm256_broadcast_ss(a), _mm256_broadcast_ss(&f16_table[h]));
}

ALWAYS_INLINE float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

ALWAYS_INLINE float hsum128(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* The two shuffle bytes that pick 16-bit lane g (of each 128-bit half). */
ALWAYS_INLINE short pick16(int g) { return (short)(0x0100 + 0x0202 * g); }
/* A shuffle mask that broadcasts 16-bit lane g to every 16-bit lane. */
ALWAYS_INLINE __m256i bcast16_mask(int g) { return _mm256_set1_epi16(pick16(g)); }

/* Software prefetch distance of the rows kernels, in bytes ahead of the block being read. One token's
 * matrix-vector products stream every weight once, and the hardware prefetcher alone leaves the memory
 * bus underused: on the 2-core EPYC VM, two threads streamed Q4_K rows from DRAM at ~20 GB/s while plain
 * reads reached 26-47 GB/s, and decode ran ~8% faster with 1.5-4 KiB of prefetch (interleaved A/B in one
 * process; no distance in that range stood out, 3 KiB is in the middle). */
#define PREFETCH_BYTES 3072

/* Prefetches the bytes [p, p + bytes) (bytes a constant: unrolled). Prefetches never fault, so the
 * distance may run past the matrix and the mapping. */
#define PREFETCH_SPAN(p, bytes, hint)                                                                       \
  do {                                                                                                      \
    for (int o_ = 0; o_ < (bytes); o_ += 64) _mm_prefetch((const char *)(p) + o_, hint);                    \
    if ((bytes) % 64) _mm_prefetch((const char *)(p) + (bytes) - 1, hint);                                  \
  } while (0)
ALWAYS_INLINE void prefetch_span(const void *p, const int bytes) { PREFETCH_SPAN(p, bytes, _MM_HINT_T0); }
/* On Intel's Xeon 6 (host G, a 2-vCPU VM) a thread's weight stream stayed near 8-10 GB/s at every near
 * distance (1.5-12 KiB alike): a core's own L1 misses in flight bound it. Asking the L2 for lines 6 KiB
 * further ahead as well (prefetcht2: the L2's own, deeper queue) took decode from 1.44x to 1.58x
 * llama-bench, 66% to 72% of the read bandwidth (`npm run bench -- --only engine`, BENCHMARKS.md; 4-16
 * KiB alike within the noise in hand-timed builds). AMD hosts keep the one distance they were measured
 * at (0: no far prefetch). */
#define FAR_PREFETCH_BYTES 6144
static int far_prefetch_bytes;
static int cpu_is_intel(void) {
  unsigned a, b, c, d;
  return __get_cpuid(0, &a, &b, &c, &d) && b == 0x756e6547u; /* "Genu" of "GenuineIntel" */
}
/* Inside a kernel body: PF is 0 (dots) or PREFETCH_BYTES (rows kernels); both constants. */
#define PREFETCH(p, bytes)                                                                                  \
  do {                                                                                                      \
    if (PF) {                                                                                               \
      prefetch_span((const char *)(p) + PF, (bytes));                                                       \
      if (far_prefetch_bytes) PREFETCH_SPAN((const char *)(p) + far_prefetch_bytes, (bytes), _MM_HINT_T2);  \
    }                                                                                                       \
  } while (0)

/* Kernel bodies are written for a constant NC (so the compiler keeps per-row state in registers).
 * One function per nc (so each gets its own register allocation and loop layout: sharing one body
 * measured ~15% slower at nc = 1), and a dispatcher on the run-time nc. The rows kernel is the nc = 1
 * body plus prefetches: the same arithmetic in the same order, so the same bits. */
#define NC_FN(kernel, k)                                                                                    \
  static __attribute__((noinline)) void kernel##_##k(int n, const void *w, const void *a, size_t as, float *out) { \
    kernel##_nc(n, w, a, as, k, out, 0);                                                                    \
  }
/* A call starts a new stream (a thread's next chunk of rows is rarely where its last one ended): the
 * first PREFETCH_BYTES, which the in-loop prefetch never covers, are requested at once; its last rows
 * prefetch nothing, as past the chunk's end lie rows another thread reads. */
#define ROWS_FN(kernel)                                                                                     \
  static void kernel##_rows(int n, const void *w, size_t ws, int nr, const void *a, float *out) {           \
    prefetch_span(w, PREFETCH_BYTES);                                                                       \
    const int tail = (int)((PREFETCH_BYTES + ws - 1) / ws), lead = nr > tail ? nr - tail : 0;               \
    for (int r = 0; r < lead; r++) kernel##_nc(n, (const uint8_t *)w + (size_t)r * ws, a, 0, 1, out + r, PREFETCH_BYTES); \
    for (int r = lead; r < nr; r++) kernel##_nc(n, (const uint8_t *)w + (size_t)r * ws, a, 0, 1, out + r, 0); \
  }
/* A few tokens (one decode step of several sequences) read each weight once, as one token's rows do, and
 * memory bounds them too: the same dots with the rows kernel's prefetch (a pass of 4 sequences on the
 * benchmark model, Zen 4: 51-55 -> 42-45 ms; of 2: 38-39 -> 30-34). A prompt's later groups of tokens
 * find the rows in cache: prima_gemm prefetches in its first group only (prompts of 16 tokens ~10%
 * faster, of 128 1-2%; prefetching in every group cost ~4%). */
#define NC_STREAM_FN(kernel, k)                                                                             \
  static __attribute__((noinline)) void kernel##_stream_##k(int n, const void *w, const void *a, size_t as, float *out) { \
    kernel##_nc(n, w, a, as, k, out, PREFETCH_BYTES);                                                       \
  }
#define STREAM_FN(kernel) PRIMA_NC_EACH(NC_STREAM_FN, kernel) PRIMA_NC_DISPATCHER(kernel##_stream)
#define DISPATCH_NC(kernel) PRIMA_DISPATCH_NC(kernel) ROWS_FN(kernel) STREAM_FN(kernel)

/* ---------------------------------------------------------------- float formats
 * A vector of VW = 8 floats (a ymm) at every x86 level: 16-float (zmm) bodies were slower on the AVX-512
 * CPU measured (Zen 4: F16 nc = 1 0.06 against 0.04 ns an element, nc = 8 0.04 against 0.03). */

#define VW 8
typedef __m256 vfloat;
#define vf_zero _mm256_setzero_ps
#define vf_fmadd _mm256_fmadd_ps
#define vf_add _mm256_add_ps
#define vf_hsum hsum256
ALWAYS_INLINE __m256 loadv_f32(const void *p) { return _mm256_loadu_ps((const float *)p); }
ALWAYS_INLINE __m256 loadv_f16(const void *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
ALWAYS_INLINE __m256 loadv_bf16(const void *p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
ALWAYS_INLINE float load1_f32(const void *p, int i) { return ((const float *)p)[i]; }
ALWAYS_INLINE float load1_f16(const void *p, int i) { return h2f(((const uint16_t *)p)[i]); }
ALWAYS_INLINE float load1_bf16(const void *p, int i) { return prima_bf16_to_fp32(((const uint16_t *)p)[i]); }

/* U = 4 accumulators per row, VW elements each per step: enough to hide FMA latency on one row
 * (decode). Which accumulator and lane a product lands in, and how they are summed, must not depend on
 * nc: a token alone and the same token inside a prompt batch get the same bits (the prompt cache and
 * failover replay rely on it). 4 x nc accumulators do not fit in registers past a few rows, so a call
 * goes through its rows FLOAT_G at a time (the weight row is re-read from L1; ~12-20% slower at nc = 8
 * than 2 accumulators per row for all 8 rows, which had nc = 1 and nc = 8 disagree). */
#define FLOAT_U 4
#ifdef __AVX512F__
#define FLOAT_G 4 /* 16 of the 32 vector registers EVEX gives */
#else
#define FLOAT_G 2 /* 8 of the 16 ymm (3 measured slower: spills) */
#endif
#define FLOAT_DOT(NAME, ESIZE, LOADV, LOAD1)                                                          \
  ALWAYS_INLINE void NAME##_cols(int n, const void *w, const void *a, size_t as, const int NC, float *out, const int PF) { \
    const int U = FLOAT_U;                                                                            \
    vfloat acc[FLOAT_U][FLOAT_G];                                                                     \
    for (int u = 0; u < U; u++)                                                                       \
      for (int c = 0; c < NC; c++) acc[u][c] = vf_zero();                                             \
    const uint8_t *wb = w;                                                                            \
    int i = 0;                                                                                        \
    for (; i + VW * U <= n; i += VW * U) {                                                            \
      PREFETCH(wb + (size_t)i * ESIZE, VW * U * ESIZE);                                               \
      for (int u = 0; u < U; u++) {                                                                   \
        const vfloat wv = LOADV(wb + (size_t)(i + VW * u) * ESIZE);                                   \
        for (int c = 0; c < NC; c++)                                                                  \
          acc[u][c] = vf_fmadd(wv, LOADV(ACT_ROW(c) + (size_t)(i + VW * u) * ESIZE), acc[u][c]);      \
      }                                                                                               \
    }                                                                                                 \
    for (; i + VW <= n; i += VW) {                                                                    \
      const vfloat wv = LOADV(wb + (size_t)i * ESIZE);                                                \
      for (int c = 0; c < NC; c++) acc[0][c] = vf_fmadd(wv, LOADV(ACT_ROW(c) + (size_t)i * ESIZE), acc[0][c]); \
    }                                                                                                 \
    for (int c = 0; c < NC; c++) {                                                                    \
      vfloat t = acc[0][c];                                                                           \
      for (int u = 1; u < U; u++) t = vf_add(t, acc[u][c]);                                           \
      float s = vf_hsum(t);                                                                           \
      /* fused by hand: GCC vectorizes this tail at some nc (in-order adds of a vector of products,  \
       * unfused) and not at others (fused), and nc = 1 must equal a batch bit for bit */            \
      for (int j = i; j < n; j++) s = fmaf(LOAD1(w, j), LOAD1(ACT_ROW(c), j), s);                     \
      out[c] = s;                                                                                     \
    }                                                                                                 \
  }                                                                                                   \
  ALWAYS_INLINE void NAME##_nc(int n, const void *w, const void *a, size_t as, const int NC, float *out, const int PF) { \
    for (int c = 0; c < NC; c += FLOAT_G) NAME##_cols(n, w, ACT_ROW(c), as, NC - c < FLOAT_G ? NC - c : FLOAT_G, out + c, PF); \
  }                                                                                                   \
  DISPATCH_NC(NAME)

FLOAT_DOT(dot_f32, 4, loadv_f32, load1_f32)
FLOAT_DOT(dot_f16, 2, loadv_f16, load1_f16)
FLOAT_DOT(dot_bf16, 2, loadv_bf16, load1_bf16)

/* ---------------------------------------------------------------- 32-element blocks */

/* 16 bytes of nibbles -> 32 bytes: element j (low nibble of byte j) then j+16 (high nibbles). */
ALWAYS_INLINE __m256i nibbles32(const uint8_t *qs) {
  const __m128i t = _mm_loadu_si128((const __m128i *)qs);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

/* Bit j of the little-endian uint32 at qh -> 0x10 in byte j (the fifth bit of Q5 levels). */
ALWAYS_INLINE __m256i fifth_bits32(const uint8_t *qh4) {
  uint32_t qh;
  memcpy(&qh, qh4, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32((int)qh), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

/* Sum of q*a over 32 signed levels q (never -128) and signed activations a, as 8 int32 lanes. */
ALWAYS_INLINE __m256i dot32_signed(__m256i absq, __m256i q, __m256i a) {
#ifdef __AVX512VNNI__
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), absq, _mm256_sign_epi8(a, q));
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(absq, _mm256_sign_epi8(a, q)), _mm256_set1_epi16(1));
#endif
}
/* Same for unsigned levels q (<= 127). */
ALWAYS_INLINE __m256i dot32_unsigned(__m256i q, __m256i a) {
#ifdef __AVX512VNNI__
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), _mm256_set1_epi16(1));
#endif
}

/* Signed-level blocks (Q4_0, Q5_0, Q8_0) against Q8_0: acc += (d_w*d_a) * isum, per lane. Blocks go in
 * pairs into two accumulator sets, so consecutive FMAs do not wait on each other. */
#define SIGNED32_DOT(NAME, BLOCK, DECODE, SCALE)                                                           \
  ALWAYS_INLINE void NAME##_block(const BLOCK *wb, int i, const void *a, size_t as, const int NC, __m256 *acc) { \
    const __m256i q = DECODE(wb);                                                                     \
    const __m256i absq = _mm256_sign_epi8(q, q);                                                      \
    const float d = SCALE(wb);                                                                        \
    for (int c = 0; c < NC; c++) {                                                                    \
      const block_q8_0 *x = (const block_q8_0 *)ACT_ROW(c) + i;                                       \
      const __m256i p = dot32_signed(absq, q, _mm256_loadu_si256((const __m256i *)x->qs));            \
      acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d * h2f(x->d)), _mm256_cvtepi32_ps(p), acc[c]);         \
    }                                                                                                 \
  }                                                                                                   \
  BLOCK32_LOOP(NAME, BLOCK)

#define BLOCK32_LOOP(NAME, BLOCK)                                                                     \
  ALWAYS_INLINE void NAME##_nc(int n, const void *vw, const void *a, size_t as, const int NC, float *out, const int PF) { \
    const BLOCK *w = vw;                                                                              \
    __m256 acc0[PRIMA_MAX_NC], acc1[PRIMA_MAX_NC];                                                    \
    float accm[PRIMA_MAX_NC];                                                                         \
    for (int c = 0; c < NC; c++) { acc0[c] = acc1[c] = _mm256_setzero_ps(); accm[c] = 0; }            \
    const int nb = n / QK32;                                                                          \
    int i = 0;                                                                                        \
    for (; i + 1 < nb; i += 2) {                                                                      \
      PREFETCH(&w[i], 2 * (int)sizeof(BLOCK));                                                        \
      NAME##_block(&w[i], i, a, as, NC, acc0 MIN_ARG);                                                \
      NAME##_block(&w[i + 1], i + 1, a, as, NC, acc1 MIN_ARG);                                        \
    }                                                                                                 \
    if (i < nb) NAME##_block(&w[i], i, a, as, NC, acc0 MIN_ARG);                                      \
    for (int c = 0; c < NC; c++) out[c] = hsum256(_mm256_add_ps(acc0[c], acc1[c])) + accm[c];         \
  }                                                                                                   \
  DISPATCH_NC(NAME)

ALWAYS_INLINE __m256i decode_q4_0(const block_q4_0 *b) { return _mm256_sub_epi8(nibbles32(b->qs), _mm256_set1_epi8(8)); }
ALWAYS_INLINE __m256i decode_q5_0(const block_q5_0 *b) {
  return _mm256_sub_epi8(_mm256_or_si256(nibbles32(b->qs), fifth_bits32(b->qh)), _mm256_set1_epi8(16));
}
ALWAYS_INLINE __m256i decode_q8_0(const block_q8_0 *b) { return _mm256_loadu_si256((const __m256i *)b->qs); }

/* IQ4 levels: each nibble looked up in the 16-value grid (pshufb looks up within each 128-bit lane, so
 * every lane holds the grid). */
ALWAYS_INLINE __m128i iq4_grid128(void) { return _mm_loadu_si128((const __m128i *)PRIMA_IQ4NL_VALUES); }
ALWAYS_INLINE __m256i decode_iq4_nl(const block_iq4_nl *b) {
  return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(iq4_grid128()), nibbles32(b->qs));
}

/* MXFP4: the same lookup in E2M1's grid; its scale is an E8M0 power of two. */
ALWAYS_INLINE __m256i decode_mxfp4(const block_mxfp4 *b) {
  return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)PRIMA_MXFP4_VALUES)), nibbles32(b->qs));
}

#define HALF_SCALE(b) h2f((b)->d)
#define E8M0_SCALE(b) prima_e8m0_half((b)->e)
#define MIN_ARG
SIGNED32_DOT(dot_q4_0, block_q4_0, decode_q4_0, HALF_SCALE)
SIGNED32_DOT(dot_q5_0, block_q5_0, decode_q5_0, HALF_SCALE)
SIGNED32_DOT(dot_q8_0, block_q8_0, decode_q8_0, HALF_SCALE)
SIGNED32_DOT(dot_iq4_nl, block_iq4_nl, decode_iq4_nl, HALF_SCALE)
SIGNED32_DOT(dot_mxfp4, block_mxfp4, decode_mxfp4, E8M0_SCALE)
#undef MIN_ARG

/* Unsigned-level blocks with a min (Q4_1, Q5_1) against Q8_1: acc += (d_w*d_a) * isum + m_w * s_a. */
#define MIN32_DOT(NAME, BLOCK, DECODE)                                                                \
  ALWAYS_INLINE void NAME##_block(const BLOCK *wb, int i, const void *a, size_t as, const int NC, __m256 *acc, \
                                  float *accm) {                                                      \
    const __m256i q = DECODE(wb);                                                                     \
    const float d = h2f(wb->d), m = h2f(wb->m);                                                       \
    for (int c = 0; c < NC; c++) {                                                                    \
      const block_q8_1 *x = (const block_q8_1 *)ACT_ROW(c) + i;                                      \
      const __m256i p = dot32_unsigned(q, _mm256_loadu_si256((const __m256i *)x->qs));                \
      acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d * h2f(x->d)), _mm256_cvtepi32_ps(p), acc[c]);         \
      accm[c] += m * h2f(x->s);                                                                       \
    }                                                                                                 \
  }                                                                                                   \
  BLOCK32_LOOP(NAME, BLOCK)

ALWAYS_INLINE __m256i decode_q4_1(const block_q4_1 *b) { return nibbles32(b->qs); }
ALWAYS_INLINE __m256i decode_q5_1(const block_q5_1 *b) { return _mm256_or_si256(nibbles32(b->qs), fifth_bits32(b->qh)); }

#define MIN_ARG , accm
MIN32_DOT(dot_q4_1, block_q4_1, decode_q4_1)
MIN32_DOT(dot_q5_1, block_q5_1, decode_q5_1)
#undef MIN_ARG

/* ---------------------------------------------------------------- K-quants
 * Common shape: per super-block and row, an int32 vector sum of scale * (levels . activations); the
 * offset or min of the levels enters once per super-block as (group scale or min) . bsums. */

ALWAYS_INLINE const block_q8_K *act_k(const void *a, size_t as, int c, int i) {
  return (const block_q8_K *)((const uint8_t *)a + (size_t)c * as) + i;
}

/* The 8 six-bit scales (bytes 0..7) and mins (bytes 8..15) of a Q4_K/Q5_K block, from its 12 scale
 * bytes as dwords u0..u2: scales 0-3 and mins 0-3 are the low 6 bits of u0 and u1; scales and mins 4-7
 * the low and high nibbles of u2, with their top 2 bits in the top bits of u0 and u1. Built in vector
 * lanes (8 instructions, where scalars and inserts took about 20; 3% of the Q4_K dot). The 16-byte load
 * reads 4 bytes past the scales, inside the block (its levels follow). */
ALWAYS_INLINE __m128i k4_scales_mins(const uint8_t *s) {
  const __m128i u = _mm_loadu_si128((const __m128i *)s);
  /* lanes: scales 0-3 (u0), scales 4-7 (u2 low nibbles), mins 0-3 (u1), mins 4-7 (u2 high nibbles) */
  const __m128i low = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4)),
                                    _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
  /* the top 2 bits of scales and mins 4-7: bits 6-7 of each byte of u0 and u1, moved to bits 4-5 */
  const __m128i top = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(1, 0, 0, 0)), 2),
                                    _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm_or_si128(low, top);
}

/* K-quant dots: a level vector holds 32 bytes (a ymm) at every x86 level. 64-byte (zmm) bodies
 * were slower at every K type, nc = 1 and nc = 8, on the one AVX-512 CPU measured (Zen 4, which runs a
 * 512-bit op as two 256-bit halves): the gathering of levels and scales across 64 bytes costs shuffles
 * the ymm bodies do not need (bench/kernels.ts: Q4_K nc = 1 8.6 against 6.3 ns a block). With
 * AVX-512 VNNI (and VL) the scale multiply-add is one dpwssd. */
#define vi_load(p) _mm256_loadu_si256((const __m256i *)(p))
#ifdef __AVX512VNNI__
#define vi_dot16_add(acc, q, a, s) _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(q, a), s)
#else
#define vi_dot16_add(acc, q, a, s) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), s))
#endif
ALWAYS_INLINE int vi_hsum32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
}

ALWAYS_INLINE __m256i scales16(__m128i s16) { return _mm256_broadcastsi128_si256(s16); }

#ifdef __AVX512VNNI__
/* VNNI: two level vectors (two groups, or two pairs of 16-element groups) at once. Each vector's
 * four-product sums come from one dpbusd (int16-sized: |t| <= 4 * 63 * 128), packed side by side, and
 * both vectors' scales go in one dpwssd: half the scale shuffles and multiply-adds of maddubs + dpwssd
 * per vector (Q4_K nc = 1 6.14 -> 5.7 ns a block on Zen 4). Lane l then holds 8 products of one vector
 * where AVX2's holds 4 of each: the same integer block sums, another float rounding (AVX2 emulating this
 * grouping, with a horizontal add, was 15% slower). A vector's scale may differ between its 128-bit
 * halves (16-element groups): g0lo/g0hi for vector 0, g1lo/g1hi for vector 1. */
ALWAYS_INLINE __m256i pair_scales(__m256i scales, int g0lo, int g0hi, int g1lo, int g1hi) {
  const short a = pick16(g0lo), b = pick16(g1lo), c = pick16(g0hi), d = pick16(g1hi);
  return _mm256_shuffle_epi8(scales, _mm256_setr_epi16(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d));
}
ALWAYS_INLINE __m256i pair_dot_add(__m256i acc, __m256i q0, __m256i x0, __m256i q1, __m256i x1, __m256i s) {
  const __m256i t0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q0, x0);
  const __m256i t1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q1, x1);
  return _mm256_dpwssd_epi32(acc, _mm256_packs_epi32(t0, t1), s);
}
/* Two consecutive level vectors through one pair_dot_add per activation row; X(c) is row c's activations
 * of the first (the second's follow). */
#define PAIR_DOT(chain, q0, q1, s, X)                                                                 \
  for (int c = 0; c < NC; c++) {                                                                      \
    const int8_t *x = X(c);                                                                           \
    chain[c] = pair_dot_add(chain[c], q0, vi_load(x), q1, vi_load(x + 32), s);                        \
  }
#endif

/* Q4_K/Q5_K, chunk j, vector v: group 2j + v = the low (v = 0) or high (v = 1) nibbles of qs[32j..];
 * Q5_K's fifth bit is bit 2j + v of each qh byte. */
ALWAYS_INLINE __m256i k4_levels(const uint8_t *qs, const uint8_t *qh, int j, int v) {
  const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j)), m4 = _mm256_set1_epi8(0x0F);
  __m256i l = v == 0 ? _mm256_and_si256(q, m4) : _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
  if (qh)
    l = _mm256_or_si256(l, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)qh), 2 * j + v),
                                                             _mm256_set1_epi8(1)), 4));
  return l;
}
ALWAYS_INLINE __m256i k4_scale(__m256i scales, int j, int v) { return _mm256_shuffle_epi8(scales, bcast16_mask(2 * j + v)); }

/* Q6_K, half h, vector k (elements 128h + 32k + l, groups 2k and 2k+1 of the half): low nibbles of
 * ql[64h + 32(k&1)..] (k < 2) or their high nibbles, with bits 2k..2k+1 of qh[32h..] moved to bits
 * 4-5 (one shift and one mask; the shift crosses bytes inside each 16-bit lane, but the mask keeps only
 * bits that came from the same byte). */
ALWAYS_INLINE __m256i q6_levels(const uint8_t *ql, const uint8_t *qh, int k) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  const __m256i lo = _mm256_loadu_si256((const __m256i *)(ql + 32 * (k & 1)));
  const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
  const __m256i low4 = k < 2 ? _mm256_and_si256(lo, m4) : _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4);
  const __m256i high2 = k == 0 ? _mm256_slli_epi16(h, 4) : k == 1 ? _mm256_slli_epi16(h, 2) : k == 2 ? h : _mm256_srli_epi16(h, 2);
  return _mm256_or_si256(low4, _mm256_and_si256(high2, m30));
}
/* The scales of 16-element groups 2k and 2k+1 of a 128-element half (Q6_K, Q3_K, Q2_K). */
ALWAYS_INLINE __m256i g16_scale(__m256i scales, int k) {
  return _mm256_shuffle_epi8(scales, _mm256_set_m128i(_mm_set1_epi16(pick16(2 * k + 1)), _mm_set1_epi16(pick16(2 * k))));
}

/* Q2_K/Q3_K, half h, vector s (elements 128h + 32s + l): bits 2s..2s+1 of qs[32h..]; Q3_K's third bit
 * is bit 4h+s of each hmask byte. */
ALWAYS_INLINE __m256i q2_levels(const uint8_t *qs, int s) {
  return _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)qs), 2 * s), _mm256_set1_epi8(3));
}
ALWAYS_INLINE __m256i q3_high_bits(const uint8_t *hmask, int h, int s) {
  return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)hmask), 4 * h + s), _mm256_set1_epi8(1)), 2);
}

/* IQ4_XS, vector v = group v: its signed levels and scale. */
ALWAYS_INLINE __m256i iq4xs_levels(const uint8_t *qs, int v) {
  return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(iq4_grid128()), nibbles32(qs + 16 * v));
}
ALWAYS_INLINE __m256i iq4xs_scale(__m256i scales, int v) { return _mm256_shuffle_epi8(scales, bcast16_mask(v)); }

/* A super-block's integer sums per row, sumi[chain][row]. With VNNI a multiply-add into an accumulator
 * is one instruction (dpwssd) whose latency (4-5 cycles) would chain a block's vectors one after the
 * other for a lone row (decode): there the vectors take turns over SUMI_CHAINS accumulators, folded
 * once a block (integer sums in any order: the same bits at every nc). Two: with the K-quants' paired
 * vectors (4 dpwssd a block, not 8) four chains measured slower at nc = 1 (Q4_K 5.71 against 5.57 ns a
 * block), one slower for IQ4_XS's 8 (11.40 against 11.11); AVX2's madd + add is no chain either way. */
#define SUMI_MAX_CHAINS 2
#define SUMI_CHAINS(NC) ((NC) <= 2 ? 2 : 1)
#define SUMI_ZERO(sumi)                                                                               \
  for (int ch = 0; ch < SUMI_CHAINS(NC); ch++)                                                        \
    for (int c = 0; c < NC; c++) sumi[ch][c] = _mm256_setzero_si256()
#define SUMI_FOLD(sumi)                                                                               \
  for (int ch = 1; ch < SUMI_CHAINS(NC); ch++)                                                        \
    for (int c = 0; c < NC; c++) sumi[0][c] = _mm256_add_epi32(sumi[0][c], sumi[ch][c])

/* A Q4_K/Q5_K super-block's 8 groups of 32 into sumi. */
#ifdef __AVX512VNNI__
#define K4_X(c) (act_k(a, as, c, i)->qs + 64 * j)
#define K4_GROUPS(b, QH)                                                                              \
  for (int j = 0; j < 4; j++) {                                                                       \
    const __m256i q0 = k4_levels(b->qs, QH(b), j, 0), q1 = k4_levels(b->qs, QH(b), j, 1);             \
    const __m256i s = pair_scales(scales, 2 * j, 2 * j, 2 * j + 1, 2 * j + 1);                        \
    __m256i *chain = sumi[j % SUMI_CHAINS(NC)];                                                       \
    PAIR_DOT(chain, q0, q1, s, K4_X);                                                                 \
  }
#else
#define K4_GROUPS(b, QH)                                                                              \
  for (int j = 0; j < 4; j++)                                                                         \
    for (int v = 0; v < 2; v++) {                                                                     \
      const __m256i q = k4_levels(b->qs, QH(b), j, v), s = k4_scale(scales, j, v);                    \
      __m256i *chain = sumi[(j * 2 + v) % SUMI_CHAINS(NC)];                                           \
      for (int c = 0; c < NC; c++)                                                                    \
        chain[c] = vi_dot16_add(chain[c], q, vi_load(act_k(a, as, c, i)->qs + 64 * j + 32 * v), s);   \
    }
#endif

/* Q4_K and Q5_K: 8 groups of 32; group 2j = low nibbles of qs chunk j, 2j+1 = high nibbles. QH(b) is
 * the block's fifth bits, or NULL. Per block and row, two multiply-adds into the row's accumulator:
 * the levels' sum, then the mins against the bsums. Every nc does the same (decode must equal a prompt
 * batch bit for bit; a separate min accumulator at nc = 1 only did not, and measured no faster on EPYC:
 * 1-2% slower at both levels). */
#define K4_DOT(NAME, BLOCK, QH)                                                                       \
  ALWAYS_INLINE void NAME##_nc(int n, const void *vw, const void *a, size_t as, const int NC, float *out, const int PF) { \
    const BLOCK *w = vw;                                                                              \
    __m256 acc[PRIMA_MAX_NC];                                                                         \
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();                                        \
    for (int i = 0; i < n / QK_K; i++) {                                                              \
      const BLOCK *b = &w[i];                                                                         \
      PREFETCH(b, (int)sizeof(BLOCK));                                                                \
      const __m128i scm = k4_scales_mins(b->scales);                                                  \
      /* min g in int16 lanes 2g and 2g+1, against the two bsums of group g */                        \
      const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm));                         \
      const __m256i scales = scales16(_mm_cvtepu8_epi16(scm));                                           \
      __m256i sumi[SUMI_MAX_CHAINS][PRIMA_MAX_NC];                                                                     \
      SUMI_ZERO(sumi);                                                                                \
      K4_GROUPS(b, QH)                                                                                \
      SUMI_FOLD(sumi);                                                                                \
      for (int c = 0; c < NC; c++) {                                                                  \
        const block_q8_K *x = act_k(a, as, c, i);                                                     \
        acc[c] = _mm256_fmadd_ps(bcast_mul_h(&x->d, b->d), _mm256_cvtepi32_ps(sumi[0][c]), acc[c]);    \
        const __m256i mp = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)x->bsums));    \
        acc[c] = _mm256_fnmadd_ps(bcast_mul_h(&x->d, b->dmin), _mm256_cvtepi32_ps(mp), acc[c]);       \
      }                                                                                               \
    }                                                                                                 \
    for (int c = 0; c < NC; c++) out[c] = hsum256(acc[c]);                                            \
  }                                                                                                   \
  DISPATCH_NC(NAME)

#define NO_QH(b) ((const uint8_t *)NULL)
#define Q5_QH(b) ((b)->qh)
K4_DOT(dot_q4_K, block_q4_K, NO_QH)
K4_DOT(dot_q5_K, block_q5_K, Q5_QH)

/* sumi += one 128-element half h of a super-block in 16-element groups: 4 level vectors
 * (LEVELS, an expression of v) against the activations, with the half's int16 `scales`. Vector v holds
 * group 2v in its low 128 bits and 2v+1 in its high ones. */
#ifdef __AVX512VNNI__
#define HALF_X(c) (act_k(a, as, c, i)->qs + 128 * h + 64 * p)
#define HALF128_DOT(LEVELS)                                                                           \
  for (int p = 0; p < 2; p++) {                                                                       \
    __m256i q0, q1;                                                                                   \
    { const int v = 2 * p; q0 = (LEVELS); }                                                           \
    { const int v = 2 * p + 1; q1 = (LEVELS); }                                                       \
    const __m256i s = pair_scales(scales, 4 * p, 4 * p + 1, 4 * p + 2, 4 * p + 3);                    \
    __m256i *chain = sumi[(h * 2 + p) % SUMI_CHAINS(NC)];                                             \
    PAIR_DOT(chain, q0, q1, s, HALF_X);                                                               \
  }
#else
#define HALF128_DOT(LEVELS)                                                                           \
  for (int v = 0; v < 4; v++) {                                                                       \
    const __m256i q = (LEVELS), s = g16_scale(scales, v);                                             \
    __m256i *chain = sumi[(h * 4 + v) % SUMI_CHAINS(NC)];                                             \
    for (int c = 0; c < NC; c++)                                                                      \
      chain[c] = vi_dot16_add(chain[c], q, vi_load(act_k(a, as, c, i)->qs + 128 * h + 32 * v), s);   \
  }
#endif

/* Q6_K and Q3_K: unsigned levels (q + 2^(OFFSET_SHIFT)) in 16 groups of 16 with int8 scales; the
 * offset enters once per super-block as -2^OFFSET_SHIFT * scales . bsums. SCALES8 gives the block's 16
 * scales as int8, LEVELS the level vector v of half h. */
#define SIGNED_SCALE_K_DOT(NAME, BLOCK, SCALES8, OFFSET_SHIFT, LEVELS)                                \
  ALWAYS_INLINE void NAME##_nc(int n, const void *vw, const void *a, size_t as, const int NC, float *out, const int PF) { \
    const BLOCK *w = vw;                                                                              \
    __m256 acc[PRIMA_MAX_NC];                                                                         \
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();                                        \
    for (int i = 0; i < n / QK_K; i++) {                                                              \
      const BLOCK *b = &w[i];                                                                         \
      PREFETCH(b, (int)sizeof(BLOCK));                                                                \
      const __m128i sc8 = (SCALES8);                                                                  \
      const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);                                                 \
      __m256i sumi[SUMI_MAX_CHAINS][PRIMA_MAX_NC];                                                                     \
      SUMI_ZERO(sumi);                                                                                \
      for (int c = 0; c < NC; c++) {                                                                  \
        const block_q8_K *x = act_k(a, as, c, i);                                                     \
        const __m256i bias = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)x->bsums));  \
        sumi[0][c] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(bias, OFFSET_SHIFT)); \
      }                                                                                               \
      for (int h = 0; h < 2; h++) {                                                                   \
        const __m256i scales = scales16(_mm_cvtepi8_epi16(h ? _mm_unpackhi_epi64(sc8, sc8) : sc8));      \
        HALF128_DOT(LEVELS)                                                                           \
      }                                                                                               \
      SUMI_FOLD(sumi);                                                                                \
      for (int c = 0; c < NC; c++) {                                                                  \
        const block_q8_K *x = act_k(a, as, c, i);                                                     \
        acc[c] = _mm256_fmadd_ps(bcast_mul_h(&x->d, b->d), _mm256_cvtepi32_ps(sumi[0][c]), acc[c]);    \
      }                                                                                               \
    }                                                                                                 \
    for (int c = 0; c < NC; c++) out[c] = hsum256(acc[c]);                                            \
  }                                                                                                   \
  DISPATCH_NC(NAME)

/* Q6_K: levels 0..63 (offset 32). */
SIGNED_SCALE_K_DOT(dot_q6_K, block_q6_K, _mm_loadu_si128((const __m128i *)b->scales), 5,
                   q6_levels(b->ql + 64 * h, b->qh + 32 * h, v))

/* Q2_K: 2-bit levels, 16 groups of 16 with 4-bit scales and mins (the mins enter via bsums). */
ALWAYS_INLINE void dot_q2_K_nc(int n, const void *vw, const void *a, size_t as, const int NC, float *out, const int PF) {
  const block_q2_K *w = vw;
  const __m128i m4 = _mm_set1_epi8(0x0F);
  __m256 acc[PRIMA_MAX_NC];
  for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
  for (int i = 0; i < n / QK_K; i++) {
    const block_q2_K *b = &w[i];
    PREFETCH(b, (int)sizeof(block_q2_K));
    const __m128i sm = _mm_loadu_si128((const __m128i *)b->scales);
    const __m128i sc8 = _mm_and_si128(sm, m4);
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), m4));
    const float dmin = h2f(b->dmin);
    __m256i sumi[SUMI_MAX_CHAINS][PRIMA_MAX_NC];
    float msum[PRIMA_MAX_NC];
    SUMI_ZERO(sumi);
    for (int c = 0; c < NC; c++) {
      const block_q8_K *x = act_k(a, as, c, i);
      const __m256i mp = _mm256_madd_epi16(mins16, _mm256_loadu_si256((const __m256i *)x->bsums));
      const __m128i m128 = _mm_add_epi32(_mm256_castsi256_si128(mp), _mm256_extracti128_si256(mp, 1));
      const __m128i m64 = _mm_add_epi32(m128, _mm_unpackhi_epi64(m128, m128));
      msum[c] = (float)_mm_cvtsi128_si32(_mm_add_epi32(m64, _mm_shuffle_epi32(m64, 1)));
    }
    for (int h = 0; h < 2; h++) {
      const __m256i scales = scales16(_mm_cvtepu8_epi16(h ? _mm_unpackhi_epi64(sc8, sc8) : sc8));
      HALF128_DOT(q2_levels(b->qs + 32 * h, v))
    }
    SUMI_FOLD(sumi);
    for (int c = 0; c < NC; c++) {
      const block_q8_K *x = act_k(a, as, c, i);
      acc[c] = _mm256_fmadd_ps(bcast_mul_h(&x->d, b->d), _mm256_cvtepi32_ps(sumi[0][c]), acc[c]);
      acc[c] = _mm256_sub_ps(acc[c], _mm256_setr_ps((x->d * dmin) * msum[c], 0, 0, 0, 0, 0, 0, 0));
    }
  }
  for (int c = 0; c < NC; c++) out[c] = hsum256(acc[c]);
}
DISPATCH_NC(dot_q2_K)

/* The 16 signed 6-bit scales of a Q3_K block as int8. */
ALWAYS_INLINE __m128i q3k_scales(const uint8_t *s) {
  uint32_t u[3];
  memcpy(u, s, 12);
  const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;
  const __m128i r = _mm_set_epi32((int)(((u[1] >> 4) & k2) | (((u[2] >> 6) & k1) << 4)),
                                  (int)(((u[0] >> 4) & k2) | (((u[2] >> 4) & k1) << 4)),
                                  (int)((u[1] & k2) | (((u[2] >> 2) & k1) << 4)), (int)((u[0] & k2) | ((u[2] & k1) << 4)));
  return _mm_sub_epi8(r, _mm_set1_epi8(32));
}

/* Q3_K: levels 0..7 (2 low bits | high bit << 2) = q + 4. */
SIGNED_SCALE_K_DOT(dot_q3_K, block_q3_K, q3k_scales(b->scales), 2,
                   _mm256_or_si256(q2_levels(b->qs + 32 * h, v), q3_high_bits(b->hmask, h, v)))

/* The 8 signed group scales (ls - 32) of an IQ4_XS block as int16 (prima_iq4xs_scale, in registers): the
 * low nibbles of scales_l (groups 0,2,4,6) interleaved with the high ones (1,3,5,7), and bits 2g..2g+1
 * of scales_h, which a multiply moves to the top of lane g and a shift brings down. */
ALWAYS_INLINE __m128i iq4xs_scales(const block_iq4_xs *b) {
  uint32_t sl;
  memcpy(&sl, b->scales_l, 4);
  const __m128i lo = _mm_cvtsi32_si128((int)(sl & 0x0F0F0F0F)), hi = _mm_cvtsi32_si128((int)((sl >> 4) & 0x0F0F0F0F));
  const __m128i low4 = _mm_cvtepu8_epi16(_mm_unpacklo_epi8(lo, hi));
  const __m128i high2 = _mm_srli_epi16(
      _mm_mullo_epi16(_mm_set1_epi16((short)b->scales_h), _mm_setr_epi16(1 << 14, 1 << 12, 1 << 10, 1 << 8, 1 << 6, 1 << 4, 1 << 2, 1)), 14);
  return _mm_sub_epi16(_mm_or_si128(low4, _mm_slli_epi16(high2, 4)), _mm_set1_epi16(32));
}

/* acc + a super-block's integer sum times d_w * d_a, fused (one rounding): the step both the IQ4_XS dot
 * and its gemm take per super-block, row and token, so decode and a prompt give the same bits. */
ALWAYS_INLINE float iq4xs_sum(int isum, float dw, float da, float acc) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), isum), _mm_set_ss(dw * da), _mm_set_ss(acc)));
}

/* IQ4_XS: signed grid levels (-127..113) in 8 groups of 32 with signed 6-bit scales, no offset or min:
 * per row sumi += scale * (|q| . (a with q's signs)), which maddubs takes without saturating
 * (2 * 127 * 127 < 32767). */
ALWAYS_INLINE void dot_iq4_xs_nc(int n, const void *vw, const void *a, size_t as, const int NC, float *out, const int PF) {
  const block_iq4_xs *w = vw;
  /* one float per row, summed as gemm_iq4_xs sums each of its lanes (iq4xs_sum): the same bits */
  float acc[PRIMA_MAX_NC];
  for (int c = 0; c < NC; c++) acc[c] = 0.0f;
  for (int i = 0; i < n / QK_K; i++) {
    const block_iq4_xs *b = &w[i];
    PREFETCH(b, (int)sizeof(block_iq4_xs));
    const __m256i scales = scales16(iq4xs_scales(b));
    const float d = h2f(b->d);
    __m256i sumi[SUMI_MAX_CHAINS][PRIMA_MAX_NC];
    SUMI_ZERO(sumi);
    for (int v = 0; v < QK_K / 32; v++) {
      const __m256i q = iq4xs_levels(b->qs, v), absq = _mm256_abs_epi8(q), s = iq4xs_scale(scales, v);
      __m256i *chain = sumi[v % SUMI_CHAINS(NC)];
      for (int c = 0; c < NC; c++)
        chain[c] = vi_dot16_add(chain[c], absq, _mm256_sign_epi8(vi_load(act_k(a, as, c, i)->qs + 32 * v), q), s);
    }
    SUMI_FOLD(sumi);
    for (int c = 0; c < NC; c++) acc[c] = iq4xs_sum(vi_hsum32(sumi[0][c]), d, act_k(a, as, c, i)->d, acc[c]);
  }
  for (int c = 0; c < NC; c++) out[c] = acc[c];
}
DISPATCH_NC(dot_iq4_xs)

/* ---------------------------------------------------------------- prompt kernels (gemm)
 * A prompt multiplies every weight row with many tokens. The dots above decode a weight block once per
 * PRIMA_MAX_NC tokens and keep a sum per token; for IQ4_XS that is more sums than registers (they lived
 * on the stack) and a sign per token and vector. The gemm decodes one super-block of 8 weight rows at a
 * time into a 2.3 KiB panel on the stack (the file's mapping is only read) with 4 consecutive levels of
 * each of the 8 rows in one vector, and runs GEMM_T tokens against it: 4 activation bytes broadcast,
 * one vector's 8 lanes are the 8 rows' sums. Each row, token and super-block gets the dot's integer sum,
 * added to the float sum as the dot adds it (iq4xs_sum, super-block after super-block), so every output
 * equals the level's dot (nc = 1, decode's) bit for bit. */

/* Tokens per tile: their sums and the panel's vectors fit the 16 ymm registers (32 with AVX-512). */
#ifdef __AVX512F__
#define GEMM_T 8
#else
#define GEMM_T 6
#endif

/* One super-block of 8 IQ4_XS rows: q[g][k] holds levels 4k..4k+3 of group g of row r at bytes 4r..4r+3;
 * sc[g] the group's scale of row r in int16 lanes 2r and 2r+1 (madd's pairs); d the rows' d. */
typedef struct {
  int8_t q[QK_K / 32][8][32];
  int16_t sc[QK_K / 32][16];
  float d[8];
} __attribute__((aligned(32))) iq4xs_panel;

/* v[r] holds 8 dwords of row r; out[k] gets dword k of each row, row r at dword r. */
ALWAYS_INLINE void transpose_dwords8(const __m256i v[8], __m256i *out) {
  __m256i t[8], u[8];
  for (int j = 0; j < 4; j++) {
    t[2 * j] = _mm256_unpacklo_epi32(v[2 * j], v[2 * j + 1]);     /* rows 2j, 2j+1: dwords 0, 1 | 4, 5 */
    t[2 * j + 1] = _mm256_unpackhi_epi32(v[2 * j], v[2 * j + 1]); /* dwords 2, 3 | 6, 7 */
  }
  for (int h = 0; h < 2; h++) { /* rows 4h..4h+3 */
    u[4 * h] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);         /* dword 0 | 4 */
    u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);     /* dword 1 | 5 */
    u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]); /* dword 2 | 6 */
    u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]); /* dword 3 | 7 */
  }
  for (int k = 0; k < 4; k++) {
    _mm256_store_si256(&out[k], _mm256_permute2x128_si256(u[k], u[4 + k], 0x20));
    _mm256_store_si256(&out[k + 4], _mm256_permute2x128_si256(u[k], u[4 + k], 0x31));
  }
}

/* Super-block i of the 8 rows at w (ws bytes apart) into p. */
ALWAYS_INLINE void iq4xs_panel_decode(const uint8_t *w, size_t ws, int i, iq4xs_panel *p) {
  const __m256i grid = _mm256_broadcastsi128_si256(iq4_grid128());
  const block_iq4_xs *b[8];
  int16_t sc[8][8];
  for (int r = 0; r < 8; r++) {
    b[r] = (const block_iq4_xs *)(w + (size_t)r * ws) + i;
    _mm_storeu_si128((__m128i *)sc[r], iq4xs_scales(b[r]));
    p->d[r] = h2f(b[r]->d);
  }
  for (int g = 0; g < QK_K / 32; g++) {
    __m256i v[8];
    for (int r = 0; r < 8; r++) v[r] = _mm256_shuffle_epi8(grid, nibbles32(b[r]->qs + 16 * g));
    transpose_dwords8(v, (__m256i *)p->q[g]);
    for (int r = 0; r < 8; r++) p->sc[g][2 * r] = p->sc[g][2 * r + 1] = sc[r][g];
  }
}

/* T tokens (activation rows as bytes apart, block i) against the panel: facc[t][r] gets row r's sum. */
ALWAYS_INLINE void iq4xs_tile(const iq4xs_panel *p, const void *a, size_t as, int i, const int T, float (*facc)[8]) {
  __m256i acc[GEMM_T];
  const int8_t *x[GEMM_T];
  for (int t = 0; t < T; t++) {
    acc[t] = _mm256_setzero_si256();
    x[t] = act_k(a, as, t, i)->qs;
  }
  for (int g = 0; g < QK_K / 32; g++) {
    const __m256i s = _mm256_load_si256((const __m256i *)p->sc[g]);
#ifdef __AVX512VNNI__
    /* four products straight into int32 per row, the levels made unsigned (q + 128, dpbusd's unsigned
     * side) and 128 times the group's activations taken off after (their sum: two of the token's bsums);
     * the group's sum then times its scale: the same integers as the dot's */
    __m256i gsum[GEMM_T];
    for (int t = 0; t < T; t++) gsum[t] = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
      const __m256i qu = _mm256_xor_si256(_mm256_load_si256((const __m256i *)p->q[g][k]), _mm256_set1_epi8((char)0x80));
      for (int t = 0; t < T; t++) {
        int32_t four;
        memcpy(&four, x[t] + 32 * g + 4 * k, 4);
        gsum[t] = _mm256_dpbusd_epi32(gsum[t], qu, _mm256_set1_epi32(four));
      }
    }
    const __m256i s32 = _mm256_srai_epi32(s, 16); /* lanes 2r and 2r+1 hold the same scale */
    for (int t = 0; t < T; t++) {
      const int16_t *bs = act_k(a, as, t, i)->bsums;
      const __m256i offset = _mm256_set1_epi32(128 * ((int)bs[2 * g] + bs[2 * g + 1]));
      acc[t] = _mm256_add_epi32(acc[t], _mm256_mullo_epi32(_mm256_sub_epi32(gsum[t], offset), s32));
    }
#else
    for (int k = 0; k < 8; k++) {
      const __m256i q = _mm256_load_si256((const __m256i *)p->q[g][k]), absq = _mm256_abs_epi8(q);
      for (int t = 0; t < T; t++) {
        int32_t four;
        memcpy(&four, x[t] + 32 * g + 4 * k, 4);
        const __m256i xv = _mm256_sign_epi8(_mm256_set1_epi32(four), q);
        acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(absq, xv), s));
      }
    }
#endif
  }
  const __m256 dw = _mm256_load_ps(p->d);
  for (int t = 0; t < T; t++) {
    /* lane r: fmaf((float)isum, d_w * d_a, acc), as iq4xs_sum */
    const __m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(act_k(a, as, t, i)->d));
    _mm256_store_ps(facc[t], _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t]), dd, _mm256_load_ps(facc[t])));
  }
}

/* Tokens per facc block (its sums stay on the stack between super-blocks; a panel is decoded once per block). */
#define GEMM_TB 64

static void gemm_iq4_xs(int n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *out, size_t os,
                        int accumulate) {
  const int nb = n / QK_K;
  int r0 = 0;
  for (; r0 + 8 <= nr; r0 += 8) {
    const uint8_t *wr = (const uint8_t *)w + (size_t)r0 * ws;
    for (int t0 = 0; t0 < nt; t0 += GEMM_TB) {
      const int tb = nt - t0 < GEMM_TB ? nt - t0 : GEMM_TB;
      const uint8_t *at = ACT_ROW(t0);
      float facc[GEMM_TB][8] __attribute__((aligned(32)));
      memset(facc, 0, sizeof facc);
      iq4xs_panel p;
      for (int i = 0; i < nb; i++) {
        if (i + 1 < nb) /* the next super-block of each row */
          for (int r = 0; r < 8; r++) _mm_prefetch((const char *)((const block_iq4_xs *)(wr + (size_t)r * ws) + i + 1), _MM_HINT_T0);
        iq4xs_panel_decode(wr, ws, i, &p);
        int t = 0;
        for (; t + GEMM_T <= tb; t += GEMM_T) iq4xs_tile(&p, at + (size_t)t * as, as, i, GEMM_T, facc + t);
        switch (tb - t) { /* the tail: a constant T each, so the token loops unroll */
#define TAIL_TILE(k) case k: if (k < GEMM_T) iq4xs_tile(&p, at + (size_t)t * as, as, i, k < GEMM_T ? k : 1, facc + t); break;
          TAIL_TILE(7) TAIL_TILE(6) TAIL_TILE(5) TAIL_TILE(4) TAIL_TILE(3) TAIL_TILE(2) TAIL_TILE(1)
#undef TAIL_TILE
        default: break;
        }
      }
      for (int t = 0; t < tb; t++)
        for (int r = 0; r < 8; r++) {
          float *o = out + (size_t)(t0 + t) * os + r0 + r;
          *o = accumulate ? *o + facc[t][r] : facc[t][r];
        }
    }
  }
  /* rows past the last 8: the dot, a row at a time over the tokens */
  for (; r0 < nr; r0++)
    for (int t0 = 0; t0 < nt; t0 += PRIMA_MAX_NC) {
      const int nc = nt - t0 < PRIMA_MAX_NC ? nt - t0 : PRIMA_MAX_NC;
      float tmp[PRIMA_MAX_NC];
      dot_iq4_xs(n, (const uint8_t *)w + (size_t)r0 * ws, ACT_ROW(t0), as, nc, tmp);
      for (int c = 0; c < nc; c++) {
        float *o = out + (size_t)(t0 + c) * os + r0;
        *o = accumulate ? *o + tmp[c] : tmp[c];
      }
    }
}

/* ---------------------------------------------------------------- activation quantizers
 * Byte-identical to quants.c's (the tests compare them): products are rounded by cvtps_epi32, which
 * rounds to nearest even like the scalar nearest_int, and the half conversions round to nearest even. */

ALWAYS_INLINE __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

ALWAYS_INLINE float hmax256(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

/* Four int32x8 (elements 0..31 in order) -> 32 int8 in order (saturating, as the values fit). */
ALWAYS_INLINE __m256i pack32(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

ALWAYS_INLINE __m256i quantize32(const float *x, __m256 mul, __m256i *sum32) {
  const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), mul));
  const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), mul));
  const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), mul));
  const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), mul));
  if (sum32) *sum32 = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
  return pack32(i0, i1, i2, i3);
}

ALWAYS_INLINE float amax32(const float *x) {
  __m256 m = abs_ps(_mm256_loadu_ps(x));
  m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + 8)));
  m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + 16)));
  m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + 24)));
  return hmax256(m);
}

ALWAYS_INLINE int hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}

static void quantize_act_q8_0(const float *x, void *vy, int64_t n) {
  block_q8_0 *y = vy;
  for (int64_t i = 0; i < n / QK32; i++, x += QK32) {
    const float amax = amax32(x);
    const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
    y[i].d = prima_fp32_to_fp16(d);
    _mm256_storeu_si256((__m256i *)y[i].qs, quantize32(x, _mm256_set1_ps(id), NULL));
  }
}

static void quantize_act_q8_1(const float *x, void *vy, int64_t n) {
  block_q8_1 *y = vy;
  for (int64_t i = 0; i < n / QK32; i++, x += QK32) {
    const float amax = amax32(x);
    const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
    __m256i sum;
    y[i].d = prima_fp32_to_fp16(d);
    _mm256_storeu_si256((__m256i *)y[i].qs, quantize32(x, _mm256_set1_ps(id), &sum));
    y[i].s = prima_fp32_to_fp16(d * (float)hsum_epi32(sum));
  }
}

static void quantize_act_q8_K(const float *x, void *vy, int64_t n) {
  block_q8_K *y = vy;
  for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < QK_K; j += 8) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + j)));
    const float amax = hmax256(m);
    if (!amax) {
      memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    /* the scale takes the sign of the first element of largest magnitude, as the scalar scan does */
    float max = 0;
    const __m256 va = _mm256_set1_ps(amax);
    for (int j = 0; j < QK_K; j += 8) {
      const int hit = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + j)), va, _CMP_EQ_OQ));
      if (hit) { max = x[j + __builtin_ctz((unsigned)hit)]; break; }
    }
    const float iscale = -127.f / max;
    const __m256 mul = _mm256_set1_ps(iscale);
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int j = 0; j < QK_K; j += 32) {
      const __m256i q = quantize32(x + j, mul, NULL);
      _mm256_storeu_si256((__m256i *)(y[i].qs + j), q);
      /* group sums: sad over q+128 gives 8-byte sums; lanes 0+1 and 2+3 are the two groups of 16 */
      const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(q, bias), _mm256_setzero_si256());
      const __m256i g = _mm256_add_epi64(sad, _mm256_srli_si256(sad, 8));
      y[i].bsums[j / 16] = (int16_t)(_mm256_extract_epi32(g, 0) - 2048);
      y[i].bsums[j / 16 + 1] = (int16_t)(_mm256_extract_epi32(g, 4) - 2048);
    }
    y[i].d = 1 / iscale;
  }
}

static void quantize_act_f16(const float *x, void *vy, int64_t n) {
  uint16_t *y = vy;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) y[i] = prima_fp32_to_fp16(x[i]);
}

/* Round to nearest even; NaN -> quiet NaN (upper half | 0x40), as prima_fp32_to_bf16. */
static void quantize_act_bf16(const float *x, void *vy, int64_t n) {
  uint16_t *y = vy;
  int64_t i = 0;
  const __m256i one = _mm256_set1_epi32(1), round = _mm256_set1_epi32(0x7FFF), absmask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(0x7F800000), quiet = _mm256_set1_epi32(0x40);
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256((const __m256i *)(x + i));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(round, _mm256_and_si256(_mm256_srli_epi32(u, 16), one))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), inf);
    const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
    const __m256i r = _mm256_blendv_epi8(rounded, qnan, nan);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128((__m128i *)(y + i), packed);
  }
  for (; i < n; i++) y[i] = prima_fp32_to_bf16(x[i]);
}

/* ---------------------------------------------------------------- the level */

#if defined(__AVX512VNNI__)
#define LEVEL_FNS prima_avx512vnni_fns
#elif defined(__AVX512BW__)
#define LEVEL_FNS prima_avx512_fns
#else
#define LEVEL_FNS prima_avx2_fns
#endif

void LEVEL_FNS(prima_level_fns *f) {
  memset(f, 0, sizeof *f);
  far_prefetch_bytes = cpu_is_intel() ? FAR_PREFETCH_BYTES : 0;
  for (int h = 0; h < (1 << 16); h++) f16_table[h] = _cvtsh_ss((unsigned short)h);
  PRIMA_SET_DOTS(f);
  PRIMA_SET_DOT_ROWS(f);
  PRIMA_SET_DOT_STREAM(f);
  f->gemm[PRIMA_IQ4_XS] = gemm_iq4_xs;
  f->act_quantize[PRIMA_F16] = quantize_act_f16;
  f->act_quantize[PRIMA_BF16] = quantize_act_bf16;
  f->act_quantize[PRIMA_Q8_0] = quantize_act_q8_0;
  f->act_quantize[PRIMA_Q8_1] = quantize_act_q8_1;
  f->act_quantize[PRIMA_Q8_K] = quantize_act_q8_K;
}
