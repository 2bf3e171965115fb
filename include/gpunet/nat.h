/* Home networks (docs/nat.md): the address peers observe us at, the kind of
 * NAT that makes of us, UDP hole punching between two NATed peers through a
 * rendezvous both reach, and the slots of a volunteer relay. I/O-free state
 * machines: they take bytes, the time and a seed, and hand back what to send
 * through the callbacks of gn_nat_io; the daemon's glue (node/nat.c) moves
 * the bytes on the overlay UDP socket and on sessions. */
#ifndef GPUNET_NAT_H
#define GPUNET_NAT_H

#include <gpunet/base.h>
#include <gpunet/identity.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GN_NAT_ADDR_MAX 64   /* "a.b.c.d:port" or "[v6]:port", with its NUL */
#define GN_NAT_NONCE_LEN 16  /* every request carries one; its answer echoes it */
#define GN_NAT_OBS_MAX 16    /* observations kept, one per reporter */
#define GN_NAT_OBS_PER_NET 2 /* ... at most this many from reporters of one /24 (/64) */
#define GN_NAT_OBS_TTL_MS (10u * 60u * 1000u)
#define GN_NAT_ASKS_MAX 32           /* observation requests awaiting their answer */
#define GN_NAT_ASK_TIMEOUT_MS 5000   /* an answer later than this is ignored */
#define GN_NAT_ASK_AGAIN_MS 30000    /* the same address is not asked again sooner */
#define GN_NAT_SEEN_MAX 256          /* rendezvous: the endpoints we told peers, by key */
#define GN_NAT_SEEN_TTL_MS 120000    /* ... usable this long */
#define GN_NAT_PUNCH_MAX 32          /* punches in progress or established */
#define GN_NAT_PUNCH_TRIES 20        /* PUNCH datagrams sent per punch... */
#define GN_NAT_PUNCH_EVERY_MS 250    /* ... this far apart */
#define GN_NAT_PUNCHED_TTL_MS 600000 /* an established hole is remembered this long */
/* Rendezvous: PUNCH_REQs one peer may have us forward (a bucket of 4,
 * one more every 2 s), and all peers together (20 a second). An
 * introduction from a rendezvous is taken at the same per-rendezvous rate. */
#define GN_NAT_REQ_BURST 4
#define GN_NAT_REQ_EVERY_S 2
#define GN_NAT_REQ_ALL_PER_S 20
#define GN_NAT_REQ_KEYS_MAX 256 /* peers whose bucket is kept */
/* TCP hole punching (docs/nat.md): after a UDP punch asked for with the TCP
 * flag, both sides connect from their listening port to the other's outside
 * endpoint at once (a simultaneous open through two cone NATs). */
#define GN_NAT_TCP_MAX 8          /* TCP punches in progress or remembered */
#define GN_NAT_TCP_WAIT_MS 3000   /* a TCP punch has this long to connect */
#define GN_NAT_TCP_RETRY_MS 250   /* a connect that failed at once is made again after this */
#define GN_NAT_TCP_AGAIN_MS 30000 /* at most one TCP punch with a peer in this time */

typedef enum gn_nat_type {
  GN_NAT_UNKNOWN = 0,   /* not enough agreeing reports yet */
  GN_NAT_PUBLIC = 1,    /* peers see us at our own listen address */
  GN_NAT_CONE = 2,      /* address-and-port-independent mapping: one outside port for every peer */
  GN_NAT_SYMMETRIC = 3, /* address- or port-dependent mapping: another port per peer */
} gn_nat_type;

/* "unknown", "public", "cone", "symmetric". */
const char *gn_nat_type_name(gn_nat_type t);

/* --- message bodies (docs/protocol.md §2.16) ------------------------------*/

/* NAT_OBSERVED (84, UDP): a question {q: nonce} or its answer {r: nonce, a:
 * "host:port" the answerer saw the question come from}. */
typedef struct gn_nat_observed {
  bool answer;
  uint8_t nonce[GN_NAT_NONCE_LEN];
  char addr[GN_NAT_ADDR_MAX]; /* answers only */
} gn_nat_observed;

/* NAT_PUNCH_REQ (85, session): to the rendezvous {t: target key, n: nonce};
 * from it, to both sides {p: the other side's key, n: nonce, a: the other
 * side's endpoint as the rendezvous saw it, "" when it knows none}. Either
 * may carry c: true (a TCP punch follows the UDP one); absent means false. */
typedef struct gn_nat_punch_req {
  bool intro; /* from the rendezvous (p, a) rather than to it (t) */
  bool tcp;   /* c: both sides connect over TCP once the UDP hole is open */
  uint8_t peer[GN_PK_LEN];
  uint8_t nonce[GN_NAT_NONCE_LEN];
  char addr[GN_NAT_ADDR_MAX];
} gn_nat_punch_req;

/* NAT_PUNCH (86, UDP): {n: nonce, k: 0 for a probe, 1 for its answer}. */
typedef struct gn_nat_punch {
  uint8_t nonce[GN_NAT_NONCE_LEN];
  bool ack;
} gn_nat_punch;

/* Each encoder appends the body to ret; each decoder validates completely
 * (GN_EINVAL when malformed, GN_ETOOBIG over a bound) and writes ret only on
 * success. Addresses must be numeric host:port (gn_nat_addr_valid). */
int gn_nat_observed_encode(const gn_nat_observed *m, gn_buf *ret);
int gn_nat_observed_decode(const uint8_t *body, size_t len, gn_nat_observed *ret);
int gn_nat_punch_req_encode(const gn_nat_punch_req *m, gn_buf *ret);
int gn_nat_punch_req_decode(const uint8_t *body, size_t len, gn_nat_punch_req *ret);
int gn_nat_punch_encode(const gn_nat_punch *m, gn_buf *ret);
int gn_nat_punch_decode(const uint8_t *body, size_t len, gn_nat_punch *ret);

/* A numeric "a.b.c.d:port" or "[v6]:port" with port 1..65535. */
bool gn_nat_addr_valid(const char *addr);

/* --- the machine -----------------------------------------------------------*/

typedef struct gn_nat_io {
  /* A datagram body of type to addr on the overlay UDP socket; the glue
   * seals it in a signed envelope. Fire and forget. */
  void (*send_dgram)(void *ud, const char *addr, uint32_t type, const uint8_t *body, size_t len);
  /* A message body over the session to peer (sealed by the glue): 0, or
   * GN_ENOTFOUND when no session is up. */
  int (*send_msg)(void *ud, const uint8_t peer[GN_PK_LEN], uint32_t type, const uint8_t *body, size_t len);
  /* A punch ended: ok with the endpoint the peer's datagrams came from, or
   * failed (addr ""). May be NULL. */
  void (*punched)(void *ud, const uint8_t peer[GN_PK_LEN], const char *addr, bool ok);
  void *ud;
  /* A TCP punch's connect: from our listening port to addr (peer's outside
   * endpoint), the connection taken up as a session with peer's key
   * required, as the Noise initiator when initiator (our key is the
   * smaller), given up at deadline_ms. 0 when under way: the glue reports
   * its end with gn_nat_tcp_result. NULL: this node does not punch TCP. */
  int (*tcp_dial)(void *ud, const uint8_t peer[GN_PK_LEN], const char *addr, bool initiator, uint64_t deadline_ms);
} gn_nat_io;

typedef struct gn_nat_stats {
  uint64_t asks_sent, answers_sent, observations, answers_ignored;
  uint64_t punch_reqs_forwarded, punch_reqs_refused, intros_taken, intros_refused;
  uint64_t punch_dgrams_sent, punch_dgrams_ignored, punches_ok, punches_failed;
  uint64_t tcp_punches, tcp_dials, tcp_ok, tcp_failed, tcp_refused;
} gn_nat_stats;

/* A TCP punch, for status: state "udp" (the UDP punch first), "connecting",
 * "retry", "connected" or "failed" (kept GN_NAT_TCP_AGAIN_MS from its start). */
typedef struct gn_nat_tcp_info {
  uint8_t peer[GN_PK_LEN];
  char addr[GN_NAT_ADDR_MAX];
  const char *state;
  uint32_t dials;
} gn_nat_tcp_info;

typedef struct gn_nat gn_nat;

/* self: our key (datagrams signed by it are ignored); local_addr: the
 * address we listen on ("" or a wildcard when unknown: then we are never
 * classified public). seed: 32 random bytes, the source of every nonce.
 * GN_EINVAL for a bad argument, GN_ENOMEM. */
int gn_nat_new(const uint8_t self[GN_PK_LEN], const char *local_addr, const gn_nat_io *io, const uint8_t seed[32],
               uint64_t now_ms, gn_nat **ret);
gn_nat *gn_nat_free(gn_nat *nat);

/* Asks the peer whose overlay socket is at addr (and whose key is peer)
 * where it sees us. Nothing is sent (GN_EBUSY) when that address was asked
 * less than GN_NAT_ASK_AGAIN_MS ago or GN_NAT_ASKS_MAX questions wait;
 * GN_EINVAL for a bad address. */
int gn_nat_ask(gn_nat *nat, const uint8_t peer[GN_PK_LEN], const char *addr, uint64_t now_ms);

/* A datagram of ours (NAT_OBSERVED or NAT_PUNCH) whose envelope verified,
 * signed by signer, came from from_addr. Questions are answered; an answer
 * counts only when it matches a question we sent to that very address and
 * key; a PUNCH only for a punch in progress with its signer and nonce.
 * GN_EINVAL/GN_ETOOBIG for a malformed body, GN_ENOTFOUND when it matched
 * nothing (then nothing changed). */
int gn_nat_on_datagram(gn_nat *nat, const char *from_addr, const uint8_t signer[GN_PK_LEN], uint32_t type,
                       const uint8_t *body, size_t len, uint64_t now_ms);

/* A NAT_PUNCH_REQ over the session to peer (its signer checked by the
 * caller). As a rendezvous: forwarded when peer's rate allows (GN_EBUSY
 * otherwise) and both sides' endpoints are known. As a side: taken when it
 * answers our request, or as an introduction within the rate. */
int gn_nat_on_message(gn_nat *nat, const uint8_t peer[GN_PK_LEN], uint32_t type, const uint8_t *body, size_t len,
                      uint64_t now_ms);

/* Starts punching to target through rendezvous (both over sessions): sends
 * the PUNCH_REQ; the punched callback reports the end. GN_EBUSY when the
 * punch table is full or a punch with target is in progress, GN_EEXIST
 * when one is established, GN_ENOTFOUND when rendezvous has no session. */
int gn_nat_punch_start(gn_nat *nat, const uint8_t target[GN_PK_LEN], const uint8_t rendezvous[GN_PK_LEN],
                       uint64_t now_ms);

/* Starts a TCP punch to target through rendezvous: a UDP punch asked for
 * with the TCP flag; once its hole is open, and only when target's signed
 * datagrams came from the very endpoint the rendezvous named, tcp_dial
 * connects there (until GN_NAT_TCP_WAIT_MS, a connect that failed at once
 * made again every GN_NAT_TCP_RETRY_MS). Only while we are behind a cone
 * NAT (GN_EPERM otherwise), at most once per peer per GN_NAT_TCP_AGAIN_MS
 * (GN_ETIMEDOUT), GN_NAT_TCP_MAX at once (GN_EBUSY); GN_EUNSUPPORTED
 * without tcp_dial; else what gn_nat_punch_start gives (an open hole is
 * punched again: the other side must connect at the same time). */
int gn_nat_tcp_punch_start(gn_nat *nat, const uint8_t target[GN_PK_LEN], const uint8_t rendezvous[GN_PK_LEN],
                           uint64_t now_ms);
/* The glue's report on a TCP punch's connect: 0 when the connection was
 * taken up, else why it failed (retried until the wait is over). */
void gn_nat_tcp_result(gn_nat *nat, const uint8_t peer[GN_PK_LEN], int status, uint64_t now_ms);
/* Whether a TCP punch with peer is under way (the UDP punch or the connect). */
bool gn_nat_tcp_active(const gn_nat *nat, const uint8_t peer[GN_PK_LEN], uint64_t now_ms);
/* The i-th TCP punch held (false past the last). */
bool gn_nat_tcp_get(const gn_nat *nat, size_t i, uint64_t now_ms, gn_nat_tcp_info *ret);
/* Whether addr's host is one only its own network reaches: loopback,
 * RFC 1918, shared (100.64/10), link-local, unspecified; IPv6 loopback,
 * ULA (fc00::/7), link-local. A node that advertises such an address does
 * not consider itself reachable from outside (unknown or symmetric NAT). */
bool gn_nat_addr_private(const char *addr);

/* Sends what is due (punch probes), expires what is old. */
void gn_nat_tick(gn_nat *nat, uint64_t now_ms);
/* When gn_nat_tick next has something to do (UINT64_MAX: nothing). */
uint64_t gn_nat_next_deadline_ms(const gn_nat *nat);

/* The classification from the observations held now: an outside address
 * counts only when reporters in at least two distinct /24s (/64s) agree on
 * it, so one liar (or many from one network) cannot move it. */
gn_nat_type gn_nat_type_get(const gn_nat *nat, uint64_t now_ms);
/* The address to advertise (public or cone: the agreed host:port) into
 * buf; false (buf untouched) when there is none. */
bool gn_nat_advertised(const gn_nat *nat, uint64_t now_ms, char *buf, size_t cap);
/* The outside host all agree on, for a symmetric NAT too (false: none). */
bool gn_nat_outside_host(const gn_nat *nat, uint64_t now_ms, char *buf, size_t cap);
/* Observations held now (for tests and status). */
size_t gn_nat_observation_count(const gn_nat *nat, uint64_t now_ms);
/* The endpoint of an established hole to peer (true), else false. */
bool gn_nat_punched_addr(const gn_nat *nat, const uint8_t peer[GN_PK_LEN], uint64_t now_ms, char *buf, size_t cap);
/* Where peer's datagrams came from when it last asked us where we see it
 * (within GN_NAT_SEEN_TTL_MS): a relay counts its reservation against that
 * address's network. */
bool gn_nat_seen_addr(const gn_nat *nat, const uint8_t peer[GN_PK_LEN], uint64_t now_ms, char *buf, size_t cap);
/* Punches in the table (in progress and established). */
size_t gn_nat_punch_count(const gn_nat *nat);
void gn_nat_stats_get(const gn_nat *nat, gn_nat_stats *ret);

#endif
