/* The lane: a ring worker's data path on its own thread (lane.h says why). One thread, one poll loop:
 * commands from JS arrive through a pipe; each link is a non-blocking socket with a buffer of
 * unparsed bytes and a queue of whole WebSocket frames to write. The frames' bytes are ws_codec.c's
 * business; this file keeps each link's state (messages, close handshake, liveness) and runs them. */
#define _GNU_SOURCE
#include "lane.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"
#include "threadpool.h"
#include "wire.h"
#include "ws_codec.h"

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0
#endif

#define FRAME_HEADER_BYTES PRIMA_WIRE_HEADER_BYTES
#define LOST 1006
/* What a queued message costs beyond its bytes (the struct and malloc's own), for the queue bound. */
#define MESSAGE_OVERHEAD 64

typedef struct chunk {
  struct chunk *next;
  size_t len, off;
  int ping;
  uint8_t data[];
} chunk;

typedef struct message {
  struct message *next;
  size_t len;
  uint8_t *data;
} message;

typedef struct {
  int fd; /* -1: not attached or ended */
  int server;
  int ended;
  uint8_t *rbuf;
  size_t rlen, rcap;
  uint8_t *msg; /* a fragmented data message being assembled */
  size_t msg_len, msg_cap;
  int in_msg;
  chunk *head;
  size_t queued;
  double last_heard, last_write, buffered_since, ping_flushed_at, next_tick;
  int ping_outstanding;
  int close_sent, close_received, close_code;
  char close_reason[PRIMA_WS_CLOSE_REASON_BYTES];
  double close_deadline;
  int sealed; /* a keyed link: data messages are records (seal.h) */
  prima_seal tx, rx;
} conn;

enum { CMD_ATTACH, CMD_SEND, CMD_RESUME, CMD_CLOSE, CMD_STOP };
typedef struct command {
  struct command *next;
  int type, link, fd, code;
  int sealed; /* CMD_ATTACH of a keyed link: tx and rx are set up */
  prima_seal tx, rx;
  char reason[PRIMA_WS_CLOSE_REASON_BYTES];
  size_t len;
  uint8_t data[];
} command;

typedef struct {
  double one_token_ms; /* the last one-token pass (none yet: huge) */
  double step_ms;      /* the last decode step of several sequences (none yet: huge) */
  uint64_t major_faults; /* during the last pass */
} window_pass;

struct prima_lane {
  prima_lane_config cfg;
  prima_lane_window *windows;
  prima_lane_window_stats *wstats;
  prima_lane_stats stats;
  pthread_t thread;
  int wake[2];
  pthread_mutex_t mu;   /* commands and stats */
  pthread_mutex_t proc; /* held while a frame runs */
  command *cmds, *cmds_tail;
  conn c[2];
  message *frames, *frames_tail; /* whole messages from the predecessor, waiting their turn */
  uint64_t frames_bytes;         /* what they hold (cfg.max_queued_bytes bounds it) */
  int paused, stopping;
  double last_done;
  window_pass *last; /* per window: its last pass, for the quick-pass rule */
  _Atomic uint64_t room;
  _Atomic int release_after_use;
};

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void emit(prima_lane *l, prima_lane_event_kind kind, int link, int code, const char *kind_name, const char *text,
                 const uint8_t *data, size_t len) {
  prima_lane_event ev = {kind, link, code, kind_name, text ? text : "", data, len};
  l->cfg.on_event(l->cfg.ctx, &ev);
}

/* ---- writing ---------------------------------------------------------------------------------- */

/* One WebSocket frame as a chunk (a client's: masked, with a zero key). */
static chunk *ws_frame(const conn *c, int fin, int op, const uint8_t *payload, size_t len) {
  uint8_t h[PRIMA_WS_MAX_HEADER_BYTES];
  size_t hl = prima_ws_header(h, fin, op, len, !c->server);
  chunk *k = malloc(sizeof(chunk) + hl + len);
  if (!k) return NULL;
  memcpy(k->data, h, hl);
  if (len) memcpy(k->data + hl, payload, len);
  k->next = NULL;
  k->len = hl + len;
  k->off = 0;
  k->ping = 0;
  return k;
}

static void enqueue(conn *c, chunk *k, int control) {
  if (!k) return;
  c->queued += k->len;
  chunk **at = &c->head;
  if (control) {
    /* A control frame may go between the fragments of a message, never inside a frame. */
    if (*at && (*at)->off > 0) at = &(*at)->next;
  } else {
    while (*at) at = &(*at)->next;
  }
  k->next = *at;
  *at = k;
}

static void end_conn(prima_lane *l, int link, int code, const char *reason);

static void fail_conn(prima_lane *l, int link, const char *kind, const char *fmt, ...) {
  conn *c = &l->c[link];
  if (c->fd < 0) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  emit(l, PRIMA_LANE_EV_FAILED, link, 0, kind, msg, NULL, 0);
  end_conn(l, link, LOST, "");
}

/* Writes what the socket takes now. */
static void flush(prima_lane *l, int link) {
  conn *c = &l->c[link];
  while (c->fd >= 0 && c->head) {
    chunk *k = c->head;
    ssize_t n = send(c->fd, k->data + k->off, k->len - k->off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      fail_conn(l, link, "closed", "connection error: %s", strerror(errno));
      return;
    }
    double t = now_ms();
    c->last_write = t;
    k->off += (size_t)n;
    c->queued -= (size_t)n;
    if (k->off < k->len) continue;
    if (k->ping && c->ping_outstanding) c->ping_flushed_at = t;
    c->head = k->next;
    free(k);
  }
  if (c->fd >= 0 && !c->head) {
    c->buffered_since = -1;
    /* Both close frames exchanged and ours written: the connection is over. */
    if (c->close_sent && c->close_received) end_conn(l, link, c->close_code, c->close_reason);
  }
}

static void send_close(prima_lane *l, int link, int code, const char *reason) {
  conn *c = &l->c[link];
  if (c->close_sent || c->fd < 0) return;
  uint8_t body[PRIMA_WS_MAX_CONTROL_BYTES];
  enqueue(c, ws_frame(c, 1, PRIMA_WS_CLOSE, body, prima_ws_close_body(body, code, reason)), 1);
  c->close_sent = 1;
  c->close_deadline = now_ms() + l->cfg.close_grace_ms;
  flush(l, link);
}

/* A whole prima frame to the successor, as fragments of at most fragment_bytes (pings overtake a long
 * frame; see ring/options.ts). */
static void send_message(prima_lane *l, const uint8_t *p, size_t len) {
  conn *c = &l->c[PRIMA_LANE_OUT];
  if (c->fd < 0) return;
  uint8_t *record = NULL;
  if (c->sealed) {
    record = malloc(len + PRIMA_SEAL_OVERHEAD);
    if (!record || prima_seal_frame(&c->tx, p, len, record) != 0) {
      free(record);
      fail_conn(l, PRIMA_LANE_OUT, "closed", "could not seal a %zu-byte frame (out of memory, or OpenSSL failed)", len);
      return;
    }
    p = record;
    len += PRIMA_SEAL_OVERHEAD;
  }
  size_t step = l->cfg.fragment_bytes ? l->cfg.fragment_bytes : len;
  size_t off = 0;
  do {
    size_t n = len - off < step ? len - off : step;
    enqueue(c, ws_frame(c, off + n == len, off == 0 ? PRIMA_WS_BINARY : PRIMA_WS_CONTINUATION, p + off, n), 0);
    off += n;
  } while (off < len);
  free(record);
  if (c->buffered_since < 0) c->buffered_since = now_ms();
  flush(l, PRIMA_LANE_OUT);
}

static void end_conn(prima_lane *l, int link, int code, const char *reason) {
  conn *c = &l->c[link];
  if (c->fd < 0) return;
  shutdown(c->fd, SHUT_RDWR);
  close(c->fd);
  c->fd = -1;
  c->ended = 1;
  while (c->head) {
    chunk *k = c->head;
    c->head = k->next;
    free(k);
  }
  c->queued = 0;
  emit(l, PRIMA_LANE_EV_CLOSED, link, code, NULL, reason, NULL, 0);
}

/* ---- running frames --------------------------------------------------------------------------- */

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

int prima_lane_frame_cycle(uint32_t hidden_size, uint32_t max_tokens_per_frame, uint64_t max_payload_bytes,
                           const uint8_t *f, size_t len) {
  if (len < FRAME_HEADER_BYTES || memcmp(f + PRIMA_WIRE_AT_MAGIC, PRIMA_WIRE_MAGIC, 4) != 0) return -1;
  if (rd16(f + PRIMA_WIRE_AT_HEADER_VERSION) != PRIMA_WIRE_HEADER_VERSION) return -1;
  uint32_t type = rd16(f + PRIMA_WIRE_AT_FRAME_TYPE);
  if (type != PRIMA_WIRE_TYPE_ACTIVATIONS && type != PRIMA_WIRE_TYPE_SEQ_ACTIVATIONS) return -1;
  const int seqs = type == PRIMA_WIRE_TYPE_SEQ_ACTIVATIONS;
  uint32_t n = rd16(f + PRIMA_WIRE_AT_N_TOKENS), dtype = rd16(f + PRIMA_WIRE_AT_PAYLOAD_DTYPE);
  uint32_t row = rd32(f + PRIMA_WIRE_AT_ROW_WIDTH), payload = rd32(f + PRIMA_WIRE_AT_PAYLOAD_BYTES);
  uint64_t pos = rd32(f + PRIMA_WIRE_AT_FIRST_TOKEN_POSITION);
  if (dtype != PRIMA_WIRE_DTYPE_F32 && dtype != PRIMA_WIRE_DTYPE_F16) return -1;
  if (rd16(f + PRIMA_WIRE_AT_RESERVED) != 0 || row != hidden_size || n < 1 || n > max_tokens_per_frame) return -1;
  /* a SEQ_ACTIVATIONS frame's positions are in its row tags; its position field is 0 */
  if (seqs ? pos != 0 : pos + n > PRIMA_WIRE_U32_MAX) return -1;
  uint64_t width = dtype == PRIMA_WIRE_DTYPE_F16 ? PRIMA_WIRE_DTYPE_F16_BYTES : PRIMA_WIRE_DTYPE_F32_BYTES;
  uint64_t tags = seqs ? (uint64_t)n * PRIMA_WIRE_SEQ_TAG_BYTES : 0;
  if ((uint64_t)payload != len - FRAME_HEADER_BYTES || tags + (uint64_t)n * row * width != payload) return -1;
  if (payload > max_payload_bytes + tags) return -1;
  for (uint32_t i = 0; i < (seqs ? n : 0); i++) {
    const uint8_t *t = f + FRAME_HEADER_BYTES + (size_t)i * PRIMA_WIRE_SEQ_TAG_BYTES;
    if (rd32(t) > PRIMA_WIRE_SEQ_TAG_MAX || rd32(t + 4) >= PRIMA_WIRE_SEQ_TAG_MAX) return -1;
  }
  return rd16(f + PRIMA_WIRE_AT_CYCLE);
}

/* The window for an ACTIVATIONS or SEQ_ACTIVATIONS frame the lane may run, or -1: the frame goes to JS, whose decoder
 * (ring/validation.ts) names whatever is wrong with it. */
static int runnable(const prima_lane *l, const uint8_t *f, size_t len) {
  int cycle = prima_lane_frame_cycle(l->cfg.hidden_size, l->cfg.max_tokens_per_frame, l->cfg.max_payload_bytes, f, len);
  if (cycle < 0) return -1;
  for (int i = 0; i < l->cfg.n_windows; i++)
    if (l->windows[i].cycle == cycle) return i;
  return -1;
}

/* An ERROR frame standing for the failed frame f (its request, position, tokens and cycle) into buf
 * (FRAME_HEADER_BYTES + 512 bytes); returns its length. */
static size_t error_frame(uint8_t *buf, const uint8_t *f, const char *text) {
  size_t tl = strlen(text) < 512 ? strlen(text) : 512;
  memcpy(buf, f, FRAME_HEADER_BYTES);
  buf[PRIMA_WIRE_AT_FRAME_TYPE] = PRIMA_WIRE_TYPE_ERROR;
  buf[PRIMA_WIRE_AT_FRAME_TYPE + 1] = 0;
  memset(buf + PRIMA_WIRE_AT_PAYLOAD_DTYPE, 0, 8); /* dtype, reserved, row width */
  buf[PRIMA_WIRE_AT_PAYLOAD_BYTES] = (uint8_t)tl;
  buf[PRIMA_WIRE_AT_PAYLOAD_BYTES + 1] = (uint8_t)(tl >> 8);
  buf[PRIMA_WIRE_AT_PAYLOAD_BYTES + 2] = buf[PRIMA_WIRE_AT_PAYLOAD_BYTES + 3] = 0;
  memcpy(buf + FRAME_HEADER_BYTES, text, tl);
  return FRAME_HEADER_BYTES + tl;
}

static void send_error_frame(prima_lane *l, const uint8_t *f, const char *text) {
  uint8_t buf[FRAME_HEADER_BYTES + 512];
  send_message(l, buf, error_frame(buf, f, text));
}

static int input_pending(prima_lane *l) {
  conn *c = &l->c[PRIMA_LANE_IN];
  if (l->frames || c->fd < 0) return l->frames != NULL;
  if (c->rlen > 0) return 1;
  struct pollfd p = {c->fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

/* The next window (cycle order, wrapping) after window i, as RingNode.nextSlot. */
static int next_window(const prima_lane *l, int i) {
  int best = -1, bestd = 1 << 30;
  for (int j = 0; j < l->cfg.n_windows; j++) {
    int d = ((l->windows[j].cycle - l->windows[i].cycle) % l->cfg.cycles + l->cfg.cycles) % l->cfg.cycles;
    if (d == 0) d = l->cfg.cycles;
    if (d < bestd) bestd = d, best = j;
  }
  return best;
}

static int is_seqs(const uint8_t *f) { return rd16(f + PRIMA_WIRE_AT_FRAME_TYPE) == PRIMA_WIRE_TYPE_SEQ_ACTIVATIONS; }
static uint32_t tag_slot(const uint8_t *f, int i) { return rd32(f + FRAME_HEADER_BYTES + (size_t)i * PRIMA_WIRE_SEQ_TAG_BYTES); }
static uint32_t tag_pos(const uint8_t *f, int i) { return rd32(f + FRAME_HEADER_BYTES + (size_t)i * PRIMA_WIRE_SEQ_TAG_BYTES + 4); }

/* A SEQ_ACTIVATIONS frame's rows are one slot's consecutive positions (a prompt's batch: RingNode
 * runs them through that slot's window) or else a decode step, one row per sequence. */
static int one_slot(const uint8_t *f, int n) {
  for (int i = 1; i < n; i++)
    if (tag_slot(f, i) != tag_slot(f, 0) || tag_pos(f, i) != tag_pos(f, 0) + (uint32_t)i) return 0;
  return 1;
}

/* A pass runs on the lane thread only when it is quick (RingNode's rule for running inline: one token
 * or one decode step of several sequences, the window's last such pass under quick_pass_ms without a
 * major fault, its pages all in memory). Anything longer (a prompt batch, a window paged in from disk)
 * runs off it (prima_lane_run on a libuv thread), so the lane keeps answering pings and reading: a
 * pass of seconds must not make this device look dead. */
static int quick(prima_lane *l, int wi, const uint8_t *f) {
  int n = rd16(f + PRIMA_WIRE_AT_N_TOKENS);
  double last = n == 1 ? l->last[wi].one_token_ms : is_seqs(f) && !one_slot(f, n) ? l->last[wi].step_ms : 1e300;
  return last < l->cfg.quick_pass_ms && l->last[wi].major_faults == 0 &&
         !atomic_load(&l->release_after_use) && atomic_load(&l->room) >= l->cfg.weight_bytes;
}

/* NaN or infinite rows would go round the ring as noise (engine/quick-forward.ts checkFinite, the
 * same rule): a sum is finite exactly when every element is, and costs one pass over the rows. */
static int rows_finite(const float *acts, size_t nf) {
  double sum = 0;
  for (size_t i = 0; i < nf; i++) sum += acts[i];
  return isfinite(sum);
}

static void nan_rows_error(const prima_window *w, char *err, size_t err_len) {
  if (w->end - w->first == 1) snprintf(err, err_len, "layer %d made NaN or infinite activations: the model's weights are broken, or its activations overflow", w->first);
  else snprintf(err, err_len, "layers %d-%d made NaN or infinite activations: the model's weights are broken, or its activations overflow", w->first, w->end - 1);
}

/* Runs the rows of a SEQ_ACTIVATIONS frame through window wi's sequence slots, as RingNode
 * .processSeqs does: one slot's batch (`one`) through its window, a decode step through one pass over
 * the weights, each row attending to its own slot's cache. On NaN rows each slot forgets what the frame wrote. */
static int forward_seqs(prima_lane *l, int wi, const uint8_t *f, int n, int one, float *acts, char *err, size_t err_len) {
  const prima_lane_window *lw = &l->windows[wi];
  int *pos = malloc((size_t)n * sizeof *pos);
  prima_window **seqs = malloc((size_t)n * sizeof *seqs);
  if (!pos || !seqs) {
    free(pos), free(seqs);
    return snprintf(err, err_len, "out of memory for the rows' sequences"), -1;
  }
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    uint32_t slot = tag_slot(f, i);
    if (slot >= (uint32_t)lw->n_seqs) {
      snprintf(err, err_len, "sequence slot %u is not on this device (it holds %d)", slot, lw->n_seqs);
      rc = -1;
    } else {
      seqs[i] = lw->seqs[slot];
      pos[i] = (int)tag_pos(f, i);
    }
  }
  if (rc == 0) {
    if (one) rc = prima_window_forward(seqs[0], acts, pos[0], n, NULL, err, err_len);
    else rc = prima_window_forward_seqs(seqs[0], seqs, pos, n, acts, NULL, err, err_len);
  }
  if (rc == 0 && !rows_finite(acts, (size_t)n * l->cfg.hidden_size)) {
    nan_rows_error(lw->window, err, err_len);
    for (int i = 0; i < n; i++)
      if (seqs[i]->n_filled > pos[i]) seqs[i]->n_filled = pos[i];
    rc = -1;
  }
  free(pos);
  free(seqs);
  return rc;
}

/* Runs window wi over the frame's rows in place (f16 rows as floats in a buffer of their own: not
 * the wire's default, so not worth keeping one); counts it. 0, or -1 with err set (nothing sent). */
static int compute(prima_lane *l, int wi, uint8_t *f, char *err, size_t err_len) {
  int n = rd16(f + PRIMA_WIRE_AT_N_TOKENS), pos = (int)rd32(f + PRIMA_WIRE_AT_FIRST_TOKEN_POSITION);
  int f16 = rd16(f + PRIMA_WIRE_AT_PAYLOAD_DTYPE) == PRIMA_WIRE_DTYPE_F16, seqs = is_seqs(f);
  int one = seqs && one_slot(f, n), step = seqs && n > 1 && !one;
  uint8_t *rows = f + FRAME_HEADER_BYTES + (seqs ? (size_t)n * PRIMA_WIRE_SEQ_TAG_BYTES : 0);
  size_t nf = (size_t)n * l->cfg.hidden_size;
  float *acts = f16 ? malloc(nf * sizeof(float)) : (float *)rows;
  if (!acts) return snprintf(err, err_len, "out of memory for the rows"), -1;
  if (f16)
    for (size_t i = 0; i < nf; i++) acts[i] = prima_fp16_to_fp32(rd16(rows + 2 * i));
  prima_pool_prewake(l->cfg.model->pool);
  struct rusage ru0, ru1;
  prima_thread_clock k0, k1;
  pthread_mutex_lock(&l->proc);
  getrusage(RUSAGE_SELF, &ru0);
  prima_thread_clock_read(&k0);
  double t0 = now_ms();
  prima_window *w = l->windows[wi].window;
  int rc;
  if (seqs) rc = forward_seqs(l, wi, f, n, one, acts, err, err_len);
  else {
    rc = prima_window_forward(w, acts, pos, n, NULL, err, err_len);
    if (rc == 0 && !rows_finite(acts, nf)) {
      nan_rows_error(w, err, err_len);
      if (w->n_filled > pos) w->n_filled = pos;
      rc = -1;
    }
  }
  double t1 = now_ms();
  prima_thread_clock_read(&k1);
  getrusage(RUSAGE_SELF, &ru1);
  pthread_mutex_unlock(&l->proc);
  pthread_mutex_lock(&l->mu);
  prima_lane_window_stats *ws = &l->wstats[wi];
  ws->compute_ms += t1 - t0;
  l->stats.descheduled_ms += prima_descheduled_ms(&k0, &k1, t1 - t0);
  ws->frames++;
  ws->tokens += (uint64_t)n;
  ws->major_faults += (uint64_t)(ru1.ru_majflt - ru0.ru_majflt);
  l->stats.frames++;
  if (n == 1) l->last[wi].one_token_ms = t1 - t0;
  else if (step) l->last[wi].step_ms = t1 - t0;
  l->last[wi].major_faults = (uint64_t)(ru1.ru_majflt - ru0.ru_majflt);
  pthread_mutex_unlock(&l->mu);
  if (f16) {
    for (size_t i = 0; rc == 0 && i < nf; i++) {
      uint16_t v = prima_fp32_to_fp16(acts[i]);
      rows[2 * i] = (uint8_t)v;
      rows[2 * i + 1] = (uint8_t)(v >> 8);
    }
    free(acts);
  }
  return rc != 0 ? -1 : 0;
}

/* After passing rows on: page in the next window, and drop this one if memory is short
 * (RingNode.advise; not while more rows for this window wait). */
static void advise(prima_lane *l, int wi, int more_for_this_window) {
  int next = next_window(l, wi);
  if (more_for_this_window) return;
  if (next < 0 || next == wi) {
    /* One window: it comes again next. If it does not fit, keep its first layers and stream the rest,
     * which is read again anyway (RingNode.advise). */
    prima_window_stream_beyond(l->windows[wi].window, atomic_load(&l->room), 0);
    return;
  }
  if (atomic_load(&l->release_after_use)) prima_window_release(l->windows[wi].window);
  if (l->cfg.prefetch) prima_window_prefetch_background(l->windows[next].window, atomic_load(&l->room));
}

static void run_frame(prima_lane *l, message *m) {
  uint8_t *f = m->data;
  int wi = runnable(l, f, m->len);
  if (wi < 0 || !quick(l, wi, f)) {
    /* code 1: JS runs it off this thread (prima_lane_run); 0: JS decodes it and says what it is. */
    l->paused = 1;
    emit(l, PRIMA_LANE_EV_FRAME, PRIMA_LANE_IN, wi < 0 ? 0 : 1, NULL, NULL, f, m->len);
    return;
  }
  char err[256] = "";
  if (compute(l, wi, f, err, sizeof err) != 0) {
    send_error_frame(l, f, err);
    emit(l, PRIMA_LANE_EV_ERROR, PRIMA_LANE_IN, 0, NULL, err, NULL, 0);
    return;
  }
  /* With no more input, this device has nothing to do until rows come round again: its threads stop
   * spinning now, since the successor starts as soon as the bytes arrive (RingNode.send). */
  if (!input_pending(l)) prima_pool_relax(l->cfg.model->pool);
  prima_thread_clock k0, k1;
  prima_thread_clock_read(&k0);
  double t1 = now_ms();
  send_message(l, f, m->len);
  double t2 = now_ms();
  prima_thread_clock_read(&k1);
  pthread_mutex_lock(&l->mu);
  l->stats.send_ms += t2 - t1;
  /* On a host the ring shares, the successor's threads wake as the bytes land and can take this
   * thread's CPU inside write(): time the send did not cost, told apart here. */
  l->stats.descheduled_ms += prima_descheduled_ms(&k0, &k1, t2 - t1);
  pthread_mutex_unlock(&l->mu);
  advise(l, wi, l->frames && runnable(l, l->frames->data, l->frames->len) == wi);
}

static void run_frames(prima_lane *l) {
  while (l->frames && !l->paused && l->c[PRIMA_LANE_OUT].fd >= 0) {
    message *m = l->frames;
    l->frames = m->next;
    if (!l->frames) l->frames_tail = NULL;
    l->frames_bytes -= m->len + MESSAGE_OVERHEAD;
    run_frame(l, m);
    free(m->data);
    free(m);
    if (!l->frames) l->last_done = now_ms();
  }
}

/* ---- reading ---------------------------------------------------------------------------------- */

static void on_message(prima_lane *l, int link, uint8_t *data, size_t len) {
  conn *c = &l->c[link];
  if (c->sealed) {
    /* The same rule and words as ring/seal.ts: exactly the next sequence number, and an intact tag. */
    uint64_t seq;
    int rc = prima_seal_open(&c->rx, data, len, &seq);
    if (rc != PRIMA_OPEN_OK) {
      free(data);
      if (rc == PRIMA_OPEN_REPLAY)
        fail_conn(l, link, "protocol", "sent a frame out of order or replayed (sequence %llu, expected %llu)", (unsigned long long)seq,
                  (unsigned long long)c->rx.seq);
      else if (rc == PRIMA_OPEN_SHORT)
        fail_conn(l, link, "protocol", "sent a %zu-byte message, shorter than any sealed frame (%d bytes)", len,
                  PRIMA_WIRE_RECORD_SEQ_BYTES + PRIMA_WIRE_HEADER_BYTES + PRIMA_WIRE_RECORD_TAG_BYTES);
      else fail_conn(l, link, "protocol", "sent a frame that fails authentication (altered, or not sealed with this link's key)");
      return;
    }
    len -= PRIMA_SEAL_OVERHEAD;
    memmove(data, data + PRIMA_WIRE_RECORD_SEQ_BYTES, len);
  }
  if (link == PRIMA_LANE_OUT) {
    /* A successor sends nothing back on the data plane: JS decodes it and reports what it is. */
    emit(l, PRIMA_LANE_EV_FRAME, link, 0, NULL, NULL, data, len);
    free(data);
    return;
  }
  /* A predecessor sends at most what one request's positions make (the head waits for each request),
   * so a queue past the bound is a flood: refused by name before it can take this device's memory. */
  if (l->frames_bytes + len + MESSAGE_OVERHEAD > l->cfg.max_queued_bytes) {
    free(data);
    fail_conn(l, link, "protocol", "sent frames faster than this device runs them: %llu bytes waiting would pass the queue's limit of %llu bytes",
              (unsigned long long)(l->frames_bytes + len + MESSAGE_OVERHEAD), (unsigned long long)l->cfg.max_queued_bytes);
    return;
  }
  message *m = malloc(sizeof *m);
  if (!m) {
    free(data);
    fail_conn(l, link, "closed", "out of memory for a %zu-byte frame", len);
    return;
  }
  if (!l->frames && l->last_done > 0) {
    pthread_mutex_lock(&l->mu);
    l->stats.wait_ms += now_ms() - l->last_done;
    pthread_mutex_unlock(&l->mu);
  }
  *m = (message){NULL, len, data};
  l->frames_bytes += len + MESSAGE_OVERHEAD;
  if (l->frames_tail) l->frames_tail->next = m;
  else l->frames = m;
  l->frames_tail = m;
}

static int grow(uint8_t **buf, size_t *cap, size_t need) {
  if (need <= *cap && *buf) return 0;
  size_t nc = *cap ? *cap : need ? need : 1;
  while (nc < need) nc *= 2;
  uint8_t *nb = realloc(*buf, nc);
  if (!nb) return -1;
  *buf = nb;
  *cap = nc;
  return 0;
}

/* Takes one WebSocket frame from the link's buffer: 1 done, 0 needs more bytes, -1 the link ended. */
static int parse_frame(prima_lane *l, int link) {
  conn *c = &l->c[link];
  prima_ws_head h;
  char why[96];
  int got = prima_ws_parse_head(c->rbuf, c->rlen, c->server, &h, why, sizeof why);
  if (got < 0) return fail_conn(l, link, "protocol", "broke the WebSocket protocol (%s)", why), -1;
  if (got == 0) return 0;
  int op = h.opcode, fin = h.fin;
  uint64_t len = h.len;
  if (op == PRIMA_WS_TEXT) return fail_conn(l, link, "protocol", "sent a text message; the data plane carries binary frames only"), -1;
  if (op == PRIMA_WS_CONTINUATION && !c->in_msg)
    return fail_conn(l, link, "protocol", "broke the WebSocket protocol (a continuation frame with no message)"), -1;
  if (op == PRIMA_WS_BINARY && c->in_msg)
    return fail_conn(l, link, "protocol", "broke the WebSocket protocol (a new message inside a fragmented one)"), -1;
  if (op < PRIMA_WS_CLOSE && c->msg_len + len > l->cfg.max_message_bytes)
    return fail_conn(l, link, "protocol", "sent a message over this link's limit of %llu bytes", (unsigned long long)l->cfg.max_message_bytes), -1;
  size_t used = h.header_bytes + h.mask_bytes + (size_t)len;
  if (c->rlen < used) return 0;
  uint8_t *p = c->rbuf + h.header_bytes + h.mask_bytes;
  if (h.masked) prima_ws_unmask(p, len, c->rbuf + h.header_bytes);
  if (op >= PRIMA_WS_CLOSE) {
    uint8_t body[PRIMA_WS_MAX_CONTROL_BYTES];
    memcpy(body, p, (size_t)len);
    memmove(c->rbuf, c->rbuf + used, c->rlen - used);
    c->rlen -= used;
    if (op == PRIMA_WS_PING) {
      if (!c->close_sent) enqueue(c, ws_frame(c, 1, PRIMA_WS_PONG, body, (size_t)len), 1);
      flush(l, link);
    } else if (op == PRIMA_WS_PONG) {
      c->ping_outstanding = 0;
      c->ping_flushed_at = -1;
    } else {
      c->close_received = 1;
      c->close_code = prima_ws_read_close(body, (size_t)len, c->close_reason);
      /* Answer with the same code (ws does) and end once it is written. */
      if (!c->close_sent) send_close(l, link, c->close_code == PRIMA_WS_NO_STATUS ? 1000 : c->close_code, "");
      else flush(l, link);
      return -1;
    }
    return 1;
  }
  /* A message's fragments gather in c->msg; the last one hands it over whole. */
  if (grow(&c->msg, &c->msg_cap, c->msg_len + (size_t)len))
    return fail_conn(l, link, "closed", "out of memory for a %llu-byte message", (unsigned long long)(c->msg_len + len)), -1;
  memcpy(c->msg + c->msg_len, p, (size_t)len);
  c->msg_len += (size_t)len;
  c->in_msg = !fin;
  memmove(c->rbuf, c->rbuf + used, c->rlen - used);
  c->rlen -= used;
  if (fin) {
    uint8_t *data = c->msg;
    size_t dlen = c->msg_len;
    c->msg = NULL;
    c->msg_len = c->msg_cap = 0;
    on_message(l, link, data, dlen);
  }
  return 1;
}

static void read_conn(prima_lane *l, int link) {
  conn *c = &l->c[link];
  for (;;) {
    if (c->fd < 0 || c->close_received) return;
    if (grow(&c->rbuf, &c->rcap, c->rlen + 65536)) {
      fail_conn(l, link, "closed", "out of memory reading the link");
      return;
    }
    ssize_t n = recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) fail_conn(l, link, "closed", "connection error: %s", strerror(errno));
      break;
    }
    if (n == 0) {
      /* Lost without a close frame (a killed peer): what ws reports as 1006. */
      end_conn(l, link, LOST, "");
      return;
    }
    c->rlen += (size_t)n;
    c->last_heard = now_ms();
    /* Parse as we go: a flooding peer must not make the buffer grow past one message. */
    while (c->fd >= 0 && parse_frame(l, link) > 0) {
    }
    if ((size_t)n < 65536) break;
  }
}

/* ---- liveness: ring/liveness.ts's rules (its livenessRules() gives the timings), for the links JS no
 * longer sees ---------------------------------------------------------------------------------- */

static void tick(prima_lane *l, int link, double now) {
  conn *c = &l->c[link];
  double dead_after = l->cfg.dead_after_ms;
  if (c->close_sent && now > c->close_deadline) {
    end_conn(l, link, LOST, "");
    return;
  }
  if (c->ping_outstanding && c->ping_flushed_at >= 0) {
    double t = c->ping_flushed_at > c->last_heard ? c->ping_flushed_at : c->last_heard;
    if (c->last_write > t) t = c->last_write;
    if (now - t > dead_after) {
      fail_conn(l, link, "dead", "no answer to a ping for %.0f ms: the peer is dead, hung or unreachable", now - c->ping_flushed_at);
      return;
    }
  }
  if (c->queued > 0) {
    if (c->buffered_since < 0) c->buffered_since = now;
    double t = c->last_write > c->buffered_since ? c->last_write : c->buffered_since;
    if (now - t > dead_after) {
      fail_conn(l, link, "dead", "the peer stopped reading: %zu bytes unsent and no write completed for %.0f ms", c->queued, now - t);
      return;
    }
  }
  if (!c->ping_outstanding && !c->close_sent && now - c->last_heard >= l->cfg.quiet_ms) {
    c->ping_outstanding = 1;
    c->ping_flushed_at = -1;
    chunk *k = ws_frame(c, 1, PRIMA_WS_PING, NULL, 0);
    if (k) k->ping = 1;
    enqueue(c, k, 1);
    flush(l, link);
  }
}

/* ---- the thread ------------------------------------------------------------------------------- */

static void attach(prima_lane *l, command *cmd) {
  conn *c = &l->c[cmd->link];
  if (c->fd >= 0 || c->ended) {
    close(cmd->fd);
    prima_seal_free(&cmd->tx);
    prima_seal_free(&cmd->rx);
    return;
  }
  double t = now_ms();
  c->sealed = cmd->sealed;
  c->tx = cmd->tx;
  c->rx = cmd->rx;
  c->fd = cmd->fd;
  c->server = cmd->link == PRIMA_LANE_IN;
  c->last_heard = c->last_write = t;
  c->buffered_since = c->ping_flushed_at = -1;
  c->next_tick = t + l->cfg.tick_ms;
}

static void run_commands(prima_lane *l) {
  char drain[64];
  while (read(l->wake[0], drain, sizeof drain) > 0) {
  }
  pthread_mutex_lock(&l->mu);
  command *cmds = l->cmds;
  l->cmds = l->cmds_tail = NULL;
  pthread_mutex_unlock(&l->mu);
  while (cmds) {
    command *cmd = cmds;
    cmds = cmd->next;
    switch (cmd->type) {
      case CMD_ATTACH: attach(l, cmd); break;
      case CMD_SEND: send_message(l, cmd->data, cmd->len); break;
      case CMD_RESUME: l->paused = 0; break;
      case CMD_CLOSE:
        if (cmd->code == 0) end_conn(l, cmd->link, LOST, "");
        else send_close(l, cmd->link, cmd->code, cmd->reason);
        break;
      case CMD_STOP: l->stopping = 1; break;
    }
    free(cmd);
  }
}

static void *lane_main(void *arg) {
  prima_lane *l = arg;
  while (!l->stopping) {
    run_commands(l);
    if (l->stopping) break;
    run_frames(l);
    double now = now_ms();
    int timeout = 1000;
    struct pollfd p[3] = {{l->wake[0], POLLIN, 0}, {-1, 0, 0}, {-1, 0, 0}};
    for (int i = 0; i < 2; i++) {
      conn *c = &l->c[i];
      if (c->fd < 0) continue;
      if (now >= c->next_tick) {
        tick(l, i, now);
        c->next_tick = now + l->cfg.tick_ms;
      }
      if (c->fd < 0) continue;
      int wait = (int)(c->next_tick - now) + 1;
      if (wait < timeout) timeout = wait;
      p[1 + i].fd = c->fd;
      p[1 + i].events = (short)((c->close_received ? 0 : POLLIN) | (c->head ? POLLOUT : 0));
    }
    if (poll(p, 3, timeout) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; i++) {
      if (p[1 + i].fd < 0 || l->c[i].fd < 0) continue;
      if (p[1 + i].revents & POLLOUT) flush(l, i);
      if (p[1 + i].revents & (POLLIN | POLLHUP | POLLERR)) read_conn(l, i);
    }
  }
  return NULL;
}

static void push_command(prima_lane *l, command *cmd) {
  if (!cmd) return;
  cmd->next = NULL;
  pthread_mutex_lock(&l->mu);
  if (l->cmds_tail) l->cmds_tail->next = cmd;
  else l->cmds = cmd;
  l->cmds_tail = cmd;
  pthread_mutex_unlock(&l->mu);
  char one = 1;
  ssize_t ignored = write(l->wake[1], &one, 1);
  (void)ignored;
}

static command *new_command(int type, int link, size_t len) {
  command *cmd = calloc(1, sizeof(command) + len);
  if (cmd) {
    cmd->type = type;
    cmd->link = link;
    cmd->fd = -1;
    cmd->len = len;
  }
  return cmd;
}

prima_lane *prima_lane_start(const prima_lane_config *cfg, char *err, size_t err_len) {
  if (cfg->n_windows < 1 || cfg->cycles < 1 || !cfg->on_event) {
    snprintf(err, err_len, "a lane needs at least one window, a cycle count and an event callback");
    return NULL;
  }
  prima_lane *l = calloc(1, sizeof *l);
  if (!l) return snprintf(err, err_len, "out of memory"), NULL;
  l->cfg = *cfg;
  l->windows = calloc((size_t)cfg->n_windows, sizeof *l->windows);
  l->wstats = calloc((size_t)cfg->n_windows, sizeof *l->wstats);
  l->last = calloc((size_t)cfg->n_windows, sizeof *l->last);
  if (!l->windows || !l->wstats || !l->last || pipe(l->wake) != 0) {
    snprintf(err, err_len, "cannot set up the lane: %s", strerror(errno));
    free(l->last);
    free(l->windows);
    free(l->wstats);
    free(l);
    return NULL;
  }
  memcpy(l->windows, cfg->windows, (size_t)cfg->n_windows * sizeof *l->windows);
  for (int i = 0; i < cfg->n_windows; i++) {
    l->last[i].one_token_ms = l->last[i].step_ms = 1e300; /* no timing yet: not quick */
    if (!l->windows[i].seqs || l->windows[i].n_seqs < 1) l->windows[i].seqs = &l->windows[i].window, l->windows[i].n_seqs = 1;
  }
  l->cfg.windows = l->windows;
  for (int i = 0; i < 2; i++) {
    fcntl(l->wake[i], F_SETFL, fcntl(l->wake[i], F_GETFL) | O_NONBLOCK);
    fcntl(l->wake[i], F_SETFD, FD_CLOEXEC);
    l->c[i].fd = -1;
  }
  atomic_store(&l->room, UINT64_MAX);
  pthread_mutex_init(&l->mu, NULL);
  pthread_mutex_init(&l->proc, NULL);
  if (pthread_create(&l->thread, NULL, lane_main, l) != 0) {
    snprintf(err, err_len, "cannot start the lane thread");
    close(l->wake[0]);
    close(l->wake[1]);
    free(l->last);
    free(l->windows);
    free(l->wstats);
    free(l);
    return NULL;
  }
  return l;
}

int prima_lane_attach(prima_lane *l, int link, int fd, const prima_lane_link_crypto *crypto, char *err, size_t err_len) {
  if (link != PRIMA_LANE_IN && link != PRIMA_LANE_OUT) return snprintf(err, err_len, "no link %d", link), -1;
  command *cmd = new_command(CMD_ATTACH, link, 0);
  if (!cmd) return snprintf(err, err_len, "out of memory"), -1;
  /* The ciphers are set up here, so a failure is the caller's error at once, before the socket moves. */
  if (crypto) {
    if (prima_seal_init(&cmd->tx, crypto->tx_key, crypto->tx_seq, 1) != 0 || prima_seal_init(&cmd->rx, crypto->rx_key, crypto->rx_seq, 0) != 0) {
      prima_seal_free(&cmd->tx);
      prima_seal_free(&cmd->rx);
      free(cmd);
      return snprintf(err, err_len, "cannot set up AES-256-GCM for the link (OpenSSL)"), -1;
    }
    cmd->sealed = 1;
  }
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (own < 0) {
    prima_seal_free(&cmd->tx);
    prima_seal_free(&cmd->rx);
    free(cmd);
    return snprintf(err, err_len, "cannot take the socket: %s", strerror(errno)), -1;
  }
  fcntl(own, F_SETFL, fcntl(own, F_GETFL) | O_NONBLOCK);
  cmd->fd = own;
  push_command(l, cmd);
  return 0;
}

void prima_lane_send(prima_lane *l, const uint8_t *frame, size_t len) {
  command *cmd = new_command(CMD_SEND, PRIMA_LANE_OUT, len);
  if (cmd) memcpy(cmd->data, frame, len);
  push_command(l, cmd);
}

int prima_lane_run(prima_lane *l, uint8_t *frame, size_t len, char *err, size_t err_len) {
  int wi = runnable(l, frame, len);
  if (wi < 0) return snprintf(err, err_len, "not a frame this device runs"), -1;
  if (compute(l, wi, frame, err, err_len) != 0) {
    /* The error frame goes the same way the rows would have (CMD_SEND, ahead of the resume). */
    uint8_t buf[FRAME_HEADER_BYTES + 512];
    prima_lane_send(l, buf, error_frame(buf, frame, err));
    return -1;
  }
  prima_lane_send(l, frame, len);
  advise(l, wi, 0);
  return 0;
}

void prima_lane_resume(prima_lane *l) { push_command(l, new_command(CMD_RESUME, 0, 0)); }

void prima_lane_close_link(prima_lane *l, int link, int code, const char *reason) {
  command *cmd = new_command(CMD_CLOSE, link, 0);
  if (cmd) {
    cmd->code = code;
    snprintf(cmd->reason, sizeof cmd->reason, "%s", reason ? reason : "");
  }
  push_command(l, cmd);
}

void prima_lane_set_weight_room(prima_lane *l, uint64_t bytes) { atomic_store(&l->room, bytes); }
void prima_lane_set_release_after_use(prima_lane *l, int on) { atomic_store(&l->release_after_use, on); }

void prima_lane_exclusive(prima_lane *l, void (*fn)(void *), void *arg) {
  pthread_mutex_lock(&l->proc);
  fn(arg);
  pthread_mutex_unlock(&l->proc);
}

void prima_lane_read_stats(prima_lane *l, prima_lane_stats *s, prima_lane_window_stats *per_window) {
  pthread_mutex_lock(&l->mu);
  *s = l->stats;
  memcpy(per_window, l->wstats, (size_t)l->cfg.n_windows * sizeof *per_window);
  pthread_mutex_unlock(&l->mu);
}

void prima_lane_reset_stats(prima_lane *l) {
  pthread_mutex_lock(&l->mu);
  memset(&l->stats, 0, sizeof l->stats);
  memset(l->wstats, 0, (size_t)l->cfg.n_windows * sizeof *l->wstats);
  pthread_mutex_unlock(&l->mu);
}

void prima_lane_stop(prima_lane *l) {
  if (!l) return;
  push_command(l, new_command(CMD_STOP, 0, 0));
  pthread_join(l->thread, NULL);
  for (int i = 0; i < 2; i++) {
    conn *c = &l->c[i];
    if (c->fd >= 0) close(c->fd);
    while (c->head) {
      chunk *k = c->head;
      c->head = k->next;
      free(k);
    }
    free(c->rbuf);
    free(c->msg);
    prima_seal_free(&c->tx);
    prima_seal_free(&c->rx);
  }
  l->frames_bytes = 0;
  while (l->frames) {
    message *m = l->frames;
    l->frames = m->next;
    free(m->data);
    free(m);
  }
  while (l->cmds) {
    command *cmd = l->cmds;
    l->cmds = cmd->next;
    if (cmd->type == CMD_ATTACH && cmd->fd >= 0) close(cmd->fd);
    prima_seal_free(&cmd->tx);
    prima_seal_free(&cmd->rx);
    free(cmd);
  }
  close(l->wake[0]);
  close(l->wake[1]);
  pthread_mutex_destroy(&l->mu);
  pthread_mutex_destroy(&l->proc);
  free(l->last);
  free(l->windows);
  free(l->wstats);
  free(l);
}
