/* Membership: SWIM failure detection with the Lifeguard refinements, as an
 * I/O-free state machine driven by datagrams, the caller's clock and a seed
 * (include/gpunet/swim.h; the bodies and rules are in docs/overlay/membership.md). */
#include <gpunet/swim.h>
#include <gpunet/wire.h>

#include <arpa/inet.h>
#include <sodium.h>
#include <stddef.h>

#define SW_NONE UINT32_MAX
#define SW_CONF_MAX 4        /* the suspicion's origin and up to k confirmers (k at most 3) */
#define SW_HELPERS_MAX 8     /* indirect_k is capped at this */
#define SW_GOSSIP_MAX 16     /* gossip_nodes is at most this */
#define SW_RELAYS_MAX 16     /* ping-req relays in flight, in total */
#define SW_RELAYS_PER_PEER 2 /* ... and per requester */
#define SW_SENT_RING 64      /* pings and ping-reqs whose answers we still accept */
#define SW_DEAD_PING_EVERY 4 /* every 4th probe also pings one recently dead member */
#define SW_INC_MAX UINT32_MAX
#define SW_GIVE 4       /* live members an ACK offers a node that asked for more */
#define SW_GHOST_HOPS 8 /* a record about a node we do not keep is passed on only this far */
#define SW_JOIN_BURST 4 /* joins about nodes we do not keep passed on in a burst (then one an interval) */
#define SW_JOIN_HOPS 5  /* ... and only this close to the newcomer (a fresh join) */
#define SW_PULL_HOP (SW_JOIN_HOPS + 1) /* the hop of a record sent to a puller: neither pushed nor offered on */
#define SW_LEAVE_TELL 3                /* a leaving node pings this many members with its leave, until one answers */
#define SW_LEAVE_ROUNDS 5              /* ... in at most this many rounds, a probe timeout apart */
#define SW_RECENT 8                    /* records whose gossip ended lately, offered to pullers (a ring) */
#define SW_RECENT_PROBES 5             /* ... for this many probe intervals after their last send */
#define SW_PULL_RECORDS 3              /* ... at most this many in one answer to a pull */

typedef struct sw_node {
  /* What a lookup and applying a record touch first, together at the
   * start (a simulation of thousands of tables is bound by cache misses). */
  uint8_t id[GN_PK_LEN];
  uint64_t hkey; /* keyed hash of id: the table's and the confirmers' key */
  uint32_t inc;
  uint8_t state;
  bool used;
  bool verified;                     /* it answered a ping of ours with its signature */
  bool want_deaths;                  /* first heard of, or with a new incarnation: tell it the recent deaths */
  bool direct;                       /* it spoke for itself (its own signed body), or our caller added it */
  bool ghost;                        /* not a member: a record about another node, kept only to pass it on */
  uint8_t tx_tier;                   /* 0: a refutation or revival, sent before anything else; 1: the rest */
  uint8_t hop;                       /* relays the queued record has been through (0: ours) */
  uint32_t q_bucket, q_prev, q_next; /* its place in the dissemination queue (q_bucket SW_NONE: not queued) */
  uint32_t tx_count;                 /* times its current record rode a body */
  uint64_t tx_stamp;                 /* when that record was queued: newer first */
  uint64_t since_ms;
  uint32_t order_pos, dead_pos, ghost_pos;
  char addr[GN_SWIM_ADDR_MAX];
  uint8_t by[GN_PK_LEN]; /* who suspected or declared it (gossiped with the record) */
  bool has_by;
  /* Its suspicion, while SUSPECT. */
  uint8_t susp_k, susp_n;
  uint32_t susp_min_ms, susp_max_ms;
  uint64_t susp_start_ms;
  uint64_t notice_ms; /* our own suspicion: when to ping the suspect again with it (0: never) */
  uint64_t susp_conf[SW_CONF_MAX];
} sw_node;

typedef struct sw_list {
  uint32_t *a;
  uint32_t n;
} sw_list;

enum { L_ORDER, L_DEAD, L_GHOST };

typedef struct sw_upd {
  uint8_t id[GN_PK_LEN];
  char addr[GN_SWIM_ADDR_MAX];
  uint32_t inc;
  uint8_t st;
  bool has_by;
  uint8_t by[GN_PK_LEN];
  uint8_t hop;
} sw_upd;

/* One decoded body: everything is validated before anything is applied. */
typedef struct sw_msg {
  uint8_t from[GN_PK_LEN];
  uint32_t inc;
  char addr[GN_SWIM_ADDR_MAX];
  uint64_t seq;
  bool has_to, has_target, more;
  uint8_t to[GN_PK_LEN];
  uint8_t target[GN_PK_LEN];
  char taddr[GN_SWIM_ADDR_MAX];
  gn_wire_doc doc;                /* held while the body is applied */
  const msgpack_object_array *g;  /* its update records, all valid; NULL if none */
  const msgpack_object_array *ml; /* ACK: live members offered ("m"), all valid; NULL if none */
} sw_msg;

typedef struct sw_sent {
  bool used;
  bool req; /* a ping-req to a helper (peer) about target */
  uint64_t seq;
  uint8_t peer[GN_PK_LEN];   /* who must sign the answer */
  uint8_t target[GN_PK_LEN]; /* whom it is about */
} sw_sent;

typedef struct sw_relay {
  bool used;
  uint64_t seq_out, seq_in, nack_ms, expire_ms;
  bool nacked;
  uint8_t requester[GN_PK_LEN];
  char req_addr[GN_SWIM_ADDR_MAX];
  uint8_t target[GN_PK_LEN];
} sw_relay;

struct gn_swim {
  gn_swim_config cfg;
  gn_swim_io io;
  uint64_t rng;
  uint8_t hash_key[crypto_shorthash_KEYBYTES];
  /* Slot 0 is this node; members live in slots 1.. (stable while they stay). */
  sw_node *nodes;
  uint32_t cap, hi;
  uint32_t *free_slots;
  uint32_t nfree;
  uint64_t *tab; /* open addressing, linear probing: slot | the hash's high half << 32 (all ones: empty) */
  uint32_t tab_mask;
  sw_list order, dead, ghosts;
  /* Members now SUSPECT, in slot order, each with when it is next due (its
   * timeout or its next ping, whichever is first: susp_arm), and room for a
   * copy to walk. The check reads only these arrays for those not due. */
  sw_list susp;
  uint32_t *susp_walk;
  uint64_t *susp_due, *susp_walk_due;
  double ln_small[SW_CONF_MAX + 1]; /* sw_ln(i), 1 <= i <= SW_CONF_MAX: the suspicion's fraction */
  /* The dissemination queue: one list per (tier, times sent), newest at
   * the head, so a body takes the least sent records without scanning. */
  uint32_t *q_head, *q_tail;
  uint32_t q_count_max; /* a record's sends are counted up to this (buckets per tier: one more) */
  uint32_t q_len;
  uint32_t nghost, ghost_max; /* records about non-members passed on (max_members / 2) */
  uint32_t ghost_hand;        /* the eviction clock's place in the ghost list */
  uint8_t rx_hop;             /* the hop records queued now get: one past the record being applied */
  uint32_t probe_idx;
  uint64_t stamp;
  uint32_t dead_cursor, dead_ping_cursor, give_cursor;
  uint32_t count[4]; /* members by state, this node excluded */
  uint32_t unverified;
  uint32_t health;
  bool left;
  uint32_t leave_acks;   /* answers to the pings that carried our leave */
  uint32_t leave_rounds; /* rounds of such pings sent (at most SW_LEAVE_ROUNDS) */
  struct {
    bool active, indirect;
    uint8_t id[GN_PK_LEN];
    uint64_t seq, start_ms, req_ms, end_ms;
    uint32_t nhelpers, nacks;
    uint8_t helpers[SW_HELPERS_MAX][GN_PK_LEN];
    bool nacked[SW_HELPERS_MAX];
  } probe;
  uint64_t next_probe_ms;
  uint64_t next_gossip_ms; /* the next gossip round, when there is news to send */
  uint64_t refute_ping_ms; /* no ping to an accuser before this */
  uint64_t join_relay_ms;  /* the join relay's token bucket: empty at this time (GCRA) */
  uint32_t probe_ticks;
  sw_sent sent[SW_SENT_RING];
  uint32_t sent_next;
  sw_relay relays[SW_RELAYS_MAX];
  uint64_t next_susp_ms, next_reap_ms;
  /* Records whose gossip ran out lately: an ACK to a ping that brought no
   * records (a pull) carries one of them, round robin (see pack_updates). */
  struct {
    uint32_t slot, inc;
    uint64_t hkey, done_ms;
    uint8_t st;
    bool used;
  } recent[SW_RECENT];
  uint32_t recent_next, recent_cursor;
  /* Plain joins heard about nodes we neither keep nor pass on (no join
   * token, or too many hops from the newcomer): a pull gets them too. */
  struct {
    uint8_t id[GN_PK_LEN];
    char addr[GN_SWIM_ADDR_MAX];
    uint32_t inc;
    uint64_t at_ms;
    bool used;
  } heard[SW_RECENT];
  uint32_t heard_next;
  uint64_t now_ms; /* of the last tick or datagram */
  gn_swim_stats stats;
  gn_wire_writer w;
  gn_buf one, ub, mb, out;
};

/* --- small helpers ----------------------------------------------------------*/

static uint64_t sw_rand(gn_swim *s) {
  uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint32_t sw_below(gn_swim *s, uint32_t n) {
  return n ? (uint32_t)(sw_rand(s) % n) : 0;
}

/* Natural logarithm, computed here so that timeouts are the same bits on
 * every machine (the simulator replays from a seed) and libm is not needed. */
static double sw_ln(double x) {
  if (x <= 0)
    return 0;
  int e = 0;
  while (x >= 2.0) {
    x /= 2.0;
    e++;
  }
  while (x < 1.0) {
    x *= 2.0;
    e--;
  }
  double t = (x - 1.0) / (x + 1.0), t2 = t * t, term = t, sum = 0;
  for (int i = 1; i < 60; i += 2) {
    sum += term / i;
    term *= t2;
  }
  return 2.0 * sum + e * 0.69314718055994530942;
}

static uint64_t sw_hash(const gn_swim *s, const uint8_t id[GN_PK_LEN]) {
  uint8_t h[crypto_shorthash_BYTES];
  crypto_shorthash(h, id, GN_PK_LEN, s->hash_key);
  uint64_t v;
  memcpy(&v, h, sizeof v);
  return v;
}

static bool addr_valid(const char *a) {
  size_t n = strnlen(a, GN_SWIM_ADDR_MAX);
  if (n < 3 || n >= GN_SWIM_ADDR_MAX)
    return false;
  const char *colon = strrchr(a, ':');
  if (!colon || colon == a)
    return false;
  const char *p = colon + 1;
  size_t plen = strlen(p);
  if (plen < 1 || plen > 5)
    return false;
  uint32_t port = 0;
  for (size_t i = 0; i < plen; i++) {
    if (p[i] < '0' || p[i] > '9')
      return false;
    port = port * 10 + (uint32_t)(p[i] - '0');
  }
  if (port < 1 || port > 65535)
    return false;
  char host[GN_SWIM_ADDR_MAX];
  size_t hlen = (size_t)(colon - a);
  unsigned char bin[16];
  if (a[0] == '[') {
    if (hlen < 3 || a[hlen - 1] != ']')
      return false;
    memcpy(host, a + 1, hlen - 2);
    host[hlen - 2] = 0;
    return inet_pton(AF_INET6, host, bin) == 1;
  }
  memcpy(host, a, hlen);
  host[hlen] = 0;
  return inet_pton(AF_INET, host, bin) == 1;
}

bool gn_swim_addr_valid(const char *addr) {
  return addr && addr_valid(addr);
}

/* Members other than this node that are not dead or gone, plus this one:
 * the n of the formulas. */
static uint32_t est_n(const gn_swim *s) {
  return s->count[GN_SWIM_ALIVE] + s->count[GN_SWIM_SUSPECT] + 1;
}

static uint64_t scaled(const gn_swim *s, uint32_t ms) {
  return (uint64_t)ms * (s->health + 1);
}

/* retransmit_mult * ceil(log10(n + 1)), at least 1. */
static uint32_t tx_limit(const gn_swim *s) {
  uint64_t n1 = (uint64_t)est_n(s) + 1, v = 1;
  uint32_t d = 0;
  while (v < n1) {
    v *= 10;
    d++;
  }
  uint32_t lim = s->cfg.retransmit_mult * d;
  return lim ? lim : 1;
}

static void health_add(gn_swim *s, int delta) {
  int64_t h = (int64_t)s->health + delta;
  if (h < 0)
    h = 0;
  if (h > (int64_t)s->cfg.awareness_max)
    h = s->cfg.awareness_max;
  s->health = (uint32_t)h;
}

/* --- lists of slots with a back index ---------------------------------------*/

static uint32_t *lpos(gn_swim *s, uint32_t slot, int which) {
  sw_node *n = &s->nodes[slot];
  return which == L_ORDER ? &n->order_pos : which == L_DEAD ? &n->dead_pos : &n->ghost_pos;
}

static sw_list *lget(gn_swim *s, int which) {
  return which == L_ORDER ? &s->order : which == L_DEAD ? &s->dead : &s->ghosts;
}

/* The suspects' list is kept sorted by slot (check_suspicions walks them in
 * that order) and found by bisection: a suspicion starts or ends far less
 * often than its timers are checked. Returns where slot is or would go. */
static uint32_t susp_find(const gn_swim *s, uint32_t slot) {
  uint32_t lo = 0, hi = s->susp.n;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (s->susp.a[mid] < slot)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static void susp_add(gn_swim *s, uint32_t slot) {
  uint32_t i = susp_find(s, slot);
  if (i < s->susp.n && s->susp.a[i] == slot)
    return;
  memmove(&s->susp.a[i + 1], &s->susp.a[i], (size_t)(s->susp.n - i) * sizeof *s->susp.a);
  memmove(&s->susp_due[i + 1], &s->susp_due[i], (size_t)(s->susp.n - i) * sizeof *s->susp_due);
  s->susp.a[i] = slot;
  s->susp_due[i] = 0; /* due at once until susp_arm says when */
  s->susp.n++;
}

static void susp_del(gn_swim *s, uint32_t slot) {
  uint32_t i = susp_find(s, slot);
  if (i == s->susp.n || s->susp.a[i] != slot)
    return;
  memmove(&s->susp.a[i], &s->susp.a[i + 1], (size_t)(s->susp.n - i - 1) * sizeof *s->susp.a);
  memmove(&s->susp_due[i], &s->susp_due[i + 1], (size_t)(s->susp.n - i - 1) * sizeof *s->susp_due);
  s->susp.n--;
}

static void susp_set_due(gn_swim *s, uint32_t slot, uint64_t due) {
  uint32_t i = susp_find(s, slot);
  if (i < s->susp.n && s->susp.a[i] == slot)
    s->susp_due[i] = due;
}

static void list_add(gn_swim *s, int which, uint32_t slot) {
  sw_list *L = lget(s, which);
  uint32_t *p = lpos(s, slot, which);
  if (*p != SW_NONE)
    return;
  L->a[L->n] = slot;
  *p = L->n++;
}

static void list_del(gn_swim *s, int which, uint32_t slot) {
  sw_list *L = lget(s, which);
  uint32_t *p = lpos(s, slot, which);
  if (*p == SW_NONE)
    return;
  uint32_t last = L->a[--L->n];
  L->a[*p] = last;
  *lpos(s, last, which) = *p;
  *p = SW_NONE;
}

static void list_swap(gn_swim *s, int which, uint32_t i, uint32_t j) {
  sw_list *L = lget(s, which);
  uint32_t a = L->a[i], b = L->a[j];
  L->a[i] = b;
  L->a[j] = a;
  *lpos(s, a, which) = j;
  *lpos(s, b, which) = i;
}

/* --- the dissemination queue ----------------------------------------------
 *
 * Records wait in one list per (tier, times sent); a body takes them bucket
 * by bucket, tier 0 first, least sent first, so building a body costs what
 * it takes, not a scan of the whole queue. */

static uint32_t q_index(const gn_swim *s, uint8_t tier, uint32_t count) {
  return tier * (s->q_count_max + 1) + (count < s->q_count_max ? count : s->q_count_max);
}

static void q_unlink(gn_swim *s, uint32_t slot) {
  sw_node *n = &s->nodes[slot];
  if (n->q_bucket == SW_NONE)
    return;
  if (n->q_prev != SW_NONE)
    s->nodes[n->q_prev].q_next = n->q_next;
  else
    s->q_head[n->q_bucket] = n->q_next;
  if (n->q_next != SW_NONE)
    s->nodes[n->q_next].q_prev = n->q_prev;
  else
    s->q_tail[n->q_bucket] = n->q_prev;
  n->q_bucket = n->q_prev = n->q_next = SW_NONE;
  s->q_len--;
}

/* Links slot into the bucket of its tier and count: at the head when its
 * record is new (newest first), at the tail when it moves there after a send
 * (so records keep the order they were sent in among equals). */
static void q_link(gn_swim *s, uint32_t slot, bool head) {
  sw_node *n = &s->nodes[slot];
  uint32_t b = q_index(s, n->tx_tier, n->tx_count);
  n->q_bucket = b;
  if (head) {
    n->q_prev = SW_NONE;
    n->q_next = s->q_head[b];
    if (n->q_next != SW_NONE)
      s->nodes[n->q_next].q_prev = slot;
    else
      s->q_tail[b] = slot;
    s->q_head[b] = slot;
  } else {
    n->q_next = SW_NONE;
    n->q_prev = s->q_tail[b];
    if (n->q_prev != SW_NONE)
      s->nodes[n->q_prev].q_next = slot;
    else
      s->q_head[b] = slot;
    s->q_tail[b] = slot;
  }
  s->q_len++;
}

/* --- the id table -----------------------------------------------------------*/

#define TAB_EMPTY UINT64_MAX

/* Each entry carries half the hash, so a probe past other ids does not
 * touch their records (a cache miss each, in a simulation of thousands of
 * tables). */
static uint64_t tab_entry(const sw_node *n, uint32_t slot) {
  return (n->hkey & 0xffffffff00000000ull) | slot;
}

static uint32_t tab_find(const gn_swim *s, const uint8_t id[GN_PK_LEN]) {
  uint64_t h = sw_hash(s, id), hi = h & 0xffffffff00000000ull;
  for (uint32_t i = (uint32_t)h & s->tab_mask;; i = (i + 1) & s->tab_mask) {
    uint64_t e = s->tab[i];
    if (e == TAB_EMPTY)
      return SW_NONE;
    uint32_t slot = (uint32_t)e;
    if ((e & 0xffffffff00000000ull) == hi && s->nodes[slot].hkey == h && memcmp(s->nodes[slot].id, id, GN_PK_LEN) == 0)
      return slot;
  }
}

/* A member (or this node, slot 0): never a ghost. */
static uint32_t member_find(const gn_swim *s, const uint8_t id[GN_PK_LEN]) {
  uint32_t slot = tab_find(s, id);
  return slot != SW_NONE && s->nodes[slot].ghost ? SW_NONE : slot;
}

static void tab_insert(gn_swim *s, uint32_t slot) {
  uint32_t i = (uint32_t)s->nodes[slot].hkey & s->tab_mask;
  while (s->tab[i] != TAB_EMPTY)
    i = (i + 1) & s->tab_mask;
  s->tab[i] = tab_entry(&s->nodes[slot], slot);
}

/* Backward-shift deletion: no tombstones, so lookups stay short however
 * many members come and go. */
static void tab_remove(gn_swim *s, uint32_t slot) {
  uint32_t i = (uint32_t)s->nodes[slot].hkey & s->tab_mask;
  while ((uint32_t)s->tab[i] != slot) {
    if (s->tab[i] == TAB_EMPTY)
      return;
    i = (i + 1) & s->tab_mask;
  }
  s->tab[i] = TAB_EMPTY;
  for (uint32_t j = (i + 1) & s->tab_mask; s->tab[j] != TAB_EMPTY; j = (j + 1) & s->tab_mask) {
    uint32_t k = (uint32_t)s->nodes[(uint32_t)s->tab[j]].hkey & s->tab_mask;
    bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (!stays) {
      s->tab[i] = s->tab[j];
      s->tab[j] = TAB_EMPTY;
      i = j;
    }
  }
}

/* Grows every per-slot array to ncap slots and rebuilds the id table. */
static int grow(gn_swim *s, uint32_t ncap) {
  uint32_t tsize = 16;
  while (tsize < 2 * ncap)
    tsize *= 2;
  sw_node *nodes = realloc(s->nodes, (size_t)ncap * sizeof *nodes);
  if (!nodes)
    return GN_ENOMEM;
  s->nodes = nodes;
  uint32_t **arrs[6] = {&s->free_slots, &s->order.a, &s->dead.a, &s->ghosts.a, &s->susp.a, &s->susp_walk};
  for (int i = 0; i < 6; i++) {
    uint32_t *p = realloc(*arrs[i], (size_t)ncap * sizeof *p);
    if (!p)
      return GN_ENOMEM;
    *arrs[i] = p;
  }
  uint64_t **arrs64[2] = {&s->susp_due, &s->susp_walk_due};
  for (int i = 0; i < 2; i++) {
    uint64_t *p = realloc(*arrs64[i], (size_t)ncap * sizeof *p);
    if (!p)
      return GN_ENOMEM;
    *arrs64[i] = p;
  }
  uint64_t *tab = malloc((size_t)tsize * sizeof *tab);
  if (!tab)
    return GN_ENOMEM;
  memset(&s->nodes[s->cap], 0, (size_t)(ncap - s->cap) * sizeof *nodes);
  free(s->tab);
  s->tab = tab;
  s->tab_mask = tsize - 1;
  s->cap = ncap;
  memset(s->tab, 0xff, (size_t)tsize * sizeof *tab);
  for (uint32_t i = 0; i < s->hi; i++)
    if (s->nodes[i].used)
      tab_insert(s, i);
  return 0;
}

/* --- events and gossip ------------------------------------------------------*/

static void to_member(const sw_node *n, gn_swim_member *m) {
  memcpy(m->id, n->id, GN_PK_LEN);
  memcpy(m->addr, n->addr, GN_SWIM_ADDR_MAX);
  m->incarnation = n->inc;
  m->state = (gn_swim_state)n->state;
  m->since_ms = n->since_ms;
}

static void emit(gn_swim *s, gn_swim_event_kind kind, const sw_node *n, bool local) {
  if (!s->io.event)
    return;
  gn_swim_event ev = {.kind = kind, .local = local};
  to_member(n, &ev.member);
  s->io.event(s->io.ud, &ev);
}

/* Puts the slot's current record at the head of the dissemination queue,
 * in tier 0 (before anything else) or 1. */
static void enqueue_tier(gn_swim *s, uint32_t slot, uint8_t tier) {
  q_unlink(s, slot);
  s->nodes[slot].tx_count = 0;
  s->nodes[slot].tx_tier = tier;
  s->nodes[slot].hop = slot == 0 ? 0 : s->rx_hop;
  s->nodes[slot].tx_stamp = ++s->stamp;
  q_link(s, slot, true);
}

static void enqueue(gn_swim *s, uint32_t slot) {
  enqueue_tier(s, slot, slot == 0 ? 0 : 1);
}

/* Moves a member to state st at incarnation inc, keeping the counts, the
 * dead list, the event and the queue in step. */
static void set_state(gn_swim *s, uint32_t slot, uint8_t st, uint32_t inc, uint64_t now, bool local) {
  sw_node *n = &s->nodes[slot];
  uint8_t old = n->state;
  n->inc = inc;
  if (old != st) {
    s->count[old]--;
    s->count[st]++;
    n->state = st;
    n->since_ms = now;
    if (st == GN_SWIM_SUSPECT)
      susp_add(s, slot);
    else if (old == GN_SWIM_SUSPECT)
      susp_del(s, slot);
    if (st == GN_SWIM_DEAD || st == GN_SWIM_LEFT) {
      list_add(s, L_DEAD, slot);
      uint64_t reap = now + s->cfg.dead_keep_ms;
      if (reap < s->next_reap_ms)
        s->next_reap_ms = reap;
    } else {
      list_del(s, L_DEAD, slot);
    }
  }
  /* A member coming back to life outranks all other news: a refutation
   * that loses the race against the suspicion's timeout is a false death.
   * Under loss the queue fills with suspicions and their confirmations,
   * which would otherwise starve it. */
  enqueue_tier(s, slot, st == GN_SWIM_ALIVE && old != GN_SWIM_ALIVE ? 0 : 1);
  if (old == st)
    return;
  gn_swim_event_kind k = st == GN_SWIM_ALIVE     ? GN_SWIM_EV_ALIVE
                         : st == GN_SWIM_SUSPECT ? GN_SWIM_EV_SUSPECT
                         : st == GN_SWIM_DEAD    ? GN_SWIM_EV_DEAD
                                                 : GN_SWIM_EV_LEFT;
  emit(s, k, n, local);
}

/* --- suspicion (Lifeguard) --------------------------------------------------*/

static uint64_t susp_deadline(const gn_swim *s, const sw_node *n) {
  uint32_t t = n->susp_min_ms;
  if (n->susp_k > 0) {
    /* susp_n <= susp_k < SW_CONF_MAX: the logarithms are gn_swim_new's. */
    double frac = s->ln_small[n->susp_n + 1] / s->ln_small[n->susp_k + 1];
    double raw = (double)n->susp_max_ms - frac * (double)(n->susp_max_ms - n->susp_min_ms);
    if (raw > (double)n->susp_min_ms)
      t = (uint32_t)raw;
  }
  return n->susp_start_ms + t;
}

static void susp_arm(gn_swim *s, const sw_node *n) {
  uint64_t d = susp_deadline(s, n);
  if (n->notice_ms && n->notice_ms < d)
    d = n->notice_ms;
  susp_set_due(s, (uint32_t)(n - s->nodes), d);
  if (d < s->next_susp_ms)
    s->next_susp_ms = d;
}

/* Starts a suspicion of slot at inc, raised by origin. */
static void suspect(gn_swim *s, uint32_t slot, uint32_t inc, const uint8_t origin[GN_PK_LEN], uint64_t now,
                    bool local) {
  sw_node *n = &s->nodes[slot];
  uint32_t nn = est_n(s);
  /* memberlist's k: the suspicion multiplier less 2 (2 with the defaults). */
  uint32_t k = s->cfg.suspicion_alpha > 2 ? s->cfg.suspicion_alpha - 2 : 0;
  if (k > SW_CONF_MAX - 1)
    k = SW_CONF_MAX - 1;
  /* Without enough other members to confirm it, expect no confirmation:
   * the timeout is then the minimum (memberlist's rule; n counts this node
   * and the suspect). */
  if (nn < k + 2)
    k = 0;
  double scale = sw_ln((double)(nn ? nn : 1)) / sw_ln(10.0);
  if (scale < 1.0)
    scale = 1.0;
  double min_ms = (double)s->cfg.suspicion_alpha * scale * (double)s->cfg.probe_interval_ms;
  double max_ms = min_ms * (double)s->cfg.suspicion_beta;
  if (max_ms > 4.0e9)
    max_ms = 4.0e9;
  if (min_ms > max_ms)
    min_ms = max_ms;
  n->susp_min_ms = (uint32_t)min_ms;
  n->susp_max_ms = (uint32_t)max_ms;
  n->susp_k = (uint8_t)k;
  n->susp_n = 0;
  n->susp_start_ms = now;
  /* A suspicion heard from others: we ping the suspect ourselves once,
   * between a quarter and half of the shortest timeout (spread, so that its
   * holders do not all ping it at once), and then as the accuser does: a
   * holder the refutation's gossip missed still hears it before its own
   * timer runs out. (The accuser's own schedule is set by probe_failed.) */
  n->notice_ms = now + n->susp_min_ms / 4 + sw_below(s, n->susp_min_ms / 4 + 1);
  memset(n->susp_conf, 0, sizeof n->susp_conf);
  n->susp_conf[0] = sw_hash(s, origin);
  memcpy(n->by, origin, GN_PK_LEN);
  n->has_by = true;
  set_state(s, slot, GN_SWIM_SUSPECT, inc, now, local);
  susp_arm(s, n);
}

/* Another suspicion of the same member at the same incarnation: gossip
 * naming another accuser, or (own) a failed probe of ours. Returns true when
 * it counted (a new, independent confirmer). Gossip naming us as the
 * accuser is our own suspicion coming back, never a confirmation. */
static bool confirm(gn_swim *s, uint32_t slot, const uint8_t by[GN_PK_LEN], bool own) {
  sw_node *n = &s->nodes[slot];
  if (n->susp_n >= n->susp_k || memcmp(by, n->id, GN_PK_LEN) == 0 ||
      (!own && memcmp(by, s->nodes[0].id, GN_PK_LEN) == 0))
    return false;
  uint64_t h = sw_hash(s, by);
  for (uint32_t i = 0; i <= n->susp_n; i++)
    if (n->susp_conf[i] == h)
      return false;
  n->susp_conf[++n->susp_n] = h;
  memcpy(n->by, by, GN_PK_LEN);
  n->has_by = true;
  susp_arm(s, n);
  return true;
}

/* A counted confirmation is gossiped again (with its accuser, so others can
 * count it) but with half a record's budget, and a record still queued
 * keeps its count: confirmations alone would otherwise keep the queue full
 * under loss, when there are many suspicions. */
static void requeue_confirmed(gn_swim *s, uint32_t slot) {
  sw_node *n = &s->nodes[slot];
  if (n->q_bucket != SW_NONE)
    return;
  enqueue_tier(s, slot, 1);
  q_unlink(s, slot);
  n->tx_count = tx_limit(s) / 2;
  q_link(s, slot, true);
}

/* --- members ----------------------------------------------------------------*/

static void remove_member(gn_swim *s, uint32_t slot) {
  sw_node *n = &s->nodes[slot];
  list_del(s, L_ORDER, slot);
  q_unlink(s, slot);
  list_del(s, L_DEAD, slot);
  if (n->state == GN_SWIM_SUSPECT)
    susp_del(s, slot);
  tab_remove(s, slot);
  s->count[n->state]--;
  if (!n->verified)
    s->unverified--;
  memset(n, 0, sizeof *n);
  s->free_slots[s->nfree++] = slot;
}

/* Where a newcomer comes from: gossip, its own signed body, our caller. */
enum { SRC_HEARSAY, SRC_SELF, SRC_CALLER };

/* When the table is full, a newcomer heard from directly may take the place
 * of a member that never answered our ping and is left or dead, once its
 * record has been passed on (until then we are one of the few that spread
 * it: an evicted death stops travelling); one our caller adds may also take
 * that of a live one only known by hearsay. A suspect is not evicted: its
 * holders are the ones that confirm, time out and spread the death. A node
 * speaking for itself does not displace a live member: with tables smaller
 * than the network every node is pinged by many that it does not keep, and
 * each would push out another, announced as joining again and again. */
static uint32_t eviction_victim(const gn_swim *s, int src) {
  static const uint8_t pref[2] = {GN_SWIM_LEFT, GN_SWIM_DEAD};
  if (!s->unverified || src == SRC_HEARSAY)
    return SW_NONE;
  for (int p = 0; p < 2; p++)
    for (uint32_t i = 0; i < s->dead.n; i++) {
      const sw_node *n = &s->nodes[s->dead.a[i]];
      if (!n->verified && n->state == pref[p] && n->q_bucket == SW_NONE)
        return s->dead.a[i];
    }
  if (src != SRC_CALLER)
    return SW_NONE;
  for (uint32_t i = 1; i < s->hi; i++) {
    const sw_node *n = &s->nodes[i];
    if (n->used && !n->ghost && !n->verified && n->state == GN_SWIM_ALIVE && !n->direct)
      return i;
  }
  return SW_NONE;
}

static uint32_t members_held(const gn_swim *s) {
  return s->hi - 1 - s->nfree - s->nghost;
}

/* Whether add_member would keep a newcomer. */
static bool room_for(const gn_swim *s, int src) {
  uint32_t members = members_held(s);
  if (src == SRC_HEARSAY)
    return members < s->cfg.max_members && s->unverified < s->cfg.max_members - s->cfg.max_members / 4;
  return members < s->cfg.max_members || eviction_victim(s, src) != SW_NONE;
}

/* A free slot: the table holds at most max_members members, ghost_max
 * ghosts and this node. */
static uint32_t alloc_slot(gn_swim *s) {
  if (s->nfree)
    return s->free_slots[--s->nfree];
  if (s->hi == s->cap) {
    uint32_t most = s->cfg.max_members + 1 + s->ghost_max, ncap = s->cap * 2;
    if (ncap > most)
      ncap = most;
    if (ncap <= s->cap || grow(s, ncap) < 0)
      return SW_NONE;
  }
  return s->hi++;
}

/* --- ghosts: news about nodes we do not keep -------------------------------
 *
 * With a table smaller than the network, most records a node hears are
 * about nodes it does not keep. It passes them on all the same (a death, a
 * refutation, a join must cross nodes that do not hold its subject, or it
 * never reaches most of those that do), and remembers the newest record per
 * node in a ghost: not a member, never probed nor reported, kept only so a
 * record is passed on once, not each time it comes back. At most ghost_max
 * ghosts; the one queued longest ago gives way. */

static void ghost_remove(gn_swim *s, uint32_t slot) {
  q_unlink(s, slot);
  list_del(s, L_GHOST, slot);
  tab_remove(s, slot);
  memset(&s->nodes[slot], 0, sizeof s->nodes[slot]);
  s->free_slots[s->nfree++] = slot;
  s->nghost--;
}

static uint8_t precedence(uint8_t st) {
  return st == GN_SWIM_LEFT ? GN_SWIM_DEAD : st;
}

/* Takes one of the tokens that let a plain join about a node we do not keep
 * be passed on: one a probe interval, SW_JOIN_BURST at most. */
static bool join_token(gn_swim *s, uint64_t now) {
  uint64_t per = s->cfg.probe_interval_ms, floor = now > SW_JOIN_BURST * per ? now - SW_JOIN_BURST * per : 0;
  uint64_t at = s->join_relay_ms > floor ? s->join_relay_ms : floor;
  if (at + per > now)
    return false;
  s->join_relay_ms = at + per;
  return true;
}

/* Passes on u, about a node we do not keep, if it is news: a higher
 * incarnation, or a graver state at the same one. */
static void ghost_put(gn_swim *s, uint32_t slot, const sw_upd *u, const uint8_t by[GN_PK_LEN]) {
  uint8_t tier = 1;
  if (slot != SW_NONE) {
    sw_node *g = &s->nodes[slot];
    if (u->inc < g->inc || (u->inc == g->inc && precedence(u->st) <= precedence(g->state)))
      return;
    if (u->st == GN_SWIM_ALIVE && g->state != GN_SWIM_ALIVE)
      tier = 0;
  } else {
    if (s->ghost_max == 0)
      return;
    if (s->nghost >= s->ghost_max) {
      /* A clock over the ghosts: the first whose record has been passed on
       * gives way (evicting one still queued would drop its news unsent);
       * if every one is still queued, the one under the hand. */
      uint32_t victim = SW_NONE;
      for (uint32_t i = 0; i < s->ghosts.n && victim == SW_NONE; i++) {
        if (s->ghost_hand >= s->ghosts.n)
          s->ghost_hand = 0;
        uint32_t gs = s->ghosts.a[s->ghost_hand++];
        if (s->nodes[gs].q_bucket == SW_NONE)
          victim = gs;
      }
      if (victim == SW_NONE)
        victim = s->ghosts.a[s->ghost_hand % s->ghosts.n];
      ghost_remove(s, victim);
    }
    if ((slot = alloc_slot(s)) == SW_NONE)
      return;
    sw_node *g = &s->nodes[slot];
    memset(g, 0, sizeof *g);
    memcpy(g->id, u->id, GN_PK_LEN);
    g->hkey = sw_hash(s, u->id);
    g->used = true;
    g->ghost = true;
    g->order_pos = g->dead_pos = g->ghost_pos = SW_NONE;
    g->q_bucket = g->q_prev = g->q_next = SW_NONE;
    tab_insert(s, slot);
    list_add(s, L_GHOST, slot);
    s->nghost++;
  }
  sw_node *g = &s->nodes[slot];
  snprintf(g->addr, sizeof g->addr, "%s", u->addr);
  g->inc = u->inc;
  g->state = u->st;
  g->has_by = u->st == GN_SWIM_SUSPECT || u->st == GN_SWIM_DEAD;
  if (g->has_by)
    memcpy(g->by, by, GN_PK_LEN);
  enqueue_tier(s, slot, tier);
}

/* Adds an alive member learnt from src. Hearsay may fill at most three
 * quarters of the table and never evicts; see eviction_victim for the rest. */
static uint32_t add_member(gn_swim *s, const uint8_t id[GN_PK_LEN], const char *addr, uint32_t inc, int src,
                           bool gossip, uint64_t now) {
  bool direct = src != SRC_HEARSAY;
  if (!room_for(s, src))
    return SW_NONE;
  if (members_held(s) >= s->cfg.max_members) {
    uint32_t v = eviction_victim(s, src);
    if (v == SW_NONE)
      return SW_NONE;
    remove_member(s, v);
  }
  uint32_t slot = alloc_slot(s);
  if (slot == SW_NONE)
    return SW_NONE;
  sw_node *n = &s->nodes[slot];
  memset(n, 0, sizeof *n);
  memcpy(n->id, id, GN_PK_LEN);
  snprintf(n->addr, sizeof n->addr, "%s", addr);
  n->hkey = sw_hash(s, id);
  n->inc = inc;
  n->state = GN_SWIM_ALIVE;
  n->since_ms = now;
  n->used = true;
  n->want_deaths = true;
  n->direct = direct;
  n->order_pos = n->dead_pos = n->ghost_pos = SW_NONE;
  n->q_bucket = n->q_prev = n->q_next = SW_NONE;
  tab_insert(s, slot);
  s->count[GN_SWIM_ALIVE]++;
  s->unverified++;
  /* A newcomer takes a random place in the probe order (memberlist), so a
   * burst of joins is not probed in the order it came. */
  list_add(s, L_ORDER, slot);
  list_swap(s, L_ORDER, n->order_pos, sw_below(s, s->order.n));
  if (gossip)
    enqueue(s, slot);
  emit(s, GN_SWIM_EV_JOIN, n, false);
  return slot;
}

static void mark_verified(gn_swim *s, uint32_t slot) {
  if (slot != SW_NONE && slot != 0 && !s->nodes[slot].verified) {
    s->nodes[slot].verified = true;
    s->unverified--;
  }
}

/* --- encoding ---------------------------------------------------------------*/

static void put_key(gn_wire_writer *w, const char *k) {
  gn_wire_put_str(w, k);
}

/* One update record into s->one: {id, addr, inc, st[, by][, hop]} (by:
 * NULL for none; hop 0: left out). */
static int encode_record(gn_swim *s, const uint8_t id[GN_PK_LEN], const char *addr, uint32_t inc, uint8_t st,
                         const uint8_t *by, uint8_t hop) {
  gn_wire_writer *w = &s->w;
  gn_wire_put_map(w, 4 + (by != NULL) + (hop > 0));
  put_key(w, "id");
  gn_wire_put_bin(w, id, GN_PK_LEN);
  put_key(w, "addr");
  gn_wire_put_str(w, addr);
  put_key(w, "inc");
  gn_wire_put_u64(w, inc);
  put_key(w, "st");
  gn_wire_put_u64(w, st);
  if (by) {
    put_key(w, "by");
    gn_wire_put_bin(w, by, GN_PK_LEN);
  }
  if (hop > 0) {
    put_key(w, "hop");
    gn_wire_put_u64(w, hop);
  }
  s->one.len = 0;
  return gn_wire_writer_take(w, &s->one);
}

/* A member's (or ghost's) current record, sent as hop. */
static int encode_node(gn_swim *s, const sw_node *n, uint8_t hop) {
  bool by = n->has_by && (n->state == GN_SWIM_SUSPECT || n->state == GN_SWIM_DEAD);
  return encode_record(s, n->id, n->addr, n->inc, n->state, by ? n->by : NULL, hop);
}

static int encode_update(gn_swim *s, const sw_node *n) {
  return encode_node(s, n, n->hop);
}

typedef struct sw_pack {
  size_t budget; /* bytes left for update records */
  uint32_t n;
  uint32_t slots[GN_SWIM_UPDATES_MAX];
} sw_pack;

/* Appends the record just encoded in s->one, for slot (SW_NONE: a record
 * about a node we hold no slot for), if it fits. */
static bool pack_one(gn_swim *s, sw_pack *p, int encoded, uint32_t slot) {
  if (encoded < 0 || s->one.len > p->budget || gn_buf_append(&s->ub, s->one.data, s->one.len) < 0)
    return false;
  p->budget -= s->one.len;
  p->slots[p->n++] = slot;
  return true;
}

static bool pack_has(const sw_pack *p, uint32_t slot) {
  for (uint32_t i = 0; i < p->n; i++)
    if (p->slots[i] == slot)
      return true;
  return false;
}

/* Appends slot's record, sent as hop, if it fits and is not in the body
 * already. */
static bool pack_add_hop(gn_swim *s, sw_pack *p, uint32_t slot, uint8_t hop) {
  if (p->n >= GN_SWIM_UPDATES_MAX || pack_has(p, slot))
    return false;
  return pack_one(s, p, encode_node(s, &s->nodes[slot], hop), slot);
}

static bool pack_add(gn_swim *s, sw_pack *p, uint32_t slot) {
  return pack_add_hop(s, p, slot, s->nodes[slot].hop);
}

/* Remembers that slot's record has been sent its last time. */
static void recent_push(gn_swim *s, uint32_t slot) {
  if (slot == 0)
    return;
  const sw_node *n = &s->nodes[slot];
  uint32_t i = s->recent_next++ % SW_RECENT;
  s->recent[i].slot = slot;
  s->recent[i].inc = n->inc;
  s->recent[i].hkey = n->hkey;
  s->recent[i].st = n->state;
  s->recent[i].done_ms = s->now_ms;
  s->recent[i].used = true;
}

static void heard_push(gn_swim *s, const sw_upd *u) {
  for (uint32_t i = 0; i < SW_RECENT; i++)
    if (s->heard[i].used && s->heard[i].inc == u->inc && memcmp(s->heard[i].id, u->id, GN_PK_LEN) == 0)
      return;
  uint32_t i = s->heard_next++ % SW_RECENT;
  memcpy(s->heard[i].id, u->id, GN_PK_LEN);
  snprintf(s->heard[i].addr, sizeof s->heard[i].addr, "%s", u->addr);
  s->heard[i].inc = u->inc;
  s->heard[i].at_ms = s->now_ms;
  s->heard[i].used = true;
}

/* Appends a plain join (alive at inc) about a node we hold no slot for. */
static bool pack_add_heard(gn_swim *s, sw_pack *p, uint32_t i) {
  if (p->n >= GN_SWIM_UPDATES_MAX)
    return false;
  return pack_one(s, p,
                  encode_record(s, s->heard[i].id, s->heard[i].addr, s->heard[i].inc, GN_SWIM_ALIVE, NULL, SW_PULL_HOP),
                  SW_NONE);
}

/* Adds up to SW_PULL_RECORDS records lately done or heard, round robin
 * over both rings (one record a pull left the newcomer unheard at 10,000
 * nodes for 3.85 s; three, 1.81 s, at 10 kbit/s more): from
 * the recent ring, one still as it was sent (else it is queued again, or
 * gone) and ended within SW_RECENT_PROBES probe intervals; from the heard
 * ring, a plain join about a node we still hold no slot for, heard within
 * as long. Either goes out with hop SW_PULL_HOP at least: a join heard
 * this way is neither pushed on nor offered to pullers again (else stale
 * joins would circulate from pull to pull and crowd out the news). */
static void pack_recent(gn_swim *s, sw_pack *p, uint32_t dest) {
  uint64_t window = (uint64_t)SW_RECENT_PROBES * s->cfg.probe_interval_ms;
  uint32_t added = 0;
  for (uint32_t k = 0; k < 2 * SW_RECENT && added < SW_PULL_RECORDS; k++) {
    uint32_t c = s->recent_cursor++ % (2 * SW_RECENT);
    if (c >= SW_RECENT) {
      uint32_t i = c - SW_RECENT;
      if (!s->heard[i].used || s->heard[i].at_ms + window < s->now_ms ||
          (dest != SW_NONE && memcmp(s->nodes[dest].id, s->heard[i].id, GN_PK_LEN) == 0) ||
          tab_find(s, s->heard[i].id) != SW_NONE)
        continue;
      added += pack_add_heard(s, p, i);
      continue;
    }
    if (!s->recent[c].used || s->recent[c].done_ms + window < s->now_ms)
      continue;
    uint32_t slot = s->recent[c].slot;
    sw_node *n = &s->nodes[slot];
    if (slot == dest || !n->used || n->hkey != s->recent[c].hkey || n->inc != s->recent[c].inc ||
        n->state != s->recent[c].st || n->q_bucket != SW_NONE)
      continue;
    added += pack_add_hop(s, p, slot, n->hop > SW_PULL_HOP ? n->hop : SW_PULL_HOP);
  }
}

/* Fills the update records of a body to dest (SW_NONE when not a member):
 * the buddy record, recent deaths, a record lately done for a puller, then
 * the dissemination queue. */
static void pack_updates(gn_swim *s, sw_pack *p, uint32_t dest, bool ack, bool pull) {
  /* Buddy system: a member we believe suspect (or dead) hears it first. */
  if (dest != SW_NONE && s->nodes[dest].state != GN_SWIM_ALIVE)
    pack_add(s, p, dest);
  /* Missed deaths: a member new to us, or back with a new incarnation, may
   * have missed deaths whose gossip has run out; tell it the newest ones
   * in up to half the room. */
  if (dest != SW_NONE && s->nodes[dest].want_deaths) {
    size_t half = p->budget / 2, stop = p->budget - half;
    for (uint32_t i = s->dead.n; i-- > 0 && p->budget > stop;)
      pack_add(s, p, s->dead.a[i]);
    s->nodes[dest].want_deaths = false;
  }
  /* And every ack carries a sample of the recent deaths, round robin, so
   * every node hears every death within dead_keep_ms however it missed it. */
  if (ack) {
    for (uint32_t i = 0; i < GN_SWIM_DEAD_SAMPLE && i < s->dead.n; i++) {
      if (s->dead_cursor >= s->dead.n)
        s->dead_cursor = 0;
      pack_add(s, p, s->dead.a[s->dead_cursor++]);
    }
  }
  /* A pull (a ping with nothing of its own) comes from a node that may be
   * held by few: pushes reach it rarely, and by the time it pulls, the
   * gossip of what spread lately has run out. */
  if (ack && pull)
    pack_recent(s, p, dest);
  /* The queue: tier 0 first, least sent first, newest first among equals. */
  uint32_t lim = tx_limit(s), misses = 0, nb = 2 * (s->q_count_max + 1), first = p->n;
  for (uint32_t b = 0; b < nb && misses < 3 && p->n < GN_SWIM_UPDATES_MAX; b++)
    for (uint32_t slot = s->q_head[b]; slot != SW_NONE && misses < 3; slot = s->nodes[slot].q_next)
      if (!pack_add(s, p, slot))
        misses++;
  for (uint32_t i = first; i < p->n; i++) {
    uint32_t slot = p->slots[i];
    q_unlink(s, slot);
    if (++s->nodes[slot].tx_count < lim)
      q_link(s, slot, false);
    else
      recent_push(s, slot);
  }
}

typedef struct sw_out {
  uint32_t type;
  uint64_t seq;
  const uint8_t *to;     /* PING: whom it is for */
  const uint8_t *target; /* PING_REQ, NACK, relayed ACK */
  const char *taddr;     /* PING_REQ */
  bool more;             /* PING: our table has room, offer us members */
  bool give;             /* ACK: offer SW_GIVE live members */
  bool pull;             /* ACK: the ping carried no records */
} sw_out;

/* Encodes the fixed part of a body into s->out (its map holds nkeys). */
static int encode_head(gn_swim *s, const sw_out *o, uint32_t extra_keys) {
  gn_wire_writer *w = &s->w;
  const sw_node *self = &s->nodes[0];
  uint32_t nkeys = 4 + (o->to ? 1 : 0) + (o->target ? 1 : 0) + (o->taddr ? 1 : 0) + o->more + extra_keys;
  gn_wire_put_map(w, nkeys);
  put_key(w, "from");
  gn_wire_put_bin(w, self->id, GN_PK_LEN);
  put_key(w, "inc");
  gn_wire_put_u64(w, self->inc);
  put_key(w, "addr");
  gn_wire_put_str(w, self->addr);
  put_key(w, "seq");
  gn_wire_put_u64(w, o->seq);
  if (o->to) {
    put_key(w, "to");
    gn_wire_put_bin(w, o->to, GN_PK_LEN);
  }
  if (o->target) {
    put_key(w, "target");
    gn_wire_put_bin(w, o->target, GN_PK_LEN);
  }
  if (o->taddr) {
    put_key(w, "taddr");
    gn_wire_put_str(w, o->taddr);
  }
  if (o->more) {
    put_key(w, "more");
    gn_wire_put_bool(w, true);
  }
  s->out.len = 0;
  return gn_wire_writer_take(w, &s->out);
}

/* Builds a body with as many update records as max_datagram allows and
 * hands it to io.send. */
static void send_body(gn_swim *s, const char *addr, const uint8_t *dest_id, const sw_out *o) {
  if (encode_head(s, o, 0) < 0)
    return;
  size_t head = s->out.len;
  /* "g" (2 bytes) and an array header of at most 3 bytes follow. */
  sw_pack p = {0};
  p.budget = s->cfg.max_datagram > head + 5 ? s->cfg.max_datagram - head - 5 : 0;
  s->ub.len = 0;
  uint32_t dest = dest_id ? member_find(s, dest_id) : SW_NONE;
  if (dest == 0)
    dest = SW_NONE;
  /* A node whose table has room asked for members: offer a few live ones,
   * round robin, under their own key "m". A joiner that nobody holds yet
   * would otherwise know only its seeds once the gossip of the others'
   * joins has run out (with tables smaller than the network, no one else
   * probes it). They are not news, so the receiver keeps them without
   * gossiping them on. */
  uint32_t ngive = 0;
  s->mb.len = 0;
  for (uint32_t i = 0; o->give && i < s->order.n && ngive < SW_GIVE; i++) {
    if (s->give_cursor >= s->order.n)
      s->give_cursor = 0;
    uint32_t slot = s->order.a[s->give_cursor++];
    if (slot == dest || s->nodes[slot].state != GN_SWIM_ALIVE || encode_update(s, &s->nodes[slot]) < 0 ||
        s->one.len + 3 > p.budget || gn_buf_append(&s->mb, s->one.data, s->one.len) < 0)
      continue;
    p.budget -= s->one.len + (ngive == 0 ? 3 : 0);
    ngive++;
  }
  pack_updates(s, &p, dest, o->type == GN_MSG_SWIM_ACK, o->pull);
  if (p.n || ngive) {
    if (encode_head(s, o, (p.n > 0) + (ngive > 0)) < 0)
      return;
    gn_wire_writer *w = &s->w;
    if (ngive) {
      put_key(w, "m");
      gn_wire_put_array(w, ngive);
      if (gn_wire_writer_take(w, &s->out) < 0 || gn_buf_append(&s->out, s->mb.data, s->mb.len) < 0)
        return;
    }
  }
  if (p.n) {
    gn_wire_writer *w = &s->w;
    put_key(w, "g");
    gn_wire_put_array(w, p.n);
    if (gn_wire_writer_take(w, &s->out) < 0 || gn_buf_append(&s->out, s->ub.data, s->ub.len) < 0)
      return;
  }
  s->stats.sent_msgs++;
  s->stats.sent_bytes += s->out.len;
  s->io.send(s->io.ud, addr, o->type, s->out.data, s->out.len);
}

static void sent_record(gn_swim *s, uint64_t seq, const uint8_t peer[GN_PK_LEN], const uint8_t target[GN_PK_LEN],
                        bool req) {
  sw_sent *e = &s->sent[s->sent_next];
  s->sent_next = (s->sent_next + 1) % SW_SENT_RING;
  e->used = true;
  e->req = req;
  e->seq = seq;
  memcpy(e->peer, peer, GN_PK_LEN);
  memcpy(e->target, target, GN_PK_LEN);
}

/* A fresh sequence number: random, never 0, never one still awaited. */
static uint64_t new_seq(gn_swim *s) {
  for (;;) {
    uint64_t v = sw_rand(s);
    bool taken = v == 0;
    for (uint32_t i = 0; i < SW_SENT_RING && !taken; i++)
      taken = s->sent[i].used && s->sent[i].seq == v;
    if (!taken)
      return v;
  }
}

static void send_ping(gn_swim *s, const char *addr, const uint8_t id[GN_PK_LEN], uint64_t seq) {
  sw_out o = {.type = GN_MSG_SWIM_PING, .seq = seq, .to = id};
  o.more = !s->left && room_for(s, SRC_HEARSAY);
  sent_record(s, seq, id, id, false);
  send_body(s, addr, id, &o);
}

/* --- decoding ---------------------------------------------------------------*/

static int get_addr(const msgpack_object *map, const char *key, char out[GN_SWIM_ADDR_MAX]) {
  int r = gn_wire_get_str(map, key, out, GN_SWIM_ADDR_MAX);
  if (r < 0)
    return r;
  return addr_valid(out) ? 0 : GN_EINVAL;
}

static int decode_update(const msgpack_object *o, sw_upd *u) {
  if (o->type != MSGPACK_OBJECT_MAP)
    return GN_EINVAL;
  if (o->via.map.size > 6)
    return GN_EINVAL;
  uint64_t st;
  int r;
  if ((r = gn_wire_get_bin_exact(o, "id", u->id, GN_PK_LEN)) < 0 || (r = get_addr(o, "addr", u->addr)) < 0 ||
      (r = gn_wire_get_u32(o, "inc", &u->inc)) < 0 || (r = gn_wire_get_u64(o, "st", &st)) < 0)
    return r;
  if (st > GN_SWIM_LEFT)
    return GN_EINVAL;
  u->st = (uint8_t)st;
  u->has_by = gn_wire_get(o, "by") != NULL;
  if (u->has_by && (r = gn_wire_get_bin_exact(o, "by", u->by, GN_PK_LEN)) < 0)
    return r;
  bool has_hop = gn_wire_get(o, "hop") != NULL;
  uint32_t hop = 0;
  if (has_hop && (r = gn_wire_get_u32(o, "hop", &hop)) < 0)
    return r;
  if (hop > 255)
    return GN_ETOOBIG;
  u->hop = (uint8_t)hop;
  return (uint32_t)(4 + u->has_by + has_hop) == o->via.map.size ? 0 : GN_EINVAL;
}

/* Decodes and validates a whole body of type into m. On success m->doc
 * holds the document (gn_wire_doc_done it) and every update record in m->g
 * has been decoded once already, so applying them cannot fail half-way. */
static int decode_msg(uint32_t type, const uint8_t *body, size_t len, sw_msg *m) {
  if (len > GN_SWIM_BODY_MAX)
    return GN_ETOOBIG;
  gn_wire_doc doc;
  int r = gn_wire_decode(body, len, &doc);
  if (r < 0)
    return r;
  const msgpack_object *root = doc.root;
  uint32_t want = 4;
  const msgpack_object_array *g = NULL;
  if (root->type != MSGPACK_OBJECT_MAP || root->via.map.size > 9) {
    r = GN_EINVAL;
    goto out;
  }
  if ((r = gn_wire_get_bin_exact(root, "from", m->from, GN_PK_LEN)) < 0 ||
      (r = gn_wire_get_u32(root, "inc", &m->inc)) < 0 || (r = get_addr(root, "addr", m->addr)) < 0 ||
      (r = gn_wire_get_u64(root, "seq", &m->seq)) < 0)
    goto out;
  m->has_to = type == GN_MSG_SWIM_PING;
  m->more = false;
  if (m->has_to) {
    if ((r = gn_wire_get_bin_exact(root, "to", m->to, GN_PK_LEN)) < 0)
      goto out;
    want++;
    if (gn_wire_get(root, "more")) {
      if ((r = gn_wire_get_bool(root, "more", &m->more)) < 0)
        goto out;
      want++;
    }
  }
  m->has_target = type == GN_MSG_SWIM_PING_REQ || type == GN_MSG_SWIM_NACK ||
                  (type == GN_MSG_SWIM_ACK && gn_wire_get(root, "target"));
  if (m->has_target) {
    if ((r = gn_wire_get_bin_exact(root, "target", m->target, GN_PK_LEN)) < 0)
      goto out;
    want++;
  }
  if (type == GN_MSG_SWIM_PING_REQ) {
    if ((r = get_addr(root, "taddr", m->taddr)) < 0)
      goto out;
    want++;
  }
  if (gn_wire_get(root, "g")) {
    if ((r = gn_wire_get_array(root, "g", GN_SWIM_UPDATES_MAX, &g)) < 0)
      goto out;
    for (uint32_t i = 0; i < g->size; i++) {
      sw_upd u;
      if ((r = decode_update(&g->ptr[i], &u)) < 0)
        goto out;
    }
    want++;
  }
  const msgpack_object_array *ml = NULL;
  if (type == GN_MSG_SWIM_ACK && gn_wire_get(root, "m")) {
    if ((r = gn_wire_get_array(root, "m", SW_GIVE, &ml)) < 0)
      goto out;
    for (uint32_t i = 0; i < ml->size; i++) {
      sw_upd u;
      if ((r = decode_update(&ml->ptr[i], &u)) < 0)
        goto out;
      if (u.st != GN_SWIM_ALIVE) {
        r = GN_EINVAL;
        goto out;
      }
    }
    want++;
  }
  /* Unknown keys are refused: a body means one thing. */
  r = root->via.map.size == want ? 0 : GN_EINVAL;
out:
  if (r < 0) {
    gn_wire_doc_done(&doc);
    return r;
  }
  m->doc = doc;
  m->g = g;
  m->ml = ml;
  return 0;
}

/* --- applying what a body says ----------------------------------------------*/

static void refute(gn_swim *s, uint32_t accused_inc, const uint8_t accuser[GN_PK_LEN], uint64_t now) {
  sw_node *self = &s->nodes[0];
  uint32_t inc = accused_inc > self->inc ? accused_inc : self->inc;
  self->inc = inc < SW_INC_MAX ? inc + 1 : SW_INC_MAX;
  self->since_ms = now;
  enqueue(s, 0);
  s->stats.refutations++;
  /* Lifeguard: having to refute means we were slow to answer. */
  health_add(s, 1);
  /* Tell the accuser first, with a ping carrying the refutation: its own
   * timer is the one that runs, and with tables smaller than the network
   * the gossip may take long to reach it. Only a member we keep, at most
   * once a probe interval, so accusations cannot aim our pings. */
  uint32_t slot = member_find(s, accuser);
  if (slot != SW_NONE && slot != 0 && s->nodes[slot].state != GN_SWIM_DEAD && s->nodes[slot].state != GN_SWIM_LEFT &&
      now >= s->refute_ping_ms) {
    s->refute_ping_ms = now + s->cfg.probe_interval_ms;
    send_ping(s, s->nodes[slot].addr, s->nodes[slot].id, new_seq(s));
  }
}

/* The sender speaks for itself: it is alive at inc, at addr. */
static void apply_self_claim(gn_swim *s, const sw_msg *m, uint64_t now) {
  uint32_t slot = tab_find(s, m->from);
  if (slot != SW_NONE && s->nodes[slot].ghost) {
    if (!room_for(s, SRC_SELF))
      return;
    ghost_remove(s, slot);
    slot = SW_NONE;
  }
  if (slot == SW_NONE) {
    /* Gossiped among holders, but not a fresh join for the others to pass
     * on: with tables smaller than the network, nodes long in it are met
     * for the first time all the while. */
    s->rx_hop = SW_JOIN_HOPS;
    add_member(s, m->from, m->addr, m->inc, SRC_SELF, true, now);
    s->rx_hop = 0;
    return;
  }
  sw_node *n = &s->nodes[slot];
  n->direct = true;
  if (m->inc > n->inc) {
    snprintf(n->addr, sizeof n->addr, "%s", m->addr);
    n->want_deaths = true;
    set_state(s, slot, GN_SWIM_ALIVE, m->inc, now, false);
  } else if (m->inc == n->inc && n->state == GN_SWIM_ALIVE && strcmp(n->addr, m->addr) != 0) {
    /* Signed by the member itself: it moved without a new incarnation. */
    snprintf(n->addr, sizeof n->addr, "%s", m->addr);
    enqueue(s, slot);
  }
}

/* Gossip about a member, heard from another (hearsay). */
static void apply_update(gn_swim *s, const sw_upd *u, const uint8_t sender[GN_PK_LEN], uint64_t now) {
  const uint8_t *by = u->has_by ? u->by : sender;
  uint32_t slot = tab_find(s, u->id);
  if (slot == 0) {
    if (u->st != GN_SWIM_ALIVE && !s->left && u->inc >= s->nodes[0].inc)
      refute(s, u->inc, by, now);
    return;
  }
  if (slot == SW_NONE || s->nodes[slot].ghost) {
    /* Only the living are learnt from hearsay, and only while there is
     * room; all else about nodes we do not keep is passed on. */
    const sw_node *g = slot == SW_NONE ? NULL : &s->nodes[slot];
    bool news = !g || u->inc > g->inc || (u->inc == g->inc && precedence(u->st) > precedence(g->state));
    if (!news)
      return;
    if (u->st == GN_SWIM_ALIVE && room_for(s, SRC_HEARSAY)) {
      if (g)
        ghost_remove(s, slot);
      add_member(s, u->id, u->addr, u->inc, SRC_HEARSAY, true, now);
      return;
    }
    /* What is passed on is news of trouble and its end: suspicions,
     * deaths, leaves, refutations. A plain join (alive at incarnation 0)
     * is not: every node has one, so forgetful relays would keep passing
     * the whole network's joins round. And however forgetful the relays,
     * a record goes no further than SW_GHOST_HOPS. */
    bool trouble = u->st != GN_SWIM_ALIVE || u->inc > 0 || (g && g->state != GN_SWIM_ALIVE);
    /* A plain join is passed on only while it is fresh (a few relays from
     * the newcomer) and at most one a probe interval on average (a burst of
     * SW_JOIN_BURST): a newcomer to a settled network is heard everywhere
     * at once, while in a bootstrap, when every node joins, the joins do
     * not crowd out everything else (each would cost every node
     * retransmit_mult * log10(n) records). */
    bool join = !trouble && u->hop < SW_JOIN_HOPS && join_token(s, now);
    if ((trouble || join) && u->hop < SW_GHOST_HOPS)
      ghost_put(s, slot, u, by);
    else if (!trouble && !g && u->hop <= SW_JOIN_HOPS)
      heard_push(s, u);
    return;
  }
  sw_node *n = &s->nodes[slot];
  switch (u->st) {
  case GN_SWIM_ALIVE:
    if (u->inc <= n->inc)
      return;
    /* Hearsay may not move a live member (that would let any member send
     * everyone's probes of it elsewhere); a dead one may come back anywhere. */
    if (n->state == GN_SWIM_DEAD || n->state == GN_SWIM_LEFT)
      snprintf(n->addr, sizeof n->addr, "%s", u->addr);
    n->want_deaths = true;
    set_state(s, slot, GN_SWIM_ALIVE, u->inc, now, false);
    return;
  case GN_SWIM_SUSPECT:
    if (u->inc < n->inc || n->state == GN_SWIM_DEAD || n->state == GN_SWIM_LEFT)
      return;
    if (n->state == GN_SWIM_SUSPECT && u->inc == n->inc) {
      if (confirm(s, slot, by, false))
        requeue_confirmed(s, slot);
      return;
    }
    suspect(s, slot, u->inc, by, now, false);
    return;
  default:
    if (u->inc < n->inc || n->state == GN_SWIM_DEAD || n->state == GN_SWIM_LEFT)
      return;
    memcpy(n->by, by, GN_PK_LEN);
    n->has_by = true;
    set_state(s, slot, u->st, u->inc, now, false);
    return;
  }
}

static sw_sent *sent_match(gn_swim *s, uint64_t seq, const uint8_t peer[GN_PK_LEN], const uint8_t target[GN_PK_LEN],
                           bool req) {
  for (uint32_t i = 0; i < SW_SENT_RING; i++) {
    sw_sent *e = &s->sent[i];
    if (e->used && e->seq == seq && e->req == req && memcmp(e->peer, peer, GN_PK_LEN) == 0 &&
        memcmp(e->target, target, GN_PK_LEN) == 0)
      return e;
  }
  return NULL;
}

static void probe_done(gn_swim *s) {
  s->probe.active = false;
  health_add(s, -1);
}

static int relays_of(const gn_swim *s, const uint8_t requester[GN_PK_LEN]) {
  int c = 0;
  for (uint32_t i = 0; i < SW_RELAYS_MAX; i++)
    if (s->relays[i].used && memcmp(s->relays[i].requester, requester, GN_PK_LEN) == 0)
      c++;
  return c;
}

static void on_ping_req(gn_swim *s, const sw_msg *m, const char *from_addr, uint64_t now) {
  /* One requester cannot make us ping the world: a few relays each, a few
   * in all, each forgotten after probe_timeout. */
  if (relays_of(s, m->from) >= SW_RELAYS_PER_PEER)
    return;
  sw_relay *r = NULL;
  for (uint32_t i = 0; i < SW_RELAYS_MAX && !r; i++)
    if (!s->relays[i].used)
      r = &s->relays[i];
  if (!r)
    return;
  r->used = true;
  r->seq_in = m->seq;
  r->seq_out = new_seq(s);
  /* Lifeguard's nack must reach the requester before its probe ends (it
   * asked at probe_timeout into a probe_interval): at half our timeout it
   * does for one-way delays up to a quarter of it. A later ack is still
   * passed on until the full timeout. */
  r->nacked = false;
  r->nack_ms = now + s->cfg.probe_timeout_ms / 2;
  r->expire_ms = now + s->cfg.probe_timeout_ms;
  memcpy(r->requester, m->from, GN_PK_LEN);
  snprintf(r->req_addr, sizeof r->req_addr, "%s", from_addr);
  memcpy(r->target, m->target, GN_PK_LEN);
  send_ping(s, m->taddr, m->target, r->seq_out);
}

int gn_swim_on_datagram(gn_swim *s, const char *from_addr, const uint8_t signer[GN_PK_LEN], uint32_t type,
                        const uint8_t *body, size_t len, uint64_t now_ms) {
  if (!s || !from_addr || !signer || (!body && len))
    return GN_EINVAL;
  s->stats.recv_msgs++;
  s->stats.recv_bytes += len;
  s->now_ms = now_ms;
  sw_msg msg, *m = &msg;
  bool held = false;
  int r = GN_EINVAL;
  if (type < GN_MSG_SWIM_PING || type > GN_MSG_SWIM_NACK || strnlen(from_addr, GN_SWIM_ADDR_MAX) >= GN_SWIM_ADDR_MAX)
    goto bad;
  if ((r = decode_msg(type, body, len, m)) < 0)
    goto bad;
  held = true;
  r = GN_EPERM;
  if (memcmp(m->from, signer, GN_PK_LEN) != 0)
    goto bad;
  r = GN_EPROTO;
  if (memcmp(m->from, s->nodes[0].id, GN_PK_LEN) == 0)
    goto bad;
  sw_sent *e = NULL;
  switch (type) {
  case GN_MSG_SWIM_PING:
    /* Meant for another key at this address: answering would vouch for it. */
    if (memcmp(m->to, s->nodes[0].id, GN_PK_LEN) != 0)
      goto bad;
    break;
  case GN_MSG_SWIM_PING_REQ:
    if (memcmp(m->target, s->nodes[0].id, GN_PK_LEN) == 0 || memcmp(m->target, m->from, GN_PK_LEN) == 0)
      goto bad;
    break;
  case GN_MSG_SWIM_ACK:
    /* Only an answer to a ping or ping-req of ours, signed by whom we asked. */
    e = sent_match(s, m->seq, m->from, m->has_target ? m->target : m->from, m->has_target);
    if (!e)
      goto bad;
    break;
  default:
    e = sent_match(s, m->seq, m->from, m->target, true);
    if (!e)
      goto bad;
    break;
  }

  /* Valid: apply it. */
  apply_self_claim(s, m, now_ms);
  for (uint32_t i = 0; m->ml && i < m->ml->size; i++) {
    sw_upd u;
    if (decode_update(&m->ml->ptr[i], &u) == 0 && tab_find(s, u.id) == SW_NONE && room_for(s, SRC_HEARSAY))
      add_member(s, u.id, u.addr, u.inc, SRC_HEARSAY, false, now_ms);
  }
  for (uint32_t i = 0; m->g && i < m->g->size; i++) {
    sw_upd u;
    if (decode_update(&m->g->ptr[i], &u) == 0) {
      s->rx_hop = u.hop < 255 ? u.hop + 1 : 255;
      apply_update(s, &u, m->from, now_ms);
      s->rx_hop = 0;
    }
  }

  switch (type) {
  case GN_MSG_SWIM_PING: {
    sw_out o = {.type = GN_MSG_SWIM_ACK, .seq = m->seq, .give = m->more, .pull = !m->g || m->g->size == 0};
    send_body(s, from_addr, m->from, &o);
    break;
  }
  case GN_MSG_SWIM_PING_REQ:
    on_ping_req(s, m, from_addr, now_ms);
    break;
  case GN_MSG_SWIM_ACK: {
    e->used = false;
    if (s->left && !m->has_target)
      s->leave_acks++;
    if (!m->has_target)
      mark_verified(s, member_find(s, m->from));
    /* The answer to a ping we sent for a requester: pass it on. */
    for (uint32_t i = 0; i < SW_RELAYS_MAX && !m->has_target; i++) {
      sw_relay *rl = &s->relays[i];
      if (rl->used && rl->seq_out == m->seq && memcmp(rl->target, m->from, GN_PK_LEN) == 0) {
        sw_out o = {.type = GN_MSG_SWIM_ACK, .seq = rl->seq_in, .target = rl->target};
        rl->used = false;
        send_body(s, rl->req_addr, rl->requester, &o);
      }
    }
    const uint8_t *about = m->has_target ? m->target : m->from;
    if (s->probe.active && s->probe.seq == m->seq && memcmp(s->probe.id, about, GN_PK_LEN) == 0)
      probe_done(s);
    break;
  }
  default:
    /* A nack leaves the entry: the helper's ack may still follow. */
    if (s->probe.active && s->probe.seq == m->seq && memcmp(s->probe.id, m->target, GN_PK_LEN) == 0) {
      for (uint32_t i = 0; i < s->probe.nhelpers; i++)
        if (!s->probe.nacked[i] && memcmp(s->probe.helpers[i], m->from, GN_PK_LEN) == 0) {
          s->probe.nacked[i] = true;
          s->probe.nacks++;
        }
    }
    break;
  }
  r = 0;
bad:
  if (r < 0)
    s->stats.recv_bad++;
  if (held)
    gn_wire_doc_done(&m->doc);
  return r;
}

/* --- timers -----------------------------------------------------------------*/

static void send_ping_reqs(gn_swim *s) {
  uint32_t k = s->cfg.indirect_k < SW_HELPERS_MAX ? s->cfg.indirect_k : SW_HELPERS_MAX;
  uint32_t target = member_find(s, s->probe.id);
  s->probe.indirect = true;
  if (target == SW_NONE || s->order.n == 0)
    return;
  const char *taddr = s->nodes[target].addr;
  /* A second direct ping with the probe's seq (memberlist sends a TCP ping
   * beside the indirect ones): under loss, one lost datagram of the first
   * exchange no longer makes the probe depend on the helpers alone. */
  sent_record(s, s->probe.seq, s->probe.id, s->probe.id, false);
  sw_out retry = {.type = GN_MSG_SWIM_PING, .seq = s->probe.seq, .to = s->probe.id};
  retry.more = !s->left && room_for(s, SRC_HEARSAY);
  send_body(s, taddr, s->probe.id, &retry);
  /* Walk the shuffled order from a random place: k random live helpers. */
  uint32_t start = sw_below(s, s->order.n);
  for (uint32_t i = 0; i < s->order.n && s->probe.nhelpers < k; i++) {
    uint32_t slot = s->order.a[(start + i) % s->order.n];
    const sw_node *h = &s->nodes[slot];
    if (slot == target || h->state != GN_SWIM_ALIVE)
      continue;
    uint32_t hi = s->probe.nhelpers++;
    memcpy(s->probe.helpers[hi], h->id, GN_PK_LEN);
    s->probe.nacked[hi] = false;
    sent_record(s, s->probe.seq, h->id, s->probe.id, true);
    sw_out o = {.type = GN_MSG_SWIM_PING_REQ, .seq = s->probe.seq, .target = s->probe.id, .taddr = taddr};
    send_body(s, h->addr, h->id, &o);
  }
}

static void probe_failed(gn_swim *s, uint64_t now) {
  s->probe.active = false;
  s->stats.probes_failed++;
  /* Lifeguard: helpers that should have said nack and did not point at us
   * being the slow one; with no helpers the failure alone counts. */
  if (s->probe.nhelpers > 0)
    health_add(s, (int)(s->probe.nhelpers - s->probe.nacks));
  else
    health_add(s, 1);
  uint32_t slot = member_find(s, s->probe.id);
  if (slot == SW_NONE || slot == 0)
    return;
  /* Our own failed probe of a member others suspect is one more
   * independent confirmation, gossiped as ours. */
  if (s->nodes[slot].state == GN_SWIM_SUSPECT) {
    if (confirm(s, slot, s->nodes[0].id, true))
      requeue_confirmed(s, slot);
    return;
  }
  if (s->nodes[slot].state != GN_SWIM_ALIVE)
    return;
  s->stats.suspicions_local++;
  suspect(s, slot, s->nodes[slot].inc, s->nodes[0].id, now, true);
  /* Tell the suspect at once (its record rides first, buddy system), and
   * again every other probe interval while we suspect it: if it is alive
   * after all, its answer carries the refutation straight back to a node
   * whose timer surely runs, instead of waiting for gossip to reach it (it
   * may have been cut off when the suspicion was gossiped) and for its
   * refutation to come back. */
  send_ping(s, s->nodes[slot].addr, s->nodes[slot].id, new_seq(s));
  s->nodes[slot].notice_ms = now + 2 * (uint64_t)s->cfg.probe_interval_ms;
  susp_arm(s, &s->nodes[slot]);
}

static void probe_start(gn_swim *s, uint64_t now) {
  s->probe_ticks++;
  uint32_t target = SW_NONE;
  for (uint32_t tries = 0; tries < s->order.n && target == SW_NONE; tries++) {
    if (s->probe_idx >= s->order.n) {
      for (uint32_t i = s->order.n; i > 1; i--)
        list_swap(s, L_ORDER, i - 1, sw_below(s, i));
      s->probe_idx = 0;
    }
    uint32_t slot = s->order.a[s->probe_idx++];
    if (s->nodes[slot].state == GN_SWIM_ALIVE || s->nodes[slot].state == GN_SWIM_SUSPECT)
      target = slot;
  }
  if (target != SW_NONE) {
    sw_node *n = &s->nodes[target];
    memset(&s->probe, 0, sizeof s->probe);
    s->probe.active = true;
    memcpy(s->probe.id, n->id, GN_PK_LEN);
    s->probe.seq = new_seq(s);
    s->probe.start_ms = now;
    s->probe.req_ms = now + scaled(s, s->cfg.probe_timeout_ms);
    s->probe.end_ms = now + scaled(s, s->cfg.probe_interval_ms);
    s->stats.probes++;
    send_ping(s, n->addr, n->id, s->probe.seq);
  }
  /* Gossip to the dead: now and then ping a recently dead member, carrying
   * its death, so that the two sides of a healed partition find each other
   * again (it refutes, and its answer brings it back). */
  if (s->probe_ticks % SW_DEAD_PING_EVERY == 0) {
    for (uint32_t tries = 0; tries < s->dead.n; tries++) {
      if (s->dead_ping_cursor >= s->dead.n)
        s->dead_ping_cursor = 0;
      sw_node *d = &s->nodes[s->dead.a[s->dead_ping_cursor++]];
      if (d->state == GN_SWIM_DEAD) {
        send_ping(s, d->addr, d->id, new_seq(s));
        break;
      }
    }
  }
}

static void check_suspicions(gn_swim *s, uint64_t now) {
  s->next_susp_ms = UINT64_MAX;
  /* A copy: a death below leaves the list. */
  uint32_t ns = s->susp.n;
  memcpy(s->susp_walk, s->susp.a, (size_t)ns * sizeof *s->susp_walk);
  memcpy(s->susp_walk_due, s->susp_due, (size_t)ns * sizeof *s->susp_walk_due);
  for (uint32_t k = 0; k < ns; k++) {
    uint32_t i = s->susp_walk[k];
    if (s->susp_walk_due[k] > now) {
      if (s->susp_walk_due[k] < s->next_susp_ms)
        s->next_susp_ms = s->susp_walk_due[k];
      continue;
    }
    sw_node *n = &s->nodes[i];
    if (!n->used || n->ghost || n->state != GN_SWIM_SUSPECT)
      continue;
    uint64_t d = susp_deadline(s, n);
    if (d <= now) {
      s->stats.deaths_local++;
      memcpy(n->by, s->nodes[0].id, GN_PK_LEN);
      n->has_by = true;
      n->notice_ms = 0;
      set_state(s, i, GN_SWIM_DEAD, n->inc, now, true);
      continue;
    }
    if (n->notice_ms && n->notice_ms <= now) {
      n->notice_ms = now + 2 * (uint64_t)s->cfg.probe_interval_ms;
      send_ping(s, n->addr, n->id, new_seq(s));
    }
    if (n->notice_ms && n->notice_ms < d)
      d = n->notice_ms;
    susp_set_due(s, i, d);
    if (d < s->next_susp_ms)
      s->next_susp_ms = d;
  }
}

static void reap(gn_swim *s, uint64_t now) {
  s->next_reap_ms = UINT64_MAX;
  for (uint32_t i = s->dead.n; i-- > 0;) {
    uint32_t slot = s->dead.a[i];
    uint64_t at = s->nodes[slot].since_ms + s->cfg.dead_keep_ms;
    if (at <= now)
      remove_member(s, slot);
    else if (at < s->next_reap_ms)
      s->next_reap_ms = at;
  }
}

/* A leaving node does not wait to be probed: it pings up to SW_LEAVE_TELL
 * live or suspect members, picked at random, with its leave riding first
 * (tier 0); their answers count in leave_acks. Returns how many it pinged. */
static uint32_t leave_tell(gn_swim *s) {
  uint32_t told = 0, n = s->order.n;
  if (s->leave_rounds >= SW_LEAVE_ROUNDS)
    return 0;
  s->leave_rounds++;
  uint32_t start = n ? sw_below(s, n) : 0;
  for (uint32_t i = 0; i < n && told < SW_LEAVE_TELL; i++) {
    sw_node *m = &s->nodes[s->order.a[(start + i) % n]];
    if (m->state != GN_SWIM_ALIVE && m->state != GN_SWIM_SUSPECT)
      continue;
    send_ping(s, m->addr, m->id, new_seq(s));
    told++;
  }
  return told;
}

/* memberlist's gossip: every gossip interval, while there are records to
 * send, ping gossip_nodes random live members with them. Probes alone carry
 * about two bodies a second per node, too few to spread news in a few
 * seconds; the answers carry the receivers' own news back. Nothing is sent
 * when the queue is empty, so a quiet network costs only its probes. */
static void gossip_round(gn_swim *s) {
  /* With nothing to send, one member is pinged all the same: its answer
   * brings its news (pull). With tables smaller than the network some
   * nodes are held by few others and so pushed to rarely; pulling, they
   * still hear what is spreading. */
  uint32_t k = s->q_len > 0 ? s->cfg.gossip_nodes : 1, n = s->order.n, sent = 0;
  uint32_t picked[SW_GOSSIP_MAX];
  for (uint32_t tries = 0; tries < 4 * k && sent < k && n > 0; tries++) {
    uint32_t slot = s->order.a[sw_below(s, n)];
    bool dup = false;
    for (uint32_t i = 0; i < sent; i++)
      dup |= picked[i] == slot;
    if (dup || s->nodes[slot].state != GN_SWIM_ALIVE)
      continue;
    picked[sent++] = slot;
    send_ping(s, s->nodes[slot].addr, s->nodes[slot].id, new_seq(s));
    if (s->q_len == 0)
      break;
  }
}

void gn_swim_tick(gn_swim *s, uint64_t now_ms) {
  if (!s)
    return;
  s->now_ms = now_ms;
  for (uint32_t i = 0; i < SW_RELAYS_MAX; i++) {
    sw_relay *r = &s->relays[i];
    if (r->used && !r->nacked && r->nack_ms <= now_ms) {
      r->nacked = true;
      sw_out o = {.type = GN_MSG_SWIM_NACK, .seq = r->seq_in, .target = r->target};
      send_body(s, r->req_addr, r->requester, &o);
    }
    if (r->used && r->expire_ms <= now_ms)
      r->used = false;
  }
  if (s->probe.active && !s->probe.indirect && now_ms >= s->probe.req_ms)
    send_ping_reqs(s);
  if (s->probe.active && now_ms >= s->probe.end_ms)
    probe_failed(s, now_ms);
  if (now_ms >= s->next_susp_ms)
    check_suspicions(s, now_ms);
  if (now_ms >= s->next_reap_ms)
    reap(s, now_ms);
  if (now_ms >= s->next_probe_ms) {
    if (s->left) {
      s->next_probe_ms = UINT64_MAX;
      if (s->leave_acks == 0 && leave_tell(s) > 0)
        s->next_probe_ms = now_ms + scaled(s, s->cfg.probe_timeout_ms);
    } else {
      s->next_probe_ms = now_ms + scaled(s, s->cfg.probe_interval_ms);
      probe_start(s, now_ms);
    }
  }
  if (s->cfg.gossip_interval_ms && !s->left && now_ms >= s->next_gossip_ms) {
    s->next_gossip_ms = now_ms + s->cfg.gossip_interval_ms;
    gossip_round(s);
  }
}

uint64_t gn_swim_next_deadline_ms(const gn_swim *s) {
  if (!s)
    return UINT64_MAX;
  uint64_t d = s->next_probe_ms;
  if (s->cfg.gossip_interval_ms && !s->left && s->next_gossip_ms < d)
    d = s->next_gossip_ms;
  if (s->probe.active) {
    uint64_t p = s->probe.indirect ? s->probe.end_ms : s->probe.req_ms;
    if (p < d)
      d = p;
  }
  for (uint32_t i = 0; i < SW_RELAYS_MAX; i++)
    if (s->relays[i].used) {
      uint64_t at = s->relays[i].nacked ? s->relays[i].expire_ms : s->relays[i].nack_ms;
      if (at < d)
        d = at;
    }
  if (s->next_susp_ms < d)
    d = s->next_susp_ms;
  if (s->next_reap_ms < d)
    d = s->next_reap_ms;
  return d;
}

/* --- the public rest --------------------------------------------------------*/

void gn_swim_config_default(gn_swim_config *cfg) {
  *cfg = (gn_swim_config){
      .probe_interval_ms = 1000,
      .probe_timeout_ms = 500,
      .indirect_k = 3,
      .suspicion_alpha = 4,
      .suspicion_beta = 6,
      .retransmit_mult = 4,
      .awareness_max = 8,
      .max_members = 4096,
      .max_datagram = 1200,
      .dead_keep_ms = 90000,
      .gossip_interval_ms = 200,
      .gossip_nodes = 3,
  };
}

static bool config_valid(const gn_swim_config *c) {
  return c->probe_interval_ms >= 1 && c->probe_interval_ms <= 3600000 && c->probe_timeout_ms >= 1 &&
         c->probe_timeout_ms <= c->probe_interval_ms && c->indirect_k <= 64 && c->suspicion_alpha >= 1 &&
         c->suspicion_alpha <= 1000 && c->suspicion_beta >= 1 && c->suspicion_beta <= 1000 && c->retransmit_mult >= 1 &&
         c->retransmit_mult <= 100 && c->awareness_max <= 64 && c->max_members >= 1 && c->max_members <= (1u << 24) &&
         c->max_datagram >= 256 && c->max_datagram <= GN_SWIM_BODY_MAX && c->dead_keep_ms <= 86400000u &&
         c->gossip_interval_ms <= 3600000 && c->gossip_nodes <= SW_GOSSIP_MAX;
}

int gn_swim_new(const uint8_t self_id[GN_PK_LEN], const char *self_addr, const gn_swim_config *cfg,
                const gn_swim_io *io, uint64_t seed, uint64_t now_ms, gn_swim **ret_s) {
  gn_swim_config def;
  if (!cfg) {
    gn_swim_config_default(&def);
    cfg = &def;
  }
  if (!self_id || !self_addr || !io || !io->send || !ret_s || !addr_valid(self_addr) || !config_valid(cfg))
    return GN_EINVAL;
  gn_swim *s = calloc(1, sizeof *s);
  if (!s)
    return GN_ENOMEM;
  s->cfg = *cfg;
  s->io = *io;
  s->rng = seed;
  for (size_t i = 0; i < sizeof s->hash_key; i += 8) {
    uint64_t v = sw_rand(s);
    memcpy(s->hash_key + i, &v, sizeof s->hash_key - i < 8 ? sizeof s->hash_key - i : 8);
  }
  gn_wire_writer_init(&s->w);
  for (uint32_t i = 1; i <= SW_CONF_MAX; i++)
    s->ln_small[i] = sw_ln((double)i);
  s->ghost_max = cfg->max_members / 2;
  /* tx_limit is at most retransmit_mult * 10 (n below 2^32). */
  s->q_count_max = cfg->retransmit_mult * 10;
  size_t nb = 2 * ((size_t)s->q_count_max + 1);
  s->q_head = malloc(nb * sizeof *s->q_head);
  s->q_tail = malloc(nb * sizeof *s->q_tail);
  if (!s->q_head || !s->q_tail) {
    gn_swim_free(s);
    return GN_ENOMEM;
  }
  memset(s->q_head, 0xff, nb * sizeof *s->q_head);
  memset(s->q_tail, 0xff, nb * sizeof *s->q_tail);
  uint32_t cap0 = cfg->max_members + 1 < 16 ? cfg->max_members + 1 : 16;
  if (grow(s, cap0) < 0) {
    gn_swim_free(s);
    return GN_ENOMEM;
  }
  sw_node *self = &s->nodes[0];
  memcpy(self->id, self_id, GN_PK_LEN);
  snprintf(self->addr, sizeof self->addr, "%s", self_addr);
  self->hkey = sw_hash(s, self_id);
  self->state = GN_SWIM_ALIVE;
  self->since_ms = now_ms;
  self->used = true;
  self->verified = true;
  self->order_pos = self->dead_pos = self->ghost_pos = SW_NONE;
  self->q_bucket = self->q_prev = self->q_next = SW_NONE;
  self->direct = true;
  s->hi = 1;
  tab_insert(s, 0);
  enqueue(s, 0);
  s->next_probe_ms = now_ms;
  s->next_susp_ms = s->next_reap_ms = UINT64_MAX;
  *ret_s = s;
  return 0;
}

gn_swim *gn_swim_free(gn_swim *s) {
  if (!s)
    return NULL;
  gn_wire_writer_done(&s->w);
  gn_buf_done(&s->one);
  gn_buf_done(&s->ub);
  gn_buf_done(&s->mb);
  gn_buf_done(&s->out);
  free(s->nodes);
  free(s->free_slots);
  free(s->order.a);
  free(s->q_head);
  free(s->q_tail);
  free(s->dead.a);
  free(s->ghosts.a);
  free(s->susp.a);
  free(s->susp_walk);
  free(s->susp_due);
  free(s->susp_walk_due);
  free(s->tab);
  free(s);
  return NULL;
}

int gn_swim_add(gn_swim *s, const uint8_t id[GN_PK_LEN], const char *addr, uint64_t now_ms) {
  if (!s || !id || !addr || !addr_valid(addr))
    return GN_EINVAL;
  uint32_t slot = tab_find(s, id);
  if (slot == 0)
    return GN_EINVAL;
  if (slot != SW_NONE && !s->nodes[slot].ghost)
    return 0;
  if (!room_for(s, SRC_CALLER))
    return GN_ETOOBIG;
  if (slot != SW_NONE)
    ghost_remove(s, slot);
  return add_member(s, id, addr, 0, SRC_CALLER, true, now_ms) == SW_NONE ? GN_ETOOBIG : 0;
}

void gn_swim_leave(gn_swim *s, uint64_t now_ms) {
  if (!s || s->left)
    return;
  sw_node *self = &s->nodes[0];
  if (self->inc < SW_INC_MAX)
    self->inc++;
  self->state = GN_SWIM_LEFT;
  self->since_ms = now_ms;
  s->left = true;
  s->probe.active = false;
  enqueue(s, 0);
  s->leave_acks = 0;
  s->leave_rounds = 0;
  if (leave_tell(s) > 0)
    s->next_probe_ms = now_ms + scaled(s, s->cfg.probe_timeout_ms);
}

uint32_t gn_swim_leave_acks(const gn_swim *s) {
  return s ? s->leave_acks : 0;
}

size_t gn_swim_count(const gn_swim *s, gn_swim_state st) {
  return s && (unsigned)st <= GN_SWIM_LEFT ? s->count[st] : 0;
}

int gn_swim_get(const gn_swim *s, const uint8_t id[GN_PK_LEN], gn_swim_member *ret_m) {
  if (!s || !id || !ret_m)
    return GN_EINVAL;
  uint32_t slot = member_find(s, id);
  if (slot == SW_NONE)
    return GN_ENOTFOUND;
  to_member(&s->nodes[slot], ret_m);
  return 0;
}

size_t gn_swim_members(const gn_swim *s, gn_swim_member *out, size_t cap) {
  if (!s)
    return 0;
  size_t n = 0;
  for (uint32_t i = 1; i < s->hi; i++) {
    if (!s->nodes[i].used || s->nodes[i].ghost)
      continue;
    if (out && n < cap)
      to_member(&s->nodes[i], &out[n]);
    n++;
  }
  return n;
}

uint32_t gn_swim_health(const gn_swim *s) {
  return s ? s->health : 0;
}

uint32_t gn_swim_incarnation(const gn_swim *s) {
  return s ? s->nodes[0].inc : 0;
}

void gn_swim_stats_get(const gn_swim *s, gn_swim_stats *ret) {
  if (s && ret)
    *ret = s->stats;
}

bool gn_swim_verified(const gn_swim *s, const uint8_t id[GN_PK_LEN]) {
  if (!s || !id)
    return false;
  uint32_t slot = member_find(s, id);
  return slot != SW_NONE && s->nodes[slot].verified;
}

int gn_swim_set_addr(gn_swim *s, const char *addr, uint64_t now_ms) {
  if (!s || !addr || strnlen(addr, GN_SWIM_ADDR_MAX) >= GN_SWIM_ADDR_MAX || !addr_valid(addr))
    return GN_EINVAL;
  sw_node *self = &s->nodes[0];
  if (strcmp(self->addr, addr) == 0)
    return 0;
  if (s->left)
    return GN_ESTATE;
  /* A new incarnation, so that our own pings (signed, carrying it) move us
   * at every member; gossip alone never moves a live member. */
  snprintf(self->addr, sizeof self->addr, "%s", addr);
  if (self->inc < SW_INC_MAX)
    self->inc++;
  self->since_ms = now_ms;
  enqueue(s, 0);
  return 0;
}
