#include "expert_prefetch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h> /* mincore */
#include <unistd.h>

#include "advisor.h"
#include "kernels.h"
#include "matmul.h"
#include "ops.h"

/* MADV_WILLNEED on n [lo, hi) byte ranges of the model's mapping (advice only). */
static void advise_ranges(const prima_model *m, const uint64_t *ranges, int n) {
  for (int i = 0; i < n; i++) prima_willneed(m, m->map + ranges[2 * i], (size_t)(ranges[2 * i + 1] - ranges[2 * i]), NULL, 0);
}

int prima_window_expert_prefetch(prima_window *w, int mode, char *err, size_t err_len) {
  if (mode < PRIMA_XP_OFF || mode > PRIMA_XP_EARLY)
    return prima_fail(err, err_len, "expert prefetch mode %d is not off (0), ahead (1), exact (2) or early (3)", mode);
  if (mode != PRIMA_XP_OFF && !w->moe_logits)
    return prima_fail(err, err_len, "window [%d, %d) has no mixture-of-experts layer to prefetch experts for", w->first, w->end);
  if (!w->xp) {
    if (mode == PRIMA_XP_OFF) return 0;
    prima_expert_prefetch *xp = calloc(1, sizeof *xp);
    if (!xp) return prima_fail(err, err_len, "out of memory for the expert prefetch of a window");
    xp->pred = calloc((size_t)w->m->hp.n_expert, 2);
    xp->ranges = calloc((size_t)w->m->hp.n_expert * 3 * 2, sizeof(uint64_t));
    xp->pred_layer[0] = xp->pred_layer[1] = -1;
    if (!xp->pred || !xp->ranges) {
      free(xp->pred);
      free(xp->ranges);
      free(xp);
      return prima_fail(err, err_len, "out of memory for the expert prefetch of a window");
    }
    if (!(xp->advisor = prima_advisor_start(w->m))) {
      free(xp->pred);
      free(xp->ranges);
      free(xp);
      return prima_fail(err, err_len, "cannot start the expert prefetch thread of a window");
    }
    /* published whole: a pass running now may see it (with pass_mode off until its next pass) */
    __atomic_store_n(&w->xp, xp, __ATOMIC_RELEASE);
  }
  /* the next pass runs with it (prima_expert_prefetch_begin) */
  __atomic_store_n(&w->xp->mode, mode, __ATOMIC_RELAXED);
  return 0;
}

prima_xp_counters prima_window_expert_prefetch_counters(const prima_window *w) {
  prima_xp_counters none = { 0 };
  return w->xp ? w->xp->c : none;
}

void prima_expert_prefetch_free(prima_window *w) {
  prima_expert_prefetch *xp = w->xp;
  if (!xp) return;
  prima_advisor_stop(xp->advisor);
  free(xp->ranges);
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

/* Expert e's gate, up and down rows (each widened to whole pages) appended to ranges ([lo, hi) pairs). */
static int expert_ranges(const prima_window *w, const prima_layer *L, int e, uint64_t *ranges, int n) {
  const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  const uint64_t map_end = ((uint64_t)w->m->map_bytes + page - 1) & ~(page - 1);
  const int64_t F = w->m->hp.n_ff_exp, E = w->m->hp.n_embd;
  const prima_tensor *ts[3] = { &L->gate_exps, &L->up_exps, &L->down_exps };
  const int64_t rows[3] = { F, F, E };
  for (int i = 0; i < 3; i++) {
    uint64_t lo, bytes;
    expert_span(ts[i], e, rows[i], &lo, &bytes);
    uint64_t hi = (lo + bytes + page - 1) & ~(page - 1);
    lo &= ~(page - 1);
    if (hi > map_end) hi = map_end;
    if (hi <= lo) continue;
    ranges[2 * n] = lo;
    ranges[2 * n + 1] = hi;
    n++;
  }
  return n;
}

void prima_expert_routed_willneed(prima_window *w, int l, const int *first) {
  if (!w->experts_random) return;
  const prima_layer *L = &w->m->layers[l];
  uint64_t ranges[6];
  for (int e = 0; e < w->m->hp.n_expert; e++) {
    if (first[e + 1] == first[e]) continue;
    advise_ranges(w->m, ranges, expert_ranges(w, L, e, ranges, 0));
  }
}

static void predict(const prima_task *t, prima_window *w, int l, const float *x, int n) {
  prima_expert_prefetch *xp = w->xp;
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
  unsigned char *pred = xp->pred + (size_t)(l & 1) * X;
  memset(pred, 0, (size_t)X);
  for (int r = 0; r < n; r++) {
    prima_moe_route(hp, L, w->moe_logits + (size_t)r * X, w->moe_sel + (size_t)r * K, w->moe_wt + (size_t)r * K);
    for (int j = 0; j < K; j++) pred[w->moe_sel[(size_t)r * K + j]] = 1;
  }
  const uint64_t each = expert_bytes(w, L);
  int nr = 0;
  for (int e = 0; e < X; e++) {
    if (!pred[e]) continue;
    nr = expert_ranges(w, L, e, xp->ranges, nr);
    xp->c.predicted++;
    xp->c.advised_bytes += each;
  }
  prima_advisor_request(xp->advisor, xp->ranges, nr); /* replaces the older layer's: it is computing by now */
  xp->c.layers++;
  xp->pred_layer[l & 1] = l;
}

void prima_expert_prefetch_begin(prima_window *w) {
  if (w->xp) w->xp->pass_mode = __atomic_load_n(&w->xp->mode, __ATOMIC_RELAXED);
}

void prima_expert_prefetch_hook(const prima_task *t, prima_window *w, int l, const float *x, int n, int after) {
  const prima_expert_prefetch *xp = __atomic_load_n(&w->xp, __ATOMIC_ACQUIRE);
  if (!xp) return;
  const int mode = xp->pass_mode; /* set before the pool started: the same on every thread */
  if (mode == PRIMA_XP_AHEAD && !after) predict(t, w, l, x, n);
  else if (mode == PRIMA_XP_EXACT && after) predict(t, w, l, x, n);
  else if (mode == PRIMA_XP_EARLY && !after && l == w->first) predict(t, w, l, x, n);
  else if (mode == PRIMA_XP_EARLY && after && l + 1 < w->end) predict(t, w, l + 1, x, n);
}

void prima_expert_prefetch_score(prima_window *w, int l, const int *first) {
  prima_expert_prefetch *xp = w->xp;
  if (!xp || xp->pred_layer[l & 1] != l) return;
  const unsigned char *pred = xp->pred + (size_t)(l & 1) * w->m->hp.n_expert;
  const uint64_t each = expert_bytes(w, &w->m->layers[l]);
  for (int e = 0; e < w->m->hp.n_expert; e++) {
    const int routed = first[e + 1] > first[e];
    if (pred[e] && routed) {
      xp->c.hits++;
      xp->c.used_bytes += each;
    } else if (pred[e]) {
      xp->c.wasted_bytes += each;
    } else if (routed) {
      xp->c.misses++;
    }
  }
  xp->pred_layer[l & 1] = -1;
}

/* An expert of a layer counts as resident when every page of its gate, up and down rows is in memory
 * (mincore): a routed expert short of a page still waits on the disk. */
int prima_window_expert_residency(prima_window *w, uint64_t *resident, uint64_t *total) {
  *resident = *total = 0;
  const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  unsigned char vec[4096];
  for (int l = w->first; l < w->end; l++) {
    const prima_layer *L = &w->m->layers[l];
    if (!L->gate_inp.data || !L->gate_exps.data) continue;
    for (int e = 0; e < w->m->hp.n_expert; e++) {
      uint64_t ranges[6];
      const int n = expert_ranges(w, L, e, ranges, 0);
      int all_in = 1;
      for (int i = 0; i < n && all_in; i++)
        for (uint64_t lo = ranges[2 * i]; lo < ranges[2 * i + 1] && all_in; lo += sizeof vec * page) {
          const uint64_t len = ranges[2 * i + 1] - lo < sizeof vec * page ? ranges[2 * i + 1] - lo : sizeof vec * page;
          if (mincore(w->m->map + lo, (size_t)len, vec) != 0) return errno;
          for (uint64_t p = 0; p < len / page; p++)
            if (!(vec[p] & 1)) { all_in = 0; break; }
        }
      *resident += (uint64_t)all_in;
      *total += 1;
    }
  }
  return 0;
}

/* Read-around on a fault in an expert tensor pulls in the neighbouring experts' rows, which a token
 * seldom routes to, and a 2 MiB folio holds several experts: a capped device faulted a folio in for one
 * and evicted hot experts with cold ones. The window's expert tensors are advised sparse (random != 0,
 * prima_advise_sparse) or back to the default. 0, or an errno. */
int prima_window_experts_random(prima_window *w, int random) {
  for (int l = w->first; l < w->end; l++) {
    const prima_layer *L = &w->m->layers[l];
    const prima_tensor *ts[3] = { &L->gate_exps, &L->up_exps, &L->down_exps };
    for (int i = 0; i < 3; i++) {
      const int rc = ts[i]->data ? prima_advise_sparse(w->m, ts[i], random) : 0;
      if (rc != 0) return rc;
    }
  }
  return 0;
}
