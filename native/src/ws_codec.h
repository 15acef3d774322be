/* WebSocket frames (RFC 6455) as the ring's links use them, for the lane (lane.c): no extensions,
 * binary messages only; a client masks, with a zero key (ring/dial.ts asks ws for one), a server does
 * not. Pure byte work: no socket, no state beyond the bytes given. */
#ifndef PRIMA_WS_CODEC_H
#define PRIMA_WS_CODEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  PRIMA_WS_CONTINUATION = 0,
  PRIMA_WS_TEXT = 1,
  PRIMA_WS_BINARY = 2,
  PRIMA_WS_CLOSE = 8,
  PRIMA_WS_PING = 9,
  PRIMA_WS_PONG = 10,
};

/* The longest header this codec writes: 2 bytes, an 8-byte length and a 4-byte mask key. */
#define PRIMA_WS_MAX_HEADER_BYTES 14
/* A control frame's payload limit, and the close code of a close frame without one. */
#define PRIMA_WS_MAX_CONTROL_BYTES 125
#define PRIMA_WS_NO_STATUS 1005
/* A close frame's reason: at most 123 bytes (a control payload less the code), NUL-terminated here. */
#define PRIMA_WS_CLOSE_REASON_BYTES 124

/* Writes the header of a frame carrying len bytes into h (PRIMA_WS_MAX_HEADER_BYTES at least) and
 * returns its length. masked (a client's frame): a zero mask key, so the payload follows as it is. */
size_t prima_ws_header(uint8_t *h, int fin, int opcode, uint64_t len, int masked);

typedef struct {
  int fin, opcode, masked;
  uint64_t len;        /* the payload's bytes */
  size_t header_bytes; /* 2, 4 or 10: up to the mask key */
  size_t mask_bytes;   /* 4 when masked: the key follows the header */
} prima_ws_head;

/* Reads the header at b (n bytes there) of a frame sent to this end (server: from a client, so it
 * must be masked). 1: *h is set (the mask key and payload may still be to come); 0: more bytes are
 * needed; -1: the frame breaks the protocol, and why (NUL-terminated) names the rule. */
int prima_ws_parse_head(const uint8_t *b, size_t n, int server, prima_ws_head *h, char *why, size_t why_len);

/* Unmasks a payload in place with the key at mask (a zero key leaves it as it is). */
void prima_ws_unmask(uint8_t *p, uint64_t len, const uint8_t *mask);

/* A close frame's payload for code and reason (cut to 123 bytes) into body (125 bytes); its length. */
size_t prima_ws_close_body(uint8_t *body, int code, const char *reason);

/* A received close frame's code (PRIMA_WS_NO_STATUS without one) and its reason into reason
 * (PRIMA_WS_CLOSE_REASON_BYTES). len is at most PRIMA_WS_MAX_CONTROL_BYTES (prima_ws_parse_head). */
int prima_ws_read_close(const uint8_t *body, size_t len, char *reason);

#ifdef __cplusplus
}
#endif
#endif
