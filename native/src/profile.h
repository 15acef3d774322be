/* Device micro-benchmarks for profiler/: the throughput of our own matmul kernels on a model's shapes,
 * memory read bandwidth, the cost of one KV-cache write, and disk reads with the page cache bypassed.
 * Each returns 0, or -1 with a message in err. */
#ifndef PRIMA_PROFILE_H
#define PRIMA_PROFILE_H

#include <stddef.h>
#include <stdint.h>

/* Most matrices one timed step runs together (the forward pass runs q, k and v as one step). */
#define PRIMA_PROFILE_MAX_ITEMS 8

typedef struct {
  double seconds_per_pass; /* mean time of one step over all its matrices */
  int passes;
  int copies;              /* distinct copies of the group cycled through (working set / group bytes) */
} prima_mm_bench;

/* Times one matmul step of the forward pass: out_i[t][r] = W_i[r] . act_i[t] for each matrix i of the
 * group (ggml type types[i], ne1s[i] rows of ne0s[i] elements, random, quantized with the type's
 * quantize_ref), in one prima_mm_run on a pool of n_threads, for n_tokens activation rows. The group is
 * copied until the copies fill working_set_bytes, so the weights stream from memory as a model's do.
 * Runs steps until min_seconds have gone by. */
int prima_profile_matmul(const int *types, const int64_t *ne0s, const int64_t *ne1s, int n_items, int n_tokens,
                         int n_threads, size_t working_set_bytes, double min_seconds, prima_mm_bench *out, char *err,
                         size_t err_len);

/* Bytes per second of reading a buffer of `bytes` with n_threads (one 8-byte load per 64-byte line,
 * so every line comes from memory), best of passes within min_seconds. */
int prima_profile_mem_read(size_t bytes, int n_threads, double min_seconds, double *bytes_per_s, char *err,
                           size_t err_len);

/* Seconds to write one token's K and V rows (kv_floats F32 values converted to F16, the cache's format)
 * into a cache of n_ctx positions, as the forward pass does: mean over writes within min_seconds. */
int prima_profile_kv_copy(int kv_floats, int n_ctx, double min_seconds, double *seconds, char *err, size_t err_len);

typedef struct {
  double seq_bytes_per_s;
  double seq_cpu_share; /* the reading thread's CPU seconds per second of sequential reading */
  double rand_bytes_per_s;
  uint64_t seq_bytes_read;
  uint64_t rand_reads;
  int direct; /* 1: O_DIRECT (or F_NOCACHE); 0: buffered reads after POSIX_FADV_DONTNEED */
} prima_disk_bench;

/* Writes a scratch file of file_bytes at path (random bytes), reads it sequentially in seq_block reads
 * for up to seq_seconds, then at random seq_block-aligned offsets in rand_block reads for up to
 * rand_seconds, with the page cache bypassed (O_DIRECT; where the file system refuses it, or
 * allow_direct is 0, the file's cached pages are dropped first). Removes the file. iodepth 1, as
 * prima.cpp's fio job. */
int prima_profile_disk(const char *path, uint64_t file_bytes, size_t seq_block, size_t rand_block, double seq_seconds,
                       double rand_seconds, int allow_direct, prima_disk_bench *out, char *err, size_t err_len);

/* Writes back and drops a file's pages from the page cache (POSIX_FADV_DONTNEED). */
int prima_profile_drop_cache(const char *path, char *err, size_t err_len);

#endif
