/* ggml as an oracle: runs llama.cpp's own quantizers, dequantizers, activation quantizers and dots
 * (from node-llama-cpp's prebuilt libggml-base.so / libggml-cpu-<variant>.so, loaded with dlopen) on
 * bytes given on stdin, and writes their output to stdout. The tests and bench/kernels.ts compile it
 * with gcc at run time (bench/ggml-oracle.ts).
 *
 *   ggml_oracle <libdir> <cpu-variant> quantize_ref <type> <n>     f32[n]            -> row bytes (IQ4_NL: quantize_iq4_nl)
 *   ggml_oracle <libdir> <cpu-variant> dequantize <type> <n>       row bytes         -> f32[n]
 *   ggml_oracle <libdir> <cpu-variant> from_float <type> <n>       f32[n]            -> row bytes (CPU activation quantizer)
 *   ggml_oracle <libdir> <cpu-variant> vec_dot <type> <n> <nc>     w row, nc act rows -> f32[nc]
 *   ggml_oracle <libdir> <cpu-variant> bench_vec_dot <type> <n> <rows> <nc> <seconds> [threads]   w rows, nc act rows
 *       -> "calls seconds bestPassSeconds" (threads split each pass's rows into contiguous slices)
 *   ggml_oracle <libdir> <cpu-variant> bench_gemm 12 <n> <rows> <seconds>   Q4_K repacked gemm, 4 act rows -> "calls seconds bestPassSeconds"
 * Types are ggml ids. Errors go to stderr with exit code 2. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*from_float_t)(const float *x, void *y, int64_t k);
typedef void (*to_float_t)(const void *x, float *y, int64_t k);
typedef void (*vec_dot_t)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by, int nrc);
typedef void (*gemm_t)(int n, float *s, size_t bs, const void *vx, const void *vy, int nr, int nc);
struct traits_cpu { from_float_t from_float; vec_dot_t vec_dot; int vec_dot_type; int64_t nrows; };

static void *base, *cpu;

static void die(const char *msg, const char *arg) {
  fprintf(stderr, "ggml_oracle: %s%s%s\n", msg, arg ? " " : "", arg ? arg : "");
  exit(2);
}

static void *sym(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (!p) die("missing symbol", name);
  return p;
}

static const char *type_name(int t) {
  switch (t) {
  case 0: return "f32"; case 1: return "f16"; case 2: return "q4_0"; case 3: return "q4_1";
  case 6: return "q5_0"; case 7: return "q5_1"; case 8: return "q8_0"; case 9: return "q8_1";
  case 10: return "q2_K"; case 11: return "q3_K"; case 12: return "q4_K"; case 13: return "q5_K";
  case 14: return "q6_K"; case 15: return "q8_K"; case 20: return "iq4_nl"; case 23: return "iq4_xs";
  case 30: return "bf16"; case 39: return "mxfp4";
  default: die("unsupported type id", NULL); return NULL;
  }
}

static size_t row_size(int t, int64_t n) {
  size_t (*f)(int, int64_t) = (size_t (*)(int, int64_t))sym(base, "ggml_row_size");
  return f(t, n);
}

static void *read_all(size_t want) {
  uint8_t *buf = aligned_alloc(64, (want + 63) / 64 * 64 + 64);
  size_t got = 0;
  while (got < want) {
    size_t r = fread(buf + got, 1, want - got, stdin);
    if (r == 0) die("stdin ended early", NULL);
    got += r;
  }
  return buf;
}

static void write_all(const void *p, size_t n) {
  if (fwrite(p, 1, n, stdout) != n) die("stdout write failed", NULL);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint16_t half_bits(float f) {
  uint16_t (*f2h)(float) = (uint16_t (*)(float))sym(base, "ggml_fp32_to_fp16");
  return f2h(f);
}

/* ---- bench_vec_dot: passes over the rows, split between threads, with a spin barrier between passes */
struct bench {
  vec_dot_t dot;
  int n, nc, threads;
  int64_t rows;
  size_t wrow, arow;
  const uint8_t *w, *a;
  double seconds, best, el;
  int64_t calls;
  atomic_int count, gen, stop;
};

static void barrier_wait(struct bench *b) {
  const int g = atomic_load(&b->gen);
  if (atomic_fetch_add(&b->count, 1) + 1 == b->threads) {
    atomic_store(&b->count, 0);
    atomic_fetch_add(&b->gen, 1);
  } else {
    while (atomic_load(&b->gen) == g) {
    }
  }
}

struct worker { struct bench *b; int t; };

static void *bench_worker(void *arg) {
  struct worker *wk = arg;
  struct bench *b = wk->b;
  const int64_t r0 = b->rows * wk->t / b->threads, r1 = b->rows * (wk->t + 1) / b->threads;
  float out[64];
  volatile float sink = 0;
  const double start = now_s();
  for (;;) {
    barrier_wait(b);
    const double p0 = now_s();
    for (int64_t r = r0; r < r1; r++) {
      for (int c = 0; c < b->nc; c++) b->dot(b->n, &out[c], 0, b->w + r * b->wrow, 0, b->a + c * b->arow, 0, 1);
      sink = sink + out[0];
    }
    barrier_wait(b);
    if (wk->t == 0) {
      const double p1 = now_s();
      if (p1 - p0 < b->best) b->best = p1 - p0;
      b->calls += b->rows;
      b->el = p1 - start;
      atomic_store(&b->stop, b->el >= b->seconds);
    }
    barrier_wait(b);
    if (atomic_load(&b->stop)) break;
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 6) die("usage: ggml_oracle <libdir> <cpu-variant> <op> <type> <n> ...", NULL);
  char path[4096];
  snprintf(path, sizeof path, "%s/libggml-base.so", argv[1]);
  base = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!base) die("dlopen failed:", dlerror());
  snprintf(path, sizeof path, "%s/libggml-cpu-%s.so", argv[1], argv[2]);
  cpu = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!cpu) die("dlopen failed:", dlerror());
  ((void (*)(void))sym(cpu, "ggml_cpu_init"))();
  const struct traits_cpu *(*get_traits)(int) = (const struct traits_cpu *(*)(int))sym(cpu, "ggml_get_type_traits_cpu");

  const char *op = argv[3];
  int type = atoi(argv[4]);
  int64_t n = atoll(argv[5]);
  const char *tn = type_name(type);
  char name[128];

  if (!strcmp(op, "quantize_ref")) {
    float *x = read_all((size_t)n * 4);
    size_t bytes = row_size(type, n);
    uint8_t *y = calloc(1, bytes + 64);
    if (type == 0) memcpy(y, x, bytes);
    else if (type == 1) ((void (*)(const float *, void *, int64_t))sym(base, "ggml_fp32_to_fp16_row"))(x, y, n);
    else if (type == 30) ((void (*)(const float *, void *, int64_t))sym(base, "ggml_fp32_to_bf16_row_ref"))(x, y, n);
    else if (type == 20) {
      /* IQ4_NL: what llama-quantize writes (quantize_iq4_nl searches the scale; quantize_row_iq4_nl_ref does not) */
      ((size_t (*)(const float *, void *, int64_t, int64_t, const float *))sym(base, "quantize_iq4_nl"))(x, y, 1, n, NULL);
    } else {
      snprintf(name, sizeof name, "quantize_row_%s_ref", tn);
      ((from_float_t)sym(base, name))(x, y, n);
    }
    write_all(y, bytes);
  } else if (!strcmp(op, "dequantize")) {
    size_t bytes = row_size(type, n);
    uint8_t *x = read_all(bytes);
    float *y = calloc((size_t)n, 4);
    if (type == 0) memcpy(y, x, bytes);
    else if (type == 1) ((void (*)(const void *, float *, int64_t))sym(base, "ggml_fp16_to_fp32_row"))(x, y, n);
    else if (type == 30) ((void (*)(const void *, float *, int64_t))sym(base, "ggml_bf16_to_fp32_row"))(x, y, n);
    else {
      snprintf(name, sizeof name, "dequantize_row_%s", tn);
      ((to_float_t)sym(base, name))(x, y, n);
    }
    write_all(y, (size_t)n * 4);
  } else if (!strcmp(op, "from_float")) {
    float *x = read_all((size_t)n * 4);
    size_t bytes = row_size(type, n);
    uint8_t *y = calloc(1, bytes + 64);
    const struct traits_cpu *t = get_traits(type);
    if (!t->from_float) die("no CPU from_float for type", tn);
    t->from_float(x, y, n);
    write_all(y, bytes);
  } else if (!strcmp(op, "vec_dot") || !strcmp(op, "bench_vec_dot")) {
    const int bench = !strcmp(op, "bench_vec_dot");
    if (argc < (bench ? 9 : 7)) die("missing arguments for", op);
    int64_t rows = bench ? atoll(argv[6]) : 1;
    int nc = atoi(argv[bench ? 7 : 6]);
    double seconds = bench ? atof(argv[8]) : 0;
    const struct traits_cpu *t = get_traits(type);
    if (!t->vec_dot) die("no CPU vec_dot for type", tn);
    size_t wrow = row_size(type, n), arow = row_size(t->vec_dot_type, n);
    uint8_t *w = read_all(wrow * rows), *a = read_all(arow * nc);
    float out[64];
    if (!bench) {
      for (int c = 0; c < nc; c++) t->vec_dot((int)n, &out[c], 0, w, 0, a + c * arow, 0, 1);
      write_all(out, (size_t)nc * 4);
    } else {
      struct bench b = {.dot = t->vec_dot, .n = (int)n, .nc = nc, .threads = argc > 9 ? atoi(argv[9]) : 1, .rows = rows,
                        .wrow = wrow, .arow = arow, .w = w, .a = a, .seconds = seconds, .best = 1e30};
      if (b.threads < 1 || b.threads > 64) die("threads must be 1..64", NULL);
      pthread_t tids[64];
      struct worker wks[64];
      for (int i = 0; i < b.threads; i++) wks[i] = (struct worker){&b, i};
      for (int i = 1; i < b.threads; i++) pthread_create(&tids[i], NULL, bench_worker, &wks[i]);
      bench_worker(&wks[0]);
      for (int i = 1; i < b.threads; i++) pthread_join(tids[i], NULL);
      printf("%lld %.9f %.9f\n", (long long)b.calls, b.el, b.best);
    }
  } else if (!strcmp(op, "bench_gemm")) {
    /* llama.cpp's prompt path on AVX2 for Q4_K: weights repacked 8 rows at a time (block_q4_Kx8),
     * activations 4 rows at a time (block_q8_Kx4), one gemm call per 8x4 tile. Only timing matters
     * here; the blocks hold valid small scales so no float op sees NaN or denormals. */
    if (argc < 8) die("missing arguments for", op);
    int64_t rows = atoll(argv[6]);
    double seconds = atof(argv[7]);
    if (type != 12) die("bench_gemm supports Q4_K (the type llama.cpp repacks on AVX2), not", tn);
    if (rows % 8) die("rows must be a multiple of 8", NULL);
    gemm_t gemm = (gemm_t)sym(cpu, "ggml_gemm_q4_K_8x8_q8_K");
    size_t nb = (size_t)(n / 256);
    const size_t wblock = 1152, ablock = 16 + 1024 + 128; /* block_q4_Kx8, block_q8_Kx4 */
    size_t wbytes = (size_t)(rows / 8) * nb * wblock;
    uint8_t *w = aligned_alloc(64, wbytes), *a = aligned_alloc(64, nb * ablock);
    srand(1);
    for (size_t i = 0; i < wbytes; i++) w[i] = (uint8_t)(rand() & 0x3F);
    for (size_t i = 0; i < nb * ablock; i++) a[i] = (uint8_t)(rand() & 0x3F);
    uint16_t h = half_bits(0.001f);
    for (size_t b = 0; b < (size_t)(rows / 8) * nb; b++) {
      uint16_t *d = (uint16_t *)(w + b * wblock); /* d[8], dmin[8] */
      for (int k = 0; k < 16; k++) d[k] = h;
    }
    for (size_t b = 0; b < nb; b++) {
      float *d = (float *)(a + b * ablock);
      for (int k = 0; k < 4; k++) d[k] = 0.01f;
    }
    float *out = calloc((size_t)rows * 4, 4);
    int64_t calls = 0;
    double t0 = now_s(), el, best = 1e30;
    do {
      double r0 = now_s();
      gemm((int)n, out, (size_t)rows, w, a, 4, (int)rows);
      double r1 = now_s();
      if (r1 - r0 < best) best = r1 - r0;
      calls += rows;
      el = r1 - t0;
    } while (el < seconds);
    printf("%lld %.9f %.9f\n", (long long)calls, el, best);
  } else {
    die("unknown op", op);
  }
  return 0;
}
