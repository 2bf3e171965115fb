/* Peer-to-peer transport: TCP on libuv, each connection a Noise_XX session
 * whose handshake binds the peer's Ed25519 node id. Carries envelopes. */
#ifndef GPUNET_TRANSPORT_H
#define GPUNET_TRANSPORT_H

#include <gpunet/identity.h>
#include <gpunet/wire.h>
#include <stdint.h>
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

/* What a transport lets peers hold and how long it waits for them
 * (docs/overlay/limits.md). gn_transport_limits_default fills in the values
 * a daemon runs with; tests and the config make them smaller. */
typedef struct gn_transport_limits {
  size_t max_conns;              /* connections in all, dialled and accepted: 512 */
  size_t dial_reserve;           /* of those, never taken by accepted ones: 64 */
  size_t max_inbound_per_host;   /* accepted connections from one IP address: 8 */
  size_t max_inbound_per_net;    /* ... from one IPv4 /24 or IPv6 /64: 64 */
  size_t max_unauth;             /* accepted connections still in their handshake: 128 */
  uint64_t handshake_timeout_ms; /* to finish the handshake: 10 s */
  uint64_t idle_timeout_ms;      /* without a message or keepalive from the peer: 180 s */
  uint64_t keepalive_ms;         /* a keepalive after this long without sending: 60 s */
  uint64_t msg_timeout_ms;       /* a started message may take this long... 60 s */
  uint64_t msg_min_rate_bps;     /* ... or as long as its size at this rate: 64 KiB/s */
  uint64_t send_stall_ms;        /* bytes queued to the peer and none taken: 30 s */
  size_t sendq_max;              /* bytes queued to one peer: 64 MiB */
  size_t mem_budget;             /* receive buffers and send queues of all peers: 256 MiB */
  uint64_t backoff_base_ms;      /* a peer closed for misbehaving is refused this long: 60 s */
  uint64_t backoff_max_ms;       /* doubling on each repeat up to: 1 h */
  size_t backoff_cap;            /* node keys and addresses remembered: 4096 */
} gn_transport_limits;

void gn_transport_limits_default(gn_transport_limits *ret_l);
/* Replaces the limits (checked: GN_EINVAL and nothing changed when one is 0
 * or they contradict each other). Meant before listening and dialling:
 * connections already open keep the deadlines they were given, and the
 * back-off table starts empty. */
int gn_transport_set_limits(gn_transport *t, const gn_transport_limits *l);

/* Counters, for tests and metrics. */
typedef struct gn_transport_stats {
  size_t conns;           /* open connections, dialled and accepted */
  size_t inbound;         /* of those, accepted */
  size_t unauth;          /* accepted and still in the handshake */
  size_t mem_bytes;       /* receive buffers and send queues held now */
  size_t mem_peak_bytes;  /* the most they ever held */
  uint64_t refused_limit; /* accepted and closed at once: over a connection limit */
  uint64_t refused_backoff;
  uint64_t closed_budget; /* closed holding the most when over mem_budget */
  uint64_t closed_timeout;
  uint64_t closed_rate;
  uint64_t closed_by_us; /* sessions closed with gn_transport_close_peer */
  size_t backoff_keys;
} gn_transport_stats;

void gn_transport_get_stats(const gn_transport *t, gn_transport_stats *ret_s);

/* Why a peer was cut off or refused, for the daemon to log: addr is the
 * connection's remote "host:port", peer its key when the handshake was done
 * (else NULL), what a short phrase ("over its gossip rate"), backoff_ms how
 * long it is now refused (0: not). */
typedef void (*gn_transport_limit_cb)(gn_transport *t, const char *addr, const uint8_t *peer, const char *what,
                                      uint64_t backoff_ms, void *ud);
void gn_transport_set_limit_cb(gn_transport *t, gn_transport_limit_cb cb);
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
/* Queues one encoded envelope to a connected peer; GN_ENOTFOUND if none.
 * GN_ETOOBIG (and the session closes) when its queue would pass sendq_max
 * or its bytes would pass mem_budget while it holds the most. */
int gn_transport_send(gn_transport *t, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len);
bool gn_transport_is_up(const gn_transport *t, const uint8_t peer[GN_PK_LEN]);
/* Closes the session to peer because this node no longer needs it (not
 * for misbehaving: nothing is backed off), and any dial in flight to that
 * key. What was queued to the peer is handed to the kernel first: the
 * socket is shut for writing once it is written, and cut DRAIN_MS (2 s)
 * later at the most, so a last message (a VIEW_DISCONNECT) is not lost to
 * the close. on_peer_down runs once, for a session that was up, before
 * this returns; the session reads nothing more. The limit callback is told
 * with what (NULL: "closed: no longer needed"). Safe from inside any
 * transport callback, including on_message from that peer. 0, or
 * GN_ENOTFOUND when no session or dial to peer exists, GN_ECLOSED while the
 * transport closes. */
int gn_transport_close_peer(gn_transport *t, const uint8_t peer[GN_PK_LEN], const char *what);
/* What the daemon needs to decide whether a session is still in use. */
typedef struct gn_transport_peer_info {
  bool inbound;         /* the peer dialled us */
  uint64_t age_ms;      /* since the connection was made */
  bool used;            /* a message of the kind below went either way */
  uint64_t use_idle_ms; /* since the last message either way that was not the
                         * overlay's upkeep (PEERS, gossip, views) nor a keepalive:
                         * a lease, job, billing, attestation or round-trip message
                         * (since the connection was made when there was none) */
  size_t queued;        /* bytes queued to the peer and not yet written */
  char remote[80];      /* the connection's remote "host:port" */
} gn_transport_peer_info;
/* GN_ENOTFOUND when no session to peer is up. */
int gn_transport_get_peer_info(const gn_transport *t, const uint8_t peer[GN_PK_LEN], gn_transport_peer_info *ret_info);
/* Copies the keys of up to cap peers whose session is up; returns how many
 * there are (which may be more than cap). */
size_t gn_transport_peers(const gn_transport *t, uint8_t (*ret_ids)[GN_PK_LEN], size_t cap);
size_t gn_transport_peer_count(const gn_transport *t);
/* Closes every session and handle; cb (may be NULL) runs once all are closed,
 * after which the transport is freed. */
void gn_transport_close(gn_transport *t, void (*cb)(void *ud), void *ud);

/* Takes up fd, a connected TCP socket this node made (a relay's splice,
 * docs/nat.md), as a session: initiator true runs the handshake as the
 * dialler. The peer must prove expect's key (else it is refused as for
 * gn_transport_connect_peer); on_peer_up follows on success. The fd is the
 * transport's from the call on, closed on failure too. */
int gn_transport_adopt(gn_transport *t, uv_os_sock_t fd, bool initiator, const uint8_t expect[GN_PK_LEN]);

#endif
