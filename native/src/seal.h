/* The record layer of a keyed ring link (ring/seal.ts is the same thing in TS; wire.h has the sizes):
 * a record is a frame sealed with AES-256-GCM under one direction's key, nonce = its sequence number.
 * The 8-byte sequence number and the frame's 32-byte header travel in clear and are authenticated;
 * the payload is encrypted. Each direction accepts exactly the next sequence number. OpenSSL's EVP
 * comes from the node binary the addon is loaded into (its headers ship with node's). */
#ifndef PRIMA_SEAL_H
#define PRIMA_SEAL_H

#include <stddef.h>
#include <stdint.h>

#include "wire.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PRIMA_SEAL_OVERHEAD (PRIMA_WIRE_RECORD_SEQ_BYTES + PRIMA_WIRE_RECORD_TAG_BYTES)

typedef struct {
  void *ctx; /* EVP_CIPHER_CTX with the key schedule; NULL: not set up */
  uint64_t seq; /* the next record's sequence number */
} prima_seal;

/* Sets up one direction (encrypt: 1 seals, 0 opens). 0, or -1 (out of memory, or OpenSSL refused). */
int prima_seal_init(prima_seal *s, const uint8_t key[PRIMA_WIRE_LINK_KEY_BYTES], uint64_t seq, int encrypt);
void prima_seal_free(prima_seal *s);
/* Overwrites key material (a copy the compiler may not optimise away). */
void prima_seal_wipe(void *p, size_t len);

/* Seals a frame (len >= the header) into out (len + PRIMA_SEAL_OVERHEAD bytes). 0, or -1. */
int prima_seal_frame(prima_seal *s, const uint8_t *frame, size_t len, uint8_t *out);

enum { PRIMA_OPEN_OK = 0, PRIMA_OPEN_SHORT = -1, PRIMA_OPEN_REPLAY = -2, PRIMA_OPEN_FORGED = -3 };
/* Opens a record in place: on PRIMA_OPEN_OK the frame is rec + PRIMA_WIRE_RECORD_SEQ_BYTES, len -
 * PRIMA_SEAL_OVERHEAD bytes. *seq gets the record's sequence number (for PRIMA_OPEN_REPLAY's message). */
int prima_seal_open(prima_seal *s, uint8_t *rec, size_t len, uint64_t *seq);

/* The same AES-256-GCM under the next sequence number, on a record in parts (a chunk stream's header,
 * its body in the buffer it is received into, its tag): aad is authenticated, len bytes of body are
 * sealed from in to out (which may be the same) or opened in place. 0 / PRIMA_OPEN_OK, or -1 /
 * PRIMA_OPEN_FORGED. */
int prima_seal_parts(prima_seal *s, const uint8_t *aad, size_t aad_len, const uint8_t *in, uint8_t *out, size_t len, uint8_t tag[PRIMA_WIRE_RECORD_TAG_BYTES]);
int prima_open_parts(prima_seal *s, const uint8_t *aad, size_t aad_len, uint8_t *body, size_t len, const uint8_t tag[PRIMA_WIRE_RECORD_TAG_BYTES]);

#ifdef __cplusplus
}
#endif
#endif
