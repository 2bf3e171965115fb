/* Discovery: the thin push protocol that spreads peer addresses (PEERS) and
 * offers (OFFER, OFFER_WITHDRAW) over the overlay. An I/O-free state machine:
 * the caller feeds it transport events and gives it send/connect functions,
 * so it runs under a simulator as well as on the real transport. */
#ifndef GPUNET_DISCOVERY_H
#define GPUNET_DISCOVERY_H

#include <gpunet/identity.h>
#include <gpunet/offer.h>
#include <gpunet/wire.h>

#define GN_DISCOVERY_MAX_PEERS_MSG 64 /* entries in one PEERS message */
#define GN_DISCOVERY_FANOUT 8         /* new connections started per PEERS message */
#define GN_DISCOVERY_MAX_UP 64        /* peers tracked as up; more are served but not remembered */
#define GN_DISCOVERY_BOOTSTRAP_RETRY_S 5

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
 * caller (who reads offers from it). */
int gn_discovery_new(const gn_identity *self, const gn_discovery_io *io, gn_offer_table *table, gn_discovery **ret_d);
gn_discovery *gn_discovery_free(gn_discovery *d);
/* Wanted: PEERS entries are then dialled with fn (io.ud as its ud), which
 * holds the session to the key the entry advertised, so a node answering at
 * that address under another key is refused (docs/protocol.md §1.6). Without
 * it they are dialled with io.connect and the key is not checked. A setter,
 * so that {send, connect, ud} initialisers stay complete. */
void gn_discovery_set_connect_peer(gn_discovery *d, gn_discovery_connect_peer_fn fn);
/* Our own advertised address, so PEERS from others never make us dial it. */
int gn_discovery_set_self_addr(gn_discovery *d, const char *addr);
/* Up to 16 bootstrap "host:port"s, dialled by gn_discovery_tick while no up
 * peer advertises that address. */
int gn_discovery_add_bootstrap(gn_discovery *d, const char *addr);

/* A session came up: remembers the peer, sends it a PEERS message and every
 * offer in the table. */
int gn_discovery_peer_up(gn_discovery *d, const uint8_t peer[GN_PK_LEN], const char *addr, int64_t now_s);
/* A session went down: forgets the peer and drops the offers it issued. */
void gn_discovery_peer_down(gn_discovery *d, const uint8_t peer[GN_PK_LEN], int64_t now_s);
/* Handles PEERS, OFFER and OFFER_WITHDRAW (new offers and effective
 * withdrawals are flooded to every other up peer). Returns 0 when handled,
 * GN_ENOTFOUND when env is not a discovery message (the caller handles it),
 * or a negative code for a bad message (GN_ESIG, GN_EPERM, GN_EINVAL...). */
int gn_discovery_on_message(gn_discovery *d, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                            size_t raw_len, int64_t now_s);
/* Our own offer (a sealed GN_MSG_OFFER) or withdrawal (GN_MSG_OFFER_WITHDRAW):
 * applied to the table and flooded. */
int gn_discovery_publish(gn_discovery *d, const uint8_t *raw_env, size_t len, int64_t now_s);
/* Expires offers; redials bootstraps every GN_DISCOVERY_BOOTSTRAP_RETRY_S. */
void gn_discovery_tick(gn_discovery *d, int64_t now_s);
size_t gn_discovery_up_count(const gn_discovery *d);

#endif
