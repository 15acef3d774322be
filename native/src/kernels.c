/* The kernel table: per SIMD level and weight type, the best function that level has (falling back to
 * the scalar reference where a level has no twin), and run-time selection of the level this CPU runs.
 * PRIMA_SIMD=scalar|avx2|avx512|neon in the environment forces a lower level (never a higher one). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "quants.h"

#define PRIMA_LEVELS 4

/* Layout facts of every type (weights and activation formats). */
typedef struct {
  const char *name;
  int block_elems, block_bytes, act_type;
} type_info;

static const type_info TYPES[PRIMA_TYPE_COUNT] = {
  [PRIMA_F32] = {"F32", 1, 4, PRIMA_F32},
  [PRIMA_F16] = {"F16", 1, 2, PRIMA_F16},
  [PRIMA_BF16] = {"BF16", 1, 2, PRIMA_BF16},
  [PRIMA_Q4_0] = {"Q4_0", QK32, sizeof(block_q4_0), PRIMA_Q8_0},
  [PRIMA_Q4_1] = {"Q4_1", QK32, sizeof(block_q4_1), PRIMA_Q8_1},
  [PRIMA_Q5_0] = {"Q5_0", QK32, sizeof(block_q5_0), PRIMA_Q8_0},
  [PRIMA_Q5_1] = {"Q5_1", QK32, sizeof(block_q5_1), PRIMA_Q8_1},
  [PRIMA_Q8_0] = {"Q8_0", QK32, sizeof(block_q8_0), PRIMA_Q8_0},
  [PRIMA_Q8_1] = {"Q8_1", QK32, sizeof(block_q8_1), PRIMA_Q8_1},
  [PRIMA_Q2_K] = {"Q2_K", QK_K, sizeof(block_q2_K), PRIMA_Q8_K},
  [PRIMA_Q3_K] = {"Q3_K", QK_K, sizeof(block_q3_K), PRIMA_Q8_K},
  [PRIMA_Q4_K] = {"Q4_K", QK_K, sizeof(block_q4_K), PRIMA_Q8_K},
  [PRIMA_Q5_K] = {"Q5_K", QK_K, sizeof(block_q5_K), PRIMA_Q8_K},
  [PRIMA_Q6_K] = {"Q6_K", QK_K, sizeof(block_q6_K), PRIMA_Q8_K},
  [PRIMA_Q8_K] = {"Q8_K", QK_K, sizeof(block_q8_K), PRIMA_Q8_K},
  [PRIMA_IQ4_NL] = {"IQ4_NL", QK32, sizeof(block_iq4_nl), PRIMA_Q8_0},
  [PRIMA_IQ4_XS] = {"IQ4_XS", QK_K, sizeof(block_iq4_xs), PRIMA_Q8_K},
  [PRIMA_MXFP4] = {"MXFP4", QK32, sizeof(block_mxfp4), PRIMA_Q8_0},
};

static prima_type_kernels g_table[PRIMA_LEVELS][PRIMA_TYPE_COUNT];
static prima_quantize_fn g_act[PRIMA_LEVELS][PRIMA_TYPE_COUNT];
static prima_dequantize_fn g_deq[PRIMA_LEVELS][PRIMA_TYPE_COUNT];
static int g_level_ok[PRIMA_LEVELS];
static int g_level = PRIMA_SIMD_SCALAR;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int cpu_runs(int simd) {
  switch (simd) {
  case PRIMA_SIMD_SCALAR: return 1;
#if defined(__x86_64__) || defined(_M_X64)
  case PRIMA_SIMD_AVX2:
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  case PRIMA_SIMD_AVX512: /* (libgcc also checks that the OS saves the zmm and mask registers) */
    return cpu_runs(PRIMA_SIMD_AVX2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
#if defined(__aarch64__) && defined(PRIMA_HAVE_NEON)
  case PRIMA_SIMD_NEON: return 1; /* NEON is part of AArch64 */
#endif
  default: return 0;
  }
}

static void fill_level(int simd, const prima_level_fns *scalar, const prima_level_fns *fns,
                       prima_quantize_fn quantize_ref[PRIMA_TYPE_COUNT]) {
  for (int t = 0; t < PRIMA_TYPE_COUNT; t++) {
    const type_info *ti = &TYPES[t];
    prima_type_kernels *k = &g_table[simd][t];
    memset(k, 0, sizeof *k);
    g_act[simd][t] = fns->act_quantize[t] ? fns->act_quantize[t] : scalar->act_quantize[t];
    g_deq[simd][t] = fns->dequantize[t] ? fns->dequantize[t] : scalar->dequantize[t];
    if (!ti->name || !scalar->dot[t]) continue; /* no kernels for this type */
    k->type = t;
    k->name = ti->name;
    k->block_elems = ti->block_elems;
    k->block_bytes = ti->block_bytes;
    k->act_type = ti->act_type;
    k->dequantize = fns->dequantize[t] ? fns->dequantize[t] : scalar->dequantize[t];
    k->quantize_ref = quantize_ref[t];
    k->dot = fns->dot[t] ? fns->dot[t] : scalar->dot[t];
    k->dot_simd = fns->dot[t] ? simd : PRIMA_SIMD_SCALAR;
    k->dot_rows = fns->dot[t] ? fns->dot_rows[t] : NULL; /* a rows kernel must match the dot it stands for */
    k->dot_stream = fns->dot[t] ? fns->dot_stream[t] : NULL;
    k->gemm = fns->dot[t] ? fns->gemm[t] : NULL;
  }
}

static int simd_from_env(void) {
  const char *s = getenv("PRIMA_SIMD");
  if (!s || !*s) return -1;
  for (int l = 0; l < PRIMA_LEVELS; l++)
    if (strcmp(s, prima_simd_name(l)) == 0) return l;
  return -1; /* unknown names are ignored: the best level is used */
}

static int g_avx512_vnni;

static void init_once(void) {
  prima_level_fns scalar, fns;
  prima_quantize_fn quantize_ref[PRIMA_TYPE_COUNT];
  prima_scalar_fns(&scalar);
  prima_scalar_quantize_ref(quantize_ref);
  fill_level(PRIMA_SIMD_SCALAR, &scalar, &scalar, quantize_ref);
  g_level_ok[PRIMA_SIMD_SCALAR] = 1;
#if defined(__x86_64__) || defined(_M_X64)
  if (cpu_runs(PRIMA_SIMD_AVX2)) {
    prima_avx2_fns(&fns);
    fill_level(PRIMA_SIMD_AVX2, &scalar, &fns, quantize_ref);
    g_level_ok[PRIMA_SIMD_AVX2] = 1;
  }
  if (cpu_runs(PRIMA_SIMD_AVX512)) {
    g_avx512_vnni = __builtin_cpu_supports("avx512vnni");
    if (g_avx512_vnni) prima_avx512vnni_fns(&fns);
    else prima_avx512_fns(&fns);
    fill_level(PRIMA_SIMD_AVX512, &scalar, &fns, quantize_ref);
    g_level_ok[PRIMA_SIMD_AVX512] = 1;
  }
#endif
#if defined(__aarch64__) && defined(PRIMA_HAVE_NEON)
  if (cpu_runs(PRIMA_SIMD_NEON)) {
    prima_neon_fns(&fns);
    fill_level(PRIMA_SIMD_NEON, &scalar, &fns, quantize_ref);
    g_level_ok[PRIMA_SIMD_NEON] = 1;
  }
#endif
  (void)fns;
  int best = PRIMA_SIMD_SCALAR;
  for (int l = 0; l < PRIMA_LEVELS; l++)
    if (g_level_ok[l]) best = l;
  int forced = simd_from_env();
  g_level = (forced >= 0 && g_level_ok[forced]) ? forced : best;
  prima_ops_select(g_level); /* the ops' own SIMD choices follow, wherever the kernels are first used */
}

void prima_dot_rows(const prima_type_kernels *k, int n, const void *w, size_t w_stride, int nr, const void *a, float *out) {
  if (k->dot_rows) {
    k->dot_rows(n, w, w_stride, nr, a, out);
    return;
  }
  for (int r = 0; r < nr; r++) k->dot(n, (const char *)w + (size_t)r * w_stride, a, 0, 1, out + r);
}

void prima_gemm(const prima_type_kernels *k, int n, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride,
                int nt, float *out, size_t out_stride, int accumulate) {
  if (k->gemm) {
    k->gemm(n, w, w_stride, nr, a, a_stride, nt, out, out_stride, accumulate);
    return;
  }
  /* the first group of tokens reads the rows from memory: the prefetching dot (quants_x86.c STREAM_FN);
   * the later ones find them in cache */
  for (int t0 = 0; t0 < nt; t0 += PRIMA_MAX_NC) {
    const prima_dot_fn dot = t0 == 0 && k->dot_stream ? k->dot_stream : k->dot;
    const int nc = nt - t0 < PRIMA_MAX_NC ? nt - t0 : PRIMA_MAX_NC;
    const char *at = (const char *)a + (size_t)t0 * a_stride;
    float *o = out + (size_t)t0 * out_stride, tmp[PRIMA_MAX_NC];
    for (int r = 0; r < nr; r++) {
      dot(n, (const char *)w + (size_t)r * w_stride, at, a_stride, nc, tmp);
      for (int c = 0; c < nc; c++) o[(size_t)c * out_stride + r] = accumulate ? o[(size_t)c * out_stride + r] + tmp[c] : tmp[c];
    }
  }
}

void prima_kernels_init(void) { pthread_once(&g_once, init_once); }

const prima_type_kernels *prima_kernels_at(int type, int simd) {
  prima_kernels_init();
  if (type < 0 || type >= PRIMA_TYPE_COUNT || simd < 0 || simd >= PRIMA_LEVELS || !g_level_ok[simd]) return NULL;
  const prima_type_kernels *k = &g_table[simd][type];
  return k->dot ? k : NULL;
}

const prima_type_kernels *prima_kernels(int type) {
  prima_kernels_init();
  return prima_kernels_at(type, g_level);
}

prima_quantize_fn prima_act_quantizer_at(int act_type, int simd) {
  prima_kernels_init();
  if (act_type < 0 || act_type >= PRIMA_TYPE_COUNT || simd < 0 || simd >= PRIMA_LEVELS || !g_level_ok[simd]) return NULL;
  return g_act[simd][act_type];
}

prima_quantize_fn prima_act_quantizer(int act_type) {
  prima_kernels_init();
  return prima_act_quantizer_at(act_type, g_level);
}

prima_dequantize_fn prima_dequantizer_at(int type, int simd) {
  prima_kernels_init();
  if (type < 0 || type >= PRIMA_TYPE_COUNT || simd < 0 || simd >= PRIMA_LEVELS || !g_level_ok[simd]) return NULL;
  return g_deq[simd][type];
}

size_t prima_row_bytes(int type, int64_t n) {
  if (type < 0 || type >= PRIMA_TYPE_COUNT || !TYPES[type].name || n < 0) return 0;
  const type_info *t = &TYPES[type];
  if (n % t->block_elems) return 0;
  return (size_t)(n / t->block_elems) * (size_t)t->block_bytes;
}

int prima_type_block_elems(int type) {
  return (type < 0 || type >= PRIMA_TYPE_COUNT || !TYPES[type].name) ? 0 : TYPES[type].block_elems;
}

const char *prima_type_name(int type) {
  return (type < 0 || type >= PRIMA_TYPE_COUNT) ? NULL : TYPES[type].name;
}

int prima_simd_level(void) {
  prima_kernels_init();
  return g_level;
}

int prima_simd_available(int simd) {
  prima_kernels_init();
  return simd >= 0 && simd < PRIMA_LEVELS && g_level_ok[simd];
}

int prima_avx512_vnni(void) {
  prima_kernels_init();
  return g_avx512_vnni;
}

const char *prima_simd_name(int simd) {
  switch (simd) {
  case PRIMA_SIMD_SCALAR: return "scalar";
  case PRIMA_SIMD_AVX2: return "avx2";
  case PRIMA_SIMD_AVX512: return "avx512";
  case PRIMA_SIMD_NEON: return "neon";
  default: return "unknown";
  }
}
