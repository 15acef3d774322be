/* A ring worker's data path on a thread of its own ("the lane"). Once both of a worker's ring links
 * are up, JS hands their sockets over: the lane reads the predecessor's WebSocket frames, runs the
 * window of each ACTIVATIONS frame and writes the rows to the successor, with no event loop, stream
 * or JS object in between (on a loopback ring that path cost ~0.4 ms per device per token). It also
 * keeps each link's WebSocket duties (pong, close handshake) and liveness (ping, dead peer, stalled
 * writes) as ring/liveness.ts describes them. Anything it does not handle itself (an ERROR frame, a
 * frame it cannot run or that fails its checks) goes to JS as an event, and the lane waits for
 * prima_lane_resume before it takes the next frame, so frames stay in order. */
#ifndef PRIMA_LANE_H
#define PRIMA_LANE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "seal.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { PRIMA_LANE_IN = 0, PRIMA_LANE_OUT = 1 };

typedef enum {
  PRIMA_LANE_EV_FRAME,  /* a whole message the lane leaves to JS (bytes); link IN pauses the lane. Code 1:
                           a frame to run off the lane thread (prima_lane_run), 0: one JS must decode */
  PRIMA_LANE_EV_FAILED, /* the link failed: kind ("protocol", "dead", "closed") and message */
  PRIMA_LANE_EV_CLOSED, /* the connection ended: code (1006 when lost without a close frame), reason */
  PRIMA_LANE_EV_ERROR,  /* a window's pass failed (message); an ERROR frame went on to the successor */
} prima_lane_event_kind;

typedef struct {
  prima_lane_event_kind kind;
  int link;
  int code;
  const char *kind_name;
  const char *text;    /* message or close reason (NUL-terminated) */
  const uint8_t *data; /* FRAME: the message */
  size_t len;
} prima_lane_event;

typedef struct {
  prima_window *window;
  int cycle;
  /* Per sequence slot (serve --parallel), the window whose KV cache holds it over the same layers:
   * seqs[0] is window. SEQ_ACTIVATIONS rows run on them; NULL with n_seqs 0: one sequence. */
  prima_window *const *seqs;
  int n_seqs;
} prima_lane_window;

typedef struct {
  double compute_ms;
  uint64_t frames, tokens, major_faults;
} prima_lane_window_stats;

typedef struct {
  double wait_ms, send_ms;
  /* Of the windows' compute_ms and of send_ms: the lane thread preempted (prima_descheduled_ms). */
  double descheduled_ms;
  uint64_t frames;
} prima_lane_stats;

typedef struct {
  prima_model *model;
  const prima_lane_window *windows;
  int n_windows;
  int cycles;
  /* This device's receive limits (its HELLO): frames outside them go to JS, which names the field. */
  uint32_t hidden_size, max_tokens_per_frame;
  uint64_t max_payload_bytes, max_message_bytes;
  /* Bytes of frames read and not yet run: past it the predecessor is dropped (a flood). */
  uint64_t max_queued_bytes;
  /* ring/liveness.ts's livenessRules(): check every tick_ms, ping a peer silent for quiet_ms, report
   * it dead after dead_after_ms without an answer or a completed write; a close handshake gets
   * close_grace_ms. Passed in, so the rules have one home. */
  double tick_ms, quiet_ms, dead_after_ms, close_grace_ms;
  uint32_t fragment_bytes;
  int prefetch;
  /* Bytes of weights in this device's windows: a pass is quick only while memory holds them all. */
  uint64_t weight_bytes;
  /* A one-token pass runs on the lane thread when the window's last one took less than this
   * (engine/quick-forward.ts's INLINE_MAX_MS) without a major page fault. */
  double quick_pass_ms;
  /* Called on the lane thread; the event's pointers are valid only during the call. */
  void (*on_event)(void *ctx, const prima_lane_event *ev);
  void *ctx;
} prima_lane_config;

typedef struct prima_lane prima_lane;

/* A keyed link (ring/seal.ts): each direction's key and next sequence number, as JS left them. */
typedef struct {
  uint8_t tx_key[PRIMA_WIRE_LINK_KEY_BYTES], rx_key[PRIMA_WIRE_LINK_KEY_BYTES];
  uint64_t tx_seq, rx_seq;
} prima_lane_link_crypto;

prima_lane *prima_lane_start(const prima_lane_config *cfg, char *err, size_t err_len);
/* The cycle of an ACTIVATIONS or SEQ_ACTIVATIONS frame the lane would run under these limits, or -1 (it
 * goes to JS, whose decoder names the fault). Exposed so a test can check it never accepts what ring/validation.ts refuses. */
int prima_lane_frame_cycle(uint32_t hidden_size, uint32_t max_tokens_per_frame, uint64_t max_payload_bytes,
                           const uint8_t *f, size_t len);
/* Gives the lane a connected socket (it takes a dup of fd) from which nothing unparsed was read. With
 * crypto, every data message on it is a sealed record (seal.h); NULL: a plaintext link. */
int prima_lane_attach(prima_lane *l, int link, int fd, const prima_lane_link_crypto *crypto, char *err, size_t err_len);
/* Queues a whole frame (header + payload) for the successor. */
void prima_lane_send(prima_lane *l, const uint8_t *frame, size_t len);
/* Runs a frame the lane left to JS with code 1 (on any thread but the lane's: a libuv thread) and
 * queues its rows, or an ERROR frame, for the successor. 0, or -1 with err. */
int prima_lane_run(prima_lane *l, uint8_t *frame, size_t len, char *err, size_t err_len);
/* After an IN frame event: take the next frame. */
void prima_lane_resume(prima_lane *l);
/* Close handshake with this code and reason; code 0 ends the connection at once (no close frame). */
void prima_lane_close_link(prima_lane *l, int link, int code, const char *reason);
void prima_lane_set_weight_room(prima_lane *l, uint64_t bytes);
void prima_lane_set_release_after_use(prima_lane *l, int on);
/* Runs fn on the calling thread while no frame is being processed (KV commands). */
void prima_lane_exclusive(prima_lane *l, void (*fn)(void *), void *arg);
void prima_lane_read_stats(prima_lane *l, prima_lane_stats *s, prima_lane_window_stats *per_window);
void prima_lane_reset_stats(prima_lane *l);
/* Stops the thread and closes its sockets (no close frames); frees the lane. */
void prima_lane_stop(prima_lane *l);

#ifdef __cplusplus
}
#endif
#endif
