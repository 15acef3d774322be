#include "matmul.h"

#include "kernels.h"

#include <stdint.h>

void prima_act_quantize_rows(int act_type, const float *x, size_t x_stride, void *act, size_t act_stride,
                             int n, int t0, int t1) {
  prima_quantize_fn q = prima_act_quantizer(act_type);
  for (int t = t0; t < t1; t++) q(x + (size_t)t * x_stride, (char *)act + (size_t)t * act_stride, n);
}

/* Most rows of a one-token chunk: its dots go to a stack buffer when they accumulate. */
#define MAX_CHUNK_ROWS 256

/* Rows per chunk: on one token, and on a few (a decode step of several sequences, which reads each
 * weight once too: a pass of 4 on the benchmark model 41-42 -> 33-34 ms with these chunks instead of 16
 * rows), about two chunks a thread (8 to 256 rows), still enough to balance them;
 * a chunk is a stream of its own (the next one a thread takes is rarely where its last ended), and its
 * start-up costs reads: sixteen chunks a thread cut a mixture of experts' small matrices (the
 * benchmark's 512-row gate and up) into 16-row streams, and its decode on 2 threads went from 203 to 289
 * tok/s at four (`npm run bench -- --only moe`, Zen 4); two a thread (up to 256 rows, was 64) took the
 * benchmark model's decode step from 20.7-23.5 to 19.8-20.6 ms and the MoE model's from 3.3-5.6 to
 * 2.8-3.2 ms (six interleaved pairs, each pair faster). Prompts: 16 rows, a few KiB that each group of
 * tokens rereads from cache. */
static int chunk_rows(int64_t rows, int n_tokens, int nth) {
  int cs;
  if (n_tokens <= PRIMA_MAX_NC) {
    cs = (int)(rows / ((int64_t)nth * 2));
    if (cs < 8) cs = 8;
    if (cs > MAX_CHUNK_ROWS) cs = MAX_CHUNK_ROWS;
  } else {
    cs = 16;
  }
  return cs;
}

/* One token: the chunk's rows in one rows-kernel call (it streams them with prefetch). */
static void mv_chunk(const prima_mm *it, const prima_type_kernels *k, int64_t r0, int64_t r1) {
  const prima_tensor *w = it->w;
  const int nr = (int)(r1 - r0);
  const uint8_t *wr = w->data + (size_t)r0 * w->row_bytes;
  if (!it->accumulate) {
    prima_dot_rows(k, (int)w->ne0, wr, w->row_bytes, nr, it->act, it->out + r0);
    return;
  }
  float tmp[MAX_CHUNK_ROWS];
  prima_dot_rows(k, (int)w->ne0, wr, w->row_bytes, nr, it->act, tmp);
  for (int r = 0; r < nr; r++) it->out[r0 + r] += tmp[r];
}

/* Several tokens: the level's gemm (or its dot over the tokens, PRIMA_MAX_NC at a time). */
static void mm_chunk(const prima_mm *it, const prima_type_kernels *k, int64_t r0, int64_t r1, int n_tokens) {
  const prima_tensor *w = it->w;
  if (n_tokens == 1) {
    mv_chunk(it, k, r0, r1);
    return;
  }
  prima_gemm(k, (int)w->ne0, w->data + (size_t)r0 * w->row_bytes, w->row_bytes, (int)(r1 - r0), it->act, it->act_stride,
             n_tokens, it->out + r0, it->out_stride, it->accumulate);
}

void prima_mm_run(const prima_task *t, const prima_mm *items, int n_items, int n_tokens) {
  int cs[8], first[9];
  const prima_type_kernels *ks[8];
  first[0] = 0;
  for (int i = 0; i < n_items; i++) {
    cs[i] = chunk_rows(items[i].w->ne1, n_tokens, t->nth);
    ks[i] = prima_kernels(items[i].w->type);
    first[i + 1] = first[i] + (int)((items[i].w->ne1 + cs[i] - 1) / cs[i]);
  }
  const int total = first[n_items];
  int item = 0;
  for (int c = t->ith; c < total; c = prima_pool_next_chunk(t)) {
    while (c >= first[item + 1]) item++;
    while (c < first[item]) item--;
    const int64_t r0 = (int64_t)(c - first[item]) * cs[item];
    int64_t r1 = r0 + cs[item];
    if (r1 > items[item].w->ne1) r1 = items[item].w->ne1;
    mm_chunk(&items[item], ks[item], r0, r1, n_tokens);
  }
}

void prima_mm_run_var(const prima_task *t, const prima_mm *items, int n_items, const int *n_tokens) {
  /* chunks are numbered item after item; each thread walks its increasing chunk numbers forward */
  int item = 0, first = 0, cs = 0, count = 0;
  const prima_type_kernels *k = NULL;
  if (n_items > 0) {
    cs = chunk_rows(items[0].w->ne1, n_tokens[0], t->nth);
    count = n_tokens[0] > 0 ? (int)((items[0].w->ne1 + cs - 1) / cs) : 0;
    k = prima_kernels(items[0].w->type);
  }
  for (int c = t->ith;; c = prima_pool_next_chunk(t)) {
    while (item < n_items && c >= first + count) {
      first += count;
      if (++item == n_items) break;
      cs = chunk_rows(items[item].w->ne1, n_tokens[item], t->nth);
      count = n_tokens[item] > 0 ? (int)((items[item].w->ne1 + cs - 1) / cs) : 0;
      k = prima_kernels(items[item].w->type);
    }
    if (item >= n_items) break;
    const int64_t r0 = (int64_t)(c - first) * cs;
    int64_t r1 = r0 + cs;
    if (r1 > items[item].w->ne1) r1 = items[item].w->ne1;
    mm_chunk(&items[item], k, r0, r1, n_tokens[item]);
  }
}
