#include "sparse_attn.h"

#include <math.h>

#include "kernels.h"

const char *prima_sparse_problem(const prima_sparse_cfg *c) {
  if (c->window < 1) return "the window must be at least 1 position";
  if (c->sinks < 0) return "the sinks must be 0 or more positions";
  if (c->log_stride != 0 && c->log_stride != 1) return "log-stride is on (1) or off (0)";
  if (c->block != 0 && c->block < 2) return "a landmark block must be 0 (none) or at least 2 positions";
  return NULL;
}

int prima_sparse_select(const prima_sparse_cfg *c, int i, int *sink_end, int *wlo, int *rungs, int *n_blocks) {
  const int lo = i - c->window + 1 > 0 ? i - c->window + 1 : 0;
  *wlo = lo;
  *sink_end = c->sinks < lo ? c->sinks : lo;
  *n_blocks = c->block > 0 ? lo / c->block : 0;
  int n = 0;
  if (c->log_stride) {
    /* from the nearest rung below the window down to the sinks, then reversed: ascending */
    for (int k = 0; k <= 30; k++) {
      const long p = (long)i - (1L << k);
      if (p < *sink_end) break;
      if (p < lo) rungs[n++] = (int)p;
    }
    for (int a = 0, b = n - 1; a < b; a++, b--) {
      const int t = rungs[a];
      rungs[a] = rungs[b];
      rungs[b] = t;
    }
  }
  return n;
}

/* row p of a head's cache as floats, as attention reads it */
static void row_floats(const prima_kv_head *h, int p, int d, float *x) {
  const int row = h->cells > 0 ? p % h->cells : p;
  prima_kernels(h->type)->dequantize(h->base + (size_t)row * h->stride, x, d);
}

void prima_sparse_landmark(const prima_kv_head *k, const prima_kv_head *v, int p0, int n, int d, float *k_mean, float *v_mean) {
  double sk[1024], sv[1024]; /* a head has at most 1024 elements (the binding's and the model's limit) */
  float x[1024];
  for (int i = 0; i < d; i++) sk[i] = sv[i] = 0;
  for (int p = p0; p < p0 + n; p++) {
    row_floats(k, p, d, x);
    for (int i = 0; i < d; i++) sk[i] += x[i];
    row_floats(v, p, d, x);
    for (int i = 0; i < d; i++) sv[i] += x[i];
  }
  for (int i = 0; i < d; i++) {
    k_mean[i] = (float)(sk[i] / n);
    v_mean[i] = (float)(sv[i] / n);
  }
}

void prima_sparse_attend(const prima_sparse_cfg *c, const prima_kv_head *k, const prima_kv_head *v, const float *lm_k,
                         const float *lm_v, const float *q, int ratio, int d, int i, float scale, float softcap, const float *sink,
                         float *out, void *scratch, int simd) {
  int sink_end, wlo, n_blocks, rungs[PRIMA_SPARSE_MAX_RUNGS];
  const int n_rungs = prima_sparse_select(c, i, &sink_end, &wlo, rungs, &n_blocks);
  prima_kv_attn a;
  prima_kv_attn_begin(&a, k, v, q, ratio, d, scale, softcap, sink, scratch, simd);
  prima_kv_attn_range(&a, 0, sink_end);
  for (int r = 0; r < n_rungs; r++) prima_kv_attn_range(&a, rungs[r], rungs[r] + 1);
  if (n_blocks > 0) prima_kv_attn_entries(&a, lm_k, lm_v, n_blocks, logf((float)c->block));
  prima_kv_attn_range(&a, wlo, i + 1);
  prima_kv_attn_end(&a, out);
}
