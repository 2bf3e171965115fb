/* The tick hash chain and the small helpers the billing files share: hashes,
 * ids, the compact tick record, and failure reasons. */
#include "billing_int.h"

#include <sodium.h>
#include <stdio.h>

static void put_be(uint8_t *p, uint64_t v, int n) {
  for (int i = n - 1; i >= 0; i--) {
    p[i] = (uint8_t)v;
    v >>= 8;
  }
}

static uint64_t get_be(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++)
    v = (v << 8) | p[i];
  return v;
}

void gn__tick_hash(const uint8_t prev[GN__HASH_LEN], const char *lease_id, uint64_t idx, int64_t t_s, uint32_t gpus,
                   uint8_t util, uint8_t ret_hash[GN__HASH_LEN]) {
  crypto_generichash_state st;
  uint8_t fixed[8 + 8 + 4 + 1];
  put_be(fixed, idx, 8);
  put_be(fixed + 8, (uint64_t)t_s, 8);
  put_be(fixed + 16, gpus, 4);
  fixed[20] = util;
  crypto_generichash_init(&st, NULL, 0, GN__HASH_LEN);
  crypto_generichash_update(&st, (const uint8_t *)GN__TICK_DOMAIN, sizeof(GN__TICK_DOMAIN));
  crypto_generichash_update(&st, prev, GN__HASH_LEN);
  crypto_generichash_update(&st, (const uint8_t *)lease_id, strlen(lease_id));
  crypto_generichash_update(&st, fixed, sizeof(fixed));
  crypto_generichash_final(&st, ret_hash, GN__HASH_LEN);
}

void gn__genesis(const uint8_t *agreement_env, size_t len, uint8_t ret_hash[GN__HASH_LEN]) {
  crypto_generichash(ret_hash, GN__HASH_LEN, agreement_env, len, NULL, 0);
}

void gn__invoice_hash(const uint8_t *env, size_t len, uint8_t ret_hash[GN__HASH_LEN]) {
  crypto_generichash(ret_hash, GN__HASH_LEN, env, len, NULL, 0);
}

void gn__invoice_id(const uint8_t hash[GN__HASH_LEN], char ret_id[GN_LEASE_ID_STRLEN]) {
  char hex[17];
  sodium_bin2hex(hex, sizeof(hex), hash, 8);
  snprintf(ret_id, GN_LEASE_ID_STRLEN, "i-%s", hex);
}

void gn__tickrec_get(const uint8_t *p, gn__tickrec *ret) {
  ret->idx = (uint32_t)get_be(p, 4);
  ret->t_off = (uint32_t)get_be(p + 4, 4);
  ret->gpus = p[8];
  ret->util = p[9];
  ret->tag = (uint16_t)get_be(p + 10, 2);
}

void gn__tickrec_put(uint8_t *p, const gn__tickrec *r) {
  put_be(p, r->idx, 4);
  put_be(p + 4, r->t_off, 4);
  p[8] = r->gpus;
  p[9] = r->util;
  put_be(p + 10, r->tag, 2);
}

/* The ledger keys rows and exported file names by lease id: the project's
 * one id grammar (gn_id_valid), never '.' or '..'. */
bool gn__lease_id_ok(const char *s) {
  return s && strnlen(s, GN_LEASE_ID_STRLEN) < GN_LEASE_ID_STRLEN && gn_id_valid(s);
}

int gn__fail(char *reason, size_t cap, const char *fmt, ...) {
  if (reason && cap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, cap, fmt, ap);
    va_end(ap);
  }
  return GN_EAUDIT;
}
