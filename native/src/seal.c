/* AES-256-GCM records for the native lane (seal.h). One EVP context per direction keeps the key
 * schedule; each record only sets a new nonce. */
#include "seal.h"

#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <string.h>

#define SEQ PRIMA_WIRE_RECORD_SEQ_BYTES
#define TAG PRIMA_WIRE_RECORD_TAG_BYTES
#define AAD (SEQ + PRIMA_WIRE_HEADER_BYTES)

static void nonce_of(uint64_t seq, uint8_t iv[12]) {
  /* The sequence number (u64 LE) and four zero bytes, as ring/seal.ts. */
  for (int i = 0; i < 8; i++) iv[i] = (uint8_t)(seq >> (8 * i));
  memset(iv + 8, 0, 4);
}

static uint64_t rd64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

int prima_seal_init(prima_seal *s, const uint8_t key[PRIMA_WIRE_LINK_KEY_BYTES], uint64_t seq, int encrypt) {
  s->ctx = NULL;
  s->seq = seq;
  EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
  if (!c) return -1;
  if (EVP_CipherInit_ex(c, EVP_aes_256_gcm(), NULL, key, NULL, encrypt) != 1) {
    EVP_CIPHER_CTX_free(c);
    return -1;
  }
  s->ctx = c;
  return 0;
}

void prima_seal_free(prima_seal *s) {
  if (s->ctx) EVP_CIPHER_CTX_free(s->ctx); /* clears the key schedule */
  s->ctx = NULL;
}

void prima_seal_wipe(void *p, size_t len) { OPENSSL_cleanse(p, len); }

/* The payload in steps an int length can hold (EVP's update takes int). */
static int update(EVP_CIPHER_CTX *c, uint8_t *out, const uint8_t *in, size_t len) {
  while (len > 0) {
    int n = len > (size_t)(INT_MAX / 2) ? INT_MAX / 2 : (int)len, outl = 0;
    if (EVP_CipherUpdate(c, out, &outl, in, n) != 1 || outl != n) return -1;
    in += n;
    out += n;
    len -= (size_t)n;
  }
  return 0;
}

int prima_seal_parts(prima_seal *s, const uint8_t *aad, size_t aad_len, const uint8_t *in, uint8_t *out, size_t len, uint8_t tag[PRIMA_WIRE_RECORD_TAG_BYTES]) {
  EVP_CIPHER_CTX *c = s->ctx;
  uint8_t iv[12];
  int outl = 0;
  if (!c || aad_len > INT_MAX) return -1;
  nonce_of(s->seq, iv);
  if (EVP_CipherInit_ex(c, NULL, NULL, NULL, iv, 1) != 1) return -1;
  if (aad_len > 0 && EVP_CipherUpdate(c, NULL, &outl, aad, (int)aad_len) != 1) return -1;
  if (update(c, out, in, len) != 0) return -1;
  if (EVP_CipherFinal_ex(c, out + len, &outl) != 1) return -1;
  if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, TAG, tag) != 1) return -1;
  s->seq++;
  return 0;
}

int prima_open_parts(prima_seal *s, const uint8_t *aad, size_t aad_len, uint8_t *body, size_t len, const uint8_t tag[PRIMA_WIRE_RECORD_TAG_BYTES]) {
  EVP_CIPHER_CTX *c = s->ctx;
  uint8_t iv[12];
  int outl = 0;
  if (!c || aad_len > INT_MAX) return PRIMA_OPEN_FORGED;
  nonce_of(s->seq, iv);
  if (EVP_CipherInit_ex(c, NULL, NULL, NULL, iv, 0) != 1) return PRIMA_OPEN_FORGED;
  if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, TAG, (void *)tag) != 1) return PRIMA_OPEN_FORGED;
  if (aad_len > 0 && EVP_CipherUpdate(c, NULL, &outl, aad, (int)aad_len) != 1) return PRIMA_OPEN_FORGED;
  /* Decrypted in place; a forged record's bytes are garbage afterwards, and the caller drops them. */
  if (update(c, body, body, len) != 0) return PRIMA_OPEN_FORGED;
  if (EVP_CipherFinal_ex(c, body + len, &outl) != 1) return PRIMA_OPEN_FORGED;
  s->seq++;
  return PRIMA_OPEN_OK;
}

int prima_seal_frame(prima_seal *s, const uint8_t *frame, size_t len, uint8_t *out) {
  if (!s->ctx || len < PRIMA_WIRE_HEADER_BYTES) return -1;
  uint64_t seq = s->seq;
  for (int i = 0; i < 8; i++) out[i] = (uint8_t)(seq >> (8 * i));
  memcpy(out + SEQ, frame, PRIMA_WIRE_HEADER_BYTES);
  return prima_seal_parts(s, out, AAD, frame + PRIMA_WIRE_HEADER_BYTES, out + AAD, len - PRIMA_WIRE_HEADER_BYTES, out + SEQ + len);
}

int prima_seal_open(prima_seal *s, uint8_t *rec, size_t len, uint64_t *seq) {
  *seq = 0;
  if (!s->ctx || len < AAD + TAG) return PRIMA_OPEN_SHORT;
  *seq = rd64(rec);
  if (*seq != s->seq) return PRIMA_OPEN_REPLAY;
  return prima_open_parts(s, rec, AAD, rec + AAD, len - AAD - TAG, rec + len - TAG);
}
