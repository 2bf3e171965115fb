/* The one table of peers a node knows: each peer's id, address, how we
 * learnt of it, whether a session proved its key, whether a session is up
 * and wanted, and its dial back-off. One bound, one eviction policy
 * (hearsay never pushes out a peer we had a verified session with), and the
 * rule that says which sessions nobody needs any more. An I/O-free table:
 * the caller hands it session events, what it heard and the time in
 * milliseconds. docs/overlay/views.md ("One peer table"). */
#ifndef GPUNET_PEERTAB_H
#define GPUNET_PEERTAB_H

#include <gpunet/base.h>
#include <gpunet/identity.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GN_PEERTAB_ADDR_MAX 64 /* "host:port" with its NUL */
#define GN_PEERTAB_CAP_MAX 65536

typedef struct gn_peertab gn_peertab;

/* How we first learnt of a peer; a session later marks it verified but
 * keeps the source. */
typedef enum gn_peer_source {
  GN_PEER_HEARSAY = 0, /* named by another peer (PEERS, membership, shuffles): unproven */
  GN_PEER_BOOTSTRAP,   /* a bootstrap node of the config, once its session proved its key */
  GN_PEER_INBOUND,     /* it dialled us */
  GN_PEER_DIALLED,     /* we dialled it */
} gn_peer_source;

typedef struct gn_peertab_entry {
  uint8_t id[GN_PK_LEN];
  char addr[GN_PEERTAB_ADDR_MAX]; /* its advertised listen address, "" if none */
  gn_peer_source source;
  bool verified;              /* a session's handshake proved this key */
  bool up;                    /* a session is up now */
  bool inbound;               /* that session: it dialled us */
  bool wanted;                /* that session is wanted (the views hold it as active) */
  uint64_t last_seen_ms;      /* last heard of, or its session last up or down */
  uint64_t up_since_ms;       /* when its session came up */
  uint64_t unwanted_since_ms; /* up and not wanted since then */
  uint64_t released_ms;       /* the views said they no longer need it (0: not since it came up) */
  uint64_t busy_ms;           /* the last time its session was found in use */
  uint64_t backoff_until_ms;  /* not dialled before this */
  uint32_t failures;          /* dials that failed in a row */
} gn_peertab_entry;

typedef struct gn_peertab_config {
  size_t cap;              /* entries in all (1024); an up session always has one */
  uint64_t grace_ms;       /* a session up, unwanted and not in use this long may close (30000) */
  uint64_t release_ms;     /* ... or this long after the views released it, if not in use (5000) */
  uint64_t backoff_ms;     /* first back-off after a failed dial; doubles per failure (2000) */
  uint64_t backoff_max_ms; /* (300000) */
} gn_peertab_config;

void gn_peertab_config_default(gn_peertab_config *ret_cfg);
/* cfg NULL takes the defaults; GN_EINVAL for a cap of 0 or over
 * GN_PEERTAB_CAP_MAX, a grace of 0, or a back-off max under its base. */
int gn_peertab_new(const gn_peertab_config *cfg, gn_peertab **ret_pt);
gn_peertab *gn_peertab_free(gn_peertab *pt);

/* A peer named by someone (source GN_PEER_HEARSAY) or a bootstrap node
 * (GN_PEER_BOOTSTRAP). A known peer has its address filled in when it had
 * none (never replaced: a stranger cannot move a known peer) and is seen
 * now. A new one takes a free place, else evicts by the policy: the least
 * recently seen entry without a session, hearsay first; hearsay may evict
 * only hearsay. 1 added, 0 already known, GN_EINVAL for a bad id or an
 * address that does not fit, GN_EBUSY when it did not fit. */
int gn_peertab_heard(gn_peertab *pt, const uint8_t id[GN_PK_LEN], const char *addr, gn_peer_source source,
                     uint64_t now_ms);
/* A session to id came up (its key proven by the handshake): verified, up,
 * not yet wanted, its back-off cleared; addr ("" if none) replaces the
 * address. Always has a place unless every entry holds a session
 * (GN_EBUSY: the caller's connection limit should be under the cap). */
int gn_peertab_session_up(gn_peertab *pt, const uint8_t id[GN_PK_LEN], const char *addr, bool inbound, uint64_t now_ms);
/* The session to id went down; the entry stays, verified. */
void gn_peertab_session_down(gn_peertab *pt, const uint8_t id[GN_PK_LEN], uint64_t now_ms);
/* Whether the session to id is wanted (by the views). Going from wanted to
 * not starts the grace period. */
void gn_peertab_set_wanted(gn_peertab *pt, const uint8_t id[GN_PK_LEN], bool wanted, uint64_t now_ms);
/* The views no longer need the session to id (they sent or took a
 * DISCONNECT, or dialled it only for a SHUFFLE_REPLY): it may close after
 * release_ms instead of the full grace, unless it is wanted again or in use.
 * Ignored when no session is up. */
void gn_peertab_release(gn_peertab *pt, const uint8_t id[GN_PK_LEN], uint64_t now_ms);
/* Something uses the session to id now (a lease, a job, an exchange): it
 * is not closed for grace_ms after. */
void gn_peertab_mark_busy(gn_peertab *pt, const uint8_t id[GN_PK_LEN], uint64_t now_ms);
/* A dial to id failed: it is not dialled again for the back-off, which
 * doubles with each failure in a row. */
void gn_peertab_dial_failed(gn_peertab *pt, const uint8_t id[GN_PK_LEN], uint64_t now_ms);
bool gn_peertab_backed_off(const gn_peertab *pt, const uint8_t id[GN_PK_LEN], uint64_t now_ms);

/* The sessions nobody needs: up, not wanted, not in use for grace_ms, and
 * either released by the views release_ms ago, or up and unwanted for
 * grace_ms (so a joining or leasing peer that dialled us has time to say
 * why). Copies up to cap ids; returns how many there
 * are. The caller closes them; each one's session_down follows. */
size_t gn_peertab_to_close(const gn_peertab *pt, uint64_t now_ms, uint8_t (*ret_ids)[GN_PK_LEN], size_t cap);

const gn_peertab_entry *gn_peertab_find(const gn_peertab *pt, const uint8_t id[GN_PK_LEN]);
size_t gn_peertab_count(const gn_peertab *pt);
size_t gn_peertab_up_count(const gn_peertab *pt);
/* The i-th entry (0 <= i < count), in no particular order; NULL past it. */
const gn_peertab_entry *gn_peertab_at(const gn_peertab *pt, size_t i);

#endif
