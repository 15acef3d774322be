/* The model and its windows: the weights stay in the mmap'd GGUF file, a window is a range of layers
 * with its own KV cache and scratch, allocated once when the window is made. Nothing here parses GGUF:
 * the TypeScript side hands over the tensor table and hyper-parameters it has already checked. */
#ifndef PRIMA_MODEL_H
#define PRIMA_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "sparse_attn.h"
#include "threadpool.h"

typedef struct {
  const uint8_t *data; /* NULL for an absent optional tensor */
  uint64_t offset;     /* in the file */
  int type;
  int64_t ne0, ne1;    /* row length, rows */
  size_t row_bytes;
  size_t n_bytes;
} prima_tensor;

/* Every tensor a layer of any supported family may have. The forward pass is built from shared blocks
 * (model.c): an optional tensor present turns its block on (QKV bias: qwen2; Q/K norms: qwen3, gemma3;
 * post-attention and post-FFN norms: gemma3). Which a family must have, TS checks (model/arch/). */
typedef struct {
  prima_tensor attn_norm, wq, wk, wv, wo, bq, bk, bv, ffn_norm, w_gate, w_up, w_down;
  prima_tensor q_norm, k_norm, attn_post_norm, ffn_post_norm;
  /* A mixture-of-experts feed-forward in place of w_gate/w_up/w_down: the router [n_embd -> n_expert]
   * and each expert's gate, up ([n_embd -> n_ff_exp]) and down ([n_ff_exp -> n_embd]) as one tensor of
   * n_expert such matrices, expert-major (ne1 = n_expert rows of each). */
  prima_tensor gate_inp, gate_exps, up_exps, down_exps;
  /* gpt-oss: the attention output's bias, a learned sink logit per head (a position every query sees,
   * with no value), and biases on the router ([n_expert]) and on every expert's gate, up and down
   * ([n_ff_exp or n_embd] x n_expert rows). */
  prima_tensor bo, sinks, gate_inp_b, gate_exps_b, up_exps_b, down_exps_b;
} prima_layer;

/* Feed-forward activation of the gated FFN: silu(gate) * up, gelu_tanh(gate) * up, or gpt-oss's clamped
 * SwiGLU (ggml's swiglu_oai: g = min(gate, 7), u = clamp(up, -7, 7), g * sigmoid(1.702 g) * (u + 1)). */
enum { PRIMA_FFN_SILU = 0, PRIMA_FFN_GELU = 1, PRIMA_FFN_SWIGLU_OAI = 2 };
/* How a token's experts and their weights come from the router's logits: softmax over all experts, the
 * k most probable, their probabilities renormalised (qwen3moe, Mixtral); or the k largest logits and a
 * softmax over those k (gpt-oss, llama.cpp's SOFTMAX_WEIGHT). */
enum { PRIMA_MOE_SOFTMAX_NORM = 0, PRIMA_MOE_TOPK_SOFTMAX = 1 };

/* Hyper-parameters and the per-model switches of the shared blocks; TS computes every value from the
 * family's file (model/arch/<family>.ts), C only applies them. */
typedef struct {
  int n_vocab, n_embd, n_layers, n_head, n_head_kv, head_dim, n_ff, rope_dims;
  int rope_neox;
  int ffn_act;        /* PRIMA_FFN_* */
  float norm_eps, rope_base, rope_freq_scale;
  float embd_scale;   /* token embeddings are multiplied by this (1: none; gemma: sqrt(n_embd)) */
  float q_scale;      /* Q is multiplied by this before attention (gemma's query scale; else 1) */
  float kq_scale;     /* attention scores are multiplied by this (1/sqrt(head_dim); gemma: 1) */
  float rope_base_swa, rope_freq_scale_swa; /* RoPE of the sliding-window layers */
  float rope_attn_factor; /* cos and sin are multiplied by this (rope.scaling.attn_factor; 1: none) */
  int n_ctx_orig;         /* a window of more context than this takes rope_factors_long, else _short */
  float attn_softcap;     /* attention scores become cap * tanh(score / cap) (gemma2); 0: none */
  float final_softcap;    /* the logits likewise (gemma2, some gemma3); 0: none */
  int n_expert, n_expert_used, n_ff_exp; /* mixture of experts: 0, 0, 0 for a dense model */
  int moe_gating;         /* PRIMA_MOE_* */
  /* YaRN as ggml's rope applies it: 0 for none, else each frequency's angle mixes the interpolated and
   * the original one by a ramp over the dims between the betas' correction dims (n_ctx_orig), and cos
   * and sin get the magnitude 1 + 0.1 ln(1/freq_scale) on top of rope_attn_factor */
  float rope_yarn_ext, rope_yarn_beta_fast, rope_yarn_beta_slow;
  const int *layer_window; /* per layer: 0 full causal attention, else a sliding window of that many
                              tokens; NULL: all full. Copied by prima_model_open. */
} prima_hparams;

/* One named tensor of the table TS hands over. */
typedef struct {
  const char *name;
  int type;
  int64_t ne0, ne1;
  uint64_t offset;
  uint64_t n_bytes;
} prima_tensor_desc;

typedef struct prima_model {
  int fd;
  uint8_t *map;
  size_t map_bytes;
  size_t willneed_chunk; /* prima_willneed's unit for this file's disk */
  struct prima_advisor *advisor; /* prima_window_prefetch_background's thread (advisor.h), made on first use */
  prima_hparams hp;
  prima_tensor tok_embd, output_norm, output, rope_freqs;
  prima_tensor rope_long, rope_short; /* phi3's LongRoPE frequency factors (absent elsewhere) */
  prima_layer *layers;
  int *layer_window; /* n_layers entries, see prima_hparams */
  prima_pool *pool;
  /* scratch of the output head (one row) */
  float *head_norm;
  void *head_act;
  /* The file as it was opened, to notice it changing under a running device (prima_model_check_file). */
  char *path;
  uint64_t file_dev, file_ino, file_size, file_now_size;
  int64_t file_mtime_ns;
  int file_state;          /* PRIMA_FILE_OK, or why the mapping can no longer be trusted (sticky) */
  int64_t file_checked_ns; /* monotonic time of the last identity check */
} prima_model;

/* Why a model's file can no longer be trusted. */
enum { PRIMA_FILE_OK, PRIMA_FILE_FAULT, PRIMA_FILE_RESIZED, PRIMA_FILE_MODIFIED, PRIMA_FILE_REPLACED, PRIMA_FILE_GONE };

typedef struct prima_window {
  prima_model *m;
  int first, end; /* layers [first, end) */
  int n_ctx, max_batch;
  int k_type, v_type;          /* the cache's element types: PRIMA_F16, PRIMA_Q8_0 or PRIMA_Q4_0 (kv_cache.h) */
  int k_rot, v_rot;            /* Hadamard rotation chunk of Q/K and of V/output (0: none; PRIMA_KV_ROTATED) */
  size_t k_row_bytes, v_row_bytes; /* one layer's row of one position: n_head_kv * head_dim elements */
  int n_filled;   /* positions [0, n_filled) of the cache hold data */
  uint8_t *k_cache, *v_cache;  /* per layer of the window, kv_cells[li] rows of row bytes from row kv_off[li] */
  int *kv_cells;  /* per layer: n_ctx, or for a sliding-window layer a ring of min(n_ctx, window + max_batch)
                     rows where position p sits in row p % cells (llama.cpp's iSWA cache size) */
  size_t *kv_off;
  int kv_end;     /* end of the furthest write since the cache last started at position 0: a ring holds
                     positions [kv_end - cells, kv_end) at most (prima_window_kv_resumable) */
  size_t kv_bytes;             /* both caches: rows over all layers x (k_row_bytes + v_row_bytes) */
  int kv_floor;   /* after a context shift of a wrapped ring, positions below this are lost too (kv_shift.c) */
  float *rope_cos, *rope_sin;  /* [n_ctx][rope_dims/2] */
  float *rope_cos_swa, *rope_sin_swa; /* the same for sliding-window layers (NULL: the window has none) */
  /* scratch, max_batch rows each */
  float *h, *q, *k, *v, *att, *gate, *up;
  void *act_a;                 /* quantized activations: up to 3 formats x max_batch rows */
  size_t act_row_bytes;        /* stride of a row in act_a/act_b */
  void *att_acc;               /* per thread: prima_kv_attend's scratch, att_scratch_bytes apart */
  size_t att_scratch_bytes;
  void *head_act;              /* max_batch rows of the head's activations: made by the first step of
                                  several sequences this window leads (prima_window_forward_seqs) */
  size_t anon_bytes;           /* KV + scratch: what the window costs in anonymous memory */
  size_t layer_bytes;          /* mean weight bytes one token's pass reads in one of its layers (a
                                  mixture of experts: all but the experts it does not use) */
  uint64_t weight_bytes;       /* weight bytes of all its layers, and of its largest */
  uint64_t largest_layer_bytes;
  /* mixture-of-experts scratch (NULL when the window has no such layer): for a batch of B tokens
   * using k experts each, B*k "expert rows" (a token's input to one of its experts) grouped by expert */
  float *moe_logits;           /* [B][n_expert] router logits, then probabilities */
  int *moe_sel;                /* [B][k] chosen experts, best first */
  float *moe_wt;               /* [B][k] their weights */
  int *moe_slot;               /* [B*k] expert row -> token * k + slot */
  int *moe_row;                /* [B*k] token * k + slot -> expert row */
  int *moe_first;              /* [n_expert + 1] an expert's first expert row */
  float *moe_gate, *moe_up;    /* [B*k][n_ff_exp] */
  float *moe_out;              /* [B*k][n_embd] */
  void *moe_act;               /* B*k activation rows in up to 2 formats (gate/up; then down) */
  struct prima_mm_s *moe_mm;   /* [3 * n_expert] the step's matmul items: gate and up, then down */
  prima_tensor *moe_view;      /* [3 * n_expert] their experts' 2-D slices */
  int *moe_mm_tokens;          /* [3 * n_expert] tokens of each item */
  uint64_t *expert_hits;       /* [layers of the window][n_expert]: tokens routed to each expert */
  struct prima_expert_prefetch *xp; /* expert prefetch (expert_prefetch.h); NULL: never enabled */
  int stream_from;             /* layers from here on are dropped right after each pass computes them
                                  (prima_window_stream_beyond); end: none */
  int experts_random;          /* MADV_RANDOM on the expert tensors (set while the window does not fit) */
  int experts_random_pinned;   /* set by the caller (expertsRandom): stream_beyond leaves it */
  uint64_t stream_keep;        /* bytes at the start of layer stream_from kept all the same */
  /* Sparse attention of the full-attention layers (sparse_attn.h; window 0: dense). A landmark per
   * layer, KV head and whole block of positions: lm_k/lm_v [layer][n_head_kv][lm_blocks][head_dim];
   * blocks [0, lm_done) hold the means of the rows the cache holds now (a write, shift or load below a
   * block's end lowers it; the next pass computes them again). */
  prima_sparse_cfg sparse;
  float *lm_k, *lm_v;
  int lm_blocks, lm_done;
  /* H2O's statistics (prima_window_set_h2o; NULL: not gathered): per compute thread, per position, the
   * attention probability every query of every layer and head gave it, accumulated (h2o_acc: threads x
   * n_ctx), and each thread's scores of one query's heads (h2o_raw: threads x n_head/n_head_kv x n_ctx) */
  float *h2o_acc, *h2o_raw;
  int h2o_threads;
} prima_window;

/* Opens and maps the file; validates the table against the file and hyper-parameters.
 * On failure returns NULL and writes a message into err. */
prima_model *prima_model_open(const char *path, const prima_tensor_desc *tensors, int n_tensors,
                              const prima_hparams *hp, int n_threads, int idle_spin_us, char *err, size_t err_len);
void prima_model_close(prima_model *m);

/* A tensor read sparsely (a row or an expert at a time): its pages without read-around and without
 * the mapping's huge pages (sparse != 0), or back to both (huge pages only where the mapping asked for
 * them): with huge pages the kernel reads and keeps 2 MiB around each fault whatever else it is told.
 * 0, or an errno. */
int prima_advise_sparse(const prima_model *m, const prima_tensor *t, int sparse);

/* k_type, v_type: the KV cache's types (PRIMA_F16, PRIMA_Q8_0 or PRIMA_Q4_0, a quantized one optionally
 * with PRIMA_KV_ROTATED); another, a quantized type whose blocks do not divide the head size, or a
 * rotation of a head that is no multiple of 64, fails naming it. */
prima_window *prima_window_create(prima_model *m, int first, int end, int n_ctx, int max_batch, int k_type, int v_type,
                                  char *err, size_t err_len);
void prima_window_destroy(prima_window *w);
/* Attention of the window's full-attention layers from now on: sparse by c (window 0: dense again).
 * Sliding-window layers keep their own window. 0, or -1 naming what is wrong (settings, memory). */
int prima_window_set_sparse(prima_window *w, const prima_sparse_cfg *c, char *err, size_t err_len);
/* Gathers H2O's statistics from now on: every query's attention probabilities, summed per position
 * over queries, layers and heads (a write at a position clears its sum and those after it, a shift
 * moves them with the rows). 0, or -1 (memory; with sparse attention, refused: landmarks are no position). */
int prima_window_set_h2o(prima_window *w, char *err, size_t err_len);
/* The sums for positions [0, n_filled) into out (n_filled floats). */
void prima_window_h2o_scores(const prima_window *w, float *out);
/* The RoPE frequency factors a window of n_ctx tokens uses (its tensor's data is NULL: none). */
const prima_tensor *prima_rope_factors(const prima_model *m, int n_ctx);

/* Runs the window's layers on n_tokens activation rows (n_embd floats each, updated in place) at
 * positions pos..pos+n_tokens-1. If logits is non-NULL, also applies the output norm and head to
 * the last row. Returns 0, or -1 with a message in err. */
int prima_window_forward(prima_window *w, float *acts, int pos, int n_tokens, float *logits, char *err, size_t err_len);

/* One decode step of n sequences in one pass over w's weights (continuous batching): row i of acts is
 * the token of the sequence whose KV cache is seqs[i] (distinct windows over w's layers and context)
 * at position pos[i]; its K/V go to that cache and its attention sees only it. The matmuls take the n
 * rows together (batch-invariant kernels: each row's result is the one it gets alone); w lends its
 * scratch (n <= its max_batch) and may be one of seqs. If logits is non-NULL, it receives n rows of
 * n_vocab, row i computed exactly as prima_window_forward computes a lone row's. */
int prima_window_forward_seqs(prima_window *w, prima_window *const *seqs, const int *pos, int n, float *acts, float *logits,
                              char *err, size_t err_len);

/* 0 while the mapped file is the one that was opened and every read of it succeeded; else -1 with a
 * message naming the file, and from then on always -1. A read that faults (the file was truncated, or
 * a disk error: SIGBUS) is seen at once; the file's identity (size, inode, mtime) is compared at most
 * every PRIMA_FILE_CHECK_MS unless force is set. Every window pass calls it before and after running. */
int prima_model_check_file(prima_model *m, int force, char *err, size_t err_len);

/* Output norm + head on one row, on the pool. */
void prima_model_logits(prima_model *m, const float *row, float *logits);
/* The output norm alone on n rows (x to y, n_embd each): the final hidden states an embedding pools,
 * the same function the head applies before its matrix. */
void prima_model_output_norm(prima_model *m, const float *x, float *y, int n);
/* Embedding rows for tokens (ids checked by the caller). */
void prima_model_embed(prima_model *m, const int32_t *tokens, int n, float *out);

/* Paging of a window's weights: 0 on success, else errno. Prefetch advises at most max_bytes, from
 * the window's first layer on (the order the forward pass reads them). */
int prima_window_prefetch(prima_window *w, uint64_t max_bytes);
/* The same advice given by the model's advisor thread: returns at once. Advising a window's bytes
 * takes as long as the kernel needs to allocate their pages and queue their reads (~25 ms for 100 MiB
 * here, the whole read on a fast disk), which on a ring device's lane thread delayed the next frame.
 * A newer request replaces one not yet done (the advisor stops the old one between chunks). */
int prima_window_prefetch_background(prima_window *w, uint64_t max_bytes);
int prima_window_release(prima_window *w);
/* Room a streamed window leaves unused beyond its largest layer (which the layer being read needs):
 * the 2 MiB block a release takes on each side of a layer, and 8 MiB for the room's reading moving
 * between passes (kept exactly to the room, reclaim took kept pages and a pass now and then reread the
 * whole window). Halda prices the same (halda STREAM_MARGIN_BYTES; test/native/paging.test.ts holds
 * the two together). */
#define PRIMA_STREAM_MARGIN_BYTES ((uint64_t)12 << 20)

/* From the next pass on, a window whose weights are more than room_bytes keeps its first bytes (whole
 * layers, then the start of the next, up to the room less its largest layer and
 * PRIMA_STREAM_MARGIN_BYTES) and drops the rest of each later layer right after the pass computes it:
 * it then rereads only that tail each pass and never holds more than what it keeps and the layer being
 * read. Left to the kernel, memory fills, reclaim demotes the kept layers too (it
 * keeps active and inactive file pages in balance), and a window reread about twice its excess a pass
 * (measured with /proc/<pid>/io). room_bytes >= its weights: nothing is dropped. Callable while a pass
 * runs: it takes effect at the next layer boundary (a layer released as the two fields change may keep
 * the other layer's share, once). */
/* A mixture of experts is not streamed unless stream_experts (the profiler's stand-in, which times
 * rereads from the disk): its experts stay for the page cache to keep (model.c). */
void prima_window_stream_beyond(prima_window *w, uint64_t room_bytes, int stream_experts);
/* Bytes of the window's weights resident in memory, and the total. */
int prima_window_residency(prima_window *w, uint64_t *resident, uint64_t *total);

/* Sliding-window layers keep only their last positions: the largest position <= pos (and <= n_filled)
 * a forward can continue from, pos when every ring still holds the window before it, else 0. */
int prima_window_kv_resumable(const prima_window *w, int pos);
/* Rows of K (or V) the window's cache holds, over all its layers. */
size_t prima_window_kv_rows(const prima_window *w);
int prima_window_kv_save(prima_window *w, const char *path, char *err, size_t err_len);
int prima_window_kv_load(prima_window *w, const char *path, char *err, size_t err_len);

/* Formats a message into err (when given) and returns -1: the error convention of the native core. */
int prima_fail(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* MADV_WILLNEED over [p, p + len) of a model's mapping, in pieces of the model's willneed_chunk: the
 * kernel reads at most its readahead window (the larger of the disk's read_ahead_kb and max_sectors_kb)
 * per call and silently skips the rest (a 100 MiB call read 8 MiB here). With gen, it stops between
 * pieces once *gen is no longer want (a newer request). Advice only: 0 or errno. */
int prima_willneed(const prima_model *m, uint8_t *p, size_t len, const uint64_t *gen, uint64_t want);

#endif
