/* Digest strings and error text helpers shared by the sandbox module: every
 * blob the sandbox keeps is named and checked by its sha256 digest, hashed
 * with OpenSSL's libcrypto (libsodium's portable SHA-256 ran at 0.13-0.19 of
 * its speed here, and pulls spent most of their time in it). */
#include "sandbox_int.h"

#include <openssl/evp.h>
#include <pthread.h>

int gn__err(char *err, size_t err_cap, int code, const char *fmt, ...) {
  if (err && err_cap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_cap, fmt, ap);
    va_end(ap);
  }
  return code;
}

bool gn__digest_valid(const char *s) {
  if (!s || strncmp(s, "sha256:", 7) != 0)
    return false;
  s += 7;
  size_t i;
  for (i = 0; s[i]; i++) {
    if (i >= 64)
      return false;
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return false;
  }
  return i == 64;
}

void gn__digest_from_hash(const uint8_t hash[32], char out[GN_DIGEST_STRLEN]) {
  static const char hex[] = "0123456789abcdef";
  memcpy(out, "sha256:", 7);
  for (size_t i = 0; i < 32; i++) {
    out[7 + 2 * i] = hex[hash[i] >> 4];
    out[8 + 2 * i] = hex[hash[i] & 15];
  }
  out[71] = '\0';
}

/* The SHA-256 implementation is fetched once: with OpenSSL 3 an implicit
 * fetch on every init costs a provider lookup under a lock. */
static pthread_once_t md_once = PTHREAD_ONCE_INIT;
static EVP_MD *md_sha256;

static void md_init_once(void) {
  md_sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
}

static const EVP_MD *sha256_md(void) {
  pthread_once(&md_once, md_init_once);
  return md_sha256 ? md_sha256 : EVP_sha256();
}

int gn__sha256_init(gn__sha256 *h) {
  if (!h)
    return GN_EINVAL;
  if (!h->ctx && !(h->ctx = EVP_MD_CTX_new()))
    return GN_ENOMEM;
  if (EVP_DigestInit_ex(h->ctx, sha256_md(), NULL) != 1)
    return GN_EIO;
  return 0;
}

void gn__sha256_update(gn__sha256 *h, const void *p, size_t n) {
  if (h && h->ctx && n)
    EVP_DigestUpdate(h->ctx, p, n);
}

int gn__sha256_final(gn__sha256 *h, uint8_t out[32]) {
  unsigned int len = 0;
  if (!h || !h->ctx || EVP_DigestFinal_ex(h->ctx, out, &len) != 1 || len != 32)
    return GN_EIO;
  return 0;
}

int gn__sha256_final_digest(gn__sha256 *h, char out[GN_DIGEST_STRLEN]) {
  uint8_t hash[32];
  int r = gn__sha256_final(h, hash);
  if (r == 0)
    gn__digest_from_hash(hash, out);
  return r;
}

void gn__sha256_done(gn__sha256 *h) {
  if (h && h->ctx) {
    EVP_MD_CTX_free(h->ctx);
    h->ctx = NULL;
  }
}

void gn__digest_of(const void *p, size_t n, char out[GN_DIGEST_STRLEN]) {
  uint8_t h[32];
  unsigned int len = 0;
  if (EVP_Digest(p, n, h, &len, sha256_md(), NULL) != 1 || len != 32) {
    /* Only on allocation failure inside libcrypto: a string no valid digest
     * equals, so every comparison against it fails closed. */
    snprintf(out, GN_DIGEST_STRLEN, "sha256:?");
    return;
  }
  gn__digest_from_hash(h, out);
}

const char *gn__digest_short(const char *digest, char buf[32]) {
  snprintf(buf, 32, "%.15s…", digest ? digest : "");
  return buf;
}
