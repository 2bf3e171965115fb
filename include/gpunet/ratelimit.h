/* Token buckets, bounded tables of them keyed by an address or a node key,
 * and a bounded back-off table: what limits a peer's messages on sessions
 * and its datagrams over UDP. No I/O and no clock of its own: every call
 * takes the current monotonic time in milliseconds. */
#ifndef GPUNET_RATELIMIT_H
#define GPUNET_RATELIMIT_H

#include <gpunet/base.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sockaddr;

/* A rate: one token every per_token_us microseconds, at most burst tokens
 * saved up. GN_RATE(100, 200) is 100 tokens a second with bursts of 200. */
typedef struct gn_rate {
  uint32_t burst;
  uint32_t per_token_us;
} gn_rate;

#define GN_RATE(per_s, burst_n) ((gn_rate){.burst = (burst_n), .per_token_us = 1000000u / (per_s)})
/* For rates below one a second: one token every `s` seconds. */
#define GN_RATE_EVERY_S(s, burst_n) ((gn_rate){.burst = (burst_n), .per_token_us = (uint32_t)(s)*1000000u})

/* One bucket. Its credit is kept in microseconds of refill time, so rates
 * of any size stay exact in integers. */
typedef struct gn_token_bucket {
  uint64_t credit_us;
  uint64_t last_ms;
} gn_token_bucket;

/* Starts the bucket full (burst tokens) at now_ms. */
void gn_token_bucket_init(gn_token_bucket *b, gn_rate rate, uint64_t now_ms);
/* Refills by the time since the last call, then takes cost tokens if it
 * holds them: true, or false and nothing taken. A clock that goes back is
 * taken as no time passing. A cost above the burst is never allowed. */
bool gn_token_bucket_take(gn_token_bucket *b, gn_rate rate, uint32_t cost, uint64_t now_ms);
/* Whole tokens the bucket would hold at now_ms (changes nothing). */
uint32_t gn_token_bucket_level(const gn_token_bucket *b, gn_rate rate, uint64_t now_ms);

/* Keys: a node key, or an address as gn_ratelimit_addr_key makes it. */
#define GN_RATELIMIT_KEY_MAX 32

/* The key of a socket address's host (the port is left out), or with
 * prefix true of its network: the /24 of an IPv4 address, the /64 of an
 * IPv6 one (an IPv4-mapped IPv6 address counts as the IPv4 one). Returns the
 * key's length, 0 for another family. */
size_t gn_ratelimit_addr_key(const struct sockaddr *sa, bool prefix, uint8_t ret_key[GN_RATELIMIT_KEY_MAX]);

/* A bounded table of buckets, one per key, all at one rate: for datagrams
 * per source address, say. It holds at most cap keys (rounded up to a
 * multiple of 8): a new key takes the place of one whose bucket is full
 * again (forgetting it loses nothing), else of the one least recently used
 * in its set of 8 (set = keyed SipHash of the key, so a stranger cannot
 * aim many keys at one set). Such a forgotten key starts again with a full
 * burst; sizing cap above the number of sources live at once avoids that. */
typedef struct gn_ratelimit gn_ratelimit;

int gn_ratelimit_new(size_t cap, gn_rate rate, gn_ratelimit **ret_rl);
gn_ratelimit *gn_ratelimit_free(gn_ratelimit *rl);
/* Takes cost tokens from key's bucket (a new key starts full): true when
 * allowed. key_len 1..GN_RATELIMIT_KEY_MAX, else false. */
bool gn_ratelimit_allow(gn_ratelimit *rl, const void *key, size_t key_len, uint32_t cost, uint64_t now_ms);
/* Keys held now (at most the table's capacity). */
size_t gn_ratelimit_count(const gn_ratelimit *rl);

/* A bounded table of back-offs: a key that misbehaved is refused for
 * base_ms; each further offence while the key is remembered doubles the
 * period, up to max_ms. A key is remembered until max_ms after its last
 * refusal ended, then starts again at base_ms. At most cap keys (rounded up
 * to a multiple of 8); when a set is full, the entry whose refusal ended
 * first (or was forgotten) makes room. */
typedef struct gn_backoff gn_backoff;

int gn_backoff_new(size_t cap, uint64_t base_ms, uint64_t max_ms, gn_backoff **ret_b);
gn_backoff *gn_backoff_free(gn_backoff *b);
/* Records one offence of key at now_ms; returns how long it is now refused
 * (ms), 0 for a bad key. */
uint64_t gn_backoff_punish(gn_backoff *b, const void *key, size_t key_len, uint64_t now_ms);
/* Whether key is refused at now_ms. */
bool gn_backoff_refused(const gn_backoff *b, const void *key, size_t key_len, uint64_t now_ms);
/* Keys held now (at most the table's capacity). */
size_t gn_backoff_count(const gn_backoff *b);

#endif
