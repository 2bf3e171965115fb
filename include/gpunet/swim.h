/* Membership: SWIM failure detection with the Lifeguard refinements (local
 * health, suspicion timeouts that shrink with independent confirmations, the
 * buddy system), as an I/O-free state machine. The caller hands it datagrams
 * whose envelope signature it has already checked (the signer is passed in),
 * the current time in milliseconds and a seed; it hands back datagram bodies
 * to send and membership events. The same code runs on the daemon's UDP socket
 * and under the deterministic simulator (tests/sim). docs/overlay.md §1. */
#ifndef GPUNET_SWIM_H
#define GPUNET_SWIM_H

#include <gpunet/base.h>
#include <gpunet/identity.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GN_SWIM_ADDR_MAX 64    /* "host:port" with its NUL */
#define GN_SWIM_BODY_MAX 65507 /* a longer body is refused (GN_ETOOBIG): more than one UDP datagram holds */
#define GN_SWIM_UPDATES_MAX 64 /* update records one body may carry; more is refused (GN_ETOOBIG) */
#define GN_SWIM_DEAD_SAMPLE 2  /* recent dead/left records every ACK carries, round robin */

typedef struct gn_swim gn_swim;

typedef struct gn_swim_config {
  uint32_t probe_interval_ms;  /* one probe per interval (1000) */
  uint32_t probe_timeout_ms;   /* direct ack wait before ping-req (500) */
  uint32_t indirect_k;         /* helpers asked by ping-req (3) */
  uint32_t suspicion_alpha;    /* min suspicion = alpha * log10(n) * interval (4); expects alpha - 2 confirmations */
  uint32_t suspicion_beta;     /* max suspicion = beta * min (6) */
  uint32_t retransmit_mult;    /* an update rides lambda * log10(n+1) messages (4) */
  uint32_t awareness_max;      /* Lifeguard local health saturation (8) */
  uint32_t max_members;        /* members kept (4096); more are not remembered */
  uint32_t max_datagram;       /* body bytes per datagram, piggyback included (1200) */
  uint32_t dead_keep_ms;       /* dead records kept to answer stale gossip (90000) */
  uint32_t gossip_interval_ms; /* while there is news, a gossip round this often (200; 0: none) */
  uint32_t gossip_nodes;       /* members pinged by a gossip round (3, at most 16) */
} gn_swim_config;

/* Fills cfg with the defaults above. */
void gn_swim_config_default(gn_swim_config *cfg);

typedef enum gn_swim_state {
  GN_SWIM_ALIVE = 0,
  GN_SWIM_SUSPECT = 1,
  GN_SWIM_DEAD = 2,
  GN_SWIM_LEFT = 3, /* announced its own leave */
} gn_swim_state;

typedef struct gn_swim_member {
  uint8_t id[GN_PK_LEN];
  char addr[GN_SWIM_ADDR_MAX];
  uint32_t incarnation;
  gn_swim_state state;
  uint64_t since_ms; /* when it entered this state here */
} gn_swim_member;

typedef enum gn_swim_event_kind {
  GN_SWIM_EV_JOIN,    /* first heard of, alive */
  GN_SWIM_EV_SUSPECT, /* suspected (here or by gossip) */
  GN_SWIM_EV_ALIVE,   /* a suspect refuted, or a dead one came back with a higher incarnation */
  GN_SWIM_EV_DEAD,    /* declared dead (here after its suspicion timed out, or by gossip) */
  GN_SWIM_EV_LEFT,    /* left on its own */
} gn_swim_event_kind;

typedef struct gn_swim_event {
  gn_swim_event_kind kind;
  gn_swim_member member;
  bool local; /* this node's own suspicion timed out (DEAD), or its own probe failed (SUSPECT) */
} gn_swim_event;

typedef struct gn_swim_io {
  /* Sends one datagram body of message type (GN_MSG_SWIM_*) to addr. The
   * caller seals it in an envelope signed by this node. */
  void (*send)(void *ud, const char *addr, uint32_t type, const uint8_t *body, size_t len);
  /* A member changed state. May be NULL. Must not call back into the swim. */
  void (*event)(void *ud, const gn_swim_event *ev);
  void *ud;
} gn_swim_io;

typedef struct gn_swim_stats {
  uint64_t sent_msgs, sent_bytes; /* bodies handed to io.send */
  uint64_t recv_msgs, recv_bytes, recv_bad;
  uint64_t probes, probes_failed, suspicions_local, deaths_local, refutations;
} gn_swim_stats;

/* cfg NULL takes the defaults. self_addr is where others reach this node
 * ("host:port"). seed drives every random choice, so a run replays. */
int gn_swim_new(const uint8_t self_id[GN_PK_LEN], const char *self_addr, const gn_swim_config *cfg,
                const gn_swim_io *io, uint64_t seed, uint64_t now_ms, gn_swim **ret_s);
gn_swim *gn_swim_free(gn_swim *s);

/* A peer to probe, learnt with its key (a bootstrap node after its handshake,
 * a view neighbour). Joins it as alive at incarnation 0 unless known. */
int gn_swim_add(gn_swim *s, const uint8_t id[GN_PK_LEN], const char *addr, uint64_t now_ms);

/* One datagram whose envelope verified: signer is its signer, from the source
 * address it came from. Bad bodies return GN_EINVAL/GN_ETOOBIG/GN_EPROTO and
 * change nothing. */
int gn_swim_on_datagram(gn_swim *s, const char *from_addr, const uint8_t signer[GN_PK_LEN], uint32_t type,
                        const uint8_t *body, size_t len, uint64_t now_ms);

/* Runs timers: probes, timeouts, suspicion expiry. Call at or after
 * gn_swim_next_deadline_ms (earlier is harmless). */
void gn_swim_tick(gn_swim *s, uint64_t now_ms);
uint64_t gn_swim_next_deadline_ms(const gn_swim *s);

/* Announces this node's leave (gossiped as LEFT with a higher incarnation):
 * pings a few live members with it at once, and again each probe timeout
 * (from gn_swim_tick) until one of them answers. */
void gn_swim_leave(gn_swim *s, uint64_t now_ms);
/* How many answers the pings that carried the leave got: once one did, a
 * member holds the leave and spreads it. */
uint32_t gn_swim_leave_acks(const gn_swim *s);

size_t gn_swim_count(const gn_swim *s, gn_swim_state st);
/* GN_ENOTFOUND if id is not a member. */
int gn_swim_get(const gn_swim *s, const uint8_t id[GN_PK_LEN], gn_swim_member *ret_m);
/* Copies up to cap members (any state); returns how many there are. */
size_t gn_swim_members(const gn_swim *s, gn_swim_member *out, size_t cap);
/* Lifeguard's local health: 0 is healthy, up to awareness_max. */
uint32_t gn_swim_health(const gn_swim *s);
uint32_t gn_swim_incarnation(const gn_swim *s);
void gn_swim_stats_get(const gn_swim *s, gn_swim_stats *ret);

/* The members above are the other nodes: gn_swim_count and gn_swim_members
 * never include this node, while gn_swim_get on its own id returns its own
 * record (its incarnation, ALIVE or LEFT). */

/* Whether id is a member that answered a ping of ours with its own
 * signature (hearsay never evicts such a member when the table is full). */
bool gn_swim_verified(const gn_swim *s, const uint8_t id[GN_PK_LEN]);
/* Whether addr is an address bodies may carry: "a.b.c.d:port" or
 * "[v6]:port", numeric, port 1-65535, shorter than GN_SWIM_ADDR_MAX. */
bool gn_swim_addr_valid(const char *addr);

/* This node is now reached at addr (a NAT's outside address it learnt):
 * a new incarnation carries it; each member takes it from our next signed
 * datagram. GN_EINVAL for an invalid address, GN_ESTATE after the leave;
 * the same address changes nothing. */
int gn_swim_set_addr(gn_swim *s, const char *addr, uint64_t now_ms);

#endif
