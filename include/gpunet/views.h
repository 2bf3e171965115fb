/* Partial views: HyParView-like active and passive views, so that the
 * connections, memory and bandwidth of a node do not grow with the size of the
 * network. An I/O-free state machine: the caller hands it view messages
 * (GN_MSG_VIEW_*, 76-82) that arrived over an authenticated session, session
 * events, the current time in milliseconds and a seed; it hands back bodies to
 * send, sessions to open or release, and view changes. docs/overlay/views.md. */
#ifndef GPUNET_VIEWS_H
#define GPUNET_VIEWS_H

#include <gpunet/base.h>
#include <gpunet/identity.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GN_VIEWS_ADDR_MAX 64     /* "host:port" with its NUL */
#define GN_VIEWS_ACTIVE_MAX 32   /* largest active_size a config may ask for */
#define GN_VIEWS_PASSIVE_MAX 256 /* largest passive_size */
#define GN_VIEWS_SHUFFLE_MAX 33  /* largest ka + kp + 1 */
#define GN_VIEWS_PENDING_MAX 16  /* dials and NEIGHBOR requests in flight */
#define GN_VIEWS_RATE_MAX 256    /* peers whose message rate is remembered */
#define GN_VIEWS_CONTACTS_MAX 8  /* bootstrap contacts kept for rejoining */
#define GN_VIEWS_BODY_MAX 4096   /* largest view message body accepted */

typedef struct gn_views gn_views;

typedef struct gn_views_config {
  uint32_t active_size;         /* active view target and bound (6) */
  uint32_t passive_size;        /* passive view bound (48) */
  uint32_t arwl;                /* active random walk length of FORWARD_JOIN (6) */
  uint32_t prwl;                /* passive random walk length: TTL at which a walker is kept as passive (3) */
  uint32_t shuffle_interval_ms; /* one SHUFFLE started per interval (10000) */
  uint32_t shuffle_ka;          /* active entries in a SHUFFLE (3) */
  uint32_t shuffle_kp;          /* passive entries in a SHUFFLE (4) */
  uint32_t shuffle_ttl;         /* SHUFFLE random walk length (6) */
  uint32_t join_interval_ms;    /* a JOIN or NEIGHBOR from one peer at most once per interval (3000) */
  uint32_t shuffle_per_peer;    /* SHUFFLEs taken from one peer per shuffle interval (10) */
  uint32_t fjoin_per_peer;      /* FORWARD_JOINs taken from one peer per shuffle interval (1000) */
  uint32_t replace_per_period;  /* passive entries a merge may evict per shuffle interval (passive_size / 4) */
  uint32_t request_timeout_ms;  /* a dial or NEIGHBOR request not answered by then failed (5000) */
  uint32_t fill_interval_ms;    /* active view refills start at most this often (1000) */
  uint32_t fill_burst;          /* NEIGHBOR requests started per refill (2) */
  uint32_t backoff_ms;          /* first back-off of a passive member that refused; doubles per refusal (2000) */
  uint32_t backoff_max_ms;      /* (60000) */
  uint32_t rejoin_interval_ms;  /* JOIN a contact again after this long with no active member (5000) */
} gn_views_config;

/* Fills cfg with the defaults above. */
void gn_views_config_default(gn_views_config *cfg);

typedef struct gn_views_peer {
  uint8_t id[GN_PK_LEN];
  char addr[GN_VIEWS_ADDR_MAX]; /* may be "" for an active member that does not listen */
  bool verified;                /* we have had a session with it (else heard of in a message) */
} gn_views_peer;

typedef enum gn_views_event_kind {
  GN_VIEWS_EV_ADDED,   /* entered the active view */
  GN_VIEWS_EV_REMOVED, /* left the active view */
} gn_views_event_kind;

typedef struct gn_views_io {
  /* Sends one body of message type (GN_MSG_VIEW_*) over the session to peer.
   * The caller seals it in an envelope signed by this node. Returns <0 when
   * no session to peer is up: the views then dial it with connect. */
  int (*send)(void *ud, const uint8_t peer[GN_PK_LEN], uint32_t type, const uint8_t *body, size_t len);
  /* Asks for a session to peer at addr, its key checked against peer. Success
   * is reported later through gn_views_peer_up; failure is silence (the views
   * time the request out). */
  void (*connect)(void *ud, const uint8_t peer[GN_PK_LEN], const char *addr);
  /* The views no longer need the session to peer; the caller may close it if
   * nothing else uses it (after flushing what was sent). May be NULL. */
  void (*disconnect)(void *ud, const uint8_t peer[GN_PK_LEN]);
  /* peer entered or left the active view. May be NULL. */
  void (*event)(void *ud, const uint8_t peer[GN_PK_LEN], gn_views_event_kind kind);
  void *ud;
} gn_views_io;
/* None of the io functions may call back into the views: a session that goes
 * down inside send is reported later through gn_views_peer_down. */

typedef struct gn_views_stats {
  uint64_t sent_msgs, sent_bytes; /* bodies handed to io.send */
  uint64_t recv_msgs, recv_bad;   /* view messages handled; refused ones (any error) */
  uint64_t rate_limited;          /* refused by a per-peer rate bound */
  uint64_t joins, forward_joins;  /* JOINs accepted; FORWARD_JOINs handled */
  uint64_t neighbor_accepted, neighbor_refused;
  uint64_t evictions;        /* active members dropped to make room */
  uint64_t promotions;       /* NEIGHBOR requests started from the passive view */
  uint64_t shuffles_sent;    /* started here */
  uint64_t shuffles_taken;   /* walks that ended here */
  uint64_t passive_replaced; /* passive entries evicted by merged entries */
  uint64_t dials;            /* io.connect calls */
} gn_views_stats;

/* cfg NULL takes the defaults; a cfg over the GN_VIEWS_*_MAX bounds, with a
 * zero size or with prwl > arwl is GN_EINVAL. self_addr is where others dial
 * this node (numeric "host:port"), or "" if it does not listen. seed drives
 * every random choice, so a run replays. io is copied. */
int gn_views_new(const uint8_t self_id[GN_PK_LEN], const char *self_addr, const gn_views_config *cfg,
                 const gn_views_io *io, uint64_t seed, uint64_t now_ms, gn_views **ret_v);
gn_views *gn_views_free(gn_views *v);

/* A bootstrap node, learnt once a session to it is up (its key checked): JOIN
 * is sent to it and it enters the active view. Kept (up to
 * GN_VIEWS_CONTACTS_MAX) to JOIN again when the active view stays empty, so
 * call it once per contact, not on every reconnect (each JOIN makes the
 * contact evict a member when full). GN_EINVAL for our own id or a bad
 * address, GN_ETOOBIG when the contact list is full (the JOIN is still
 * sent). */
int gn_views_add_contact(gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr, uint64_t now_ms);

/* A peer learnt elsewhere (the membership list), kept in the passive view as
 * hearsay under the same rules as a shuffled entry (one entry per id and per
 * address, never ourselves, evicting only hearsay within the period's budget),
 * so a node whose contacts are gone can still refill its views. GN_EINVAL for
 * our own id or address or a bad address, GN_EEXIST when already in a view,
 * GN_EBUSY when it did not fit. */
int gn_views_add_passive(gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr, uint64_t now_ms);

/* A session to id came up (either side dialled); addr is its advertised
 * listen address or "". Requests waiting for that session are sent. */
void gn_views_peer_up(gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr, uint64_t now_ms);
/* The session to id went down: id leaves the active view (it is not kept as
 * passive: it may be dead) and a replacement is sought from the passive view. */
void gn_views_peer_down(gn_views *v, const uint8_t id[GN_PK_LEN], uint64_t now_ms);

/* One view message of type (76-82) from peer, the authenticated node at the
 * other end of the session it came over. Returns 0 when handled, GN_ENOTFOUND
 * for a type that is not a view message, GN_EINVAL/GN_ETOOBIG for a malformed
 * body, GN_EPERM when peer may not send it (not an active member, our own id),
 * GN_EBUSY over a per-peer rate bound, GN_ESTATE for an answer to nothing we
 * asked. A refused message changes nothing but the stats. */
int gn_views_on_message(gn_views *v, const uint8_t peer[GN_PK_LEN], uint32_t type, const uint8_t *body, size_t len,
                        uint64_t now_ms);

/* Runs timers: request timeouts, the periodic SHUFFLE, refills of the active
 * view from the passive one, rejoining. Call at or after
 * gn_views_next_deadline_ms (earlier is harmless). */
void gn_views_tick(gn_views *v, uint64_t now_ms);
uint64_t gn_views_next_deadline_ms(const gn_views *v);

/* Copy up to cap members; return how many there are. */
size_t gn_views_active(const gn_views *v, gn_views_peer *out, size_t cap);
size_t gn_views_passive(const gn_views *v, gn_views_peer *out, size_t cap);
size_t gn_views_active_count(const gn_views *v);
size_t gn_views_passive_count(const gn_views *v);
size_t gn_views_pending_count(const gn_views *v); /* dials and NEIGHBOR requests in flight */
size_t gn_views_rate_count(const gn_views *v);    /* peers with rate state */
bool gn_views_is_active(const gn_views *v, const uint8_t id[GN_PK_LEN]);
bool gn_views_is_passive(const gn_views *v, const uint8_t id[GN_PK_LEN]);
/* Whether id was given as a contact (gn_views_add_contact): a session to it
 * that comes up again must not JOIN again. */
bool gn_views_is_contact(const gn_views *v, const uint8_t id[GN_PK_LEN]);
void gn_views_stats_get(const gn_views *v, gn_views_stats *ret);

/* True for a numeric "host:port" that fits GN_VIEWS_ADDR_MAX: a dotted IPv4
 * address or a bracketed IPv6 one, and a port 1-65535 in at most 5 digits. */
bool gn_views_addr_valid(const char *addr);

#endif
