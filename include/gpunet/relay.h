/* A volunteer relay's book-keeping (docs/nat.md): the slots NATed peers
 * reserve, the calls that pair a caller with a reserved peer under two
 * one-time tokens, and the byte budgets of each relayed pair and of all of
 * them. I/O-free: the daemon's glue (node/nat.c) accepts the two TCP
 * connections that present the tokens and splices them, asking this machine
 * how long to pause reading; the session's own handshake runs end to end
 * through the splice, so the relay carries ciphertext only. */
#ifndef GPUNET_RELAY_H
#define GPUNET_RELAY_H

#include <gpunet/base.h>
#include <gpunet/identity.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GN_RELAY_TOKEN_LEN 16
#define GN_RELAY_RESERVE_TTL_MS 120000 /* a reservation lasts this long unless renewed */
#define GN_RELAY_CALL_WAIT_MS 10000    /* both sides must present their tokens within this */
#define GN_RELAY_PER_NET 2             /* reservations from one /24 (/64) */
/* Calls one caller may make (a bucket of 4, one more every 2 s) and how
 * many callers' buckets are kept. */
#define GN_RELAY_CALL_BURST 4
#define GN_RELAY_CALL_EVERY_S 2
#define GN_RELAY_CALLERS_MAX 256

typedef struct gn_relay_limits {
  size_t max_reservations;    /* slots reserved at once: 32 */
  size_t max_sessions;        /* pairs being set up or spliced at once: 16 */
  uint64_t pair_bytes_per_s;  /* each relayed pair, both directions together: 1 MiB/s */
  uint64_t total_bytes_per_s; /* all pairs together: 8 MiB/s */
} gn_relay_limits;

void gn_relay_limits_default(gn_relay_limits *ret);

typedef struct gn_relay_stats {
  uint64_t reserved, reserve_refused, calls, calls_refused, claims_refused, bytes, paused;
} gn_relay_stats;

typedef struct gn_relay gn_relay;

/* GN_EINVAL when a limit is 0. seed: 32 random bytes for the tokens. */
int gn_relay_new(const gn_relay_limits *l, const uint8_t seed[32], uint64_t now_ms, gn_relay **ret);
gn_relay *gn_relay_free(gn_relay *r);

/* peer asks for a slot; peer_addr is where its datagrams or connection
 * come from (its network counts against GN_RELAY_PER_NET). A peer that
 * holds one renews it. GN_EBUSY when the table or its network is full,
 * GN_EINVAL for a bad address. *ret_expires_ms: when it lapses. */
int gn_relay_reserve(gn_relay *r, const uint8_t peer[GN_PK_LEN], const char *peer_addr, uint64_t now_ms,
                     uint64_t *ret_expires_ms);
bool gn_relay_is_reserved(const gn_relay *r, const uint8_t peer[GN_PK_LEN], uint64_t now_ms);
size_t gn_relay_reservations(const gn_relay *r, uint64_t now_ms);

/* caller wants the reserved target: a pair is set up with one token for
 * each side (caller's first). GN_ENOTFOUND when target holds no slot,
 * GN_EBUSY over the caller's rate or max_sessions, GN_EINVAL for a call to
 * oneself. */
int gn_relay_call(gn_relay *r, const uint8_t caller[GN_PK_LEN], const uint8_t target[GN_PK_LEN], uint64_t now_ms,
                  uint64_t *ret_pair, uint8_t ret_caller_tok[GN_RELAY_TOKEN_LEN],
                  uint8_t ret_target_tok[GN_RELAY_TOKEN_LEN]);
/* A connection presented tok: its pair and side (0 caller, 1 target).
 * Each token works once, within GN_RELAY_CALL_WAIT_MS of the call.
 * GN_ENOTFOUND otherwise. */
int gn_relay_claim(gn_relay *r, const uint8_t tok[GN_RELAY_TOKEN_LEN], uint64_t now_ms, uint64_t *ret_pair,
                   int *ret_side);
/* Both sides of the pair claimed their tokens. */
bool gn_relay_pair_ready(const gn_relay *r, uint64_t pair);
/* Whether the pair is still set up or spliced (false once ended or when a
 * call's wait ran out: the glue then closes its connections). */
bool gn_relay_pair_live(const gn_relay *r, uint64_t pair, uint64_t now_ms);
/* bytes passed through the pair: returns how many milliseconds to pause
 * reading its connections so that the pair's and the total rate hold
 * (0: go on). */
uint64_t gn_relay_pair_charge(gn_relay *r, uint64_t pair, size_t bytes, uint64_t now_ms);
void gn_relay_pair_end(gn_relay *r, uint64_t pair);
/* Pairs set up or spliced now. */
size_t gn_relay_sessions(const gn_relay *r, uint64_t now_ms);
void gn_relay_stats_get(const gn_relay *r, gn_relay_stats *ret);

/* --- message bodies (docs/protocol.md §2.16) ------------------------------*/

#define GN_RELAY_WHY_MAX 64

/* RELAY_RESERVE (87, session, to the relay): {r: true} reserves or renews a
 * slot, {r: false} gives it back. */
typedef struct gn_relay_reserve_msg {
  bool reserve;
} gn_relay_reserve_msg;

/* RELAY_STATUS (88, session, from the relay): {ok, w: why when not ok, a:
 * the splice address ("" when none), e: seconds the slot lasts (0 when
 * answering a call), p: the target when answering a call, k: the caller's
 * token when answering a call}. p and k are both present or both absent. */
typedef struct gn_relay_status_msg {
  bool ok;
  char why[GN_RELAY_WHY_MAX];
  char addr[64];
  uint32_t ttl_s;
  bool has_call;
  uint8_t peer[GN_PK_LEN];
  uint8_t token[GN_RELAY_TOKEN_LEN];
} gn_relay_status_msg;

/* RELAY_CALL (89, session): to the relay {p: the target}; from the relay to
 * the target {p: the caller, k: the target's token, a: the splice address}. */
typedef struct gn_relay_call_msg {
  bool from_relay;
  uint8_t peer[GN_PK_LEN];
  uint8_t token[GN_RELAY_TOKEN_LEN];
  char addr[64];
} gn_relay_call_msg;

/* Encoders append to ret; decoders validate completely, GN_EINVAL or
 * GN_ETOOBIG, and write ret only on success. */
int gn_relay_reserve_encode(const gn_relay_reserve_msg *m, gn_buf *ret);
int gn_relay_reserve_decode(const uint8_t *body, size_t len, gn_relay_reserve_msg *ret);
int gn_relay_status_encode(const gn_relay_status_msg *m, gn_buf *ret);
int gn_relay_status_decode(const uint8_t *body, size_t len, gn_relay_status_msg *ret);
int gn_relay_call_encode(const gn_relay_call_msg *m, gn_buf *ret);
int gn_relay_call_decode(const uint8_t *body, size_t len, gn_relay_call_msg *ret);

/* --- reaching a peer through its relay (the caller's side) ---------------*/

/* A node that needs a session with a peer whose offer names a relay
 * (gn_offer relay_id, relay_addr) dials the peer directly and hands the
 * peer to this machine: if no session is up after a grace, it dials the
 * relay (once: the relay's address is the offer's word, so a hostile offer
 * costs one dial, like its own address), asks it to call the peer
 * (RELAY_CALL), backs off after a refusal, and gives up after
 * GN_REACH_CALLS calls or when the relay's session does not come up. A peer
 * it gave up on is not tried again for GN_REACH_FORGET_MS. I/O-free. */
#define GN_REACH_MAX 16              /* peers being reached (or given up on) at once */
#define GN_REACH_GRACE_MS 2000       /* a direct dial has this long before the relay is asked */
#define GN_REACH_RELAY_WAIT_MS 10000 /* for the session with the relay we dialled */
#define GN_REACH_CALL_WAIT_MS 14000  /* for the peer's session after a call */
#define GN_REACH_CALLS 3             /* calls through the relay before giving up */
#define GN_REACH_BACKOFF_MS 2000     /* after a refusal: 2 s, then 4 s */
#define GN_REACH_FORGET_MS 30000     /* a peer given up on is not tried again sooner */
#define GN_REACH_HOLD_MAX_MS 9000    /* a hole being punched holds the call this long at most */

typedef enum gn_reach_outcome {
  GN_REACH_DIRECT = 0,  /* up before any call: the direct dial (or the peer) made it */
  GN_REACH_RELAYED = 1, /* up after a call through the relay */
  GN_REACH_GAVE_UP = 2,
} gn_reach_outcome;

typedef struct gn_reach_io {
  /* Whether a session with key is up. */
  bool (*is_up)(void *ud, const uint8_t key[GN_PK_LEN]);
  /* Dial the relay at addr, holding the session to key. 0 or an error. */
  int (*dial)(void *ud, const char *addr, const uint8_t key[GN_PK_LEN]);
  /* Send RELAY_CALL {p: peer} to relay over its session. 0 or an error. */
  int (*call)(void *ud, const uint8_t relay[GN_PK_LEN], const uint8_t peer[GN_PK_LEN]);
  /* The attempt for peer ended (why: a phrase when it gave up, else ""). */
  void (*done)(void *ud, const uint8_t peer[GN_PK_LEN], const uint8_t relay[GN_PK_LEN], gn_reach_outcome outcome,
               const char *why);
  void *ud;
} gn_reach_io;

typedef struct gn_reach_stats {
  uint64_t wanted, direct, relayed, gave_up, dials, calls, refused, busy;
} gn_reach_stats;

/* One attempt, for status. state: "direct" (the grace), "dialling-relay",
 * "calling", "backoff", "gave-up". */
typedef struct gn_reach_info {
  uint8_t peer[GN_PK_LEN], relay[GN_PK_LEN];
  char relay_addr[64];
  const char *state;
  unsigned calls;
  char why[GN_RELAY_WHY_MAX];
} gn_reach_info;

typedef struct gn_reach gn_reach;

/* GN_EINVAL without is_up, dial and call. */
int gn_reach_new(const gn_reach_io *io, gn_reach **ret);
gn_reach *gn_reach_free(gn_reach *r);
/* A local need wants a session with peer (not up), whose offer names
 * relay_id at relay_addr. direct_dialling: a direct dial is under way (it
 * gets GN_REACH_GRACE_MS); false asks the relay at once. 0 when taken,
 * GN_EEXIST when peer is being reached already, GN_ETIMEDOUT when it was
 * given up on less than GN_REACH_FORGET_MS ago (both: nothing changes),
 * GN_EBUSY when the table is full, GN_EINVAL for a bad address or a relay
 * that is the peer itself. */
int gn_reach_want(gn_reach *r, const uint8_t peer[GN_PK_LEN], const uint8_t relay_id[GN_PK_LEN], const char *relay_addr,
                  bool direct_dialling, uint64_t now_ms);
/* relay refused our call for peer, or its splice could not be dialled:
 * the next call after a back-off, or the end. */
void gn_reach_refused(gn_reach *r, const uint8_t relay[GN_PK_LEN], const uint8_t peer[GN_PK_LEN], const char *why,
                      uint64_t now_ms);
/* A session with key came up (a peer being reached, or a relay we
 * dialled): acts on it now. */
void gn_reach_up(gn_reach *r, const uint8_t key[GN_PK_LEN], uint64_t now_ms);
/* A TCP hole is being punched to peer (docs/nat.md): the relay is not
 * called before until_ms (nor later than GN_REACH_HOLD_MAX_MS after the
 * want, or after the hold when it began while the relay was dialled:
 * the caller holds only once the relay's session is up), while no call was
 * made yet; a hold to now_ms ends a hold (the punch failed: the relay is
 * asked at once). Nothing when peer is not wanted. */
void gn_reach_hold(gn_reach *r, const uint8_t peer[GN_PK_LEN], uint64_t until_ms, uint64_t now_ms);
void gn_reach_tick(gn_reach *r, uint64_t now_ms);
/* When gn_reach_tick next has something to do (UINT64_MAX: nothing). */
uint64_t gn_reach_next_deadline_ms(const gn_reach *r);
/* Whether an attempt for peer is under way (held and not given up). */
bool gn_reach_active(const gn_reach *r, const uint8_t peer[GN_PK_LEN]);
/* The i-th attempt held (false past the end). */
bool gn_reach_get(const gn_reach *r, size_t i, gn_reach_info *ret);
void gn_reach_stats_get(const gn_reach *r, gn_reach_stats *ret);

#endif
