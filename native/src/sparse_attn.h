/* Sparse attention (after ruvllm's sparse-attention kernel): a query at position i attends not to all of
 * 0..i but to its last `window` positions, the first `sinks` positions (attention sinks), positions
 * i - 2^k below its window (log-stride rungs) and, for every whole block of `block` positions below its
 * window, one landmark: the mean of the block's cached keys and values, standing for the block's
 * positions (its score gets + ln(block): block keys scoring alike weigh block times one). A query
 * therefore reads about window + sinks + log2(i) + i / block entries instead of i + 1. A query whose
 * window reaches position 0 attends densely: the same call as dense attention, the same bits. The
 * selection is one rule, prima_sparse_select; test/native/sparse-attention.test.ts states it again
 * and holds the two together. */
#ifndef PRIMA_SPARSE_ATTN_H
#define PRIMA_SPARSE_ATTN_H

#include <stddef.h>

#include "kv_cache.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int window;     /* >= 1: the last `window` positions, the query's own included */
  int sinks;      /* >= 0: positions [0, sinks) */
  int log_stride; /* 0 or 1: positions i - 2^k (k >= 0) below the window and from `sinks` on */
  int block;      /* 0: no landmarks; else >= 2: whole blocks [b * block, (b + 1) * block) below the window */
} prima_sparse_cfg;

/* Rungs below the window at most (i - 2^k >= 0 for k <= 30). */
#define PRIMA_SPARSE_MAX_RUNGS 31

/* NULL when the settings can run, else what is wrong with them. */
const char *prima_sparse_problem(const prima_sparse_cfg *c);

/* What a query at position i sees: positions [0, *sink_end) and [*wlo, i], the returned number of rungs
 * in rungs[] (ascending, each in [*sink_end, *wlo), at most PRIMA_SPARSE_MAX_RUNGS) and the landmarks
 * of blocks [0, *n_blocks). *wlo == 0 means dense: no sinks, rungs or landmarks beside the window. */
int prima_sparse_select(const prima_sparse_cfg *c, int i, int *sink_end, int *wlo, int *rungs, int *n_blocks);

/* A block's landmark for one KV head: the means of n cached rows from position p0 on, as attention sees
 * them (dequantized: rounded by the cache's type), into k_mean and v_mean (d floats each). */
void prima_sparse_landmark(const prima_kv_head *k, const prima_kv_head *v, int p0, int n, int d, float *k_mean, float *v_mean);

/* The sparse attention of the `ratio` query heads q that share one KV head, the query at position i:
 * prima_kv_attend's arguments, the settings, and that head's landmarks (block b's key at lm_k + b * d,
 * its value at lm_v + b * d; the caller keeps them for every whole block below the window). The same
 * scratch as prima_kv_attend. */
void prima_sparse_attend(const prima_sparse_cfg *c, const prima_kv_head *k, const prima_kv_head *v, const float *lm_k,
                         const float *lm_v, const float *q, int ratio, int d, int i, float scale, float softcap, const float *sink,
                         float *out, void *scratch, int simd);

#ifdef __cplusplus
}
#endif
#endif
