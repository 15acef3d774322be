/* The KV cache's element types and attention over it. A window's cache holds one row per layer and
 * position (n_head_kv heads of head_dim elements) in F16 (the default), Q8_0 or Q4_0, llama.cpp's
 * --cache-type-k / --cache-type-v. Rows are quantized as they are written, as ggml's CPU backend writes
 * a quantized cache (set_rows through the type's from_float), and attention reads the blocks directly:
 * Q·K is the weight kernels' dot of a K block against Q quantized to Q8_0 (what llama.cpp's flash
 * attention does), the V accumulation multiplies each block's levels by its scale. No dequantized copy
 * of the cache is ever made. */
#ifndef PRIMA_KV_CACHE_H
#define PRIMA_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A quantized cache type may carry this flag: Q and K (K's flag) or V and the attention's output (V's)
 * are rotated by an orthonormal Walsh-Hadamard matrix around the cache, as llama.cpp does by default
 * for a quantized cache (llama-kv-cache.cpp attn_rot_k/v): the rotation spreads an outlier over its
 * chunk, so the block's scale fits the rest better, and q·k and the output are unchanged. */
#define PRIMA_KV_ROTATED 0x100

/* The rotation's chunk for heads of head_dim elements (llama.cpp's nrot): K the largest power of two
 * from 64 that divides the head, V 64. 0 when head_dim is no multiple of 64. */
int prima_kv_rotation_chunk(int head_dim, int is_k);
/* x = H x on each consecutive chunk of n (a multiple of chunk, a power of two): H the Sylvester
 * Hadamard matrix scaled by 1/sqrt(chunk), which is its own inverse. */
void prima_hadamard(float *x, int n, int chunk);

/* 1 for a type a KV cache may hold (PRIMA_F16, PRIMA_Q8_0, PRIMA_Q4_0). */
int prima_kv_type_ok(int type);
/* NULL when a cache of this type can hold heads of head_dim elements, else why not (a quantized type's
 * blocks must not straddle heads: llama.cpp refuses the same with flash attention). */
const char *prima_kv_type_problem(int type, int head_dim);

/* One position's row of n floats into the cache's type, as llama.cpp writes it: F16 rounded to nearest
 * even, Q8_0 by the CPU backend's quantize_row_q8_0 (the activation quantizer), Q4_0 by
 * quantize_row_q4_0_ref. */
void prima_kv_store(int type, const float *x, void *dst, int n);

/* The cached K or V of one KV head: position p's head_dim elements start at base + row * stride bytes,
 * row = p, or p % cells for a sliding-window layer's ring of `cells` rows (0: no ring). */
typedef struct {
  int type;
  const uint8_t *base;
  size_t stride;
  int cells;
} prima_kv_head;

/* Per-thread scratch prima_kv_attend needs for `ratio` query heads of d elements. */
size_t prima_kv_attend_scratch_bytes(int ratio, int d);

/* Attention of the `ratio` query heads q (ratio x d floats, already scaled by the model's query scale)
 * that share one KV head, over cached positions [lo, hi): out[h] = softmax(scale * q[h]·K)·V with
 * scores soft-capped when softcap > 0. sink (NULL: none): per query head one more score in the softmax
 * with no value (gpt-oss's attention sinks). Blocked online softmax. simd: the kernels' level (prima_simd_level()
 * for the model; tests pass each level). scratch: prima_kv_attend_scratch_bytes, 64-byte aligned. */
void prima_kv_attend(const prima_kv_head *k, const prima_kv_head *v, const float *q, int ratio, int d, int lo, int hi,
                     float scale, float softcap, const float *sink, float *out, void *scratch, int simd);

/* The same in parts, for attention over more than one range of positions (sparse_attn.c): begin,
 * then any number of ranges and of f32 entries, then end; the online softmax is one over all of them.
 * prima_kv_attend is begin, one range, end. */
typedef struct {
  const prima_kv_head *k, *v;
  const float *q_in;
  int ratio, d, simd;
  float scale, softcap;
  const prima_type_kernels *kk;
  float *q, *acc, *M, *S, *s;
  uint8_t *q8;
  size_t q8_row;
  /* NULL (begin's default), or where a range leaves each head's score of each position: raw[h *
   * raw_stride + p], after scale and soft-cap (H2O's statistics: with M and S after end, a position's
   * probability is exp(raw - M[h]) / S[h]) */
  float *raw;
  size_t raw_stride;
} prima_kv_attn;
void prima_kv_attn_begin(prima_kv_attn *a, const prima_kv_head *k, const prima_kv_head *v, const float *q, int ratio, int d,
                         float scale, float softcap, const float *sink, void *scratch, int simd);
/* cached positions [lo, hi) */
void prima_kv_attn_range(prima_kv_attn *a, int lo, int hi);
/* n entries that are no cached position: keys kx and values vx, n x d floats each (in the cache's rotated
 * space for a -rot type), scored with the unrounded q: score = softcap(scale * q·k) + bias */
void prima_kv_attn_entries(prima_kv_attn *a, const float *kx, const float *vx, int n, float bias);
void prima_kv_attn_end(prima_kv_attn *a, float *out);

#ifdef __cplusplus
}
#endif
#endif
