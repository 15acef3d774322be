#include "kv_shift.h"

#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kv_cache.h"
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

/* Each key row: from the cache's type to float, rotated as a key at a position is (prima_rope_apply
 * over the KV heads), back to the cache's type with the rounding the forward pass writes it with
 * (prima_kv_store: F16 to nearest even, Q8_0/Q4_0 llama.cpp's quantizers). A Hadamard-rotated cache
 * holds H k: H undone before RoPE and done again after (H is its own inverse), as llama.cpp's
 * build_rope_shift does (dequantize, rotate back, RoPE, rotate forward, copy into the quantized cache);
 * ggml's in-place RoPE of an F16 cache rounds the same way. */
static void rotate_rows(const prima_window *w, uint8_t *rows, int n_rows, const float *c, const float *s, float *tmp) {
  const prima_hparams *hp = &w->m->hp;
  const int kvdim = hp->n_head_kv * hp->head_dim;
  const prima_type_kernels *kt = prima_kernels(w->k_type);
  for (int r = 0; r < n_rows; r++) {
    uint8_t *row = rows + (size_t)r * w->k_row_bytes;
    kt->dequantize(row, tmp, kvdim);
    if (w->k_rot) prima_hadamard(tmp, kvdim, w->k_rot);
    prima_rope_apply(tmp, hp->n_head_kv, hp->head_dim, hp->rope_dims, hp->rope_neox, c, s);
    if (w->k_rot) prima_hadamard(tmp, kvdim, w->k_rot);
    prima_kv_store(w->k_type, tmp, row, kvdim);
  }
}

typedef struct {
  prima_window *w;
  int p0, d, n_past;
  float *scratch;   /* per thread: cos, sin (rope_dims / 2 each), one key row */
  size_t per_thread;
  uint8_t *held;    /* per thread: a ring's moved K and V rows (ring_rows rows of each) */
  size_t held_rows;
} shift_job;

/* A ring (model.c kv_layout: position p in row p % cells) holds positions [kv_end - cells, kv_end)
 * from kv_floor on; those moved are copied out first and written to the rows of their new positions
 * (p - d lands in another row of the same ring). Positions it no longer held stay gone (kv_floor). */
static void shift_ring(shift_job *j, int li, uint8_t *K, uint8_t *V, const float *c, const float *s, float *tmp, uint8_t *held) {
  prima_window *w = j->w;
  const int cells = w->kv_cells[li];
  int low = w->kv_end - cells; /* the lowest position it holds */
  if (low < w->kv_floor) low = w->kv_floor;
  const int from = j->p0 + j->d > low ? j->p0 + j->d : low;
  const int n = j->n_past - from;
  if (n <= 0) return;
  const size_t kb = w->k_row_bytes, vb = w->v_row_bytes;
  uint8_t *hk = held, *hv = held + (size_t)cells * kb;
  for (int i = 0; i < n; i++) {
    const size_t row = (size_t)((from + i) % cells);
    memcpy(hk + (size_t)i * kb, K + row * kb, kb);
    memcpy(hv + (size_t)i * vb, V + row * vb, vb);
  }
  rotate_rows(w, hk, n, c, s, tmp);
  for (int i = 0; i < n; i++) {
    const size_t row = (size_t)((from + i - j->d) % cells);
    memcpy(K + row * kb, hk + (size_t)i * kb, kb);
    memcpy(V + row * vb, hv + (size_t)i * vb, vb);
  }
}

/* One layer per chunk: a layer's rows move down in place, so its rows stay with one thread (a row is
 * written only after every row it lands on was read). */
static void shift_layers(const prima_task *t, void *ctx) {
  shift_job *j = ctx;
  prima_window *w = j->w;
  const prima_hparams *hp = &w->m->hp;
  const size_t half = (size_t)hp->rope_dims / 2;
  const int n_move = j->n_past - j->p0 - j->d;
  float *c = j->scratch + (size_t)t->ith * j->per_thread, *s = c + half, *tmp = s + half;
  const size_t kb = w->k_row_bytes, vb = w->v_row_bytes;
  uint8_t *held = j->held ? j->held + (size_t)t->ith * j->held_rows * (kb + vb) : NULL;
  for (int li = t->ith; li < w->end - w->first; li = prima_pool_next_chunk(t)) {
    uint8_t *K = w->k_cache + w->kv_off[li] * kb, *V = w->v_cache + w->kv_off[li] * vb;
    delta_row(w->m, w->first + li, w->n_ctx, -j->d, c, s);
    if (w->kv_cells[li] < w->n_ctx) {
      shift_ring(j, li, K, V, c, s, tmp, held);
    } else if (n_move > 0) {
      memmove(V + (size_t)j->p0 * vb, V + (size_t)(j->p0 + j->d) * vb, vb * (size_t)n_move);
      memmove(K + (size_t)j->p0 * kb, K + (size_t)(j->p0 + j->d) * kb, kb * (size_t)n_move);
      rotate_rows(w, K + (size_t)j->p0 * kb, n_move, c, s, tmp);
    }
  }
}

int prima_window_kv_shift(prima_window *w, int p0, int n_discard, int n_past, char *err, size_t err_len) {
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
  if (ring_rows > 0) j.held = malloc((w->k_row_bytes + w->v_row_bytes) * (size_t)ring_rows * (size_t)nth);
  if (!j.scratch || (ring_rows > 0 && !j.held)) {
    free(j.scratch);
    free(j.held);
    return prima_fail(err, err_len, "out of memory for a context shift");
  }
  prima_pool_run(w->m->pool, shift_layers, &j);
  free(j.scratch);
  free(j.held);
  w->n_filled = next;
  if (w->sparse.block > 0 && w->lm_done > p0 / w->sparse.block) w->lm_done = p0 / w->sparse.block; /* rows moved */
  for (int t = 0; w->h2o_acc && t < w->h2o_threads; t++) { /* H2O's sums move with their rows */
    float *acc = w->h2o_acc + (size_t)t * w->n_ctx;
    memmove(acc + p0, acc + p0 + n_discard, sizeof(float) * (size_t)(n_past - p0 - n_discard));
    memset(acc + next, 0, sizeof(float) * (size_t)(w->n_ctx - next));
  }
  if (ring_rows > 0) {
    w->kv_end = next;
    w->kv_floor = new_floor;
  }
  return 0;
}
