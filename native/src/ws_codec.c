/* WebSocket frames for the lane (ws_codec.h says which rules). */
#include "ws_codec.h"

#include <stdio.h>
#include <string.h>

size_t prima_ws_header(uint8_t *h, int fin, int opcode, uint64_t len, int masked) {
  size_t hl = len < 126 ? 2 : len < 65536 ? 4 : 10;
  uint8_t mbit = masked ? 0x80 : 0;
  h[0] = (uint8_t)((fin ? 0x80 : 0) | opcode);
  if (len < 126) h[1] = mbit | (uint8_t)len;
  else if (len < 65536) {
    h[1] = mbit | 126;
    h[2] = (uint8_t)(len >> 8);
    h[3] = (uint8_t)len;
  } else {
    h[1] = mbit | 127;
    for (int i = 0; i < 8; i++) h[2 + i] = (uint8_t)(len >> (56 - 8 * i));
  }
  if (!masked) return hl;
  memset(h + hl, 0, 4);
  return hl + 4;
}

int prima_ws_parse_head(const uint8_t *b, size_t n, int server, prima_ws_head *h, char *why, size_t why_len) {
  if (n < 2) return 0;
  int fin = b[0] >> 7, rsv = b[0] & 0x70, op = b[0] & 15, masked = b[1] >> 7;
  uint64_t len = b[1] & 127;
  size_t hl = 2;
  if (rsv) return snprintf(why, why_len, "RSV bits set, no extension agreed"), -1;
  if (masked != server) return snprintf(why, why_len, "%s", server ? "an unmasked frame from a client" : "a masked frame from a server"), -1;
  if (op != PRIMA_WS_CONTINUATION && op != PRIMA_WS_TEXT && op != PRIMA_WS_BINARY && op != PRIMA_WS_CLOSE && op != PRIMA_WS_PING &&
      op != PRIMA_WS_PONG)
    return snprintf(why, why_len, "invalid opcode %d", op), -1;
  if (len == 126) {
    if (n < 4) return 0;
    len = (uint64_t)b[2] << 8 | b[3];
    hl = 4;
  } else if (len == 127) {
    if (n < 10) return 0;
    len = 0;
    for (int i = 0; i < 8; i++) len = len << 8 | b[2 + i];
    hl = 10;
    if (len >> 63) return snprintf(why, why_len, "a 64-bit length with its top bit set"), -1;
  }
  if (op >= PRIMA_WS_CLOSE && (!fin || len > PRIMA_WS_MAX_CONTROL_BYTES))
    return snprintf(why, why_len, "a fragmented or over-long control frame"), -1;
  h->fin = fin;
  h->opcode = op;
  h->masked = masked;
  h->len = len;
  h->header_bytes = hl;
  h->mask_bytes = masked ? 4 : 0;
  return 1;
}

void prima_ws_unmask(uint8_t *p, uint64_t len, const uint8_t *mask) {
  if (!(mask[0] | mask[1] | mask[2] | mask[3])) return;
  for (uint64_t i = 0; i < len; i++) p[i] ^= mask[i & 3];
}

size_t prima_ws_close_body(uint8_t *body, int code, const char *reason) {
  size_t rl = strnlen(reason, PRIMA_WS_MAX_CONTROL_BYTES - 2);
  body[0] = (uint8_t)(code >> 8);
  body[1] = (uint8_t)code;
  memcpy(body + 2, reason, rl);
  return 2 + rl;
}

int prima_ws_read_close(const uint8_t *body, size_t len, char *reason) {
  size_t rl = len > 2 ? len - 2 : 0;
  memcpy(reason, body + 2, rl);
  reason[rl] = 0;
  return len >= 2 ? body[0] << 8 | body[1] : PRIMA_WS_NO_STATUS;
}
