#include "expert_prefetch.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels.h"
#include "matmul.h"
#include "ops.h"

int prima_window_expert_prefetch(prima_window *w, int mode, char *err, size_t err_len) {
  if (mode != PRIMA_XP_OFF && mode != PRIMA_XP_AHEAD && mode != PRIMA_XP_EXACT)
    return prima_fail(err, err_len, "expert prefetch mode %d is not off (0), ahead (1) or exact (2)", mode);
  if (mode != PRIMA_XP_OFF && !w->moe_logits)
    return prima_fail(err, err_len, "window [%d, %d) has no mixture-of-experts layer to prefetch experts for", w->first, w->end);
  if (!w->xp) {
    if (mode == PRIMA_XP_OFF) return 0;
    prima_expert_prefetch *xp = calloc(1, sizeof *xp);
    if (xp) xp->pred = calloc((size_t)w->m->hp.n_expert, 1);
    if (!xp || !xp->pred) {
      if (xp) free(xp);
      return prima_fail(err, err_len, "out of memory for the expert prefetch of a window");
    }
    xp->pred_layer = -1;
    w->xp = xp;
  }
  /* a pass running now sees the new mode at its next layer */
  __atomic_store_n(&w->xp->mode, mode, __ATOMIC_RELAXED);
  return 0;
}

prima_xp_counters prima_window_expert_prefetch_counters(const prima_window *w) {
  prima_xp_counters none = { 0 };
  return w->xp ? w->xp->c : none;
}

void prima_expert_prefetch_free(prima_window *w) {
  if (!w->xp) return;
  free(w->xp->pred);
  free(w->xp);
  w->xp = NULL;
}

/* Expert e's rows in one of its layer's 3-D tensors (rows_each rows per expert): [lo, lo + bytes). */
static void expert_span(const prima_tensor *all, int e, int64_t rows_each, uint64_t *lo, uint64_t *bytes) {
  *bytes = (uint64_t)rows_each * all->row_bytes;
  *lo = all->offset + (uint64_t)e * *bytes;
}

static uint64_t expert_bytes(const prima_window *w, const prima_layer *L) {
  const int64_t F = w->m->hp.n_ff_exp, E = w->m->hp.n_embd;
  return (uint64_t)F * (L->gate_exps.row_bytes + L->up_exps.row_bytes) + (uint64_t)E * L->down_exps.row_bytes;
}

/* MADV_WILLNEED over expert e's gate, up and down rows (each widened to whole pages). */
static void advise_expert(prima_window *w, const prima_layer *L, int e) {
  const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  const int64_t F = w->m->hp.n_ff_exp, E = w->m->hp.n_embd;
  const prima_tensor *ts[3] = { &L->gate_exps, &L->up_exps, &L->down_exps };
  const int64_t rows[3] = { F, F, E };
  for (int i = 0; i < 3; i++) {
    uint64_t lo, bytes;
    expert_span(ts[i], e, rows[i], &lo, &bytes);
    uint64_t hi = (lo + bytes + page - 1) & ~(page - 1);
    lo &= ~(page - 1);
    if (hi > (uint64_t)w->m->map_bytes) hi = ((uint64_t)w->m->map_bytes + page - 1) & ~(page - 1);
    if (hi > lo) madvise(w->m->map + lo, (size_t)(hi - lo), MADV_WILLNEED); /* advice: a failure costs nothing */
  }
}

void prima_expert_prefetch_predict(const prima_task *t, prima_window *w, int l, const float *x, int n, int when) {
  prima_expert_prefetch *xp = w->xp;
  if (!xp || __atomic_load_n(&xp->mode, __ATOMIC_RELAXED) != when) return;
  const prima_layer *L = &w->m->layers[l];
  if (!L->gate_inp.data) return;
  const prima_hparams *hp = &w->m->hp;
  const int E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used;
  const int fmt = prima_kernels(L->gate_inp.type)->act_type;
  const size_t stride = w->act_row_bytes;
  /* the router's input as the layer computes it, from x: norm, then its activation format */
  for (int r = t->ith; r < n; r = prima_pool_next_chunk(t)) {
    prima_rmsnorm(x + (size_t)r * E, (const float *)L->ffn_norm.data, w->h + (size_t)r * E, E, hp->norm_eps);
    prima_act_quantize_rows(fmt, w->h, E, w->act_a, stride, E, r, r + 1);
  }
  prima_pool_barrier(t);
  const prima_mm mm = { &L->gate_inp, w->act_a, stride, w->moe_logits, (size_t)X, 0 };
  prima_mm_run(t, &mm, 1, n);
  prima_pool_barrier(t);
  /* thread 0 routes and advises while the others go on into the layer (which does not touch the
   * router's scratch before its own router runs, a barrier later) */
  if (t->ith != 0) return;
  memset(xp->pred, 0, (size_t)X);
  for (int r = 0; r < n; r++) {
    prima_moe_route(hp, L, w->moe_logits + (size_t)r * X, w->moe_sel + (size_t)r * K, w->moe_wt + (size_t)r * K);
    for (int j = 0; j < K; j++) xp->pred[w->moe_sel[(size_t)r * K + j]] = 1;
  }
  const uint64_t each = expert_bytes(w, L);
  for (int e = 0; e < X; e++) {
    if (!xp->pred[e]) continue;
    advise_expert(w, L, e);
    xp->c.predicted++;
    xp->c.advised_bytes += each;
  }
  xp->c.layers++;
  xp->pred_layer = l;
}

void prima_expert_prefetch_score(prima_window *w, int l, const int *first) {
  prima_expert_prefetch *xp = w->xp;
  if (!xp || xp->pred_layer != l) return;
  const uint64_t each = expert_bytes(w, &w->m->layers[l]);
  for (int e = 0; e < w->m->hp.n_expert; e++) {
    const int routed = first[e + 1] > first[e];
    if (xp->pred[e] && routed) {
      xp->c.hits++;
      xp->c.used_bytes += each;
    } else if (xp->pred[e]) {
      xp->c.wasted_bytes += each;
    } else if (routed) {
      xp->c.misses++;
    }
  }
  xp->pred_layer = -1;
}
