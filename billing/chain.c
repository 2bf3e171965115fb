/* The tick hash chain (v2) and the small helpers the billing files share:
 * hashes, ids, the bill head, the tolerance rule, and failure reasons. */
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

void gn__tick_hasher_init(gn__tick_hasher *h, const char *lease_id) {
  size_t n = strnlen(lease_id, GN_LEASE_ID_STRLEN - 1);
  memcpy(h->prefix, GN__TICK_DOMAIN, sizeof(GN__TICK_DOMAIN));
  memcpy(h->prefix + sizeof(GN__TICK_DOMAIN), lease_id, n);
  h->prefix_len = sizeof(GN__TICK_DOMAIN) + n;
}

/* One BLAKE2b call over a single contiguous buffer: the domain and lease id
 * come before prev in the hash input, so they cannot be kept as a midstate;
 * copying ~100 bytes is far cheaper than the init/update/final sequence. */
void gn__tick_hasher_step(const gn__tick_hasher *h, uint8_t chain[GN__HASH_LEN], uint64_t idx, uint32_t gpus,
                          uint8_t util) {
  /* Order of the v2 input: domain (with NUL), prev, lease_id, idx, gpus,
   * util. One BLAKE2b call over one contiguous buffer: prev comes before the
   * lease id, so nothing constant can be kept as a midstate, and copying
   * ~100 bytes is cheaper than the init/update/final sequence. */
  const size_t d = sizeof(GN__TICK_DOMAIN), id_len = h->prefix_len - d;
  uint8_t buf[sizeof(h->prefix) + GN__HASH_LEN + 13];
  uint8_t *p = buf;
  memcpy(p, h->prefix, d);
  p += d;
  memcpy(p, chain, GN__HASH_LEN);
  p += GN__HASH_LEN;
  memcpy(p, h->prefix + d, id_len);
  p += id_len;
  put_be(p, idx, 8);
  put_be(p + 8, gpus, 4);
  p[12] = util;
  p += 13;
  crypto_generichash(chain, GN__HASH_LEN, buf, (size_t)(p - buf), NULL, 0);
}

void gn__tick_hash(const uint8_t prev[GN__HASH_LEN], const char *lease_id, uint64_t idx, uint32_t gpus, uint8_t util,
                   uint8_t ret_hash[GN__HASH_LEN]) {
  gn__tick_hasher h;
  uint8_t c[GN__HASH_LEN];
  gn__tick_hasher_init(&h, lease_id);
  memcpy(c, prev, GN__HASH_LEN);
  gn__tick_hasher_step(&h, c, idx, gpus, util);
  memcpy(ret_hash, c, GN__HASH_LEN);
}

void gn__genesis(const uint8_t *agreement_env, size_t len, uint8_t ret_hash[GN__HASH_LEN]) {
  crypto_generichash(ret_hash, GN__HASH_LEN, agreement_env, len, NULL, 0);
}

void gn__invoice_hash(const uint8_t *env, size_t len, uint8_t ret_hash[GN__HASH_LEN]) {
  crypto_generichash(ret_hash, GN__HASH_LEN, env, len, NULL, 0);
}

void gn_bill_hash(const uint8_t *env, size_t len, uint8_t ret_hash[32]) {
  crypto_generichash(ret_hash, GN__HASH_LEN, env, len, NULL, 0);
}

void gn__invoice_id(const uint8_t hash[GN__HASH_LEN], char ret_id[GN_LEASE_ID_STRLEN]) {
  char hex[17];
  sodium_bin2hex(hex, sizeof(hex), hash, 8);
  snprintf(ret_id, GN_LEASE_ID_STRLEN, "i-%s", hex);
}

uint64_t gn_bill_tolerance_s(uint64_t observed_s) {
  /* observed_s / 1000 + 5 cannot overflow. */
  return GN_BILL_TOLERANCE_S + observed_s / 1000u;
}

/* The last agreement this thread verified, keyed by the BLAKE2b-256 of its
 * exact bytes: every note, answer and check of a lease opens the same
 * agreement (two Ed25519 verifications), and a verification of the same
 * bytes always gives the same result, so a hit is as good as verifying. */
static __thread struct {
  bool valid;
  size_t len;
  uint8_t hash[GN__HASH_LEN];
  gn_agreement ag;
} ag_cache;

int gn__bill_ctx_open(const uint8_t *env, size_t len, gn__bill_ctx *ret, char *reason, size_t cap) {
  gn__bill_ctx c;
  char why[256];
  if (!env)
    return gn__fail(reason, cap, "no agreement given");
  memset(&c, 0, sizeof(c));
  gn__genesis(env, len, c.hash);
  if (ag_cache.valid && ag_cache.len == len && sodium_memcmp(ag_cache.hash, c.hash, GN__HASH_LEN) == 0) {
    c.ag = ag_cache.ag;
  } else {
    if (gn__agreement_open(env, len, &c.ag, why, sizeof(why)) < 0)
      return gn__fail(reason, cap, "the agreement does not verify: %s", why);
    ag_cache.ag = c.ag;
    ag_cache.len = len;
    memcpy(ag_cache.hash, c.hash, GN__HASH_LEN);
    ag_cache.valid = true;
  }
  c.env = env;
  c.len = len;
  *ret = c;
  return 0;
}

void gn__bill_head_genesis(const gn__bill_ctx *ctx, gn_bill_head *ret) {
  memset(ret, 0, sizeof(*ret));
  memcpy(ret->chain_head, ctx->hash, GN__HASH_LEN);
}

int gn_bill_head_init(const uint8_t *agreement_env, size_t agreement_len, gn_bill_head *ret) {
  gn__bill_ctx c;
  if (!agreement_env || !ret)
    return GN_EINVAL;
  int r = gn_agreement_open(agreement_env, agreement_len, &c.ag);
  if (r < 0)
    return r;
  c.env = agreement_env;
  c.len = agreement_len;
  gn__genesis(agreement_env, agreement_len, c.hash);
  gn__bill_head_genesis(&c, ret);
  return 0;
}

/* u64be seq, note_hash, u64be seconds, gpu_seconds, total_micro, chain_head. */
void gn_bill_head_encode(const gn_bill_head *h, uint8_t out[GN_BILL_HEAD_LEN]) {
  put_be(out, h->seq, 8);
  memcpy(out + 8, h->note_hash, 32);
  put_be(out + 40, h->seconds, 8);
  put_be(out + 48, h->gpu_seconds, 8);
  put_be(out + 56, h->total_micro, 8);
  memcpy(out + 64, h->chain_head, 32);
}

int gn_bill_head_decode(const uint8_t *p, size_t len, gn_bill_head *ret) {
  gn_bill_head h;
  if (!p || !ret || len != GN_BILL_HEAD_LEN)
    return GN_EINVAL;
  h.seq = get_be(p, 8);
  memcpy(h.note_hash, p + 8, 32);
  h.seconds = get_be(p + 40, 8);
  h.gpu_seconds = get_be(p + 48, 8);
  h.total_micro = get_be(p + 56, 8);
  memcpy(h.chain_head, p + 64, 32);
  *ret = h;
  return 0;
}

/* The ledger keys rows and exported file names by lease id: the project's
 * one id grammar (gn_id_valid), never '.' or '..'. */
bool gn__lease_id_ok(const char *s) {
  return s && strnlen(s, GN_LEASE_ID_STRLEN) < GN_LEASE_ID_STRLEN && gn_id_valid(s);
}

bool gn__printable(const char *s) {
  if (!s || !*s)
    return false;
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
      return false;
  return true;
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
