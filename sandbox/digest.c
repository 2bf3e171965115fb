/* Digest strings and error text helpers shared by the sandbox module: every
 * blob the sandbox keeps is named and checked by its sha256 digest. */
#include "sandbox_int.h"

#include <sodium.h>

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
  memcpy(out, "sha256:", 7);
  sodium_bin2hex(out + 7, GN_DIGEST_STRLEN - 7, hash, 32);
}

void gn__digest_of(const void *p, size_t n, char out[GN_DIGEST_STRLEN]) {
  uint8_t h[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(h, p, n);
  gn__digest_from_hash(h, out);
}

const char *gn__digest_short(const char *digest, char buf[32]) {
  snprintf(buf, 32, "%.15s…", digest ? digest : "");
  return buf;
}
