#include "kv_shift.h"

#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"

/* The angles of a rotation by delta positions for layer l of a window of n_ctx tokens: the layer's
 * base and scale (a sliding-window layer has its own), the window's factors, no attention factor. */
static void delta_row(const prima_model *m, int l, int n_ctx, int delta, float *c, float *s) {
  const prima_hparams *hp = &m->hp;
  const int swa = m->layer_window[l] > 0;
  const prima_tensor *f = prima_rope_factors(m, n_ctx);
  prima_rope_row(c, s, delta, hp->rope_dims, swa ? hp->rope_base_swa : hp->rope_base, swa ? hp->rope_freq_scale_swa : hp->rope_freq_scale,
                 f->data ? (const float *)f->data : NULL);
}

/* Each row: F16 to float, rotated as a key at a position is (prima_rope_apply over the KV heads), back
 * to F16: ggml's in-place RoPE of an F16 cache rounds the same way. */
static void rotate_rows(const prima_hparams *hp, uint16_t *rows, size_t stride, int n_rows, const float *c, const float *s, float *tmp) {
  const int kvdim = hp->n_head_kv * hp->head_dim;
  /* the conversions the forward pass stores keys with (model.c store_f16), SIMD where there is one */
  const prima_type_kernels *f16 = prima_kernels(PRIMA_F16);
  const prima_quantize_fn store = prima_act_quantizer(PRIMA_F16);
  for (int r = 0; r < n_rows; r++) {
    uint16_t *row = rows + (size_t)r * stride;
    f16->dequantize(row, tmp, kvdim);
    prima_rope_apply(tmp, hp->n_head_kv, hp->head_dim, hp->rope_dims, hp->rope_neox, c, s);
    store(tmp, row, kvdim);
  }
}

typedef struct {
  prima_window *w;
  int p0, d, n_past;
  float *scratch; /* per thread: cos, sin (rope_dims / 2 each), one key row */
  size_t per_thread;
} shift_job;

/* One layer per chunk: a layer's rows move down in place, so its rows stay with one thread (a row is
 * written only after every row it lands on was read). */
static void shift_layers(const prima_task *t, void *ctx) {
  shift_job *j = ctx;
  prima_window *w = j->w;
  const prima_hparams *hp = &w->m->hp;
  const size_t kvdim = (size_t)hp->n_head_kv * hp->head_dim, half = (size_t)hp->rope_dims / 2;
  const int n_move = j->n_past - j->p0 - j->d;
  float *c = j->scratch + (size_t)t->ith * j->per_thread, *s = c + half, *tmp = s + half;
  for (int li = t->ith; li < w->end - w->first; li = prima_pool_next_chunk(t)) {
    const size_t layer = (size_t)li * w->n_ctx * kvdim;
    uint16_t *K = w->k_cache + layer, *V = w->v_cache + layer;
    delta_row(w->m, w->first + li, w->n_ctx, -j->d, c, s);
    if (n_move > 0) {
      memmove(V + (size_t)j->p0 * kvdim, V + (size_t)(j->p0 + j->d) * kvdim, sizeof(uint16_t) * kvdim * (size_t)n_move);
      memmove(K + (size_t)j->p0 * kvdim, K + (size_t)(j->p0 + j->d) * kvdim, sizeof(uint16_t) * kvdim * (size_t)n_move);
      rotate_rows(hp, K + (size_t)j->p0 * kvdim, kvdim, n_move, c, s, tmp);
    }
  }
}

int prima_window_kv_shift(prima_window *w, int p0, int n_discard, int n_past, char *err, size_t err_len) {
  if (w->kv_type != PRIMA_F16) return prima_fail(err, err_len, "context shift of a KV cache of type %d is not supported (only F16)", w->kv_type);
  if (p0 < 0 || n_discard < 1 || n_past > w->n_filled || (int64_t)p0 + n_discard > n_past)
    return prima_fail(err, err_len, "context shift of positions %d..%d out of %d: the cache holds %d", p0, p0 + n_discard - 1, n_past,
                      w->n_filled);
  const prima_hparams *hp = &w->m->hp;
  const int nth = prima_pool_threads(w->m->pool);
  shift_job j = { w, p0, n_discard, n_past, NULL, (size_t)hp->rope_dims + (size_t)hp->n_head_kv * hp->head_dim };
  j.scratch = malloc(sizeof(float) * j.per_thread * (size_t)nth);
  if (!j.scratch) return prima_fail(err, err_len, "out of memory for a context shift");
  prima_pool_run(w->m->pool, shift_layers, &j);
  free(j.scratch);
  w->n_filled = n_past - n_discard;
  return 0;
}
