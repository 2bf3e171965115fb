/* Token buckets, bounded keyed tables of buckets and back-offs, and the
 * table of rate classes that every session message is charged to. */
#include <gpunet/ratelimit.h>
#include <gpunet/wire.h>

#include <netinet/in.h>
#include <sodium.h>
#include <sys/socket.h>

#include "rateclass.h"

#define WAYS 8

/* --- token buckets ---------------------------------------------------------*/

static uint64_t bucket_cap_us(gn_rate rate) {
  return (uint64_t)rate.burst * rate.per_token_us;
}

static uint64_t bucket_credit_at(const gn_token_bucket *b, gn_rate rate, uint64_t now_ms) {
  uint64_t cap = bucket_cap_us(rate);
  uint64_t credit = b->credit_us;
  if (now_ms > b->last_ms) {
    uint64_t gained = now_ms - b->last_ms;
    /* Saturate: a long-idle bucket is simply full. */
    gained = gained > cap / 1000u + 1 ? cap : gained * 1000u;
    credit = cap - credit < gained ? cap : credit + gained;
  }
  return credit > cap ? cap : credit;
}

void gn_token_bucket_init(gn_token_bucket *b, gn_rate rate, uint64_t now_ms) {
  b->credit_us = bucket_cap_us(rate);
  b->last_ms = now_ms;
}

bool gn_token_bucket_take(gn_token_bucket *b, gn_rate rate, uint32_t cost, uint64_t now_ms) {
  b->credit_us = bucket_credit_at(b, rate, now_ms);
  if (now_ms > b->last_ms)
    b->last_ms = now_ms;
  uint64_t need = (uint64_t)cost * rate.per_token_us;
  if (cost > rate.burst || need > b->credit_us)
    return false;
  b->credit_us -= need;
  return true;
}

uint32_t gn_token_bucket_level(const gn_token_bucket *b, gn_rate rate, uint64_t now_ms) {
  if (rate.per_token_us == 0)
    return rate.burst;
  return (uint32_t)(bucket_credit_at(b, rate, now_ms) / rate.per_token_us);
}

/* --- keys --------------------------------------------------------------------*/

size_t gn_ratelimit_addr_key(const struct sockaddr *sa, bool prefix, uint8_t ret_key[GN_RATELIMIT_KEY_MAX]) {
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  const uint8_t *v4 = NULL;
  memset(ret_key, 0, GN_RATELIMIT_KEY_MAX);
  if (!sa)
    return 0;
  if (sa->sa_family == AF_INET) {
    v4 = (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr;
  } else if (sa->sa_family == AF_INET6) {
    const uint8_t *a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
    if (memcmp(a, mapped, sizeof(mapped)) == 0) {
      v4 = a + 12;
    } else {
      /* 6, then the address or its first 64 bits, then a prefix flag. */
      ret_key[0] = 6;
      memcpy(ret_key + 1, a, prefix ? 8 : 16);
      ret_key[17] = prefix;
      return 18;
    }
  } else {
    return 0;
  }
  ret_key[0] = 4;
  memcpy(ret_key + 1, v4, prefix ? 3 : 4);
  ret_key[5] = prefix;
  return 6;
}

/* A keyed hash picks a key's set; the SipHash key is random per table. */
typedef struct keyed {
  uint8_t key[GN_RATELIMIT_KEY_MAX];
  uint8_t len; /* 0: a free slot */
} keyed;

static size_t sets_for(size_t cap) {
  size_t want = (cap + WAYS - 1) / WAYS, n = 1;
  while (n < want)
    n *= 2;
  return n;
}

static size_t set_of(const uint8_t hkey[crypto_shorthash_KEYBYTES], size_t nsets, const void *key, size_t len) {
  uint8_t h[crypto_shorthash_BYTES];
  crypto_shorthash(h, key, len, hkey);
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(h); i++)
    v = v << 8 | h[i];
  return (size_t)(v & (nsets - 1));
}

static bool keyed_is(const keyed *k, const void *key, size_t len) {
  return k->len == len && memcmp(k->key, key, len) == 0;
}

static bool key_ok(const void *key, size_t len) {
  return key && len >= 1 && len <= GN_RATELIMIT_KEY_MAX;
}

/* --- bucket tables -----------------------------------------------------------*/

typedef struct rl_entry {
  keyed k;
  gn_token_bucket b;
} rl_entry;

struct gn_ratelimit {
  gn_rate rate;
  size_t nsets;
  size_t count;
  uint8_t hkey[crypto_shorthash_KEYBYTES];
  rl_entry *e; /* nsets * WAYS */
};

int gn_ratelimit_new(size_t cap, gn_rate rate, gn_ratelimit **ret_rl) {
  if (!ret_rl || cap == 0 || cap > (1u << 24) || rate.burst == 0 || rate.per_token_us == 0)
    return GN_EINVAL;
  if (sodium_init() < 0)
    return GN_EIO;
  gn_ratelimit *rl = calloc(1, sizeof(*rl));
  if (!rl)
    return GN_ENOMEM;
  rl->rate = rate;
  rl->nsets = sets_for(cap);
  rl->e = calloc(rl->nsets * WAYS, sizeof(rl->e[0]));
  if (!rl->e) {
    free(rl);
    return GN_ENOMEM;
  }
  crypto_shorthash_keygen(rl->hkey);
  *ret_rl = rl;
  return 0;
}

gn_ratelimit *gn_ratelimit_free(gn_ratelimit *rl) {
  if (rl) {
    free(rl->e);
    free(rl);
  }
  return NULL;
}

bool gn_ratelimit_allow(gn_ratelimit *rl, const void *key, size_t key_len, uint32_t cost, uint64_t now_ms) {
  if (!rl || !key_ok(key, key_len))
    return false;
  rl_entry *set = rl->e + set_of(rl->hkey, rl->nsets, key, key_len) * WAYS;
  rl_entry *victim = NULL;
  uint64_t cap = bucket_cap_us(rl->rate);
  for (size_t i = 0; i < WAYS; i++) {
    rl_entry *e = &set[i];
    if (keyed_is(&e->k, key, key_len))
      return gn_token_bucket_take(&e->b, rl->rate, cost, now_ms);
    if (e->k.len == 0) {
      if (!victim || victim->k.len != 0)
        victim = e;
      continue;
    }
    if (victim && victim->k.len == 0)
      continue;
    /* A full bucket holds nothing a fresh one would not; else the least
     * recently used. */
    bool full = bucket_credit_at(&e->b, rl->rate, now_ms) >= cap;
    bool vfull = victim && bucket_credit_at(&victim->b, rl->rate, now_ms) >= cap;
    if (!victim || (full && !vfull) || (full == vfull && e->b.last_ms < victim->b.last_ms))
      victim = e;
  }
  if (victim->k.len == 0)
    rl->count++;
  memcpy(victim->k.key, key, key_len);
  victim->k.len = (uint8_t)key_len;
  gn_token_bucket_init(&victim->b, rl->rate, now_ms);
  return gn_token_bucket_take(&victim->b, rl->rate, cost, now_ms);
}

size_t gn_ratelimit_count(const gn_ratelimit *rl) {
  return rl ? rl->count : 0;
}

/* --- back-offs ---------------------------------------------------------------*/

typedef struct bo_entry {
  keyed k;
  uint64_t until_ms;  /* refused before this */
  uint64_t period_ms; /* the last refusal's length */
} bo_entry;

struct gn_backoff {
  uint64_t base_ms, max_ms;
  size_t nsets;
  size_t count;
  uint8_t hkey[crypto_shorthash_KEYBYTES];
  bo_entry *e;
};

int gn_backoff_new(size_t cap, uint64_t base_ms, uint64_t max_ms, gn_backoff **ret_b) {
  if (!ret_b || cap == 0 || cap > (1u << 24) || base_ms == 0 || max_ms < base_ms)
    return GN_EINVAL;
  if (sodium_init() < 0)
    return GN_EIO;
  gn_backoff *b = calloc(1, sizeof(*b));
  if (!b)
    return GN_ENOMEM;
  b->base_ms = base_ms;
  b->max_ms = max_ms;
  b->nsets = sets_for(cap);
  b->e = calloc(b->nsets * WAYS, sizeof(b->e[0]));
  if (!b->e) {
    free(b);
    return GN_ENOMEM;
  }
  crypto_shorthash_keygen(b->hkey);
  *ret_b = b;
  return 0;
}

gn_backoff *gn_backoff_free(gn_backoff *b) {
  if (b) {
    free(b->e);
    free(b);
  }
  return NULL;
}

static bool bo_remembered(const gn_backoff *b, const bo_entry *e, uint64_t now_ms) {
  return e->k.len != 0 && now_ms < e->until_ms + b->max_ms;
}

uint64_t gn_backoff_punish(gn_backoff *b, const void *key, size_t key_len, uint64_t now_ms) {
  if (!b || !key_ok(key, key_len))
    return 0;
  bo_entry *set = b->e + set_of(b->hkey, b->nsets, key, key_len) * WAYS;
  bo_entry *victim = NULL;
  for (size_t i = 0; i < WAYS; i++) {
    bo_entry *e = &set[i];
    if (keyed_is(&e->k, key, key_len)) {
      uint64_t period = b->base_ms;
      if (bo_remembered(b, e, now_ms))
        period = e->period_ms >= b->max_ms / 2 ? b->max_ms : e->period_ms * 2;
      e->period_ms = period;
      e->until_ms = now_ms + period;
      return period;
    }
    /* Room: a free slot, a forgotten key, else the refusal ending first. */
    bool free_here = !bo_remembered(b, e, now_ms);
    bool free_victim = victim && !bo_remembered(b, victim, now_ms);
    if (!victim || (free_here && !free_victim) || (free_here == free_victim && e->until_ms < victim->until_ms))
      victim = e;
  }
  if (victim->k.len == 0)
    b->count++;
  memcpy(victim->k.key, key, key_len);
  victim->k.len = (uint8_t)key_len;
  victim->period_ms = b->base_ms;
  victim->until_ms = now_ms + b->base_ms;
  return b->base_ms;
}

bool gn_backoff_refused(const gn_backoff *b, const void *key, size_t key_len, uint64_t now_ms) {
  if (!b || !key_ok(key, key_len))
    return false;
  const bo_entry *set = b->e + set_of(b->hkey, b->nsets, key, key_len) * WAYS;
  for (size_t i = 0; i < WAYS; i++)
    if (keyed_is(&set[i].k, key, key_len))
      return now_ms < set[i].until_ms;
  return false;
}

size_t gn_backoff_count(const gn_backoff *b) {
  return b ? b->count : 0;
}

/* --- rate classes --------------------------------------------------------------*/

/* Per session, per class; docs/overlay/limits.md has the reasons for each
 * figure. A message costs one token; in the bulk class one per started
 * 64 KiB, so that class bounds bytes as well as messages. */
static const gn__rate_class classes[GN__RC_COUNT] = {
    [GN__RC_PEERS] = {"peers", GN_RATE(1, 16)},         [GN__RC_GOSSIP] = {"gossip", GN_RATE(1000, 16384)},
    [GN__RC_VIEW] = {"view", GN_RATE(20, 128)},         [GN__RC_CONTROL] = {"control", GN_RATE(50, 512)},
    [GN__RC_BULK] = {"bulk", GN_RATE(2000, 20000)},     [GN__RC_ATTEST] = {"attest", GN_RATE(5, 128)},
    [GN__RC_RTT] = {"rtt", GN_RATE(20, 256)},           [GN__RC_OTHER] = {"other", GN_RATE(1, 16)},
    [GN__RC_KEEPALIVE] = {"keepalive", GN_RATE(1, 16)}, [GN__RC_NAT] = {"nat", GN_RATE(4, 32)},
};

int gn__rate_class_of(uint32_t type) {
  switch (type) {
  case GN_MSG_PEERS:
    return GN__RC_PEERS;
  case GN_MSG_OFFER:
  case GN_MSG_OFFER_WITHDRAW:
  case GN_MSG_OFFER_DIGEST:
  case GN_MSG_OFFER_WANT:
    return GN__RC_GOSSIP;
  case GN_MSG_VIEW_JOIN:
  case GN_MSG_VIEW_FORWARD_JOIN:
  case GN_MSG_VIEW_NEIGHBOR:
  case GN_MSG_VIEW_NEIGHBOR_REPLY:
  case GN_MSG_VIEW_DISCONNECT:
  case GN_MSG_VIEW_SHUFFLE:
  case GN_MSG_VIEW_SHUFFLE_REPLY:
    return GN__RC_VIEW;
  case GN_MSG_LEASE_REQUEST:
  case GN_MSG_LEASE_ACCEPT:
  case GN_MSG_LEASE_REJECT:
  case GN_MSG_LEASE_RELEASE:
  case GN_MSG_LEASE_END:
  case GN_MSG_JOB_MANIFEST:
  case GN_MSG_JOB_STATUS:
  case GN_MSG_JOB_STOP:
  case GN_MSG_INVOICE:
  case GN_MSG_INVOICE_ACCEPT:
  case GN_MSG_INVOICE_REJECT:
  case GN_MSG_DEBIT_NOTE:
  case GN_MSG_DEBIT_ACCEPT:
  case GN_MSG_DEBIT_REJECT:
  case GN_MSG_ERROR:
    return GN__RC_CONTROL;
  case GN_MSG_EXEC_OPEN:
  case GN_MSG_EXEC_SIGNAL:
  case GN_MSG_EXEC_EXIT:
  case GN_MSG_EXEC_CLOSE:
    return GN__RC_CONTROL;
  case GN_MSG_EXEC_DATA: /* a keystroke each, or 32 KiB of output */
  case GN_MSG_EXEC_WINDOW:
  case GN_MSG_JOB_LOG:
  case GN_MSG_JOB_OUTPUT_GET:
  case GN_MSG_JOB_OUTPUT:
  case GN_MSG_JOB_SEED_GET:
  case GN_MSG_JOB_SEED:
  case GN_MSG_WS_PUT: /* gpunet cp: 32 KiB chunks, at most 64 in flight per lease (node/ws_req.c) */
  case GN_MSG_WS_PUT_ACK:
  case GN_MSG_WS_GET:
  case GN_MSG_WS_DATA:
  case GN_MSG_WS_STAT:
  case GN_MSG_WS_STAT_REPLY:
  case GN_MSG_FWD_OPEN: /* forwarded ports: paced by the sender (node/fwd.c) */
  case GN_MSG_FWD_DATA:
  case GN_MSG_FWD_CREDIT:
  case GN_MSG_FWD_CLOSE:
    return GN__RC_BULK;
  case GN_MSG_RTT_ASK:
  case GN_MSG_RTT_REPORT:
  case GN_MSG_RTT_PING:
  case GN_MSG_RTT_PONG:
    return GN__RC_RTT;
  case GN_MSG_NAT_OBSERVED:
  case GN_MSG_NAT_PUNCH_REQ:
  case GN_MSG_NAT_PUNCH:
  case GN_MSG_RELAY_RESERVE:
  case GN_MSG_RELAY_STATUS:
  case GN_MSG_RELAY_CALL:
    return GN__RC_NAT;
  default:
    /* Attestation owns 50..59 (gpunet/attest.h numbers 54..59 itself). */
    if (type >= GN_MSG_ATTEST_CHALLENGE && type <= 59)
      return GN__RC_ATTEST;
    return GN__RC_OTHER;
  }
}

const gn__rate_class *gn__rate_class_get(int cls) {
  return cls >= 0 && cls < GN__RC_COUNT ? &classes[cls] : NULL;
}

uint32_t gn__rate_cost(int cls, size_t len) {
  if (cls != GN__RC_BULK)
    return 1;
  uint64_t cost = 1u + len / 65536u;
  const gn__rate_class *c = gn__rate_class_get(cls);
  if (c && cost > c->rate.burst)
    cost = c->rate.burst;
  return (uint32_t)cost;
}
