#include "kv_shift.h"

#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"

/* The angles of a rotation by delta positions for layer l of a window of n_ctx tokens: the layer's
 * base and scale (a sliding-window layer has its own), the window's factors, the table's rule (YaRN's
 * ramp where the model has it), no attention factor or YaRN magnitude: the key carries those once. */
static void delta_row(const prima_model *m, int l, int n_ctx, int delta, float *c, float *s) {
  const prima_hparams *hp = &m->hp;
  const int swa = m->layer_window[l] > 0;
  const prima_tensor *f = prima_rope_factors(m, n_ctx);
  const float base = swa ? hp->rope_base_swa : hp->rope_base, scale = swa ? hp->rope_freq_scale_swa : hp->rope_freq_scale;
  const float *ff = f->data ? (const float *)f->data : NULL;
  if (hp->rope_yarn_ext > 0)
    prima_rope_row_yarn(c, s, delta, hp->rope_dims, base, scale, ff, hp->rope_yarn_ext, hp->n_ctx_orig, hp->rope_yarn_beta_fast,
                        hp->rope_yarn_beta_slow, 1.0f);
  else
    prima_rope_row(c, s, delta, hp->rope_dims, base, scale, ff);
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
  float *scratch;   /* per thread: cos, sin (rope_dims / 2 each), one key row */
  size_t per_thread;
  uint16_t *held;   /* per thread: a ring's moved K and V rows (2 * ring_rows rows) */
  size_t held_rows;
} shift_job;

/* A ring (model.c kv_layout: position p in row p % cells) holds positions [kv_end - cells, kv_end)
 * from kv_floor on; those moved are copied out first and written to the rows of their new positions
 * (p - d lands in another row of the same ring). Positions it no longer held stay gone (kv_floor). */
static void shift_ring(shift_job *j, int li, uint16_t *K, uint16_t *V, size_t kvdim, const float *c, const float *s, float *tmp,
                       uint16_t *held) {
  prima_window *w = j->w;
  const int cells = w->kv_cells[li];
  int low = w->kv_end - cells; /* the lowest position it holds */
  if (low < w->kv_floor) low = w->kv_floor;
  const int from = j->p0 + j->d > low ? j->p0 + j->d : low;
  const int n = j->n_past - from;
  if (n <= 0) return;
  uint16_t *hk = held, *hv = held + (size_t)cells * kvdim;
  for (int i = 0; i < n; i++) {
    const size_t row = (size_t)((from + i) % cells) * kvdim;
    memcpy(hk + (size_t)i * kvdim, K + row, sizeof(uint16_t) * kvdim);
    memcpy(hv + (size_t)i * kvdim, V + row, sizeof(uint16_t) * kvdim);
  }
  rotate_rows(&w->m->hp, hk, kvdim, n, c, s, tmp);
  for (int i = 0; i < n; i++) {
    const size_t row = (size_t)((from + i - j->d) % cells) * kvdim;
    memcpy(K + row, hk + (size_t)i * kvdim, sizeof(uint16_t) * kvdim);
    memcpy(V + row, hv + (size_t)i * kvdim, sizeof(uint16_t) * kvdim);
  }
}

/* One layer per chunk: a layer's rows move down in place, so its rows stay with one thread (a row is
 * written only after every row it lands on was read). */
static void shift_layers(const prima_task *t, void *ctx) {
  shift_job *j = ctx;
  prima_window *w = j->w;
  const prima_hparams *hp = &w->m->hp;
  const size_t kvdim = (size_t)hp->n_head_kv * hp->head_dim, half = (size_t)hp->rope_dims / 2;
  const int n_move = j->n_past - j->p0 - j->d;
  float *c = j->scratch + (size_t)t->ith * j->per_thread, *s = c + half, *tmp = s + half;
  uint16_t *held = j->held ? j->held + (size_t)t->ith * 2 * j->held_rows * kvdim : NULL;
  for (int li = t->ith; li < w->end - w->first; li = prima_pool_next_chunk(t)) {
    uint16_t *K = w->k_cache + w->kv_off[li] * kvdim, *V = w->v_cache + w->kv_off[li] * kvdim;
    delta_row(w->m, w->first + li, w->n_ctx, -j->d, c, s);
    if (w->kv_cells[li] < w->n_ctx) {
      shift_ring(j, li, K, V, kvdim, c, s, tmp, held);
    } else if (n_move > 0) {
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
  const int nl = w->end - w->first;
  /* the rings: which positions they hold, which they will hold, and whether the next position's
   * window finds all it attends to in them (else the shift is refused before anything moves) */
  int ring_rows = 0, new_floor = w->kv_floor;
  const int next = n_past - n_discard;
  for (int li = 0; li < nl; li++) {
    const int cells = w->kv_cells[li];
    if (cells == w->n_ctx) continue;
    int low = w->kv_end - cells;
    if (low < w->kv_floor) low = w->kv_floor;
    if (low < 0) low = 0;
    const int new_low = low <= p0 ? low : low <= p0 + n_discard ? p0 : low - n_discard;
    const int window = w->m->layer_window[w->first + li];
    const int need = next > window ? next - window + 1 : 0;
    if (need < new_low)
      return prima_fail(err, err_len,
                        "context shift: layer %d's sliding window of %d needs position %d after dropping %d..%d, and its ring of %d rows "
                        "no longer holds it (discard fewer positions)",
                        w->first + li, window, need, p0, p0 + n_discard - 1, cells);
    if (cells > ring_rows) ring_rows = cells;
    if (new_low > new_floor) new_floor = new_low;
  }
  const int nth = prima_pool_threads(w->m->pool);
  const size_t kvdim = (size_t)hp->n_head_kv * hp->head_dim;
  shift_job j = { w, p0, n_discard, n_past, NULL, (size_t)hp->rope_dims + kvdim, NULL, (size_t)ring_rows };
  j.scratch = malloc(sizeof(float) * j.per_thread * (size_t)nth);
  if (ring_rows > 0) j.held = malloc(sizeof(uint16_t) * 2 * (size_t)ring_rows * kvdim * (size_t)nth);
  if (!j.scratch || (ring_rows > 0 && !j.held)) {
    free(j.scratch);
    free(j.held);
    return prima_fail(err, err_len, "out of memory for a context shift");
  }
  prima_pool_run(w->m->pool, shift_layers, &j);
  free(j.scratch);
  free(j.held);
  w->n_filled = next;
  if (ring_rows > 0) {
    w->kv_end = next;
    w->kv_floor = new_floor;
  }
  return 0;
}
