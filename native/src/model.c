#include "model.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "advisor.h"
#include "attn_tile.h"
#include "expert_prefetch.h"
#include "kernels.h"
#include "kv_cache.h"
#include "matmul.h"
#include "ops.h"

#define PRIMA_MAX_EXPERTS 1024 /* llama.cpp's LLAMA_MAX_EXPERTS */
#define MAX_ACT_FORMATS 3 /* distinct activation formats one input may need (mixed weight types) */
#define SMALL_LAYER_BYTES (512 * 1024) /* below this per layer, one token runs on one thread */

/* A layer's tensors, as an array: prima_layer holds nothing but prima_tensors, attn_norm first. */
#define LAYER_N_TENSORS ((int)(sizeof(prima_layer) / sizeof(prima_tensor)))
static const prima_tensor *layer_tensors(const prima_layer *L) { return &L->attn_norm; }

/* Bytes of a layer's weights in the file. */
static uint64_t layer_weight_bytes(const prima_layer *L) {
  const prima_tensor *ts = layer_tensors(L);
  uint64_t bytes = 0;
  for (int i = 0; i < LAYER_N_TENSORS; i++) bytes += ts[i].n_bytes;
  return bytes;
}

int prima_fail(char *err, size_t err_len, const char *fmt, ...) {
  if (err && err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* ---- the mapped file under a running device ---------------------------------------------- */

/* The weights are read straight from the mapped file, so a file truncated under a running device makes
 * the next read of a page past its new end raise SIGBUS, which would kill the process with no message.
 * A process-wide SIGBUS handler looks the faulting address up among the open models' mappings; for one
 * of ours it maps zero pages over the rest of that mapping and returns, so the faulting read (on any
 * thread: a pool worker, the lane, the JS thread) goes on with zeros, and the model is marked: the pass
 * that faulted and every later one return an error naming the file. Jumping out of the pass instead
 * (siglongjmp) would strand the pool's other threads at their next barrier. A fault outside our
 * mappings goes to the handler that was there before (by default: the process dies as it would have). */

#define PRIMA_FILE_CHECK_MS 50 /* identity checks cost ~1 us (fstat + stat): at most this often */
#define GUARD_SLOTS 256

typedef struct {
  uintptr_t lo, hi;
  prima_model *m; /* NULL: a free slot */
} guard_slot;

static guard_slot guards[GUARD_SLOTS];
static pthread_mutex_t guards_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;
static struct sigaction guard_prev;
static int guard_installed;
static uintptr_t guard_page = 4096;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
  const uintptr_t a = (uintptr_t)si->si_addr;
  if (si->si_code > 0) { /* raised by the kernel for a memory access, not sent by kill() */
    for (int i = 0; i < GUARD_SLOTS; i++) {
      prima_model *m = __atomic_load_n(&guards[i].m, __ATOMIC_ACQUIRE);
      if (!m || a < guards[i].lo || a >= guards[i].hi) continue;
      const uintptr_t page = a & ~(guard_page - 1);
      /* mmap is a plain system call here; zero pages up to the mapping's end, so later reads of
       * pages past the new end fault no more */
      if (mmap((void *)page, guards[i].hi - page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
        break;
      __atomic_store_n(&m->file_state, PRIMA_FILE_FAULT, __ATOMIC_RELEASE);
      return;
    }
  }
  if ((guard_prev.sa_flags & SA_SIGINFO) && guard_prev.sa_sigaction) {
    guard_prev.sa_sigaction(sig, si, uc);
  } else if (guard_prev.sa_handler != SIG_DFL && guard_prev.sa_handler != SIG_IGN) {
    guard_prev.sa_handler(sig);
  } else {
    /* the default action: returning re-runs the access, which faults again and ends the process */
    signal(SIGBUS, SIG_DFL);
  }
}

static void guard_install(void) {
  const long page = sysconf(_SC_PAGESIZE);
  if (page > 0) guard_page = (uintptr_t)page;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  guard_installed = sigaction(SIGBUS, &sa, &guard_prev) == 0;
}

/* Watches m's mapping; without a free slot the model still works, only unguarded. */
static void guard_add(prima_model *m) {
  pthread_once(&guard_once, guard_install);
  if (!guard_installed) return;
  pthread_mutex_lock(&guards_lock);
  for (int i = 0; i < GUARD_SLOTS; i++) {
    if (guards[i].m) continue;
    guards[i].lo = (uintptr_t)m->map;
    guards[i].hi = (uintptr_t)m->map + m->map_bytes;
    __atomic_store_n(&guards[i].m, m, __ATOMIC_RELEASE);
    break;
  }
  pthread_mutex_unlock(&guards_lock);
}

static void guard_remove(prima_model *m) {
  pthread_mutex_lock(&guards_lock);
  for (int i = 0; i < GUARD_SLOTS; i++)
    if (guards[i].m == m) __atomic_store_n(&guards[i].m, NULL, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&guards_lock);
}

static int64_t mono_ns(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t mtime_ns(const struct stat *st) {
#if defined(__APPLE__)
  return (int64_t)st->st_mtimespec.tv_sec * 1000000000 + st->st_mtimespec.tv_nsec;
#else
  return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
#endif
}

#if defined(CLOCK_MONOTONIC_COARSE)
#define CHECK_CLOCK CLOCK_MONOTONIC_COARSE /* a few ns through the vDSO */
#else
#define CHECK_CLOCK CLOCK_MONOTONIC
#endif

int prima_model_check_file(prima_model *m, int force, char *err, size_t err_len) {
  int state = __atomic_load_n(&m->file_state, __ATOMIC_ACQUIRE);
  if (state == PRIMA_FILE_OK && m->path) {
    const int64_t now = mono_ns(CHECK_CLOCK);
    const int64_t last = __atomic_load_n(&m->file_checked_ns, __ATOMIC_RELAXED);
    if (force || now - last >= (int64_t)PRIMA_FILE_CHECK_MS * 1000000) {
      __atomic_store_n(&m->file_checked_ns, now, __ATOMIC_RELAXED);
      struct stat st, at;
      int found = PRIMA_FILE_OK;
      if (fstat(m->fd, &st) == 0) {
        if ((uint64_t)st.st_size != m->file_size) {
          found = PRIMA_FILE_RESIZED;
          m->file_now_size = (uint64_t)st.st_size;
        } else if (mtime_ns(&st) != m->file_mtime_ns) {
          found = PRIMA_FILE_MODIFIED;
        }
      }
      if (found == PRIMA_FILE_OK) {
        if (stat(m->path, &at) != 0) {
          if (errno == ENOENT) found = PRIMA_FILE_GONE;
        } else if ((uint64_t)at.st_dev != m->file_dev || (uint64_t)at.st_ino != m->file_ino) {
          found = PRIMA_FILE_REPLACED;
        }
      }
      if (found != PRIMA_FILE_OK) {
        int expected = PRIMA_FILE_OK; /* a fault seen meanwhile is the better explanation */
        __atomic_compare_exchange_n(&m->file_state, &expected, found, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
      }
      state = __atomic_load_n(&m->file_state, __ATOMIC_ACQUIRE);
    }
  }
  const char *path = m->path ? m->path : "(unknown)";
  switch (state) {
    case PRIMA_FILE_OK:
      return 0;
    case PRIMA_FILE_FAULT:
      return prima_fail(err, err_len, "model file %s could not be read while in use (truncated, or a disk error); this device stopped using it", path);
    case PRIMA_FILE_RESIZED:
      return prima_fail(err, err_len, "model file %s changed while in use: %llu bytes when opened, %llu now; this device stopped using it", path,
                        (unsigned long long)m->file_size, (unsigned long long)m->file_now_size);
    case PRIMA_FILE_MODIFIED:
      return prima_fail(err, err_len, "model file %s was modified while in use; this device stopped using it", path);
    case PRIMA_FILE_REPLACED:
      return prima_fail(err, err_len, "model file %s was replaced by another file while in use; this device stopped using it", path);
    default:
      return prima_fail(err, err_len, "model file %s was removed or renamed while in use; this device stopped using it", path);
  }
}

/* ---- opening ------------------------------------------------------------------------------ */

static const prima_tensor_desc *find(const prima_tensor_desc *t, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(t[i].name, name) == 0) return &t[i];
  return NULL;
}

/* Resolves one tensor: present (unless optional), inside the file, the expected shape, with kernels. */
static int bind_tensor(prima_model *m, const prima_tensor_desc *all, int n, const char *name, int64_t ne0,
                       int64_t ne1, int optional, int f32_only, prima_tensor *out, char *err, size_t err_len) {
  memset(out, 0, sizeof *out);
  const prima_tensor_desc *d = find(all, n, name);
  if (!d) return optional ? 0 : prima_fail(err, err_len, "missing tensor %s", name);
  if (d->ne0 != ne0 || d->ne1 != ne1)
    return prima_fail(err, err_len, "tensor %s has shape [%lld, %lld], expected [%lld, %lld]", name, (long long)d->ne0,
                (long long)d->ne1, (long long)ne0, (long long)ne1);
  if (f32_only && d->type != PRIMA_F32) return prima_fail(err, err_len, "tensor %s must be F32", name);
  const prima_type_kernels *k = prima_kernels(d->type);
  if (!k) return prima_fail(err, err_len, "tensor %s: no kernels for type %d", name, d->type);
  const size_t row_bytes = prima_row_bytes(d->type, ne0);
  if (row_bytes == 0) return prima_fail(err, err_len, "tensor %s: row of %lld is not whole blocks", name, (long long)ne0);
  const uint64_t bytes = (uint64_t)row_bytes * (uint64_t)ne1;
  if (bytes != d->n_bytes) return prima_fail(err, err_len, "tensor %s: %llu bytes expected, table says %llu", name,
                                       (unsigned long long)bytes, (unsigned long long)d->n_bytes);
  if (d->offset > m->map_bytes || bytes > m->map_bytes - d->offset)
    return prima_fail(err, err_len, "tensor %s: offset %llu + %llu bytes is past the end of the file (%zu bytes)", name,
                (unsigned long long)d->offset, (unsigned long long)bytes, m->map_bytes);
  out->data = m->map + d->offset;
  out->offset = d->offset;
  out->type = d->type;
  out->ne0 = ne0;
  out->ne1 = ne1;
  out->row_bytes = row_bytes;
  out->n_bytes = bytes;
  return 0;
}

/* Whether the weights map with huge pages (PRIMA_NO_THP turns them off). */
static int huge_pages_wanted(void) { return getenv("PRIMA_NO_THP") == NULL; }

int prima_advise_sparse(const prima_model *m, const prima_tensor *t, int sparse) {
  const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  const uint64_t map_end = ((uint64_t)m->map_bytes + page - 1) & ~(page - 1);
  const uint64_t lo = t->offset & ~(page - 1);
  uint64_t hi = (t->offset + t->n_bytes + page - 1) & ~(page - 1);
  if (hi > map_end) hi = map_end;
  if (hi <= lo) return 0;
  uint8_t *p = m->map + lo;
  const size_t len = (size_t)(hi - lo);
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
  if (sparse || huge_pages_wanted()) madvise(p, len, sparse ? MADV_NOHUGEPAGE : MADV_HUGEPAGE); /* advice only */
#endif
#ifdef MADV_RANDOM
  if (madvise(p, len, sparse ? MADV_RANDOM : MADV_NORMAL) != 0) return errno;
#endif
  return 0;
}

/* Maps the file read-only at a 2 MiB-aligned address and asks for huge pages: where the file system
 * keeps large folios (ext4 and xfs on recent Linux), the weights then map with 2 MiB pages, read in by
 * 2 MiB readahead, and a token's pass over them needs a few hundred TLB entries instead of a page-table
 * walk per 4 KiB. Returns NULL (errno set) on failure. */
static uint8_t *map_weights(int fd, size_t bytes) {
  const size_t huge = (size_t)2 << 20;
#if defined(MAP_FIXED) && defined(MADV_HUGEPAGE)
  if (huge_pages_wanted()) {
    /* reserve one huge page more, map the file over the aligned part, give back the rest */
    uint8_t *span = mmap(NULL, bytes + huge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (span != MAP_FAILED) {
      uint8_t *at = (uint8_t *)(((uintptr_t)span + huge - 1) & ~(uintptr_t)(huge - 1));
      uint8_t *p = mmap(at, bytes, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
      if (p != MAP_FAILED) {
        if (at > span) munmap(span, (size_t)(at - span));
        const size_t tail = (size_t)(span + huge - at); /* the reservation past the file's end */
        if (tail) munmap(at + bytes, tail);
        madvise(p, bytes, MADV_HUGEPAGE); /* advice only: without THP it changes nothing */
        return p;
      }
      munmap(span, bytes + huge);
    }
  }
#endif
  void *p = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? NULL : p;
}

/* The most bytes one MADV_WILLNEED reads on the disk behind st_dev: the kernel's force_page_cache_ra
 * caps a call at max(bdi->io_pages, ra_pages), which sysfs shows as max_sectors_kb and read_ahead_kb
 * (a partition's are its disk's). 128 KiB (the usual read_ahead_kb) where they cannot be read. */
static size_t willneed_chunk_bytes(dev_t dev) {
  size_t best = 0;
  static const char *const files[] = {"queue/read_ahead_kb", "queue/max_sectors_kb", "../queue/read_ahead_kb", "../queue/max_sectors_kb"};
  for (int i = 0; i < 4; i++) {
    char path[96];
    snprintf(path, sizeof path, "/sys/dev/block/%u:%u/%s", major(dev), minor(dev), files[i]);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    unsigned long kb = 0;
    if (fscanf(f, "%lu", &kb) == 1 && kb * 1024 > best) best = kb * 1024;
    fclose(f);
  }
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (best == 0) best = 128 << 10;
  if (best > (64u << 20)) best = 64u << 20;
  return best < page ? page : best & ~(page - 1);
}

int prima_willneed(const prima_model *m, uint8_t *p, size_t len, const uint64_t *gen, uint64_t want) {
  for (size_t done = 0; done < len && (!gen || __atomic_load_n(gen, __ATOMIC_ACQUIRE) == want); done += m->willneed_chunk) {
    const size_t n = len - done < m->willneed_chunk ? len - done : m->willneed_chunk;
    if (madvise(p + done, n, MADV_WILLNEED) != 0) return errno;
  }
  return 0;
}

prima_model *prima_model_open(const char *path, const prima_tensor_desc *tensors, int n_tensors,
                              const prima_hparams *hp, int n_threads, int idle_spin_us, char *err, size_t err_len) {
  prima_kernels_init();
  prima_ops_init();
  if (hp->n_embd <= 0 || hp->n_layers <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->head_dim <= 0 ||
      hp->n_ff <= 0 || hp->n_vocab <= 0 || hp->n_head % hp->n_head_kv != 0 || hp->rope_dims > hp->head_dim ||
      hp->rope_dims % 2 != 0 || (hp->ffn_act != PRIMA_FFN_SILU && hp->ffn_act != PRIMA_FFN_GELU && hp->ffn_act != PRIMA_FFN_SWIGLU_OAI) ||
      !(hp->embd_scale > 0) || !(hp->q_scale > 0) || !(hp->kq_scale > 0) || !(hp->rope_base_swa > 1) ||
      !(hp->rope_freq_scale_swa > 0) || !(hp->rope_attn_factor > 0) || hp->n_ctx_orig < 1 || !(hp->attn_softcap >= 0) ||
      !(hp->final_softcap >= 0) || (hp->ffn_act == PRIMA_FFN_SWIGLU_OAI && hp->n_expert == 0) ||
      (hp->moe_gating != PRIMA_MOE_SOFTMAX_NORM && hp->moe_gating != PRIMA_MOE_TOPK_SOFTMAX) || !(hp->rope_yarn_ext >= 0) ||
      (hp->rope_yarn_ext > 0 && !(hp->rope_yarn_beta_fast > 0 && hp->rope_yarn_beta_slow > 0)) || hp->n_expert < 0 || hp->n_expert > PRIMA_MAX_EXPERTS ||
      (hp->n_expert > 0 && (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert || hp->n_ff_exp < 1))) {
    prima_fail(err, err_len, "invalid hyper-parameters");
    return NULL;
  }
  prima_model *m = calloc(1, sizeof *m);
  if (!m) {
    prima_fail(err, err_len, "out of memory");
    return NULL;
  }
  m->fd = -1;
  m->hp = *hp;
  m->hp.layer_window = NULL; /* the caller's array: m->layer_window holds the copy */
  m->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (m->fd < 0) {
    prima_fail(err, err_len, "cannot open %s: %s", path, strerror(errno));
    goto bad;
  }
  struct stat st;
  if (fstat(m->fd, &st) != 0 || st.st_size <= 0) {
    prima_fail(err, err_len, "cannot stat %s", path);
    goto bad;
  }
  m->map_bytes = (size_t)st.st_size;
  m->willneed_chunk = willneed_chunk_bytes(st.st_dev);
  m->map = map_weights(m->fd, m->map_bytes);
  if (!m->map) {
    prima_fail(err, err_len, "cannot map %s: %s", path, strerror(errno));
    goto bad;
  }
  m->path = strdup(path);
  m->file_dev = (uint64_t)st.st_dev;
  m->file_ino = (uint64_t)st.st_ino;
  m->file_size = (uint64_t)st.st_size;
  m->file_mtime_ns = mtime_ns(&st);
  m->file_checked_ns = mono_ns(CHECK_CLOCK);
  guard_add(m);

  const int E = hp->n_embd, D = hp->head_dim;
  const int64_t qdim = (int64_t)hp->n_head * D, kvdim = (int64_t)hp->n_head_kv * D;
  if (bind_tensor(m, tensors, n_tensors, "token_embd.weight", E, hp->n_vocab, 0, 0, &m->tok_embd, err, err_len) ||
      bind_tensor(m, tensors, n_tensors, "output_norm.weight", E, 1, 0, 1, &m->output_norm, err, err_len) ||
      bind_tensor(m, tensors, n_tensors, "output.weight", E, hp->n_vocab, 1, 0, &m->output, err, err_len) ||
      bind_tensor(m, tensors, n_tensors, "rope_freqs.weight", hp->rope_dims / 2, 1, 1, 1, &m->rope_freqs, err, err_len) ||
      bind_tensor(m, tensors, n_tensors, "rope_factors_long.weight", hp->rope_dims / 2, 1, 1, 1, &m->rope_long, err, err_len) ||
      bind_tensor(m, tensors, n_tensors, "rope_factors_short.weight", hp->rope_dims / 2, 1, 1, 1, &m->rope_short, err, err_len))
    goto bad;
  if (!m->output.data) m->output = m->tok_embd; /* tied embeddings */
  else if (m->tok_embd.data) {
    /* An untied embedding table is read a row per token, rows far apart: without readahead a row
     * costs its own pages instead of the 2 MiB read around it (test/native/paging.test.ts: 20 rows
     * 6.5 MB before, 0.27 MB after; Halda counts one row). */
    prima_advise_sparse(m, &m->tok_embd, 1); /* advice only */
  }
  m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
  if (!m->layers) {
    prima_fail(err, err_len, "out of memory");
    goto bad;
  }
  /* One table binds every family's layer tensors: a slot's shape is given by what it multiplies
   * (E: the hidden size, Q/KV: the query and key/value widths, D: one head, F: the FFN width). The
   * tensors each family requires are checked by TS (model/arch/); here the optional ones may be absent
   * and everything present must fit. */
  enum { S_E, S_Q, S_KV, S_D, S_F, S_1, S_X, S_FX, S_EX, S_FE, S_H };
  static const struct {
    size_t field;
    const char *suffix;
    int ne0, ne1, optional, f32;
  } slots[] = {
    { offsetof(prima_layer, attn_norm), "attn_norm.weight", S_E, S_1, 0, 1 },
    { offsetof(prima_layer, wq), "attn_q.weight", S_E, S_Q, 0, 0 },
    { offsetof(prima_layer, wk), "attn_k.weight", S_E, S_KV, 0, 0 },
    { offsetof(prima_layer, wv), "attn_v.weight", S_E, S_KV, 0, 0 },
    { offsetof(prima_layer, wo), "attn_output.weight", S_Q, S_E, 0, 0 },
    { offsetof(prima_layer, bq), "attn_q.bias", S_Q, S_1, 1, 1 },
    { offsetof(prima_layer, bk), "attn_k.bias", S_KV, S_1, 1, 1 },
    { offsetof(prima_layer, bv), "attn_v.bias", S_KV, S_1, 1, 1 },
    { offsetof(prima_layer, q_norm), "attn_q_norm.weight", S_D, S_1, 1, 1 },
    { offsetof(prima_layer, k_norm), "attn_k_norm.weight", S_D, S_1, 1, 1 },
    { offsetof(prima_layer, attn_post_norm), "post_attention_norm.weight", S_E, S_1, 1, 1 },
    { offsetof(prima_layer, ffn_norm), "ffn_norm.weight", S_E, S_1, 0, 1 },
    { offsetof(prima_layer, w_gate), "ffn_gate.weight", S_E, S_F, 1, 0 },
    { offsetof(prima_layer, w_up), "ffn_up.weight", S_E, S_F, 1, 0 },
    { offsetof(prima_layer, w_down), "ffn_down.weight", S_F, S_E, 1, 0 },
    { offsetof(prima_layer, ffn_post_norm), "post_ffw_norm.weight", S_E, S_1, 1, 1 },
    /* the experts' 3-D tensors bind as 2-D: n_expert matrices' rows one after another */
    { offsetof(prima_layer, gate_inp), "ffn_gate_inp.weight", S_E, S_X, 1, 0 },
    { offsetof(prima_layer, gate_exps), "ffn_gate_exps.weight", S_E, S_FX, 1, 0 },
    { offsetof(prima_layer, up_exps), "ffn_up_exps.weight", S_E, S_FX, 1, 0 },
    { offsetof(prima_layer, down_exps), "ffn_down_exps.weight", S_FE, S_EX, 1, 0 },
    { offsetof(prima_layer, bo), "attn_output.bias", S_E, S_1, 1, 1 },
    { offsetof(prima_layer, sinks), "attn_sinks.weight", S_H, S_1, 1, 1 },
    { offsetof(prima_layer, gate_inp_b), "ffn_gate_inp.bias", S_X, S_1, 1, 1 },
    { offsetof(prima_layer, gate_exps_b), "ffn_gate_exps.bias", S_FE, S_X, 1, 1 },
    { offsetof(prima_layer, up_exps_b), "ffn_up_exps.bias", S_FE, S_X, 1, 1 },
    { offsetof(prima_layer, down_exps_b), "ffn_down_exps.bias", S_E, S_X, 1, 1 },
  };
  const int64_t size_of[] = { E, qdim, kvdim, D, hp->n_ff, 1, hp->n_expert, (int64_t)hp->n_ff_exp * hp->n_expert,
                              (int64_t)E * hp->n_expert, hp->n_ff_exp, hp->n_head };
  m->layer_window = calloc((size_t)hp->n_layers, sizeof *m->layer_window);
  if (!m->layer_window) {
    prima_fail(err, err_len, "out of memory");
    goto bad;
  }
  for (int l = 0; l < hp->n_layers; l++) {
    prima_layer *L = &m->layers[l];
    char name[96];
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) {
      snprintf(name, sizeof name, "blk.%d.%s", l, slots[i].suffix);
      if (bind_tensor(m, tensors, n_tensors, name, size_of[slots[i].ne0], size_of[slots[i].ne1], slots[i].optional, slots[i].f32,
                      (prima_tensor *)((char *)L + slots[i].field), err, err_len))
        goto bad;
    }
    /* the blocks come in pairs: Q without K norm (or a partial QKV bias) is no family's layer */
    if (!L->q_norm.data != !L->k_norm.data || !L->bq.data != !L->bk.data || !L->bq.data != !L->bv.data) {
      prima_fail(err, err_len, "layer %d has only part of the Q/K norms or of the QKV biases", l);
      goto bad;
    }
    /* a feed-forward is either dense or a mixture of experts, whole */
    const int dense = (L->w_gate.data != NULL) + (L->w_up.data != NULL) + (L->w_down.data != NULL);
    const int moe = (L->gate_inp.data != NULL) + (L->gate_exps.data != NULL) + (L->up_exps.data != NULL) + (L->down_exps.data != NULL);
    if (!((dense == 3 && moe == 0) || (dense == 0 && moe == 4))) {
      prima_fail(err, err_len, "layer %d has neither a whole dense feed-forward (ffn_gate/up/down) nor a whole mixture of experts "
                 "(ffn_gate_inp, ffn_gate/up/down_exps)", l);
      goto bad;
    }
    /* the experts' biases come all together, and only with experts */
    const int exp_b = (L->gate_inp_b.data != NULL) + (L->gate_exps_b.data != NULL) + (L->up_exps_b.data != NULL) + (L->down_exps_b.data != NULL);
    if (exp_b != 0 && (exp_b != 4 || moe != 4)) {
      prima_fail(err, err_len, "layer %d has only part of the experts' biases (ffn_gate_inp/gate_exps/up_exps/down_exps.bias), "
                 "or biases without experts", l);
      goto bad;
    }
    if (hp->layer_window) {
      if (hp->layer_window[l] < 0) {
        prima_fail(err, err_len, "layer %d: sliding window %d is negative", l, hp->layer_window[l]);
        goto bad;
      }
      m->layer_window[l] = hp->layer_window[l];
    }
  }
  m->pool = prima_pool_create(n_threads, idle_spin_us);
  m->head_norm = malloc(sizeof(float) * (size_t)E);
  m->head_act = malloc(prima_row_bytes(PRIMA_F32, E)); /* F32 is the widest activation format */
  if (!m->pool || !m->head_norm || !m->head_act) {
    prima_fail(err, err_len, "out of memory");
    goto bad;
  }
  return m;
bad:
  prima_model_close(m);
  return NULL;
}

void prima_model_close(prima_model *m) {
  if (!m) return;
  prima_advisor_stop(m->advisor);
  prima_pool_destroy(m->pool);
  free(m->layers);
  free(m->layer_window);
  free(m->head_norm);
  free(m->head_act);
  guard_remove(m);
  free(m->path);
  if (m->map) munmap(m->map, m->map_bytes);
  if (m->fd >= 0) close(m->fd);
  free(m);
}

/* ---- the KV cache's rows: sliding-window layers as rings ---------------------------------- */

/* A sliding-window layer attends to its last `window` positions, so its cache is a ring of
 * min(n_ctx, window + max_batch) rows (llama.cpp's iSWA cache: n_swa + n_ubatch): a batch writes its
 * rows before it attends, and its first token still finds the window before it. */
static int kv_layout(prima_window *w) {
  const int nl = w->end - w->first;
  w->kv_cells = malloc(sizeof(int) * (size_t)nl);
  w->kv_off = malloc(sizeof(size_t) * (size_t)nl);
  if (!w->kv_cells || !w->kv_off) return -1;
  size_t off = 0;
  for (int li = 0; li < nl; li++) {
    const int64_t window = w->m->layer_window[w->first + li];
    const int64_t ring = window + w->max_batch;
    w->kv_cells[li] = window > 0 && ring < w->n_ctx ? (int)ring : w->n_ctx;
    w->kv_off[li] = off;
    off += (size_t)w->kv_cells[li];
  }
  w->kv_end = 0;
  return 0;
}

size_t prima_window_kv_rows(const prima_window *w) {
  const int nl = w->end - w->first;
  return w->kv_off[nl - 1] + (size_t)w->kv_cells[nl - 1];
}

/* Layer li's K and V rows, and the row of a position in them. */
static inline uint8_t *kv_k_rows(const prima_window *w, int li) { return w->k_cache + w->kv_off[li] * w->k_row_bytes; }
static inline uint8_t *kv_v_rows(const prima_window *w, int li) { return w->v_cache + w->kv_off[li] * w->v_row_bytes; }
static inline int kv_row(const prima_window *w, int li, int pos) { return pos % w->kv_cells[li]; }
/* Positions from p on in contiguous rows of layer li, at most n of them (a ring wraps at its end). */
static inline int kv_run(const prima_window *w, int li, int p, int n) {
  const int left = w->kv_cells[li] - kv_row(w, li, p);
  return n < left ? n : left;
}

int prima_window_kv_resumable(const prima_window *w, int pos) {
  if (pos > w->n_filled) pos = w->n_filled;
  if (pos <= 0) return 0;
  for (int li = 0; li < w->end - w->first; li++) {
    if (w->kv_cells[li] == w->n_ctx) continue; /* the whole context: every position is kept */
    const int window = w->m->layer_window[w->first + li];
    const int need = pos > window ? pos - window + 1 : 0; /* the first position pos attends to */
    if (need < w->kv_end - w->kv_cells[li] || need < w->kv_floor) return 0;
  }
  return pos;
}

/* After positions [pos, pos + n) are written. */
static void kv_wrote(prima_window *w, int pos, int n) {
  if (w->h2o_acc) /* what attended to the positions from pos on is gone with them */
    for (int t = 0; t < w->h2o_threads; t++) memset(w->h2o_acc + (size_t)t * w->n_ctx + pos, 0, sizeof(float) * (size_t)(w->n_ctx - pos));
  if (w->sparse.block > 0 && w->lm_done > pos / w->sparse.block) w->lm_done = pos / w->sparse.block;
  if (pos == 0) w->kv_floor = 0;
  if (pos == 0 || pos + n > w->kv_end) w->kv_end = pos + n;
}

/* ---- windows ------------------------------------------------------------------------------ */

const prima_tensor *prima_rope_factors(const prima_model *m, int n_ctx) {
  return m->rope_freqs.data ? &m->rope_freqs : n_ctx > m->hp.n_ctx_orig && m->rope_long.data ? &m->rope_long : &m->rope_short;
}

static int act_type_of(const prima_tensor *w) { return prima_kernels(w->type)->act_type; }

prima_window *prima_window_create(prima_model *m, int first, int end, int n_ctx, int max_batch, int k_type, int v_type,
                                  char *err, size_t err_len) {
  const prima_hparams *hp = &m->hp;
  if (first < 0 || end > hp->n_layers || first >= end) {
    prima_fail(err, err_len, "window [%d, %d) is not inside the model's %d layers", first, end, hp->n_layers);
    return NULL;
  }
  if (n_ctx < 1 || n_ctx > (1 << 22)) {
    prima_fail(err, err_len, "context of %d tokens is out of range", n_ctx);
    return NULL;
  }
  if (max_batch < 1 || max_batch > 4096) {
    prima_fail(err, err_len, "batch of %d tokens is out of range", max_batch);
    return NULL;
  }
  const int rotated[2] = { (k_type & PRIMA_KV_ROTATED) != 0, (v_type & PRIMA_KV_ROTATED) != 0 };
  k_type &= ~PRIMA_KV_ROTATED;
  v_type &= ~PRIMA_KV_ROTATED;
  const int kv_types[2] = { k_type, v_type };
  for (int i = 0; i < 2; i++) {
    const char *why = prima_kv_type_problem(kv_types[i], hp->head_dim);
    if (!why && rotated[i] && (kv_types[i] == PRIMA_F16 || !prima_kv_rotation_chunk(hp->head_dim, i == 0)))
      why = "cannot be rotated: rotation needs a quantized type and a head size that is a multiple of 64";
    if (why) {
      const char *name = prima_type_name(kv_types[i]);
      prima_fail(err, err_len, "%s cache type %s %s (%d)", i ? "V" : "K", name ? name : "(unknown)", why, hp->head_dim);
      return NULL;
    }
  }
  prima_window *w = calloc(1, sizeof *w);
  if (!w) {
    prima_fail(err, err_len, "out of memory");
    return NULL;
  }
  w->m = m;
  w->first = first;
  w->end = end;
  w->n_ctx = n_ctx;
  w->max_batch = max_batch;
  w->k_type = k_type;
  w->v_type = v_type;
  w->k_rot = rotated[0] ? prima_kv_rotation_chunk(hp->head_dim, 1) : 0;
  w->v_rot = rotated[1] ? prima_kv_rotation_chunk(hp->head_dim, 0) : 0;
  const int E = hp->n_embd, D = hp->head_dim, nth = prima_pool_threads(m->pool);
  const size_t qdim = (size_t)hp->n_head * D, kvdim = (size_t)hp->n_head_kv * D;
  const size_t nl = (size_t)(end - first), B = (size_t)max_batch, half = (size_t)hp->rope_dims / 2;
  const int ratio = hp->n_head / hp->n_head_kv;

  /* The widest activation row any matmul of this window reads. */
  size_t act_row = 0;
  for (int l = first; l < end; l++) {
    const prima_layer *L = &m->layers[l];
    const prima_tensor *ws[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down,
                                 &L->gate_inp, &L->gate_exps, &L->up_exps, &L->down_exps };
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
      if (!ws[i]->data) continue;
      const size_t b = prima_row_bytes(act_type_of(ws[i]), ws[i]->ne0);
      if (b > act_row) act_row = b;
    }
  }
  act_row = (act_row + 63) & ~(size_t)63;
  uint64_t weights = 0, largest = 0, read = 0;
  for (int l = first; l < end; l++) {
    const prima_layer *L = &m->layers[l];
    const uint64_t b = layer_weight_bytes(L);
    weights += b;
    if (b > largest) largest = b;
    const uint64_t experts = (uint64_t)L->gate_exps.n_bytes + L->up_exps.n_bytes + L->down_exps.n_bytes;
    read += b - experts + (hp->n_expert > 0 ? experts / (uint64_t)hp->n_expert * (uint64_t)hp->n_expert_used : 0);
  }
  w->act_row_bytes = act_row;

  if (kv_layout(w)) {
    prima_fail(err, err_len, "out of memory");
    prima_window_destroy(w);
    return NULL;
  }
  w->k_row_bytes = prima_row_bytes(k_type, (int64_t)kvdim);
  w->v_row_bytes = prima_row_bytes(v_type, (int64_t)kvdim);
  const size_t kv_rows = prima_window_kv_rows(w), kv_bytes = kv_rows * (w->k_row_bytes + w->v_row_bytes);
  w->kv_bytes = kv_bytes;
  w->k_cache = calloc(kv_rows, w->k_row_bytes);
  w->v_cache = calloc(kv_rows, w->v_row_bytes);
  w->rope_cos = malloc(sizeof(float) * (size_t)n_ctx * half);
  w->rope_sin = malloc(sizeof(float) * (size_t)n_ctx * half);
  w->h = malloc(sizeof(float) * B * E);
  w->q = malloc(sizeof(float) * B * qdim);
  w->k = malloc(sizeof(float) * B * kvdim);
  w->v = malloc(sizeof(float) * B * kvdim);
  w->att = malloc(sizeof(float) * B * qdim);
  w->gate = malloc(sizeof(float) * B * hp->n_ff);
  w->up = malloc(sizeof(float) * B * hp->n_ff);
  w->act_a = malloc(act_row * B * MAX_ACT_FORMATS);
  const size_t row_scratch = prima_kv_attend_scratch_bytes(ratio, D), tile_scratch = prima_kv_tile_scratch_bytes(ratio, D);
  w->att_scratch_bytes = ((row_scratch > tile_scratch ? row_scratch : tile_scratch) + 63) & ~(size_t)63;
  w->att_acc = aligned_alloc(64, (size_t)nth * w->att_scratch_bytes);
  int has_moe = 0;
  for (int l = first; l < end; l++) has_moe |= m->layers[l].gate_inp.data != NULL;
  size_t moe_bytes = 0;
  if (has_moe) {
    const size_t X = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used, BK = B * K, Fx = (size_t)hp->n_ff_exp;
    w->moe_logits = malloc(sizeof(float) * B * X);
    w->moe_sel = malloc(sizeof(int) * BK);
    w->moe_wt = malloc(sizeof(float) * BK);
    w->moe_slot = malloc(sizeof(int) * BK);
    w->moe_row = malloc(sizeof(int) * BK);
    w->moe_first = malloc(sizeof(int) * (X + 1));
    w->moe_gate = malloc(sizeof(float) * BK * Fx);
    w->moe_up = malloc(sizeof(float) * BK * Fx);
    w->moe_out = malloc(sizeof(float) * BK * E);
    w->moe_act = malloc(act_row * BK * 2);
    w->moe_view = malloc(sizeof(prima_tensor) * 3 * X);
    w->moe_mm = malloc(sizeof(prima_mm) * 3 * X);
    w->moe_mm_tokens = malloc(sizeof(int) * 3 * X);
    w->expert_hits = calloc(nl * X, sizeof(uint64_t));
    moe_bytes = sizeof(float) * (B * X + BK + BK * (2 * Fx + E)) + sizeof(int) * (3 * BK + X + 1) + act_row * BK * 2;
    if (!w->moe_logits || !w->moe_sel || !w->moe_wt || !w->moe_slot || !w->moe_row || !w->moe_first || !w->moe_gate ||
        !w->moe_up || !w->moe_out || !w->moe_act || !w->moe_view || !w->moe_mm || !w->moe_mm_tokens || !w->expert_hits) {
      prima_fail(err, err_len, "out of memory for the experts' scratch of a window of %d tokens", max_batch);
      prima_window_destroy(w);
      return NULL;
    }
  }
  if (!w->k_cache || !w->v_cache || !w->rope_cos || !w->rope_sin || !w->h || !w->q || !w->k || !w->v || !w->att ||
      !w->gate || !w->up || !w->act_a || !w->att_acc) {
    prima_fail(err, err_len, "out of memory for a window of %zu layers and %d tokens of context", nl, n_ctx);
    prima_window_destroy(w);
    return NULL;
  }
  /* llama.cpp's get_rope_factors: rope_freqs when the file has them, else phi3's long factors for a
   * context longer than the original one, else its short ones (its context is padded to 256: equal
   * choices for contexts that are multiples of 256) */
  const prima_tensor *factors = prima_rope_factors(m, n_ctx);
  if (hp->rope_yarn_ext > 0)
    prima_rope_table_yarn(w->rope_cos, w->rope_sin, n_ctx, hp->rope_dims, hp->rope_base, hp->rope_freq_scale,
                          factors->data ? (const float *)factors->data : NULL, hp->rope_yarn_ext, hp->n_ctx_orig,
                          hp->rope_yarn_beta_fast, hp->rope_yarn_beta_slow, hp->rope_attn_factor);
  else
    prima_rope_table(w->rope_cos, w->rope_sin, n_ctx, hp->rope_dims, hp->rope_base, hp->rope_freq_scale,
                     factors->data ? (const float *)factors->data : NULL);
  if (hp->rope_attn_factor != 1.0f && !(hp->rope_yarn_ext > 0)) {
    prima_scale(w->rope_cos, (int)((size_t)n_ctx * half), hp->rope_attn_factor);
    prima_scale(w->rope_sin, (int)((size_t)n_ctx * half), hp->rope_attn_factor);
  }
  int has_swa = 0;
  for (int l = first; l < end; l++) has_swa |= m->layer_window[l] > 0;
  if (has_swa) {
    w->rope_cos_swa = malloc(sizeof(float) * (size_t)n_ctx * half);
    w->rope_sin_swa = malloc(sizeof(float) * (size_t)n_ctx * half);
    if (!w->rope_cos_swa || !w->rope_sin_swa) {
      prima_fail(err, err_len, "out of memory for a window of %zu layers and %d tokens of context", nl, n_ctx);
      prima_window_destroy(w);
      return NULL;
    }
    /* llama.cpp gives sliding-window layers their own base and scale, the same factors and the same
     * attention factor (get_rope_factors and yarn_attn_factor do not depend on the layer) */
    if (hp->rope_yarn_ext > 0)
      prima_rope_table_yarn(w->rope_cos_swa, w->rope_sin_swa, n_ctx, hp->rope_dims, hp->rope_base_swa, hp->rope_freq_scale_swa,
                            factors->data ? (const float *)factors->data : NULL, hp->rope_yarn_ext, hp->n_ctx_orig,
                            hp->rope_yarn_beta_fast, hp->rope_yarn_beta_slow, hp->rope_attn_factor);
    else
      prima_rope_table(w->rope_cos_swa, w->rope_sin_swa, n_ctx, hp->rope_dims, hp->rope_base_swa, hp->rope_freq_scale_swa,
                       factors->data ? (const float *)factors->data : NULL);
    if (hp->rope_attn_factor != 1.0f && !(hp->rope_yarn_ext > 0)) {
      prima_scale(w->rope_cos_swa, (int)((size_t)n_ctx * half), hp->rope_attn_factor);
      prima_scale(w->rope_sin_swa, (int)((size_t)n_ctx * half), hp->rope_attn_factor);
    }
  }
  w->layer_bytes = read / nl;
  w->weight_bytes = weights;
  w->largest_layer_bytes = largest;
  w->stream_from = end;
  w->stream_keep = 0;
  w->anon_bytes = kv_bytes + sizeof(size_t) * nl + sizeof(int) * nl +
                  sizeof(float) * ((size_t)n_ctx * half * (has_swa ? 4 : 2) + B * (E + 2 * qdim + 2 * kvdim + 2 * (size_t)hp->n_ff)) +
                  act_row * B * MAX_ACT_FORMATS + moe_bytes;
  return w;
}

int prima_window_set_sparse(prima_window *w, const prima_sparse_cfg *c, char *err, size_t err_len) {
  const prima_hparams *hp = &w->m->hp;
  const prima_sparse_cfg dense = { 0, 0, 0, 0 };
  if (c->window > 0 && w->h2o_acc) return prima_fail(err, err_len, "sparse attention with H2O eviction: a landmark is no position to score");
  if (c->window > 0) {
    const char *why = prima_sparse_problem(c);
    if (why) return prima_fail(err, err_len, "sparse attention: %s", why);
    if (hp->head_dim > 1024) return prima_fail(err, err_len, "sparse attention: heads of %d elements are more than 1024", hp->head_dim);
  }
  const size_t old = sizeof(float) * 2 * (size_t)(w->end - w->first) * (size_t)hp->n_head_kv * (size_t)w->lm_blocks * (size_t)hp->head_dim;
  free(w->lm_k);
  free(w->lm_v);
  w->lm_k = w->lm_v = NULL;
  w->anon_bytes -= old;
  w->lm_blocks = w->lm_done = 0;
  w->sparse = c->window > 0 ? *c : dense;
  if (w->sparse.block > 0) {
    w->lm_blocks = w->n_ctx / w->sparse.block;
    const size_t n = (size_t)(w->end - w->first) * (size_t)hp->n_head_kv * (size_t)w->lm_blocks * (size_t)hp->head_dim;
    if (n > 0) {
      w->lm_k = malloc(sizeof(float) * n);
      w->lm_v = malloc(sizeof(float) * n);
      if (!w->lm_k || !w->lm_v) {
        free(w->lm_k);
        free(w->lm_v);
        w->lm_k = w->lm_v = NULL;
        w->lm_blocks = 0;
        w->sparse = dense;
        return prima_fail(err, err_len, "out of memory for the landmarks of sparse attention");
      }
      w->anon_bytes += sizeof(float) * 2 * n;
    }
  }
  return 0;
}

int prima_window_set_h2o(prima_window *w, char *err, size_t err_len) {
  if (w->sparse.window > 0) return prima_fail(err, err_len, "H2O eviction with sparse attention: a landmark is no position to score");
  if (w->h2o_acc) return 0;
  const int nth = prima_pool_threads(w->m->pool), ratio = w->m->hp.n_head / w->m->hp.n_head_kv;
  w->h2o_acc = calloc((size_t)nth * w->n_ctx, sizeof(float));
  w->h2o_raw = malloc(sizeof(float) * (size_t)nth * ratio * w->n_ctx);
  if (!w->h2o_acc || !w->h2o_raw) {
    free(w->h2o_acc);
    free(w->h2o_raw);
    w->h2o_acc = w->h2o_raw = NULL;
    return prima_fail(err, err_len, "out of memory for H2O's attention statistics");
  }
  w->h2o_threads = nth;
  w->anon_bytes += sizeof(float) * (size_t)nth * (size_t)(1 + ratio) * w->n_ctx;
  return 0;
}

void prima_window_h2o_scores(const prima_window *w, float *out) {
  for (int p = 0; p < w->n_filled; p++) {
    double sum = 0;
    for (int t = 0; w->h2o_acc && t < w->h2o_threads; t++) sum += w->h2o_acc[(size_t)t * w->n_ctx + p];
    out[p] = (float)sum;
  }
}

void prima_window_destroy(prima_window *w) {
  if (!w) return;
  free(w->h2o_acc);
  free(w->h2o_raw);
  free(w->lm_k);
  free(w->lm_v);
  free(w->k_cache);
  free(w->v_cache);
  free(w->kv_cells);
  free(w->kv_off);
  free(w->rope_cos);
  free(w->rope_sin);
  free(w->rope_cos_swa);
  free(w->rope_sin_swa);
  free(w->h);
  free(w->q);
  free(w->k);
  free(w->v);
  free(w->att);
  free(w->gate);
  free(w->up);
  free(w->act_a);
  free(w->att_acc);
  free(w->head_act);
  free(w->moe_logits);
  free(w->moe_sel);
  free(w->moe_wt);
  free(w->moe_slot);
  free(w->moe_row);
  free(w->moe_first);
  free(w->moe_gate);
  free(w->moe_up);
  free(w->moe_out);
  free(w->moe_act);
  free(w->moe_view);
  free(w->moe_mm);
  free(w->moe_mm_tokens);
  free(w->expert_hits);
  prima_expert_prefetch_free(w);
  free(w);
}

/* ---- forward ------------------------------------------------------------------------------ */

typedef struct {
  prima_window *w;
  float *x;      /* n rows of n_embd */
  int pos, n;    /* this sub-batch */
  float *logits; /* NULL: no head */
  /* A step of several sequences (prima_window_forward_seqs): row r is sequence seqs[r]'s token at
   * seq_pos[r], its K/V go to and its attention reads seqs[r]'s cache; logits then holds n rows.
   * NULL: the rows are one sequence at pos..pos+n-1 in w's own cache. */
  prima_window *const *seqs;
  const int *seq_pos;
} fwd_job;

/* Where row r of a pass sits: its position, and the window whose KV cache it uses. */
static inline int row_pos(const fwd_job *j, int r) { return j->seqs ? j->seq_pos[r] : j->pos + r; }
static inline prima_window *row_win(const fwd_job *j, int r) { return j->seqs ? j->seqs[r] : j->w; }

/* Activation buffers for the distinct formats of up to three matrices reading the same input.
 * slot[i] is the buffer matrix i reads. */
typedef struct {
  int n_formats;
  int format[MAX_ACT_FORMATS];
  void *buf[MAX_ACT_FORMATS];
  int slot[3];
} act_set;

static void act_set_make(act_set *s, prima_window *w, const prima_tensor *const *ms, int n) {
  s->n_formats = 0;
  for (int i = 0; i < n; i++) {
    const int f = act_type_of(ms[i]);
    int j = 0;
    while (j < s->n_formats && s->format[j] != f) j++;
    if (j == s->n_formats) {
      s->format[j] = f;
      s->buf[j] = (char *)w->act_a + (size_t)j * w->act_row_bytes * w->max_batch;
      s->n_formats++;
    }
    s->slot[i] = j;
  }
}

/* Each thread takes whole tokens: y[t] = f(x[t]) then quantized into every format of the set. */
static void quantize_for(const prima_task *t, prima_window *w, const act_set *s, const float *x, int n_cols, int n_rows) {
  for (int r = t->ith; r < n_rows; r = prima_pool_next_chunk(t)) {
    for (int j = 0; j < s->n_formats; j++)
      prima_act_quantize_rows(s->format[j], x, n_cols, s->buf[j], w->act_row_bytes, n_cols, r, r + 1);
  }
}

/* The final soft-cap of n rows of logits, after every thread's rows: each thread caps its slice of each
 * row (gemma2's 256000 logits took one thread ~1 ms a token while the other waited). */
static void softcap_rows(const prima_task *t, const prima_model *m, float *logits, int n) {
  prima_pool_barrier(t);
  const int64_t V = m->hp.n_vocab, lo = V * t->ith / t->nth, hi = V * (t->ith + 1) / t->nth;
  for (int r = 0; r < n; r++) prima_softcap(logits + (size_t)r * (size_t)V + lo, (int)(hi - lo), m->hp.final_softcap);
}

/* Output norm and head on one row, on the pool, and the final soft-cap. */
static void head_rows(const prima_task *t, prima_model *m, const float *row, float *logits) {
  const int E = m->hp.n_embd;
  if (t->ith == 0) {
    prima_rmsnorm(row, (const float *)m->output_norm.data, m->head_norm, E, m->hp.norm_eps);
    prima_act_quantizer(act_type_of(&m->output))(m->head_norm, m->head_act, E);
  }
  prima_pool_barrier(t);
  const prima_mm mm = { &m->output, m->head_act, 0, logits, 0, 0 };
  prima_mm_run(t, &mm, 1, 1);
  if (m->hp.final_softcap > 0) softcap_rows(t, m, logits, 1);
}

/* A batch of one sequence's rows over a dense F16 cache (attn_tile.c): each thread takes (tile of tokens,
 * KV head) pairs, the last tiles (the most positions, causally) first. 0 when this batch is no such
 * batch (several sequences, sparse attention, H2O's statistics, another cache type or SIMD level). */
static int tiled_attention(const prima_task *t, prima_window *w, int li, const fwd_job *j, int n) {
  const prima_hparams *hp = &w->m->hp;
  const int D = hp->head_dim, G = hp->n_head_kv, ratio = hp->n_head / G;
  const int window = w->m->layer_window[w->first + li];
  const prima_window *kw = j->w;
  if (n < 2 || j->seqs || kw->h2o_acc || (window == 0 && kw->sparse.window > 0)) return 0; /* attention() takes these row by row */
  const prima_kv_head K0 = { kw->k_type, kv_k_rows(kw, li), kw->k_row_bytes, kw->kv_cells[li] };
  const prima_kv_head V0 = { kw->v_type, kv_v_rows(kw, li), kw->v_row_bytes, kw->kv_cells[li] };
  if (!prima_kv_tile_ok(&K0, &V0, D, prima_simd_level())) return 0;
  const size_t qdim = (size_t)hp->n_head * D;
  const int TT = prima_kv_tile_tokens(ratio), n_tiles = (n + TT - 1) / TT;
  void *scratch = (char *)w->att_acc + (size_t)t->ith * w->att_scratch_bytes;
  const float *sinks = (const float *)w->m->layers[w->first + li].sinks.data;
  for (int task = t->ith; task < n_tiles * G; task = prima_pool_next_chunk(t)) {
    const int tile = n_tiles - 1 - task / G, g = task % G, t0 = tile * TT, nt = n - t0 < TT ? n - t0 : TT;
    const prima_kv_head K = { K0.type, K0.base + (size_t)g * (kw->k_row_bytes / G), K0.stride, K0.cells };
    const prima_kv_head V = { V0.type, V0.base + (size_t)g * (kw->v_row_bytes / G), V0.stride, V0.cells };
    const size_t off = (size_t)t0 * qdim + (size_t)g * ratio * D;
    prima_kv_attend_tile(&K, &V, w->q + off, qdim, nt, j->pos + t0, window, ratio, D, hp->kq_scale, hp->attn_softcap,
                         sinks ? sinks + (size_t)g * ratio : NULL, w->att + off, scratch);
  }
  return 1;
}

/* Each thread takes (token, KV head) pairs: the token's query heads of that group attend to its own
 * sequence's cache (kv_cache.c), causally, a sliding-window layer to its last `window` positions. */
static void attention(const prima_task *t, prima_window *w, int li, const fwd_job *j, int n) {
  const prima_hparams *hp = &w->m->hp;
  const int D = hp->head_dim, G = hp->n_head_kv, ratio = hp->n_head / G;
  const size_t qdim = (size_t)hp->n_head * D;
  const int window = w->m->layer_window[w->first + li];
  const int simd = prima_simd_level();
  void *scratch = (char *)w->att_acc + (size_t)t->ith * w->att_scratch_bytes;
  float *q = w->q; /* scaled in place by the model's query scale, row by row, before attention reads it */
  if (tiled_attention(t, w, li, j, n)) return;
  for (int task = t->ith; task < n * G; task = prima_pool_next_chunk(t)) {
    const int tok = task / G, g = task % G;
    const prima_window *kw = row_win(j, tok); /* the token's own sequence: it sees no other's cache */
    /* a sink is one more score in the softmax with no value (gpt-oss), one per query head */
    const float *sink = w->m->layers[w->first + li].sinks.data ? (const float *)w->m->layers[w->first + li].sinks.data + (size_t)g * ratio : NULL;
    const prima_kv_head K = { kw->k_type, kv_k_rows(kw, li) + (size_t)g * (kw->k_row_bytes / G), kw->k_row_bytes, kw->kv_cells[li] };
    const prima_kv_head V = { kw->v_type, kv_v_rows(kw, li) + (size_t)g * (kw->v_row_bytes / G), kw->v_row_bytes, kw->kv_cells[li] };
    const int n_pos = row_pos(j, tok) + 1; /* causal: positions 0..its own */
    /* a sliding-window layer sees the last `window` positions (llama.cpp masks p0 when p1 - p0 >= n_swa) */
    const int lo = window > 0 && n_pos > window ? n_pos - window : 0;
    const size_t off = (size_t)tok * qdim + (size_t)g * ratio * D;
    if (window == 0 && kw->sparse.window > 0) {
      const size_t lm = (((size_t)li * G + g) * (size_t)kw->lm_blocks) * D;
      prima_sparse_attend(&kw->sparse, &K, &V, kw->lm_k ? kw->lm_k + lm : NULL, kw->lm_v ? kw->lm_v + lm : NULL, q + off, ratio, D,
                          n_pos - 1, hp->kq_scale, hp->attn_softcap, sink, w->att + off, scratch, simd);
    } else if (kw->h2o_acc) {
      /* H2O: the probabilities this query's heads give each position, into this thread's sums */
      prima_kv_attn a;
      prima_kv_attn_begin(&a, &K, &V, q + off, ratio, D, hp->kq_scale, hp->attn_softcap, sink, scratch, simd);
      a.raw = kw->h2o_raw + (size_t)t->ith * ratio * kw->n_ctx;
      a.raw_stride = (size_t)kw->n_ctx;
      prima_kv_attn_range(&a, lo, n_pos);
      prima_kv_attn_end(&a, w->att + off);
      float *acc = kw->h2o_acc + (size_t)t->ith * kw->n_ctx;
      for (int h = 0; h < ratio; h++) {
        const float *raw = a.raw + (size_t)h * kw->n_ctx, m = a.M[h], inv = 1.0f / a.S[h];
        for (int p = lo; p < n_pos; p++) acc[p] += expf(raw[p] - m) * inv;
      }
    } else if (prima_kv_tile_ok(&K, &V, D, simd)) {
      /* the kernel a batch uses, for the same bits as that token in a prompt's batch */
      prima_kv_attend_tile(&K, &V, q + off, qdim, 1, n_pos - 1, window, ratio, D, hp->kq_scale, hp->attn_softcap, sink, w->att + off, scratch);
    } else {
      prima_kv_attend(&K, &V, q + off, ratio, D, lo, n_pos, hp->kq_scale, hp->attn_softcap, sink, w->att + off, scratch, simd);
    }
  }
}

/* Sparse attention's landmarks of layer li for every whole block a row's sequence now holds that has
 * none yet (blocks [lm_done, (pos + 1) / block)): the last row of a pass of one sequence, every row of
 * a step of several (each its own sequence), threads taking (row, KV head) pairs. */
static void sparse_landmarks(const prima_task *t, prima_window *w, int li, const fwd_job *j, int n) {
  const prima_hparams *hp = &w->m->hp;
  const int D = hp->head_dim, G = hp->n_head_kv;
  const int first = j->seqs ? 0 : n - 1;
  for (int task = t->ith; task < (n - first) * G; task = prima_pool_next_chunk(t)) {
    const int r = first + task / G, g = task % G;
    prima_window *kw = row_win(j, r);
    const int B = kw->sparse.block;
    if (B <= 0) continue;
    const int end = (row_pos(j, r) + 1) / B;
    const prima_kv_head K = { kw->k_type, kv_k_rows(kw, li) + (size_t)g * (kw->k_row_bytes / G), kw->k_row_bytes, kw->kv_cells[li] };
    const prima_kv_head V = { kw->v_type, kv_v_rows(kw, li) + (size_t)g * (kw->v_row_bytes / G), kw->v_row_bytes, kw->kv_cells[li] };
    const size_t lm = (((size_t)li * G + g) * (size_t)kw->lm_blocks) * D;
    for (int b = kw->lm_done; b < end && b < kw->lm_blocks; b++)
      prima_sparse_landmark(&K, &V, b * B, B, D, kw->lm_k + lm + (size_t)b * D, kw->lm_v + lm + (size_t)b * D);
  }
}

static int advise_release(prima_window *w, uint8_t *p, size_t len, void *arg);

/* Drops layer l's weight pages (MADV_DONTNEED + POSIX_FADV_DONTNEED, as advise_release), over whole
 * 2 MiB blocks around the layer's bytes: the page cache keeps this file in folios of up to 2 MiB, and
 * one that straddles the range is neither unmapped nor dropped (measured: ~110 MiB of a 296 MiB window
 * stayed after its layers were released one by one, crowding out the kept ones). A neighbour's block
 * edge goes with it: at most 2 MiB read again on each side. */
static void release_layer(prima_window *w, int l, uint64_t keep) {
  const uint64_t block = (uint64_t)2 << 20;
  const prima_tensor *ts = layer_tensors(&w->m->layers[l]);
  uint64_t lo = UINT64_MAX, hi = 0;
  for (int i = 0; i < LAYER_N_TENSORS; i++) {
    if (!ts[i].data) continue;
    if (ts[i].offset < lo) lo = ts[i].offset;
    if (ts[i].offset + ts[i].n_bytes > hi) hi = ts[i].offset + ts[i].n_bytes;
  }
  if (hi <= lo) return;
  /* its first `keep` bytes (in file order) stay, with the rest of the block they end in */
  lo = keep ? (lo + keep + block - 1) & ~(block - 1) : lo & ~(block - 1);
  hi = (hi + block - 1) & ~(block - 1);
  if (hi <= lo) return;
  if (hi > (uint64_t)w->m->map_bytes) hi = (uint64_t)w->m->map_bytes; /* the last partial page is still whole */
  advise_release(w, w->m->map + lo, (size_t)(hi - lo), NULL);
}

static const prima_tensor NO_TENSOR; /* an absent optional tensor */

/* A block's output matrix joins the residual stream: accumulated straight into x, or, for a family
 * with a post-norm (gemma3), written to scratch, normed, then added. Ends at a barrier. */
static void residual_out(const prima_task *t, prima_window *w, const prima_tensor *W, void *act, const prima_tensor *post,
                         const prima_tensor *bias, float *x, int n) {
  const int E = w->m->hp.n_embd;
  const int apart = post->data || bias->data; /* the block's output rounds on its own before the add */
  const prima_mm mm = { W, act, w->act_row_bytes, apart ? w->h : x, (size_t)E, apart ? 0 : 1 };
  prima_mm_run(t, &mm, 1, n);
  prima_pool_barrier(t);
  if (!apart) return;
  for (int r = t->ith; r < n; r = prima_pool_next_chunk(t)) {
    float *hr = w->h + (size_t)r * E;
    if (bias->data) prima_add(hr, (const float *)bias->data, E);
    if (post->data) prima_rmsnorm(hr, (const float *)post->data, hr, E, w->m->hp.norm_eps);
    prima_add(x + (size_t)r * E, hr, E);
  }
  prima_pool_barrier(t);
}

/* x += wo(attention(rope(qk_norm(wq/wk/wv(norm(x)) + bias)))), each part present when the layer has
 * its tensors; sliding-window layers take their own RoPE table and window (attention()). */
static void attention_block(const prima_task *t, prima_window *w, int l, float *x, const fwd_job *j, int n) {
  const prima_model *m = w->m;
  const prima_hparams *hp = &m->hp;
  const prima_layer *L = &m->layers[l];
  const int E = hp->n_embd, D = hp->head_dim, li = l - w->first;
  const size_t qdim = (size_t)hp->n_head * D, kvdim = (size_t)hp->n_head_kv * D, half = (size_t)hp->rope_dims / 2;
  const int swa = m->layer_window[l] > 0;
  const float *rope_cos = swa ? w->rope_cos_swa : w->rope_cos, *rope_sin = swa ? w->rope_sin_swa : w->rope_sin;

  act_set qkv;
  const prima_tensor *qkv_w[3] = { &L->wq, &L->wk, &L->wv };
  act_set_make(&qkv, w, qkv_w, 3);
  for (int r = t->ith; r < n; r = prima_pool_next_chunk(t)) {
    prima_rmsnorm(x + (size_t)r * E, (const float *)L->attn_norm.data, w->h + (size_t)r * E, E, hp->norm_eps);
    for (int f = 0; f < qkv.n_formats; f++)
      prima_act_quantize_rows(qkv.format[f], w->h, E, qkv.buf[f], w->act_row_bytes, E, r, r + 1);
  }
  prima_pool_barrier(t);
  {
    const prima_mm mm[3] = {
      { &L->wq, qkv.buf[qkv.slot[0]], w->act_row_bytes, w->q, qdim, 0 },
      { &L->wk, qkv.buf[qkv.slot[1]], w->act_row_bytes, w->k, kvdim, 0 },
      { &L->wv, qkv.buf[qkv.slot[2]], w->act_row_bytes, w->v, kvdim, 0 },
    };
    prima_mm_run(t, mm, 3, n);
  }
  prima_pool_barrier(t);
  for (int r = t->ith; r < n; r = prima_pool_next_chunk(t)) {
    prima_window *kw = row_win(j, r);
    const int pos = row_pos(j, r);
    uint8_t *Kl = kv_k_rows(kw, li) + (size_t)kv_row(kw, li, pos) * kw->k_row_bytes;
    uint8_t *Vl = kv_v_rows(kw, li) + (size_t)kv_row(kw, li, pos) * kw->v_row_bytes;
    float *q = w->q + (size_t)r * qdim, *k = w->k + (size_t)r * kvdim, *v = w->v + (size_t)r * kvdim;
    if (L->bq.data) {
      prima_add(q, (const float *)L->bq.data, (int)qdim);
      prima_add(k, (const float *)L->bk.data, (int)kvdim);
      prima_add(v, (const float *)L->bv.data, (int)kvdim);
    }
    if (L->q_norm.data) { /* one RMS norm per head, weights shared by the heads */
      for (int h = 0; h < hp->n_head; h++) prima_rmsnorm(q + (size_t)h * D, (const float *)L->q_norm.data, q + (size_t)h * D, D, hp->norm_eps);
      for (int h = 0; h < hp->n_head_kv; h++) prima_rmsnorm(k + (size_t)h * D, (const float *)L->k_norm.data, k + (size_t)h * D, D, hp->norm_eps);
    }
    const float *c = rope_cos + (size_t)pos * half, *s = rope_sin + (size_t)pos * half;
    prima_rope_apply(q, hp->n_head, D, hp->rope_dims, hp->rope_neox, c, s);
    prima_rope_apply(k, hp->n_head_kv, D, hp->rope_dims, hp->rope_neox, c, s);
    /* a rotated cache holds H k and H v; H q meets H k, and the output is rotated back below */
    if (kw->k_rot) {
      prima_hadamard(q, (int)qdim, kw->k_rot);
      prima_hadamard(k, (int)kvdim, kw->k_rot);
    }
    if (kw->v_rot) prima_hadamard(v, (int)kvdim, kw->v_rot);
    prima_kv_store(kw->k_type, k, Kl, (int)kvdim);
    prima_kv_store(kw->v_type, v, Vl, (int)kvdim);
    /* gemma scales Q itself, before the cache's rounding of Q, as llama.cpp does */
    if (hp->q_scale != 1.0f) prima_scale(q, (int)qdim, hp->q_scale);
  }
  prima_pool_barrier(t);
  if (!swa && w->sparse.block > 0) {
    sparse_landmarks(t, w, li, j, n);
    prima_pool_barrier(t);
  }
  attention(t, w, li, j, n);
  prima_pool_barrier(t);
  for (int r = t->ith; r < n; r = prima_pool_next_chunk(t)) {
    const prima_window *kw = row_win(j, r);
    if (kw->v_rot) prima_hadamard(w->att + (size_t)r * qdim, (int)qdim, kw->v_rot);
  }
  prima_pool_barrier(t);
  act_set o;
  const prima_tensor *o_w[1] = { &L->wo };
  act_set_make(&o, w, o_w, 1);
  quantize_for(t, w, &o, w->att, (int)qdim, n);
  prima_pool_barrier(t);
  residual_out(t, w, &L->wo, o.buf[0], &L->attn_post_norm, &L->bo, x, n);
}

/* x += down(act(gate(norm(x))) * up(norm(x))), act SiLU or GELU (tanh, as ggml's table) per model. */
static void ffn_block(const prima_task *t, prima_window *w, int l, float *x, int n) {
  const prima_hparams *hp = &w->m->hp;
  const prima_layer *L = &w->m->layers[l];
  const int E = hp->n_embd;
  const size_t F = (size_t)hp->n_ff;
  act_set gu;
  const prima_tensor *gu_w[2] = { &L->w_gate, &L->w_up };
  act_set_make(&gu, w, gu_w, 2);
  for (int r = t->ith; r < n; r = prima_pool_next_chunk(t)) {
    prima_rmsnorm(x + (size_t)r * E, (const float *)L->ffn_norm.data, w->h + (size_t)r * E, E, hp->norm_eps);
    for (int f = 0; f < gu.n_formats; f++)
      prima_act_quantize_rows(gu.format[f], w->h, E, gu.buf[f], w->act_row_bytes, E, r, r + 1);
  }
  prima_pool_barrier(t);
  {
    const prima_mm mm[2] = {
      { &L->w_gate, gu.buf[gu.slot[0]], w->act_row_bytes, w->gate, F, 0 },
      { &L->w_up, gu.buf[gu.slot[1]], w->act_row_bytes, w->up, F, 0 },
    };
    prima_mm_run(t, mm, 2, n);
  }
  prima_pool_barrier(t);
  act_set dn;
  const prima_tensor *dn_w[1] = { &L->w_down };
  act_set_make(&dn, w, dn_w, 1);
  for (int r = t->ith; r < n; r = prima_pool_next_chunk(t)) {
    if (hp->ffn_act == PRIMA_FFN_GELU) prima_geglu(w->gate + (size_t)r * F, w->up + (size_t)r * F, (int)F);
    else prima_swiglu(w->gate + (size_t)r * F, w->up + (size_t)r * F, (int)F);
    prima_act_quantize_rows(dn.format[0], w->gate, F, dn.buf[0], w->act_row_bytes, (int)F, r, r + 1);
  }
  prima_pool_barrier(t);
  residual_out(t, w, &L->w_down, dn.buf[0], &L->ffn_post_norm, &NO_TENSOR, x, n);
}

/* One token's routing, as llama.cpp's build_moe_ffn with softmax gating and norm_w (llama/Mixtral,
 * qwen3moe): p = softmax(logits) over all experts (max subtracted, the sum in double), the k largest
 * (best first, the lower index on a tie), their p divided by their sum (clamped below at F16's
 * smallest normal, as ggml does). For Mixtral this equals a softmax over the k chosen logits. */
static void route_token(float *p, int X, int K, int *sel, float *wt) {
  float max = -INFINITY;
  for (int e = 0; e < X; e++) max = p[e] > max ? p[e] : max;
  double sum = 0.0;
  for (int e = 0; e < X; e++) {
    p[e] = expf(p[e] - max);
    sum += (double)p[e];
  }
  const float inv = (float)(1.0 / sum);
  for (int e = 0; e < X; e++) p[e] *= inv;
  unsigned char taken[PRIMA_MAX_EXPERTS];
  memset(taken, 0, (size_t)X);
  for (int j = 0; j < K; j++) {
    int best = -1;
    for (int e = 0; e < X; e++)
      if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
    taken[best] = 1;
    sel[j] = best;
    wt[j] = p[best];
  }
  double wsum = 0.0;
  for (int j = 0; j < K; j++) wsum += (double)wt[j];
  float ws = (float)wsum;
  if (ws < 6.103515625e-5f) ws = 6.103515625e-5f;
  for (int j = 0; j < K; j++) wt[j] /= ws;
}

/* gpt-oss's routing (llama.cpp's SOFTMAX_WEIGHT gating): the k largest logits (best first, the lower
 * index on a tie), their weights a softmax over those k alone (ggml_soft_max on k values: exp of the
 * difference to the max, the sum in double, one float scale). */
static void route_topk_softmax(const float *logits, int X, int K, int *sel, float *wt) {
  unsigned char taken[PRIMA_MAX_EXPERTS];
  memset(taken, 0, (size_t)X);
  for (int j = 0; j < K; j++) {
    int best = -1;
    for (int e = 0; e < X; e++)
      if (!taken[e] && (best < 0 || logits[e] > logits[best])) best = e;
    taken[best] = 1;
    sel[j] = best;
    wt[j] = logits[best];
  }
  float max = -INFINITY;
  for (int j = 0; j < K; j++) max = wt[j] > max ? wt[j] : max;
  double sum = 0.0;
  for (int j = 0; j < K; j++) {
    wt[j] = expf(wt[j] - max);
    sum += (double)wt[j];
  }
  const float scale = (float)(1.0 / sum);
  for (int j = 0; j < K; j++) wt[j] *= scale;
}

/* A token's experts and their weights from its router logits (bias added first, as ggml_add). */
void prima_moe_route(const prima_hparams *hp, const prima_layer *L, float *logits, int *sel, float *wt) {
  if (L->gate_inp_b.data) prima_add(logits, (const float *)L->gate_inp_b.data, hp->n_expert);
  if (hp->moe_gating == PRIMA_MOE_TOPK_SOFTMAX) route_topk_softmax(logits, hp->n_expert, hp->n_expert_used, sel, wt);
  else route_token(logits, hp->n_expert, hp->n_expert_used, sel, wt);
}

/* Expert e's 2-D matrix within a tensor of n_expert of them (rows_each rows apiece). */
static prima_tensor expert_slice(const prima_tensor *all, int e, int64_t rows_each) {
  prima_tensor v = *all;
  v.data = all->data + (size_t)e * rows_each * all->row_bytes;
  v.offset = all->offset + (uint64_t)e * rows_each * all->row_bytes;
  v.ne1 = rows_each;
  v.n_bytes = (size_t)rows_each * all->row_bytes;
  return v;
}

/* x += sum over the token's k experts of weight * down(silu(gate(norm(x))) * up(norm(x))). The router
 * picks each token's experts; the token-expert pairs are grouped by expert, so that an expert's
 * matrices run once over all its tokens, each a 2-D slice of the 3-D tensor through the same dot
 * kernels as a dense matmul (every weight type works). The weighted sum adds the experts in the
 * router's order, then the residual, in float as ggml does. */
static void moe_block(const prima_task *t, prima_window *w, int l, float *x, int n) {
  const prima_hparams *hp = &w->m->hp;
  const prima_layer *L = &w->m->layers[l];
  const int E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used, NK = n * K;
  const size_t F = (size_t)hp->n_ff_exp, stride = w->act_row_bytes;
  act_set in;
  const prima_tensor *in_w[3] = { &L->gate_inp, &L->gate_exps, &L->up_exps };
  act_set_make(&in, w, in_w, 3);
  for (int r = t->ith; r < n; r = prima_pool_next_chunk(t)) {
    prima_rmsnorm(x + (size_t)r * E, (const float *)L->ffn_norm.data, w->h + (size_t)r * E, E, hp->norm_eps);
    for (int f = 0; f < in.n_formats; f++)
      prima_act_quantize_rows(in.format[f], w->h, E, in.buf[f], stride, E, r, r + 1);
  }
  prima_pool_barrier(t);
  {
    const prima_mm mm = { &L->gate_inp, in.buf[in.slot[0]], stride, w->moe_logits, (size_t)X, 0 };
    prima_mm_run(t, &mm, 1, n);
  }
  prima_pool_barrier(t);
  /* one token (decode): thread 0 routes it with the grouping below, a step and a barrier fewer */
  if (n > 1) {
    for (int r = t->ith; r < n; r = prima_pool_next_chunk(t))
      prima_moe_route(hp, L, w->moe_logits + (size_t)r * X, w->moe_sel + (size_t)r * K, w->moe_wt + (size_t)r * K);
    prima_pool_barrier(t);
  }
  /* the gate and up inputs of expert row p, grouped by expert (then the down input, in the first) */
  const int fmt_gate = 0, fmt_up = in.slot[1] == in.slot[2] ? 0 : 1;
  char *act_gu[2] = { w->moe_act, (char *)w->moe_act + stride * (size_t)w->max_batch * K };
  /* one token: its experts read its input rows where they are, nothing to gather */
  const int gather = n > 1;
  const char *src_gate = in.buf[in.slot[1]], *src_up = in.buf[in.slot[2]];
  if (t->ith == 0) {
    if (n == 1) prima_moe_route(hp, L, w->moe_logits, w->moe_sel, w->moe_wt);
    int *first = w->moe_first;
    memset(first, 0, sizeof(int) * (size_t)(X + 1));
    for (int i = 0; i < NK; i++) first[w->moe_sel[i] + 1]++;
    for (int e = 0; e < X; e++) first[e + 1] += first[e];
    uint64_t *hits = w->expert_hits + (size_t)(l - w->first) * X;
    for (int e = 0; e < X; e++) hits[e] += (uint64_t)(first[e + 1] - first[e]);
    prima_expert_prefetch_score(w, l, first);
    prima_expert_routed_willneed(w, l, first);
    int *fill = w->moe_mm_tokens; /* a cursor per expert here; the items' token counts below */
    for (int e = 0; e < X; e++) fill[e] = first[e];
    for (int i = 0; i < NK; i++) w->moe_slot[fill[w->moe_sel[i]]++] = i;
    for (int p = 0; p < NK; p++) w->moe_row[w->moe_slot[p]] = p;
    /* the experts used, their matmuls: gate and up items first, then down */
    int u = 0;
    for (int e = 0; e < X; e++) {
      const int c = first[e + 1] - first[e];
      if (c == 0) continue;
      prima_tensor *v = w->moe_view + 3 * u;
      v[0] = expert_slice(&L->gate_exps, e, (int64_t)F);
      v[1] = expert_slice(&L->up_exps, e, (int64_t)F);
      v[2] = expert_slice(&L->down_exps, e, E);
      u++;
    }
    int item = 0;
    for (int e = 0, i = 0; e < X; e++) {
      const int c = first[e + 1] - first[e];
      if (c == 0) continue;
      const size_t p0 = (size_t)first[e];
      const void *ag = gather ? act_gu[fmt_gate] + p0 * stride : src_gate, *au = gather ? act_gu[fmt_up] + p0 * stride : src_up;
      const prima_mm g = { &w->moe_view[3 * i], ag, stride, w->moe_gate + p0 * F, F, 0 };
      const prima_mm up = { &w->moe_view[3 * i + 1], au, stride, w->moe_up + p0 * F, F, 0 };
      w->moe_mm[item] = g;
      w->moe_mm_tokens[item++] = c;
      w->moe_mm[item] = up;
      w->moe_mm_tokens[item++] = c;
      i++;
    }
    for (int e = 0, i = 0; e < X; e++) {
      const int c = first[e + 1] - first[e];
      if (c == 0) continue;
      const size_t p0 = (size_t)first[e];
      const prima_mm d = { &w->moe_view[3 * i + 2], act_gu[0] + p0 * stride, stride, w->moe_out + p0 * E, (size_t)E, 0 };
      w->moe_mm[item] = d;
      w->moe_mm_tokens[item++] = c;
      i++;
    }
  }
  prima_pool_barrier(t);
  int used = 0;
  for (int e = 0; e < X; e++) used += w->moe_first[e + 1] > w->moe_first[e];
  if (gather) {
    for (int p = t->ith; p < NK; p = prima_pool_next_chunk(t)) {
      const size_t tok = (size_t)(w->moe_slot[p] / K);
      memcpy(act_gu[fmt_gate] + (size_t)p * stride, src_gate + tok * stride, stride);
      if (fmt_up) memcpy(act_gu[fmt_up] + (size_t)p * stride, src_up + tok * stride, stride);
    }
    prima_pool_barrier(t);
  }
  prima_mm_run_var(t, w->moe_mm, 2 * used, w->moe_mm_tokens);
  prima_pool_barrier(t);
  const int dn_fmt = act_type_of(&L->down_exps);
  for (int p = t->ith; p < NK; p = prima_pool_next_chunk(t)) {
    float *g = w->moe_gate + (size_t)p * F, *u = w->moe_up + (size_t)p * F;
    if (L->gate_exps_b.data) { /* gpt-oss: each expert's biases on its gate and up */
      const size_t e = (size_t)w->moe_sel[w->moe_slot[p]];
      prima_add(u, (const float *)L->up_exps_b.data + e * F, (int)F);
      prima_add(g, (const float *)L->gate_exps_b.data + e * F, (int)F);
    }
    if (hp->ffn_act == PRIMA_FFN_SWIGLU_OAI) prima_swiglu_oai(g, u, (int)F, 1.702f, 7.0f); /* llama.cpp's constants */
    else if (hp->ffn_act == PRIMA_FFN_GELU) prima_geglu(g, u, (int)F);
    else prima_swiglu(g, u, (int)F);
    prima_act_quantize_rows(dn_fmt, w->moe_gate, F, act_gu[0], stride, (int)F, p, p + 1);
  }
  prima_pool_barrier(t);
  prima_mm_run_var(t, w->moe_mm + 2 * used, used, w->moe_mm_tokens + 2 * used);
  prima_pool_barrier(t);
  for (int r = t->ith; r < n; r = prima_pool_next_chunk(t)) {
    float *acc = w->h + (size_t)r * E, *xr = x + (size_t)r * E;
    const float *wt = w->moe_wt + (size_t)r * K;
    const int *row = w->moe_row + (size_t)r * K;
    if (L->down_exps_b.data) { /* gpt-oss: each expert's down bias, rounded before the weight as ggml's add_id */
      for (int j = 0; j < K; j++)
        prima_add(w->moe_out + (size_t)row[j] * E, (const float *)L->down_exps_b.data + (size_t)w->moe_sel[(size_t)r * K + j] * E, E);
    }
    const float *e0 = w->moe_out + (size_t)row[0] * E;
    for (int i = 0; i < E; i++) acc[i] = e0[i] * wt[0];
    for (int j = 1; j < K; j++) {
      const float *ej = w->moe_out + (size_t)row[j] * E;
      for (int i = 0; i < E; i++) {
        const float term = ej[i] * wt[j]; /* rounded before the add, as ggml's separate mul and add */
        acc[i] += term;
      }
    }
    for (int i = 0; i < E; i++) xr[i] = acc[i] + xr[i];
  }
  prima_pool_barrier(t);
}

static void forward_job(const prima_task *t, void *ctx) {
  fwd_job *j = ctx;
  prima_window *w = j->w;
  prima_model *m = w->m;
  const prima_hparams *hp = &m->hp;
  const int E = hp->n_embd, n = j->n;
  float *x = j->x;

  for (int l = w->first; l < w->end; l++) {
    /* a MoE layer's probable experts are advised before it needs them (expert_prefetch.h) */
    prima_expert_prefetch_hook(t, w, l, x, n, 0);
    attention_block(t, w, l, x, j, n);
    prima_expert_prefetch_hook(t, w, l, x, n, 1);
    if (m->layers[l].gate_inp.data) moe_block(t, w, l, x, n);
    else ffn_block(t, w, l, x, n);
    /* every thread is past this layer: a streamed one goes now, so that the window never holds more
     * than its kept layers and the one being read (the others go on to the next layer meanwhile) */
    if (t->ith == 0) {
      const int from = __atomic_load_n(&w->stream_from, __ATOMIC_RELAXED);
      if (l >= from) release_layer(w, l, l == from ? __atomic_load_n(&w->stream_keep, __ATOMIC_RELAXED) : 0);
    }
  }

  if (j->logits && !j->seqs) head_rows(t, m, x + (size_t)(n - 1) * E, j->logits);
  /* every sequence's row: the output norm and head as a lone row gets them (the same functions per
   * row; the head matrix read once for all rows by the batch-invariant matmul), so the same bits */
  else if (j->logits) {
    const int at = act_type_of(&m->output);
    const size_t hb = prima_row_bytes(at, E), V = (size_t)hp->n_vocab;
    for (int r = t->ith; r < n; r = prima_pool_next_chunk(t)) {
      float *hr = w->h + (size_t)r * E;
      prima_rmsnorm(x + (size_t)r * E, (const float *)m->output_norm.data, hr, E, hp->norm_eps);
      prima_act_quantizer(at)(hr, (char *)w->head_act + (size_t)r * hb, E);
    }
    prima_pool_barrier(t);
    const prima_mm mm = { &m->output, w->head_act, hb, j->logits, V, 0 };
    prima_mm_run(t, &mm, 1, n);
    if (hp->final_softcap > 0) softcap_rows(t, m, j->logits, n);
  }
}

int prima_window_forward(prima_window *w, float *acts, int pos, int n_tokens, float *logits, char *err, size_t err_len) {
  if (n_tokens < 1) return prima_fail(err, err_len, "forward needs at least one token");
  if (pos < 0 || pos > w->n_filled)
    return prima_fail(err, err_len, "position %d leaves a gap: the cache holds %d positions", pos, w->n_filled);
  if ((int64_t)pos + n_tokens > w->n_ctx)
    return prima_fail(err, err_len, "positions %d..%d exceed the context of %d tokens", pos, pos + n_tokens - 1, w->n_ctx);
  if (prima_window_kv_resumable(w, pos) != pos)
    return prima_fail(err, err_len, "position %d: the sliding-window layers' cache no longer holds the window before it (continue from 0)", pos);
  if (prima_model_check_file(w->m, 0, err, err_len)) return -1;
  kv_wrote(w, pos, n_tokens); /* before the pass: a pass that fails has overwritten ring rows all the same */
  const int E = w->m->hp.n_embd;
  for (int done = 0; done < n_tokens;) {
    const int n = n_tokens - done < w->max_batch ? n_tokens - done : w->max_batch;
    fwd_job j = { w, acts + (size_t)done * E, pos + done, n, done + n == n_tokens ? logits : NULL, NULL, NULL };
    prima_expert_prefetch_begin(w);
    /* One token through small layers is a few microseconds of work per step: meeting other threads at
     * ten barriers per layer would cost more than it saves. */
    if (n == 1 && w->layer_bytes < SMALL_LAYER_BYTES) prima_pool_run_alone(w->m->pool, forward_job, &j);
    else prima_pool_run(w->m->pool, forward_job, &j);
    done += n;
    if (w->sparse.block > 0) w->lm_done = (pos + done) / w->sparse.block; /* every layer has them now */
  }
  /* a read that faulted during the pass left zeros in it: refuse its result */
  if (__atomic_load_n(&w->m->file_state, __ATOMIC_ACQUIRE) != PRIMA_FILE_OK) return prima_model_check_file(w->m, 0, err, err_len);
  w->n_filled = pos + n_tokens;
  return 0;
}

int prima_window_forward_seqs(prima_window *w, prima_window *const *seqs, const int *pos, int n, float *acts, float *logits,
                              char *err, size_t err_len) {
  if (n < 1 || n > w->max_batch) return prima_fail(err, err_len, "a step of %d sequences does not fit a batch of %d", n, w->max_batch);
  for (int i = 0; i < n; i++) {
    const prima_window *s = seqs[i];
    if (!s || s->m != w->m || s->first != w->first || s->end != w->end || s->n_ctx != w->n_ctx)
      return prima_fail(err, err_len, "sequence %d's window is not over the same model, layers and context", i);
    for (int k = 0; k < i; k++)
      if (seqs[k] == s) return prima_fail(err, err_len, "sequences %d and %d share a window", k, i);
    if (pos[i] < 0 || pos[i] > s->n_filled)
      return prima_fail(err, err_len, "sequence %d: position %d leaves a gap: its cache holds %d positions", i, pos[i], s->n_filled);
    if (pos[i] >= s->n_ctx) return prima_fail(err, err_len, "sequence %d: position %d exceeds the context of %d tokens", i, pos[i], s->n_ctx);
    if (prima_window_kv_resumable(s, pos[i]) != pos[i])
      return prima_fail(err, err_len, "sequence %d: position %d: the sliding-window layers' cache no longer holds the window before it", i, pos[i]);
  }
  if (prima_model_check_file(w->m, 0, err, err_len)) return -1;
  for (int i = 0; i < n; i++) kv_wrote(seqs[i], pos[i], 1);
  if (logits && !w->head_act) { /* the head's activations of a step: only a window that leads steps has them */
    w->head_act = malloc(prima_row_bytes(PRIMA_F32, w->m->hp.n_embd) * (size_t)w->max_batch); /* F32: the widest */
    if (!w->head_act) return prima_fail(err, err_len, "out of memory for the head of a step of %d sequences", w->max_batch);
    w->anon_bytes += prima_row_bytes(PRIMA_F32, w->m->hp.n_embd) * (size_t)w->max_batch;
  }
  fwd_job j = { w, acts, 0, n, logits, seqs, pos };
  prima_expert_prefetch_begin(w);
  /* the same choice of threads as a lone decode step (prima_window_forward) */
  if (n == 1 && w->layer_bytes < SMALL_LAYER_BYTES) prima_pool_run_alone(w->m->pool, forward_job, &j);
  else prima_pool_run(w->m->pool, forward_job, &j);
  if (__atomic_load_n(&w->m->file_state, __ATOMIC_ACQUIRE) != PRIMA_FILE_OK) return prima_model_check_file(w->m, 0, err, err_len);
  for (int i = 0; i < n; i++) {
    seqs[i]->n_filled = pos[i] + 1;
    if (seqs[i]->sparse.block > 0) seqs[i]->lm_done = (pos[i] + 1) / seqs[i]->sparse.block;
  }
  return 0;
}

typedef struct {
  prima_model *m;
  const float *row;
  float *logits;
} head_job;

static void head_job_fn(const prima_task *t, void *ctx) {
  head_job *j = ctx;
  head_rows(t, j->m, j->row, j->logits);
}

void prima_model_logits(prima_model *m, const float *row, float *logits) {
  head_job j = { m, row, logits };
  prima_pool_run(m->pool, head_job_fn, &j);
}

void prima_model_output_norm(prima_model *m, const float *x, float *y, int n) {
  const int E = m->hp.n_embd;
  for (int r = 0; r < n; r++) prima_rmsnorm(x + (size_t)r * E, (const float *)m->output_norm.data, y + (size_t)r * E, E, m->hp.norm_eps);
}

void prima_model_embed(prima_model *m, const int32_t *tokens, int n, float *out) {
  const prima_type_kernels *k = prima_kernels(m->tok_embd.type);
  const int E = m->hp.n_embd;
  for (int i = 0; i < n; i++) {
    k->dequantize(m->tok_embd.data + (size_t)tokens[i] * m->tok_embd.row_bytes, out + (size_t)i * E, E);
    if (m->hp.embd_scale != 1.0f) prima_scale(out + (size_t)i * E, E, m->hp.embd_scale);
  }
}

/* ---- paging ------------------------------------------------------------------------------- */

/* Calls fn on each maximal page-aligned run of the window's weight bytes, in file order. Runs must be
 * as long as possible: the page cache keeps large folios, and dropping part of one drops nothing. */
typedef struct {
  uint64_t lo, hi;
} byte_range;

static int cmp_range(const void *a, const void *b) {
  const byte_range *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static int for_each_range(prima_window *w, int (*fn)(prima_window *, uint8_t *, size_t, void *), void *arg) {
  const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  const int nt = LAYER_N_TENSORS;
  const int cap = (w->end - w->first) * nt;
  byte_range *r = malloc(sizeof *r * (size_t)cap);
  if (!r) return ENOMEM;
  int n = 0;
  for (int l = w->first; l < w->end; l++) {
    const prima_tensor *ts = layer_tensors(&w->m->layers[l]);
    for (int i = 0; i < nt; i++) {
      if (!ts[i].data) continue;
      r[n].lo = ts[i].offset & ~(page - 1);
      r[n].hi = (ts[i].offset + ts[i].n_bytes + page - 1) & ~(page - 1);
      n++;
    }
  }
  qsort(r, (size_t)n, sizeof *r, cmp_range);
  const uint64_t map_end = ((uint64_t)w->m->map_bytes + page - 1) & ~(page - 1);
  int rc = 0;
  for (int i = 0; i < n && rc == 0;) {
    uint64_t lo = r[i].lo, hi = r[i].hi;
    for (i++; i < n && r[i].lo <= hi; i++)
      if (r[i].hi > hi) hi = r[i].hi;
    if (hi > map_end) hi = map_end;
    rc = fn(w, w->m->map + lo, (size_t)(hi - lo), arg);
  }
  free(r);
  return rc;
}

static int advise_release(prima_window *w, uint8_t *p, size_t len, void *arg) {
  (void)arg;
  if (madvise(p, len, MADV_DONTNEED) != 0) return errno;
  /* Drop the clean pages from the page cache too, so the memory really returns to the device. */
  posix_fadvise(w->m->fd, (off_t)(p - w->m->map), (off_t)len, POSIX_FADV_DONTNEED);
  return 0;
}

typedef struct {
  uint64_t resident, total;
} residency_acc;

static int count_resident(prima_window *w, uint8_t *p, size_t len, void *arg) {
  (void)w;
  residency_acc *acc = arg;
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t n_pages = (len + page - 1) / page;
  unsigned char vec[4096];
  for (size_t done = 0; done < n_pages;) {
    const size_t chunk = n_pages - done < sizeof vec ? n_pages - done : sizeof vec;
    size_t bytes = chunk * page;
    if (done * page + bytes > len) bytes = len - done * page;
    if (mincore(p + done * page, bytes, vec) != 0) return errno;
    for (size_t i = 0; i < chunk; i++)
      if (vec[i] & 1) acc->resident += page;
    done += chunk;
  }
  acc->total += len;
  return 0;
}

/* ---- window prefetch: its runs advised here, or by the model's advisor thread ---------------- */

typedef struct {
  uint64_t left;
  uint64_t *r; /* [lo, hi) pairs of file offsets */
  int n, cap;
} range_list;

/* Collects the window's runs in file order until the byte budget (l->left) is spent. */
static int collect_range(prima_window *w, uint8_t *p, size_t len, void *arg) {
  range_list *l = arg;
  if (l->left == 0) return 0;
  if (len > l->left) len = (size_t)l->left;
  l->left -= len;
  if (l->n == l->cap) {
    const int cap = l->cap ? 2 * l->cap : 64;
    uint64_t *g = realloc(l->r, sizeof *g * 2 * (size_t)cap);
    if (!g) return ENOMEM;
    l->r = g, l->cap = cap;
  }
  l->r[2 * l->n] = (uint64_t)(p - w->m->map);
  l->r[2 * l->n + 1] = l->r[2 * l->n] + len;
  l->n++;
  return 0;
}

/* The window's runs to advise, at most max_bytes from its first layer on (what would not fit is
 * evicted before it is used), into l (its pairs freed by the caller). 0 or errno. */
static int prefetch_ranges(prima_window *w, uint64_t max_bytes, range_list *l) {
  *l = (range_list){max_bytes, NULL, 0, 0};
  return for_each_range(w, collect_range, l);
}

int prima_window_prefetch(prima_window *w, uint64_t max_bytes) {
  range_list l;
  int rc = prefetch_ranges(w, max_bytes, &l);
  for (int i = 0; rc == 0 && i < l.n; i++) rc = prima_willneed(w->m, w->m->map + l.r[2 * i], (size_t)(l.r[2 * i + 1] - l.r[2 * i]), NULL, 0);
  free(l.r);
  return rc;
}

int prima_window_prefetch_background(prima_window *w, uint64_t max_bytes) {
  prima_model *m = w->m;
  prima_advisor *a = __atomic_load_n(&m->advisor, __ATOMIC_ACQUIRE);
  if (!a && (a = prima_advisor_start(m)) != NULL) {
    prima_advisor *none = NULL; /* two threads' first calls: one advisor stays */
    if (!__atomic_compare_exchange_n(&m->advisor, &none, a, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) prima_advisor_stop(a), a = none;
  }
  if (!a) return prima_window_prefetch(w, max_bytes); /* no thread: advise here */
  range_list l;
  int rc = prefetch_ranges(w, max_bytes, &l);
  if (rc == 0) rc = prima_advisor_request(a, l.r, l.n);
  free(l.r);
  return rc;
}
int prima_window_release(prima_window *w) { return for_each_range(w, advise_release, NULL); }
void prima_window_stream_beyond(prima_window *w, uint64_t room_bytes, int stream_experts) {
  /* The layer being read in shares the room with the kept bytes while it is computed: they get the
   * room less the largest layer and the margin, or reading each streamed layer makes reclaim take kept
   * pages, which the next pass reads again. The first streamed layer keeps what is left of that budget
   * (kept whole layers only, a pass reread up to a layer more: 80 MiB a pass where this reads 68, in
   * a 10-layer window of the benchmark model under 256 MiB, `bench/capped.ts --window`). Halda prices
   * the same: an overloaded device rereads its excess, a layer and the margin ("stream" in
   * halda/types.ts). A window that fits whole keeps everything. */
  int from = w->end;
  uint64_t keep = 0;
  if (w->weight_bytes > room_bytes) {
    const uint64_t margin = w->largest_layer_bytes + PRIMA_STREAM_MARGIN_BYTES;
    const uint64_t budget = room_bytes > margin ? room_bytes - margin : 0;
    uint64_t sum = 0;
    for (from = w->first; from < w->end; from++) {
      const uint64_t b = layer_weight_bytes(&w->m->layers[from]);
      if (sum + b > budget) break;
      sum += b;
    }
    if (from < w->end) keep = budget - sum;
  }
  /* A window short of room rereads routed experts; read-around on those faults pulls in neighbouring
   * experts a token seldom uses (bench/expert-prefetch.ts: 17% fewer bytes a token and faster decode,
   * loaded, in 200 MiB), so their tensors are read without it until the window fits again. */
  const int random = w->weight_bytes > room_bytes;
  if (w->moe_logits && !w->experts_random_pinned && random != w->experts_random && prima_window_experts_random(w, random) == 0) w->experts_random = random;
  /* A mixture of experts is not streamed: dropping a layer's experts after each pass makes the next
   * reread every routed expert of it, where the page cache, left alone, keeps the ones most tokens use
   * (what Halda prices for MoE, moeRereadBytes; `npm run bench -- --only moe`, capped: a 6-layer window
   * in 170 MiB read 72 MiB a token streamed). */
  if (w->moe_logits && !stream_experts) {
    from = w->end;
    keep = 0;
  }
  /* what stops being streamed stays as it is: what the next pass reads in, memory keeps */
  __atomic_store_n(&w->stream_keep, keep, __ATOMIC_RELAXED);
  __atomic_store_n(&w->stream_from, from, __ATOMIC_RELAXED);
}

int prima_window_residency(prima_window *w, uint64_t *resident, uint64_t *total) {
  residency_acc acc = { 0, 0 };
  const int rc = for_each_range(w, count_resident, &acc);
  *resident = acc.resident;
  *total = acc.total;
  return rc;
}

/* ---- KV cache files ------------------------------------------------------------------------ */

#define KV_MAGIC 0x31564b50u /* "PKV1" */

typedef struct {
  uint32_t magic, kv_type;
  int32_t n_layers, kv_dim, n_filled, first;
} kv_header;

/* kv_type: the cache's type as it was (1, F16, for a cache of F16 K and V), or both as k | v << 8; bits 16
 * and 17 for a rotated K and V */
static uint32_t kv_type_code(const prima_window *w) {
  const uint32_t rot = (w->k_rot ? 1u << 16 : 0) | (w->v_rot ? 1u << 17 : 0);
  return (w->k_type == w->v_type ? (uint32_t)w->k_type : (uint32_t)w->k_type | (uint32_t)w->v_type << 8) | rot;
}

int prima_window_kv_save(prima_window *w, const char *path, char *err, size_t err_len) {
  const size_t kvdim = (size_t)w->m->hp.n_head_kv * w->m->hp.head_dim;
  const kv_header h = { KV_MAGIC, kv_type_code(w), w->end - w->first, (int32_t)kvdim, w->n_filled, w->first };
  /* the file holds every position of every layer: a ring that has wrapped no longer has them */
  for (int li = 0; li < h.n_layers; li++)
    if (w->kv_cells[li] < w->n_ctx && w->n_filled > 0 && (w->kv_end > w->kv_cells[li] || w->kv_floor > 0))
      return prima_fail(err, err_len, "layer %d keeps only its last %d positions (a sliding window): its cache cannot be saved whole",
                        w->first + li, w->kv_cells[li]);
  FILE *f = fopen(path, "wb");
  if (!f) return prima_fail(err, err_len, "cannot write %s: %s", path, strerror(errno));
  int ok = fwrite(&h, sizeof h, 1, f) == 1;
  for (int li = 0; ok && li < h.n_layers; li++) {
    /* positions 0.. sit in rows 0.. of a ring that has not wrapped */
    const size_t k_len = (size_t)w->n_filled * w->k_row_bytes, v_len = (size_t)w->n_filled * w->v_row_bytes;
    ok = fwrite(kv_k_rows(w, li), 1, k_len, f) == k_len && fwrite(kv_v_rows(w, li), 1, v_len, f) == v_len;
  }
  if (fclose(f) != 0) ok = 0;
  return ok ? 0 : prima_fail(err, err_len, "writing %s failed", path);
}

int prima_window_kv_load(prima_window *w, const char *path, char *err, size_t err_len) {
  const size_t kvdim = (size_t)w->m->hp.n_head_kv * w->m->hp.head_dim;
  FILE *f = fopen(path, "rb");
  if (!f) return prima_fail(err, err_len, "cannot read %s: %s", path, strerror(errno));
  kv_header h;
  int rc = 0;
  if (fread(&h, sizeof h, 1, f) != 1 || h.magic != KV_MAGIC) {
    rc = prima_fail(err, err_len, "%s is not a prima KV cache file", path);
  } else if (h.kv_type != kv_type_code(w) || h.n_layers != w->end - w->first || h.kv_dim != (int32_t)kvdim || h.first != w->first) {
    rc = prima_fail(err, err_len, "%s holds the cache of another window or model", path);
  } else if (h.n_filled < 0 || h.n_filled > w->n_ctx) {
    rc = prima_fail(err, err_len, "%s holds %d positions, more than the context of %d", path, h.n_filled, w->n_ctx);
  } else {
    for (int li = 0; rc == 0 && li < h.n_layers; li++)
      for (int c = 0; rc == 0 && c < 2; c++) { /* K then V; a ring keeps the last positions */
        uint8_t *rows = c ? kv_v_rows(w, li) : kv_k_rows(w, li);
        const size_t rb = c ? w->v_row_bytes : w->k_row_bytes;
        for (int p = 0, n; rc == 0 && p < h.n_filled; p += n) {
          n = kv_run(w, li, p, h.n_filled - p);
          if (fread(rows + (size_t)kv_row(w, li, p) * rb, rb, (size_t)n, f) != (size_t)n)
            rc = prima_fail(err, err_len, "%s is truncated", path);
        }
      }
    w->kv_end = h.n_filled; /* rows were overwritten even when the file fell short */
    w->lm_done = 0;
    if (w->h2o_acc) memset(w->h2o_acc, 0, sizeof(float) * (size_t)w->h2o_threads * w->n_ctx); /* unknown: start again */
    w->kv_floor = 0;
    if (rc == 0) w->n_filled = h.n_filled;
    else w->n_filled = 0;
  }
  fclose(f);
  return rc;
}
