/* Offers: what a provider advertises, their encoding, and the offer table a
 * node keeps of everything it has heard. */
#ifndef GPUNET_OFFER_H
#define GPUNET_OFFER_H

#include <gpunet/identity.h>
#include <gpunet/wire.h>
#include <sqlite3.h>
#include <stdbool.h>

#define GN_OFFER_ID_STRLEN 16    /* "o-" + 12 hex + NUL, padded */
#define GN_OFFER_ATTEST_MAX 3072 /* a signed GN_MSG_ATTEST_REPORT envelope */
/* The longest an offer may live from its issue time (providers send 60 s
 * offers every 20 s): a table refuses one that expires later, so a flood of
 * long-lived offers cannot outlast the real ones. */
#define GN_OFFER_LIFETIME_MAX_S 900

typedef struct gn_offer {
  uint8_t provider[GN_PK_LEN];
  uint64_t seq;       /* increases with every refresh by the provider */
  int64_t issued_s;   /* UTC */
  int64_t expires_s;  /* UTC; a table drops the offer after this */
  char addr[64];      /* provider's listen address, host:port */
  char gpu_model[64]; /* "NVIDIA GeForce RTX 4090" */
  uint32_t vram_mib;
  uint32_t gpus_free;
  uint32_t gpus_total;
  uint64_t price_uper_hour; /* micro-units of currency per GPU-hour */
  char currency[8];         /* "EUR" */
  uint32_t max_hours;
  bool simulated; /* the GPU is simulated: no real hardware */
  /* Optional, signed, and sent only when true (so offers without them still
   * verify): the provider runs jobs without a user namespace of their own
   * (a job's root is the host's root, without capabilities: key
   * "no_userns"), or without enforced memory and pids limits (key
   * "unenforced_limits"). Both are what its operator opted into. */
  bool no_userns;
  bool unenforced_limits;
  /* Optional, signed, sent only when training is true: the provider takes
   * ranks of training jobs (key "training") and gives their WireGuard
   * sockets UDP ports jobnet_port_lo..jobnet_port_hi (key "jobnet_ports",
   * [lo, hi], 1 <= lo <= hi <= 65535; both 0 when training is false). */
  bool training;
  uint16_t jobnet_port_lo, jobnet_port_hi;
  /* Optional, signed, sent only when relay_addr is set: a provider behind
   * NAT is reachable through the volunteer relay with key relay_id, whose
   * sessions are at relay_addr (keys "relay_id", bin 32, and "relay_addr",
   * a numeric host:port; both or neither, relay_id not the provider's).
   * docs/nat.md, "Reaching a NATed peer". */
  uint8_t relay_id[GN_PK_LEN];
  char relay_addr[64];
  /* Optional: the provider's signed attestation report for this GPU model
   * (key "attest", absent when attest_len is 0). Readers verify it with
   * gn_attest_report_open and check its signer is the provider. */
  uint32_t attest_len;
  uint8_t attest[GN_OFFER_ATTEST_MAX];
} gn_offer;

/* The body of a GN_MSG_OFFER envelope. */
int gn_offer_encode(const gn_offer *o, gn_buf *ret);
int gn_offer_decode(const uint8_t *body, size_t len, gn_offer *ret);
/* Stable id of a provider's offer for one GPU model: "o-" + 12 hex digits of
 * BLAKE2b(provider || model). */
void gn_offer_id(const gn_offer *o, char ret_id[GN_OFFER_ID_STRLEN]);

/* Encodes o with its provider set to id's key and signs it as a GN_MSG_OFFER
 * envelope, appended to ret_env. */
int gn_offer_seal(const gn_identity *id, const gn_offer *o, gn_buf *ret_env);
/* A GN_MSG_OFFER_WITHDRAW envelope for id's offers with seq <= seq; its body
 * is the map {provider: bin 32, seq: u64}. */
int gn_offer_withdraw_seal(const gn_identity *id, uint64_t seq, gn_buf *ret_env);

typedef struct gn_offer_entry {
  gn_offer offer;
  char id[GN_OFFER_ID_STRLEN];
  uint8_t *raw; /* the signed envelope as received, for relaying */
  size_t raw_len;
  uint8_t relayer[GN_PK_LEN]; /* the peer that handed it over; zero if unknown (the cache) */
  int standing;               /* the standing hook's score when it was stored (0 without a hook) */
} gn_offer_entry;

typedef struct gn_offer_table gn_offer_table;

gn_offer_table *gn_offer_table_new(size_t max_entries);
gn_offer_table *gn_offer_table_free(gn_offer_table *t);
/* The most offers of one provider the table holds (default 16, the
 * PER_PROVIDER_MAX of p2p/offer.c; 0 restores it). Offers held beyond a
 * lowered cap stay until they expire or are replaced. */
void gn_offer_table_set_max_per_provider(gn_offer_table *t, size_t max);
/* The node's own key: its offers are never evicted and always find room. */
void gn_offer_table_set_self(gn_offer_table *t, const uint8_t self[GN_PK_LEN]);
/* The standing of an offer's provider with this node, a small score: by
 * convention 2 = its attestation verified and it completed leases with us,
 * 1 = its attestation verified, 0 = unknown. Called once by each put of an
 * offer that is new or newer than the one held (not for duplicates, older,
 * withdrawn or invalid ones); it must be cheap and must not change the table.
 * The score is kept with the entry until its next refresh. */
typedef int (*gn_offer_standing_fn)(void *ud, const gn_offer *o);
/* Sets (or with fn NULL, clears) the standing hook. When the table is full,
 * only entries of the lowest standing held are eviction candidates, so a
 * newcomer of lower standing than every entry is refused, one of higher
 * standing always finds room, and offers of standing 0 can never push out an
 * offer of standing > 0. Scores are clamped to 0..100. */
void gn_offer_table_set_standing(gn_offer_table *t, gn_offer_standing_fn fn, void *ud);
/* Verifies a GN_MSG_OFFER envelope (issuer's signature, expiry against now_s,
 * lifetime at most GN_OFFER_LIFETIME_MAX_S past its issue time, issued at most
 * an hour ahead) and inserts it. Returns 1 if it is new or newer than what the
 * table held, 0 if it was a duplicate or older (or withdrawn), or a negative
 * code (the table is unchanged): GN_EPERM when the signer is not the provider,
 * GN_EEXPIRED, GN_EINVAL for a lifetime out of bounds, GN_ETOOBIG when the
 * provider already holds 16 offers or the table is full and the newcomer's
 * relayer (or, within it, its provider) already holds the most entries.
 * When full, room is made among the entries of the lowest standing (see
 * gn_offer_table_set_standing) by evicting from the relayer holding the most
 * of them, within it from the provider holding the most, its offer expiring
 * first; the node's own offers are never evicted. relayer may be NULL
 * (unknown). */
int gn_offer_table_put_from(gn_offer_table *t, const uint8_t *env, size_t len, int64_t now_s,
                            const uint8_t relayer[GN_PK_LEN]);
/* gn_offer_table_put_from with an unknown relayer. */
int gn_offer_table_put(gn_offer_table *t, const uint8_t *env, size_t len, int64_t now_s);
/* Handles a GN_MSG_OFFER_WITHDRAW envelope body {provider, seq}: drops the
 * provider's offers with seq <= the given one, and remembers the withdrawal so
 * such offers arriving later are ignored. Returns the number dropped, or a
 * negative code (GN_EPERM when the signer is not the provider). */
int gn_offer_table_withdraw(gn_offer_table *t, const uint8_t *env, size_t len);
/* True when a withdrawal the table remembers covers the provider's offers
 * up to seq (a put of such an offer would be ignored). */
bool gn_offer_table_withdrawn(const gn_offer_table *t, const uint8_t provider[GN_PK_LEN], uint64_t seq);
size_t gn_offer_table_remove_provider(gn_offer_table *t, const uint8_t provider[GN_PK_LEN]);
size_t gn_offer_table_expire(gn_offer_table *t, int64_t now_s);
size_t gn_offer_table_count(const gn_offer_table *t);
/* Entries in no particular order; index < count. Pointers stay valid until
 * the next change to the table. */
const gn_offer_entry *gn_offer_table_at(const gn_offer_table *t, size_t index);
const gn_offer_entry *gn_offer_table_find(const gn_offer_table *t, const char *id);
/* The offer cache in SQLite (table "offers"): save replaces its contents,
 * load re-verifies each cached envelope and skips expired ones. */
int gn_offer_table_save(const gn_offer_table *t, sqlite3 *db);
int gn_offer_table_load(gn_offer_table *t, sqlite3 *db, int64_t now_s);

#endif
