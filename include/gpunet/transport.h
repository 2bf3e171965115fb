/* Peer-to-peer transport: TCP on libuv, each connection a Noise_XX session
 * whose handshake binds the peer's Ed25519 node id. Carries envelopes. */
#ifndef GPUNET_TRANSPORT_H
#define GPUNET_TRANSPORT_H

#include <gpunet/identity.h>
#include <gpunet/wire.h>
#include <uv.h>

typedef struct gn_transport gn_transport;

typedef struct gn_transport_cbs {
  /* A session finished its handshake. addr is the peer's advertised listen
   * address ("host:port", empty if it does not listen). */
  void (*on_peer_up)(gn_transport *t, const uint8_t peer[GN_PK_LEN], const char *addr, void *ud);
  void (*on_peer_down)(gn_transport *t, const uint8_t peer[GN_PK_LEN], void *ud);
  /* One envelope arrived and verified; raw is its encoded form (valid only
   * during the call). */
  void (*on_message)(gn_transport *t, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                     size_t raw_len, void *ud);
} gn_transport_cbs;

/* A dial made with gn_transport_connect_peer reached a node whose handshake
 * proved another key than the one expected: the session was closed without
 * on_peer_up (docs/protocol.md §1.3). */
typedef void (*gn_transport_refused_cb)(gn_transport *t, const char *addr, const uint8_t expected[GN_PK_LEN],
                                        const uint8_t got[GN_PK_LEN], void *ud);

int gn_transport_new(uv_loop_t *loop, const gn_identity *id, const gn_transport_cbs *cbs, void *ud,
                     gn_transport **ret_t);
/* Listens on "host:port" (port 0 picks one); the bound address is then
 * available from gn_transport_listen_addr. */
int gn_transport_listen(gn_transport *t, const char *addr);
const char *gn_transport_listen_addr(const gn_transport *t);
/* The "host:port" told to peers in the handshake (at most 63 chars). By
 * default the bound listen address; set it when that is a wildcard. */
int gn_transport_set_advertised_addr(gn_transport *t, const char *addr);
/* Starts connecting; on_peer_up follows on success. A second connect to a
 * peer already up is harmless. */
int gn_transport_connect(gn_transport *t, const char *addr);
/* Like gn_transport_connect, for an address learnt together with a node key
 * (a PEERS entry, an offer): the session comes up only if the node there
 * proves that key in the handshake; another key closes it (the refused callback,
 * never on_peer_up). expect NULL is gn_transport_connect. A dial to an
 * address already being dialled joins that dial, except that an address
 * already up under another key answers GN_EPERM at once. */
int gn_transport_connect_peer(gn_transport *t, const char *addr, const uint8_t expect[GN_PK_LEN]);
/* Optional: told of each dial refused for another key (with the ud given to
 * gn_transport_new). A setter rather than a field of gn_transport_cbs, so
 * that callers' {up, down, message} initialisers stay complete. */
void gn_transport_set_refused_cb(gn_transport *t, gn_transport_refused_cb cb);
/* Queues one encoded envelope to a connected peer; GN_ENOTFOUND if none. */
int gn_transport_send(gn_transport *t, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len);
bool gn_transport_is_up(const gn_transport *t, const uint8_t peer[GN_PK_LEN]);
size_t gn_transport_peer_count(const gn_transport *t);
/* Closes every session and handle; cb (may be NULL) runs once all are closed,
 * after which the transport is freed. */
void gn_transport_close(gn_transport *t, void (*cb)(void *ud), void *ud);

#endif
