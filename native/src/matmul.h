/* Weight matmuls on the thread pool: out[t][r] (+)= dot(W row r, activation row t).
 * Activations are quantized once into the weight type's activation format and shared by every
 * matrix that reads the same input (q/k/v, gate/up); rows are split into chunks that threads take
 * dynamically, and each chunk walks the batch PRIMA_MAX_NC tokens at a time so a decoded weight block
 * serves several tokens while it is in L1. */
#ifndef PRIMA_MATMUL_H
#define PRIMA_MATMUL_H

#include <stddef.h>

#include "model.h"
#include "threadpool.h"

typedef struct prima_mm_s {
  const prima_tensor *w;
  const void *act;     /* n_tokens rows, act_stride bytes apart, in w's activation format */
  size_t act_stride;
  float *out;          /* out[t * out_stride + r] */
  size_t out_stride;   /* in floats */
  int accumulate;      /* add into out instead of storing */
} prima_mm;

/* Runs all items (sharing n_tokens) across the pool's threads of task t. No barrier at the end. */
void prima_mm_run(const prima_task *t, const prima_mm *items, int n_items, int n_tokens);

/* As prima_mm_run, each item over its own number of tokens (n_tokens[i] >= 0, 0: skipped): the
 * experts of a mixture each run on the tokens routed to them, all in one step. */
void prima_mm_run_var(const prima_task *t, const prima_mm *items, int n_items, const int *n_tokens);

/* Quantizes rows [t0, t1) of x (n floats each, x_stride floats apart) into act (act_stride bytes apart). */
void prima_act_quantize_rows(int act_type, const float *x, size_t x_stride, void *act, size_t act_stride,
                             int n, int t0, int t1);

#endif
