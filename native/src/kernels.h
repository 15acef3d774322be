/* The kernel table: for each weight type, its fused dequantize-and-dot against quantized activations,
 * its dequantizer and its reference quantizer. One scalar implementation of each function is the
 * reference (quants.c); SIMD twins (quants_x86.c, quants_neon.c) are picked at run time. */
#ifndef PRIMA_KERNELS_H
#define PRIMA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ggml type ids, as GGUF stores them. The activation formats (Q8_0, Q8_1, Q8_K) reuse ggml's ids. */
enum prima_type {
  PRIMA_F32 = 0, PRIMA_F16 = 1, PRIMA_Q4_0 = 2, PRIMA_Q4_1 = 3, PRIMA_Q5_0 = 6, PRIMA_Q5_1 = 7,
  PRIMA_Q8_0 = 8, PRIMA_Q8_1 = 9, PRIMA_Q2_K = 10, PRIMA_Q3_K = 11, PRIMA_Q4_K = 12,
  PRIMA_Q5_K = 13, PRIMA_Q6_K = 14, PRIMA_Q8_K = 15, PRIMA_IQ4_NL = 20, PRIMA_IQ4_XS = 23, PRIMA_BF16 = 30,
  PRIMA_MXFP4 = 39, PRIMA_TYPE_COUNT = 40
};

enum prima_simd { PRIMA_SIMD_SCALAR = 0, PRIMA_SIMD_AVX2 = 1, PRIMA_SIMD_AVX512 = 2, PRIMA_SIMD_NEON = 3 };

/* Most activation rows one dot call takes (a prompt batch reuses each decoded weight block this often;
 * 8 measured ~15% faster per row than 4 on AVX2 for Q4_K/Q6_K). */
#define PRIMA_MAX_NC 8

/* n floats -> n/block_elems blocks of the type. n is a multiple of the block size. */
typedef void (*prima_quantize_fn)(const float *x, void *y, int64_t n);
/* n/block_elems blocks -> n floats. */
typedef void (*prima_dequantize_fn)(const void *x, float *y, int64_t n);
/* out[c] = dot(weight row w, activation row c) for c in 0..nc-1, nc in 1..PRIMA_MAX_NC.
 * Both rows hold n elements; activation row c starts at (const char *)a + c * a_stride and is in
 * the type's act_type format. */
typedef void (*prima_dot_fn)(int n, const void *w, const void *a, size_t a_stride, int nc, float *out);
/* Decode's matrix-vector product: out[r] = dot(weight row r, activation row a) for r in 0..nr-1 (nr >= 1),
 * weight row r at (const char *)w + r * w_stride. Each out[r] equals the level's dot (nc = 1) on that row
 * bit for bit: only the memory access differs. A rows kernel walks its rows in order and prefetches the
 * bytes ahead of it (through and past the last row: a matrix is read front to back by chunks of rows),
 * which on one token is what bounds the speed, not arithmetic. */
typedef void (*prima_dot_rows_fn)(int n, const void *w, size_t w_stride, int nr, const void *a, float *out);
/* A prompt's product over a block of rows: out[t * out_stride + r] = dot(weight row r, activation row t)
 * (added to out when accumulate) for r < nr, t < nt, weight rows w_stride and activation rows a_stride
 * bytes apart. Each value equals the level's dot (nc = 1) on that row and token bit for bit (decode and
 * a prompt give the same hidden state); only how work is blocked differs. */
typedef void (*prima_gemm_fn)(int n, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                              float *out, size_t out_stride, int accumulate);

typedef struct {
  int type;
  const char *name;
  int block_elems;
  int block_bytes;
  int act_type;                    /* format its dot reads activations in: F32, F16, BF16, Q8_0, Q8_1 or Q8_K */
  prima_dequantize_fn dequantize;
  prima_quantize_fn quantize_ref;  /* weight quantizer equal to llama.cpp's quantize_row_*_ref */
  prima_dot_fn dot;
  int dot_simd;                    /* level the dot was written for (SCALAR where a level has no twin yet) */
  prima_dot_rows_fn dot_rows;      /* NULL where the level has none: prima_dot_rows calls dot row by row */
  prima_dot_fn dot_stream;         /* dot with the rows kernel's prefetch, for rows read from memory; NULL: dot */
  prima_gemm_fn gemm;              /* NULL where the level has none: prima_gemm calls dot over the tokens */
} prima_type_kernels;

/* out[r] = dot(row r, a) for nr rows w_stride bytes apart: the level's rows kernel, or its dot row by row
 * (the reference: the two agree bit for bit). */
void prima_dot_rows(const prima_type_kernels *k, int n, const void *w, size_t w_stride, int nr, const void *a, float *out);

/* The level's gemm, or its dot PRIMA_MAX_NC tokens at a time row by row (the reference: the two agree
 * bit for bit). */
void prima_gemm(const prima_type_kernels *k, int n, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride,
                int nt, float *out, size_t out_stride, int accumulate);

/* Selects the best kernels this CPU runs (idempotent; also called lazily). */
void prima_kernels_init(void);
/* Kernels for a weight type at the selected level, or NULL for a type without kernels. */
const prima_type_kernels *prima_kernels(int type);
/* Kernels at a given level (tests compare levels); NULL when the level is not compiled in or the CPU
 * cannot run it. */
const prima_type_kernels *prima_kernels_at(int type, int simd);
/* The quantizer for an activation format (F32 is a copy, F16/BF16 convert) at the selected level. */
prima_quantize_fn prima_act_quantizer(int act_type);
prima_quantize_fn prima_act_quantizer_at(int act_type, int simd);
/* The dequantizer of any type with one (weights and the Q8_0/Q8_1/Q8_K activation formats). */
prima_dequantize_fn prima_dequantizer_at(int type, int simd);
/* Bytes of a row of n elements of a type (weights or activations); 0 for an unknown type or an n that
 * is not a whole number of blocks. */
size_t prima_row_bytes(int type, int64_t n);
/* Elements per block (1 for float types), 0 for an unknown type. */
int prima_type_block_elems(int type);
/* "Q4_K" etc., NULL for an unknown type. */
const char *prima_type_name(int type);
/* The selected level (best the CPU runs unless PRIMA_SIMD=scalar|avx2|avx512|neon forces a lower one). */
int prima_simd_level(void);
/* Whether a level is compiled in and this CPU runs it. */
int prima_simd_available(int simd);
const char *prima_simd_name(int simd);
/* Whether the AVX-512 level runs its VNNI kernels: its K-quant dots then group products otherwise than
 * AVX2's (the same integer block sums, other float rounding); without VNNI it equals AVX2 bit for bit. */
int prima_avx512_vnni(void);

/* Half and bfloat16 conversions used across the engine. */
float prima_fp16_to_fp32(uint16_t h);
uint16_t prima_fp32_to_fp16(float f);
float prima_bf16_to_fp32(uint16_t h);
uint16_t prima_fp32_to_bf16(float f);

#ifdef __cplusplus
}
#endif
#endif
