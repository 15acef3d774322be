/* Expert prefetch of a mixture-of-experts window: before a MoE layer computes, its router is applied to
 * the layer's input, the experts it will probably use are predicted, and their bytes (each one's
 * gate, up and down rows) are advised to the OS (MADV_WILLNEED), so that on a device short of memory
 * the pages are read while the layer's attention computes. Prediction never changes a result: it
 * writes only scratch that the layer overwrites before reading, and its own flags. */
#ifndef PRIMA_EXPERT_PREFETCH_H
#define PRIMA_EXPERT_PREFETCH_H

#include <stdint.h>

#include "model.h"
#include "threadpool.h"

/* When a layer's experts are predicted (model.c calls the hook before and after each layer's attention):
 * - AHEAD: from the layer's input x (the previous layer's output), before its attention. The router
 *   reads ffn_norm(x + attention(x)); the predictor takes ffn_norm(x): the cheapest honest stand-in,
 *   the attention's residual left out (the residual stream changes little in one layer).
 * - EXACT: from the router's own input, after the attention (the prediction is the routing itself: a
 *   check of the predictor, and a bound on its hit rate; too late to hide any read).
 * - EARLY: layer l + 1's from layer l's state after its attention (l + 1's ffn_norm and router on it:
 *   its own FFN and l + 1's attention left out), so its reads have layer l's experts and layer
 *   l + 1's attention to hide behind; the window's first layer as AHEAD. */
enum { PRIMA_XP_OFF = 0, PRIMA_XP_AHEAD = 1, PRIMA_XP_EXACT = 2, PRIMA_XP_EARLY = 3 };

typedef struct {
  uint64_t layers;        /* MoE layer passes predicted */
  uint64_t predicted;     /* experts predicted (a layer pass: the union over its tokens) */
  uint64_t hits;          /* of them, routed to by the pass */
  uint64_t misses;        /* routed to, not predicted */
  uint64_t advised_bytes; /* bytes advised (the predicted experts' gate, up and down) */
  uint64_t used_bytes;    /* of them, an expert's that was routed to */
  uint64_t wasted_bytes;  /* of them, an expert's that was not */
} prima_xp_counters;

/* The advice goes to an advisor thread of the window's own (advisor.h): MADV_WILLNEED on a file
 * mapping allocates the pages and submits their reads before it returns, which on the compute thread
 * delayed the layer it was meant to hide behind (measured: decode slower with the advice inline than
 * without it). A newer layer's request replaces the older one's: that layer is computing by then. */
typedef struct prima_expert_prefetch {
  int mode;               /* PRIMA_XP_*, as last set (any thread, any time) */
  int pass_mode;          /* the mode of the pass running: every thread of a pass must see the same,
                             or some would meet the predictor's barriers and others not */
  int pred_layer[2];      /* the layer pred[i] is for (layer % 2), -1: none */
  unsigned char *pred;    /* [2][n_expert] */
  prima_xp_counters c;
  struct prima_advisor *advisor;
  uint64_t *ranges;       /* [3 * n_expert][2]: page-aligned byte ranges [lo, hi) of the file to advise */
} prima_expert_prefetch;

/* Sets the window's mode (a window without experts accepts only OFF). 0, or -1 with a message. */
int prima_window_expert_prefetch(prima_window *w, int mode, char *err, size_t err_len);
/* The window's counters since it was made (zeros when never enabled). */
prima_xp_counters prima_window_expert_prefetch_counters(const prima_window *w);
void prima_expert_prefetch_free(prima_window *w);
/* Experts of the window's MoE layers (a layer's expert counted once per layer) wholly in memory, of
 * all of them (0 of 0 for a dense window). 0, or an errno. */
int prima_window_expert_residency(prima_window *w, uint64_t *resident, uint64_t *total);
/* The window's expert tensors advised sparse (random != 0: no read-around, no huge pages) or back to
 * the mapping's defaults (prima_advise_sparse). 0, or an errno. */
int prima_window_experts_random(prima_window *w, int random);

/* The experts layer l routes to this pass (first: per expert, the start of its rows, as the MoE step
 * groups them), advised in whole (MADV_WILLNEED) where the window reads its experts without
 * read-around or huge pages: one read of each slice where its faults would read it a page at a time. */
void prima_expert_routed_willneed(prima_window *w, int l, const int *first);

/* In the forward pass, on every thread, before (after = 0) and after (1) layer l's attention: predicts
 * the experts of the MoE layer the window's mode says from rows x (n of them) and advises their bytes.
 * Uses w->h, the activation scratch and the router scratch, which the layer's own blocks overwrite
 * before reading. */
/* Before a pass starts its threads: fixes the mode it runs with. */
void prima_expert_prefetch_begin(prima_window *w);
void prima_expert_prefetch_hook(const prima_task *t, prima_window *w, int l, const float *x, int n, int after);
/* Thread 0, once layer l has routed its tokens (first: moe_block's per-expert row starts): scores the
 * prediction against the routing. */
void prima_expert_prefetch_score(prima_window *w, int l, const int *first);

/* model.c's routing of one token (the predictor routes as the layer does). */
void prima_moe_route(const prima_hparams *hp, const prima_layer *L, float *logits, int *sel, float *wt);

#endif
