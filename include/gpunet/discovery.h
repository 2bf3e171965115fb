/* Discovery: how peers learn of each other (PEERS) and how offers and
 * withdrawals spread over the overlay: push gossip to a few random
 * neighbours, and anti-entropy by digests (OFFER_DIGEST, OFFER_WANT) that
 * makes two neighbours exchange only the offers one of them lacks
 * (docs/overlay/gossip.md). An I/O-free state machine: the caller feeds it
 * transport events and the time and gives it send/connect functions, so it
 * runs under a simulator as well as on the real transport. */
#ifndef GPUNET_DISCOVERY_H
#define GPUNET_DISCOVERY_H

#include <gpunet/identity.h>
#include <gpunet/offer.h>
#include <gpunet/wire.h>

#define GN_DISCOVERY_MAX_PEERS_MSG 64 /* entries in one PEERS message */
#define GN_DISCOVERY_MAX_UP 64        /* peers tracked as up; more are served but not remembered */
#define GN_DISCOVERY_BOOTSTRAP_RETRY_S 5
/* PEERS: hearsay costs the receiver dials, so it is rationed. */
#define GN_DISCOVERY_PEERS_DIALS 8      /* dials started for one accepted PEERS message */
#define GN_DISCOVERY_PEERS_EVERY_S 30   /* one PEERS accepted per peer in this time */
#define GN_DISCOVERY_DIALS_PER_MIN 8    /* dials from PEERS, all peers together (a token bucket of 8) */
#define GN_DISCOVERY_REDIAL_AFTER_S 300 /* an address learnt from PEERS is dialled at most once in this */
/* Push gossip. */
#define GN_DISCOVERY_FANOUT 6 /* neighbours a new or newer offer is pushed to */
/* Anti-entropy: each period every node sends a summary digest to one random
 * neighbour, and each neighbour may make it do this much for it. */
#define GN_DISCOVERY_DIGEST_S 5                 /* the period */
#define GN_DISCOVERY_BUCKETS_MAX 512            /* buckets of a summary */
#define GN_DISCOVERY_DIGEST_ENTRIES 512         /* entries of one detail digest */
#define GN_DISCOVERY_WANT_ENTRIES 512           /* offers named in one WANT */
#define GN_DISCOVERY_PEER_DIGESTS 12            /* digests taken from one peer per period */
#define GN_DISCOVERY_PEER_WANTS 12              /* wants answered for one peer per period */
#define GN_DISCOVERY_PEER_SYNC_BYTES (2u << 20) /* bytes sent to one peer per period in answer */
#define GN_DISCOVERY_SYNC_BYTES (8u << 20)      /* the same, all peers together */
#define GN_DISCOVERY_DIGESTS_PER_PERIOD 64      /* digests taken per period, all peers together */
#define GN_DISCOVERY_WANT_RETRY_S 30            /* an offer asked for is not asked for again before */
#define GN_DISCOVERY_DETAILS_PER_ASK 8          /* detail digests taken for one bucket WANT we sent */

typedef struct gn_discovery gn_discovery;

typedef struct gn_discovery_io {
  /* Sends one encoded envelope to a connected peer (gn_transport_send). */
  int (*send)(void *ud, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len);
  /* Starts connecting to "host:port" (gn_transport_connect). Used for
   * bootstrap addresses, which come without a node key. */
  int (*connect)(void *ud, const char *addr);
  void *ud;
} gn_discovery_io;

/* Starts connecting to an address learnt from a PEERS entry, expecting the
 * node key it was advertised with (gn_transport_connect_peer). */
typedef int (*gn_discovery_connect_peer_fn)(void *ud, const char *addr, const uint8_t expect[GN_PK_LEN]);

/* self and table must outlive the discovery; the table is shared with the
 * caller (who reads offers from it). Randomness (gossip targets, digest
 * salts) comes from a generator seeded from libsodium; gn_discovery_seed
 * makes it deterministic. */
int gn_discovery_new(const gn_identity *self, const gn_discovery_io *io, gn_offer_table *table, gn_discovery **ret_d);
gn_discovery *gn_discovery_free(gn_discovery *d);
/* What one peer (and all peers together) may make a node do for
 * anti-entropy in each GN_DISCOVERY_DIGEST_S period (docs/overlay/gossip.md).
 * gn_discovery_config_default fills in the GN_DISCOVERY_* values above;
 * gn_discovery_set_config replaces them (GN_EINVAL, nothing changed, when
 * one is 0 or a per-peer value is above its total). */
typedef struct gn_discovery_config {
  uint32_t peer_digests;       /* digests taken from one peer: GN_DISCOVERY_PEER_DIGESTS */
  uint32_t peer_wants;         /* wants answered for one peer: GN_DISCOVERY_PEER_WANTS */
  uint32_t digests_per_period; /* digests taken from all peers: GN_DISCOVERY_DIGESTS_PER_PERIOD */
  size_t peer_sync_bytes;      /* bytes sent to one peer in answer: GN_DISCOVERY_PEER_SYNC_BYTES */
  size_t sync_bytes;           /* the same, all peers: GN_DISCOVERY_SYNC_BYTES */
} gn_discovery_config;
void gn_discovery_config_default(gn_discovery_config *ret_c);
int gn_discovery_set_config(gn_discovery *d, const gn_discovery_config *c);
/* Reseeds the generator, so that a simulator replays exactly. */
void gn_discovery_seed(gn_discovery *d, uint64_t seed);
/* How many neighbours a new offer is pushed to (default GN_DISCOVERY_FANOUT;
 * 0 restores it; GN_DISCOVERY_MAX_UP or more floods every neighbour, which is
 * what the protocol did before gossip: kept for comparisons). */
void gn_discovery_set_fanout(gn_discovery *d, size_t fanout);
/* Neighbours: the up peers that get pushes and periodic digests. By default
 * every up peer is one. With only on, an up peer is one once marked with
 * gn_discovery_set_neighbour (the daemon's active view); a peer that is not
 * still gets a digest when its session comes up and is answered. */
void gn_discovery_neighbours_only(gn_discovery *d, bool only);
/* GN_ENOTFOUND when the peer is not up (or not tracked). */
int gn_discovery_set_neighbour(gn_discovery *d, const uint8_t peer[GN_PK_LEN], bool neighbour);
/* Wanted: PEERS entries are then dialled with fn (io.ud as its ud), which
 * holds the session to the key the entry advertised, so a node answering at
 * that address under another key is refused (docs/protocol.md §1.6). Without
 * it they are dialled with io.connect and the key is not checked. A setter,
 * so that {send, connect, ud} initialisers stay complete. */
void gn_discovery_set_connect_peer(gn_discovery *d, gn_discovery_connect_peer_fn fn);
/* Optional: with partial views, a PEERS entry (id, addr), checked and not
 * ours nor up, is handed to this instead of dialled: the caller keeps it in
 * its one peer table and the views' passive view, which dial when they need
 * a neighbour (include/gpunet/peertab.h). Nothing is dialled then, and the
 * dial rations do not apply. */
typedef void (*gn_discovery_heard_fn)(void *ud, const uint8_t id[GN_PK_LEN], const char *addr);
void gn_discovery_set_heard(gn_discovery *d, gn_discovery_heard_fn fn);
/* Our own advertised address, so PEERS from others never make us dial it. */
int gn_discovery_set_self_addr(gn_discovery *d, const char *addr);
/* Up to 16 bootstrap "host:port"s, dialled by gn_discovery_tick while no up
 * peer advertises that address; with gn_discovery_neighbours_only, only
 * until a session to it was up once (the partial views rejoin through it
 * when they need to, and a session they closed is not dialled again). */
int gn_discovery_add_bootstrap(gn_discovery *d, const char *addr);

/* A session came up: remembers the peer and sends it a PEERS message and a
 * summary digest of the offer table (not the offers: it asks for those it
 * lacks). */
int gn_discovery_peer_up(gn_discovery *d, const uint8_t peer[GN_PK_LEN], const char *addr, int64_t now_s);
/* A session went down: forgets the peer and drops the offers it issued. */
void gn_discovery_peer_down(gn_discovery *d, const uint8_t peer[GN_PK_LEN], int64_t now_s);
/* Handles PEERS, OFFER, OFFER_WITHDRAW, OFFER_DIGEST and OFFER_WANT. A new or
 * newer offer that was pushed to us is pushed on to GN_DISCOVERY_FANOUT
 * neighbours that have not been seen with it (one we asked for is not); an
 * effective withdrawal goes to every neighbour that has not. Returns 0 when
 * handled, GN_ENOTFOUND when env is not a discovery message (the caller
 * handles it), GN_EBUSY when the peer is over a rate limit (the message is
 * dropped), GN_ESTATE for a detail digest nobody asked for, or another
 * negative code for a bad message (GN_ESIG, GN_EPERM, GN_EINVAL,
 * GN_ETOOBIG...). A refused message changes nothing. */
int gn_discovery_on_message(gn_discovery *d, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                            size_t raw_len, int64_t now_s);
/* Our own offer (a sealed GN_MSG_OFFER) or withdrawal (GN_MSG_OFFER_WITHDRAW):
 * applied to the table; a new or newer offer is pushed like one heard from a
 * peer, a withdrawal goes to every neighbour. */
int gn_discovery_publish(gn_discovery *d, const uint8_t *raw_env, size_t len, int64_t now_s);
/* Expires offers; redials bootstraps every GN_DISCOVERY_BOOTSTRAP_RETRY_S;
 * every GN_DISCOVERY_DIGEST_S sends a summary digest to one random neighbour. */
void gn_discovery_tick(gn_discovery *d, int64_t now_s);
size_t gn_discovery_up_count(const gn_discovery *d);

#endif
