/* Attention of a batch of query rows over an F16 KV cache, tiled as a flash attention: a block of
 * cached positions is converted from F16 to F32 once and used by every query row of the tile (up to
 * 64 query heads: several tokens times the `ratio` heads that share the KV head), scores and the V
 * accumulation are small register-blocked matrix products, and the softmax is online per row.
 * The per-row path (kv_cache.c) converts each K and V row again for every token; at depth that
 * conversion and the one-query dot products were two thirds of a prompt's time. Decode and steps of
 * several sequences use this kernel too (one token per call): a token's blocks of positions do not
 * depend on the tile it is in, so its result has the same bits alone as in a prompt's batch. */
#ifndef PRIMA_ATTN_TILE_H
#define PRIMA_ATTN_TILE_H

#include <stddef.h>

#include "kv_cache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when prima_kv_attend_tile handles this cache at this SIMD level (both caches F16, AVX2, d a
 * multiple of 16 and at most 256); otherwise attend row by row with prima_kv_attend. */
int prima_kv_tile_ok(const prima_kv_head *k, const prima_kv_head *v, int d, int simd);
/* Tokens one call takes at most for `ratio` query heads per KV head. */
int prima_kv_tile_tokens(int ratio);
/* Per-thread scratch of prima_kv_attend_tile, 64-byte aligned. */
size_t prima_kv_tile_scratch_bytes(int ratio, int d);

/* n_tok consecutive tokens of one sequence (n_tok <= prima_kv_tile_tokens(ratio)): token t is at
 * position pos0 + t and its `ratio` query heads at q + t * q_stride (ratio x d floats) attend to the
 * cached positions [lo_t, pos0 + t + 1), lo_t = 0, or with window > 0 the last `window` of them.
 * Output at out + t * q_stride. Otherwise as prima_kv_attend (scale, softcap, sink per query head);
 * the result equals it up to float summation order. */
void prima_kv_attend_tile(const prima_kv_head *k, const prima_kv_head *v, const float *q, size_t q_stride, int n_tok, int pos0,
                          int window, int ratio, int d, float scale, float softcap, const float *sink, float *out, void *scratch);

#ifdef __cplusplus
}
#endif
#endif
