/* Device micro-benchmarks (profile.h). They run the engine's own code where there is one: the matmul
 * is prima_mm_run on a prima_pool, the KV write is the F16 activation quantizer the forward pass
 * stores K and V with. */
#define _GNU_SOURCE
#include "profile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"
#include "matmul.h"
#include "model.h"
#include "threadpool.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

/* Uniform in [-scale, scale): the values do not change a kernel's speed, only keep floats normal. */
static float rng_float(uint64_t *s, float scale) {
  return scale * ((float)(rng_next(s) >> 40) / (float)(1 << 23) - 1.0f);
}

static void *alloc_aligned(size_t bytes, size_t align) {
  void *p = NULL;
  if (bytes == 0) bytes = align;
  bytes = (bytes + align - 1) / align * align;
  return posix_memalign(&p, align, bytes) == 0 ? p : NULL;
}

/* ---- matmul ---------------------------------------------------------------------------------- */

typedef struct {
  const prima_mm *items; /* n_items per copy of the group */
  int n_items;
  int copies;
  int n_tokens;
  int passes; /* per job */
  int first;  /* copy the job starts at */
} mm_job;

static void mm_job_fn(const prima_task *t, void *ctx) {
  const mm_job *j = ctx;
  for (int p = 0; p < j->passes; p++) {
    prima_mm_run(t, &j->items[(size_t)((j->first + p) % j->copies) * j->n_items], j->n_items, j->n_tokens);
    prima_pool_barrier(t); /* the forward pass has one after every matmul step too */
  }
}

int prima_profile_matmul(const int *types, const int64_t *ne0s, const int64_t *ne1s, int n_items, int n_tokens,
                         int n_threads, size_t working_set_bytes, double min_seconds, prima_mm_bench *out, char *err,
                         size_t err_len) {
  prima_kernels_init();
  if (n_items < 1 || n_items > PRIMA_PROFILE_MAX_ITEMS) return prima_fail(err, err_len, "a group has 1..%d matrices, not %d", PRIMA_PROFILE_MAX_ITEMS, n_items);
  if (n_tokens < 1 || n_tokens > PRIMA_MAX_NC * 64) return prima_fail(err, err_len, "n_tokens %d is out of range", n_tokens);
  if (n_threads < 1 || n_threads > 1024) return prima_fail(err, err_len, "n_threads %d is out of range", n_threads);
  const prima_type_kernels *ks[PRIMA_PROFILE_MAX_ITEMS];
  size_t row_bytes[PRIMA_PROFILE_MAX_ITEMS], act_row[PRIMA_PROFILE_MAX_ITEMS], mat_off[PRIMA_PROFILE_MAX_ITEMS + 1];
  size_t act_off[PRIMA_PROFILE_MAX_ITEMS + 1], out_off[PRIMA_PROFILE_MAX_ITEMS + 1];
  mat_off[0] = act_off[0] = out_off[0] = 0;
  for (int i = 0; i < n_items; i++) {
    const int64_t ne0 = ne0s[i], ne1 = ne1s[i];
    ks[i] = prima_kernels(types[i]);
    if (!ks[i]) return prima_fail(err, err_len, "no kernels for weight type %d", types[i]);
    if (!ks[i]->quantize_ref) return prima_fail(err, err_len, "weight type %s has no reference quantizer", ks[i]->name);
    if (ne0 < 1 || ne1 < 1 || ne0 > (1 << 20) || ne1 > (1 << 22))
      return prima_fail(err, err_len, "matrix shape %lld x %lld is out of range", (long long)ne1, (long long)ne0);
    row_bytes[i] = prima_row_bytes(types[i], ne0);
    if (!row_bytes[i]) return prima_fail(err, err_len, "rows of %lld elements are not whole %s blocks", (long long)ne0, ks[i]->name);
    act_row[i] = prima_row_bytes(ks[i]->act_type, ne0);
    if (!act_row[i]) return prima_fail(err, err_len, "rows of %lld elements do not fit the %s activation format", (long long)ne0, ks[i]->name);
    /* 64-byte aligned pieces, as tensors in a GGUF file are (32-byte) aligned. */
    mat_off[i + 1] = mat_off[i] + (row_bytes[i] * (size_t)ne1 + 63) / 64 * 64;
    act_off[i + 1] = act_off[i] + (act_row[i] * (size_t)n_tokens + 63) / 64 * 64;
    out_off[i + 1] = out_off[i] + (size_t)ne1 * (size_t)n_tokens;
  }
  const size_t group_bytes = mat_off[n_items];
  size_t copies = working_set_bytes > group_bytes ? (working_set_bytes + group_bytes - 1) / group_bytes : 1;
  if (copies > 4096) copies = 4096;
  int64_t max_ne0 = 0;
  for (int i = 0; i < n_items; i++) if (ne0s[i] > max_ne0) max_ne0 = ne0s[i];

  int rc = -1;
  uint8_t *w = alloc_aligned(group_bytes * copies, 64);
  float *src = malloc(sizeof(float) * (size_t)max_ne0);
  uint8_t *act = alloc_aligned(act_off[n_items], 64);
  float *o = alloc_aligned(sizeof(float) * out_off[n_items], 64);
  prima_tensor *ts = calloc(copies * (size_t)n_items, sizeof *ts);
  prima_mm *items = calloc(copies * (size_t)n_items, sizeof *items);
  prima_pool *pool = prima_pool_create(n_threads, -1);
  if (!w || !src || !act || !o || !ts || !items || !pool) {
    prima_fail(err, err_len, "out of memory for a %.1f MiB matmul working set", (double)(group_bytes * copies) / 1048576.0);
    goto done;
  }
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < n_items; i++) {
    const int64_t ne0 = ne0s[i], ne1 = ne1s[i];
    uint8_t *m = w + mat_off[i];
    /* A few distinct quantized rows, repeated: quantize_ref is far slower than the dot it feeds. */
    const int64_t distinct = ne1 < 8 ? ne1 : 8;
    for (int64_t r = 0; r < distinct; r++) {
      for (int64_t e = 0; e < ne0; e++) src[e] = rng_float(&seed, 0.05f);
      ks[i]->quantize_ref(src, m + (size_t)r * row_bytes[i], ne0);
    }
    for (int64_t r = distinct; r < ne1; r++) memcpy(m + (size_t)r * row_bytes[i], m + (size_t)(r % distinct) * row_bytes[i], row_bytes[i]);
    prima_quantize_fn aq = prima_act_quantizer(ks[i]->act_type);
    for (int t = 0; t < n_tokens; t++) {
      for (int64_t e = 0; e < ne0; e++) src[e] = rng_float(&seed, 1.0f);
      aq(src, act + act_off[i] + (size_t)t * act_row[i], ne0);
    }
  }
  for (size_t c = 1; c < copies; c++) memcpy(w + c * group_bytes, w, group_bytes);
  for (size_t c = 0; c < copies; c++) {
    for (int i = 0; i < n_items; i++) {
      const size_t k = c * (size_t)n_items + (size_t)i;
      ts[k] = (prima_tensor){ .data = w + c * group_bytes + mat_off[i], .offset = 0, .type = types[i], .ne0 = ne0s[i],
                              .ne1 = ne1s[i], .row_bytes = row_bytes[i], .n_bytes = row_bytes[i] * (size_t)ne1s[i] };
      items[k] = (prima_mm){ .w = &ts[k], .act = act + act_off[i], .act_stride = act_row[i], .out = o + out_off[i],
                             .out_stride = (size_t)ne1s[i], .accumulate = 0 };
    }
  }
  /* Jobs of about 20 ms (at least one sweep of the copies), after one untimed sweep. */
  mm_job job = { items, n_items, (int)copies, n_tokens, (int)copies, 0 };
  double t0 = now_s();
  prima_pool_run(pool, mm_job_fn, &job);
  const double per_pass = (now_s() - t0) / (double)copies;
  int per_job = per_pass > 0 ? (int)(0.02 / per_pass) : 1;
  if (per_job < 1) per_job = 1;
  if (per_job > 100000) per_job = 100000;
  job.passes = per_job;
  double total = 0;
  int passes = 0;
  const double start = now_s();
  do {
    job.first = passes % (int)copies;
    t0 = now_s();
    prima_pool_run(pool, mm_job_fn, &job);
    total += now_s() - t0;
    passes += per_job;
  } while (now_s() - start < min_seconds);
  out->seconds_per_pass = total / passes;
  out->passes = passes;
  out->copies = (int)copies;
  rc = 0;
done:
  if (pool) prima_pool_destroy(pool);
  free(items);
  free(ts);
  free(o);
  free(act);
  free(src);
  free(w);
  return rc;
}

/* ---- memory read bandwidth ------------------------------------------------------------------- */

typedef struct {
  const uint64_t *buf;
  size_t words;
  uint64_t sink[64];
} read_job;

static void read_job_fn(const prima_task *t, void *ctx) {
  read_job *j = ctx;
  const size_t per = (j->words / (size_t)t->nth) & ~(size_t)7;
  const size_t a = per * (size_t)t->ith, b = t->ith == t->nth - 1 ? j->words : a + per;
  uint64_t s0 = 0, s1 = 0;
  /* One load per 64-byte line (8 words): the line still comes whole from memory. */
  for (size_t i = a; i + 8 < b; i += 16) {
    s0 += j->buf[i];
    s1 += j->buf[i + 8];
  }
  j->sink[t->ith & 63] += s0 + s1;
}

int prima_profile_mem_read(size_t bytes, int n_threads, double min_seconds, double *bytes_per_s, char *err,
                           size_t err_len) {
  if (bytes < (1u << 20) || bytes > ((size_t)1 << 34)) return prima_fail(err, err_len, "buffer of %zu bytes is out of range", bytes);
  if (n_threads < 1 || n_threads > 1024) return prima_fail(err, err_len, "n_threads %d is out of range", n_threads);
  bytes &= ~(size_t)127;
  uint64_t *buf = alloc_aligned(bytes, 64);
  prima_pool *pool = prima_pool_create(n_threads, -1);
  if (!buf || !pool) {
    free(buf);
    if (pool) prima_pool_destroy(pool);
    return prima_fail(err, err_len, "out of memory for a %.0f MiB read buffer", (double)bytes / 1048576.0);
  }
  for (size_t i = 0; i < bytes / 8; i++) buf[i] = i * 0x9e3779b97f4a7c15ull;
  read_job job = { buf, bytes / 8, {0} };
  prima_pool_run(pool, read_job_fn, &job); /* warm-up */
  double best = 1e30;
  const double start = now_s();
  int runs = 0;
  do {
    const double t0 = now_s();
    prima_pool_run(pool, read_job_fn, &job);
    const double dt = now_s() - t0;
    if (dt < best) best = dt;
    runs++;
  } while (now_s() - start < min_seconds || runs < 3);
  *bytes_per_s = (double)bytes / best; /* job.sink keeps the loads observable */
  prima_pool_destroy(pool);
  free(buf);
  return 0;
}

/* ---- KV write -------------------------------------------------------------------------------- */

int prima_profile_kv_copy(int kv_floats, int n_ctx, double min_seconds, double *seconds, char *err, size_t err_len) {
  prima_kernels_init();
  if (kv_floats < 2 || kv_floats > (1 << 22) || kv_floats % 2) return prima_fail(err, err_len, "kv_floats %d must be even and in 2..%d", kv_floats, 1 << 22);
  if (n_ctx < 1 || n_ctx > (1 << 20)) return prima_fail(err, err_len, "n_ctx %d is out of range", n_ctx);
  const int half = kv_floats / 2;
  float *src = malloc(sizeof(float) * (size_t)kv_floats);
  uint16_t *k = malloc(sizeof(uint16_t) * (size_t)n_ctx * (size_t)half);
  uint16_t *v = malloc(sizeof(uint16_t) * (size_t)n_ctx * (size_t)half);
  if (!src || !k || !v) {
    free(src);
    free(k);
    free(v);
    return prima_fail(err, err_len, "out of memory for a KV cache of %d positions", n_ctx);
  }
  memset(k, 0, sizeof(uint16_t) * (size_t)n_ctx * (size_t)half);
  memset(v, 0, sizeof(uint16_t) * (size_t)n_ctx * (size_t)half);
  uint64_t seed = 12345;
  for (int i = 0; i < kv_floats; i++) src[i] = rng_float(&seed, 2.0f);
  prima_quantize_fn f16 = prima_act_quantizer(PRIMA_F16);
  long writes = 0;
  const double start = now_s();
  double elapsed;
  do {
    for (int i = 0; i < 256; i++, writes++) {
      const size_t pos = (size_t)(writes % n_ctx) * (size_t)half;
      f16(src, k + pos, half);
      f16(src + half, v + pos, half);
    }
    elapsed = now_s() - start;
  } while (elapsed < min_seconds);
  *seconds = elapsed / (double)writes;
  free(src);
  free(k);
  free(v);
  return 0;
}

/* ---- disk ------------------------------------------------------------------------------------ */

/* Opens bypassing the page cache where the system allows it; *direct says whether it did. */
static int open_uncached(const char *path, int flags, mode_t mode, int allow_direct, int *direct) {
#ifdef O_DIRECT
  if (allow_direct) {
    int fd = open(path, flags | O_DIRECT | O_CLOEXEC, mode);
    if (fd >= 0) {
      *direct = 1;
      return fd;
    }
    if (errno != EINVAL) return -1;
  }
#endif
  int fd2 = open(path, flags | O_CLOEXEC, mode);
  *direct = 0;
#ifdef F_NOCACHE
  if (allow_direct && fd2 >= 0 && fcntl(fd2, F_NOCACHE, 1) == 0) *direct = 1;
#endif
  return fd2;
}

/* Buffered reads: write back and forget the file's pages, so the next read comes from the disk. */
static void drop_pages(int fd, int advice) {
#if defined(POSIX_FADV_DONTNEED)
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  if (advice) posix_fadvise(fd, 0, 0, advice);
#else
  (void)fd;
  (void)advice;
#endif
}

int prima_profile_disk(const char *path, uint64_t file_bytes, size_t seq_block, size_t rand_block, double seq_seconds,
                       double rand_seconds, int allow_direct, prima_disk_bench *out, char *err, size_t err_len) {
  if (seq_block < 4096 || seq_block % 4096 || seq_block > (64u << 20)) return prima_fail(err, err_len, "sequential block of %zu bytes must be a multiple of 4096 up to 64 MiB", seq_block);
  if (rand_block < 4096 || rand_block % 4096 || rand_block > seq_block) return prima_fail(err, err_len, "random block of %zu bytes must be a multiple of 4096 up to the sequential block", rand_block);
  if (file_bytes < seq_block || file_bytes > ((uint64_t)1 << 40)) return prima_fail(err, err_len, "scratch file of %llu bytes is out of range", (unsigned long long)file_bytes);
  file_bytes = file_bytes / seq_block * seq_block;
  memset(out, 0, sizeof *out);
  uint8_t *buf = alloc_aligned(seq_block, 4096);
  if (!buf) return prima_fail(err, err_len, "out of memory for a %zu-byte read buffer", seq_block);
  int rc = -1, direct = 0, fd = -1;
  uint64_t seed = 0x2545f4914f6cdd1dull;

  /* Random contents, so that no layer below us can compress or deduplicate the reads away. */
  fd = open_uncached(path, O_WRONLY | O_CREAT | O_TRUNC, 0600, allow_direct, &direct);
  if (fd < 0) {
    prima_fail(err, err_len, "cannot create the scratch file %s: %s", path, strerror(errno));
    goto done;
  }
  for (uint64_t off = 0; off < file_bytes; off += seq_block) {
    uint64_t *words = (uint64_t *)buf;
    for (size_t i = 0; i < seq_block / 8; i++) words[i] = rng_next(&seed);
    if (pwrite(fd, buf, seq_block, (off_t)off) != (ssize_t)seq_block) {
      prima_fail(err, err_len, "writing the scratch file %s: %s", path, errno ? strerror(errno) : "short write");
      goto done;
    }
  }
  if (fdatasync(fd) != 0) {
    prima_fail(err, err_len, "syncing the scratch file %s: %s", path, strerror(errno));
    goto done;
  }
  close(fd);
  fd = -1;

  /* Sequential reads of the read-ahead size. */
  fd = open_uncached(path, O_RDONLY, 0, allow_direct, &direct);
  if (fd < 0) {
    prima_fail(err, err_len, "cannot open the scratch file %s: %s", path, strerror(errno));
    goto done;
  }
#if defined(POSIX_FADV_SEQUENTIAL)
  if (!direct) drop_pages(fd, POSIX_FADV_SEQUENTIAL);
#endif
  double start = now_s(), elapsed = 0;
  prima_thread_clock cpu0, cpu1;
  prima_thread_clock_read(&cpu0);
  uint64_t off = 0;
  do {
    if (pread(fd, buf, seq_block, (off_t)off) != (ssize_t)seq_block) {
      prima_fail(err, err_len, "reading the scratch file %s: %s", path, errno ? strerror(errno) : "short read");
      goto done;
    }
    off += seq_block;
    elapsed = now_s() - start;
  } while (off < file_bytes && elapsed < seq_seconds);
  out->seq_bytes_read = off;
  out->seq_bytes_per_s = (double)off / elapsed;
  prima_thread_clock_read(&cpu1);
  out->seq_cpu_share = (cpu1.cpu_ms - cpu0.cpu_ms) / 1000.0 / elapsed;

  /* Random reads of a page at block-aligned offsets, so no two share a read-ahead window. */
#if defined(POSIX_FADV_RANDOM)
  if (!direct) drop_pages(fd, POSIX_FADV_RANDOM);
#endif
  const uint64_t slots = file_bytes / seq_block;
  uint64_t reads = 0;
  start = now_s();
  do {
    const uint64_t at = (rng_next(&seed) % slots) * seq_block + (rng_next(&seed) % (seq_block / rand_block)) * rand_block;
    if (pread(fd, buf, rand_block, (off_t)at) != (ssize_t)rand_block) {
      prima_fail(err, err_len, "reading the scratch file %s: %s", path, errno ? strerror(errno) : "short read");
      goto done;
    }
    reads++;
    elapsed = now_s() - start;
  } while (elapsed < rand_seconds && reads < slots * (seq_block / rand_block));
  out->rand_reads = reads;
  out->rand_bytes_per_s = (double)(reads * rand_block) / elapsed;
  out->direct = direct;
  rc = 0;
done:
  if (fd >= 0) close(fd);
  unlink(path);
  free(buf);
  return rc;
}

int prima_profile_drop_cache(const char *path, char *err, size_t err_len) {
#if defined(POSIX_FADV_DONTNEED)
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return prima_fail(err, err_len, "cannot open %s: %s", path, strerror(errno));
  fdatasync(fd);
  const int r = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
  if (r != 0) return prima_fail(err, err_len, "posix_fadvise on %s: %s", path, strerror(r));
  return 0;
#else
  return prima_fail(err, err_len, "dropping cached pages of %s is not supported on this system", path);
#endif
}
