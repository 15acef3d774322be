/* Context shift of a window's KV cache (llama.cpp's llama_memory_seq_rm + seq_add on one sequence):
 * when the context is full, the positions [p0, p0 + n_discard) are dropped and the later ones move
 * down by n_discard, each cached key rotated back by n_discard positions with the layer's own RoPE. */
#ifndef PRIMA_KV_SHIFT_H
#define PRIMA_KV_SHIFT_H

#include <stddef.h>

#include "model.h"

/* Drops positions [p0, p0 + n_discard) of the cache and moves [p0 + n_discard, n_past) down to p0:
 * V rows copied, K rows rotated by -n_discard with the RoPE the layer computed them with (normal or
 * neox, its rotary dims, its base and scale: the sliding-window layers' own, the window's frequency
 * factors; the attention factor not again: a key computed at its new position has it once). The
 * cache then holds n_past - n_discard positions. Runs on the model's pool. 0, or -1 with err. */
int prima_window_kv_shift(prima_window *w, int p0, int n_discard, int n_past, char *err, size_t err_len);

#endif
