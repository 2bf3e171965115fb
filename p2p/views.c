/* Partial views (HyParView) as an I/O-free state machine: a small active view
 * of peers held over sessions, a larger passive view of addresses to replace
 * them from, JOIN/FORWARD_JOIN random walks to enter, NEIGHBOR to promote and
 * SHUFFLE walks to keep the passive view fresh. Every table is bounded and
 * every message a peer can send is rate- or share-bounded, so a hostile peer
 * cannot grow our state or take over our views cheaply. docs/overlay/views.md. */
#include <gpunet/views.h>
#include <gpunet/wire.h>

#include <arpa/inet.h>
#include <stdio.h>

#define MAX_REPLY_PENDING 4 /* SHUFFLE_REPLY dials in flight */

typedef struct entry {
  uint8_t id[GN_PK_LEN];
  char addr[GN_VIEWS_ADDR_MAX];
} entry;

typedef struct member {
  uint8_t id[GN_PK_LEN];
  char addr[GN_VIEWS_ADDR_MAX];
  bool verified;     /* we have had a session with it */
  uint32_t fails;    /* refusals in a row (passive) */
  uint64_t retry_ms; /* not asked again before (passive) */
  uint64_t seq;      /* order of entry into the active view */
  uint64_t since_ms; /* in the active view since (active) */
  uint64_t score_ms; /* time it held an active link with us, all told */
} member;

typedef enum pend_kind {
  PEND_NEIGHBOR, /* NEIGHBOR sent or to send; waits for NEIGHBOR_REPLY */
  PEND_JOIN,     /* JOIN to send to a contact once its session is up */
  PEND_REPLY,    /* SHUFFLE_REPLY to send to a walk's origin once its session is up */
} pend_kind;

typedef struct pending {
  uint8_t id[GN_PK_LEN];
  char addr[GN_VIEWS_ADDR_MAX];
  pend_kind kind;
  bool dialling; /* waiting for the session */
  bool high;     /* NEIGHBOR priority */
  uint64_t deadline_ms;
  uint64_t nonce; /* PEND_REPLY */
  size_t slot;    /* PEND_REPLY: its entries are replies[slot * shuffle_max(v)...] */
  size_t nentries;
} pending;

typedef struct rate {
  uint8_t id[GN_PK_LEN];
  uint64_t ask_ms; /* last JOIN or NEIGHBOR taken, valid when asked is set */
  bool asked;
  uint64_t win_ms; /* start of the current shuffle-interval window */
  uint32_t shuffles, fjoins;
  uint64_t seen_ms;
} rate;

struct gn_views {
  uint8_t self[GN_PK_LEN];
  char self_addr[GN_VIEWS_ADDR_MAX];
  gn_views_config cfg;
  gn_views_io io;
  uint64_t rng;

  /* Tables sized by the config, so an instance with the defaults holds about
   * 16 KiB and a simulator can run many thousands. */
  member *active; /* cfg.active_size */
  size_t nactive;
  member *passive; /* cfg.passive_size */
  size_t npassive;
  pending pend[GN_VIEWS_PENDING_MAX];
  size_t npend;
  entry *replies; /* MAX_REPLY_PENDING slots of shuffle_max entries */
  rate *rates;    /* grows by doubling up to GN_VIEWS_RATE_MAX */
  size_t nrates, rates_cap;
  entry contacts[GN_VIEWS_CONTACTS_MAX];
  size_t ncontacts;

  /* The SHUFFLE we started last, waiting for its reply. */
  bool shuffle_on;
  uint64_t shuffle_nonce, shuffle_deadline_ms;
  entry *shuffle_sent; /* shuffle_max */
  size_t shuffle_nsent;

  /* Passive entries evicted by merges in the current window. */
  uint64_t repl_win_ms;
  uint32_t repl_used;

  uint64_t next_shuffle_ms, next_fill_ms, next_rejoin_ms;
  uint64_t active_seq;
  gn_views_stats stats;
};

void gn_views_config_default(gn_views_config *cfg) {
  *cfg = (gn_views_config){
      .active_size = 6,
      .passive_size = 48,
      .arwl = 6,
      .prwl = 3,
      .shuffle_interval_ms = 10000,
      .shuffle_ka = 3,
      .shuffle_kp = 4,
      .shuffle_ttl = 6,
      .join_interval_ms = 3000,
      .shuffle_per_peer = 10,
      .fjoin_per_peer = 1000,
      .replace_per_period = 12,
      .request_timeout_ms = 5000,
      .fill_interval_ms = 1000,
      .fill_burst = 2,
      .backoff_ms = 2000,
      .backoff_max_ms = 60000,
      .rejoin_interval_ms = 5000,
  };
}

/* --- small helpers --------------------------------------------------------*/

/* splitmix64: small, good enough for choosing peers, and replays from the seed. */
static uint64_t rnd(gn_views *v) {
  uint64_t z = (v->rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static size_t rnd_below(gn_views *v, size_t n) {
  return n ? (size_t)(rnd(v) % n) : 0;
}

static bool id_eq(const uint8_t *a, const uint8_t *b) {
  return memcmp(a, b, GN_PK_LEN) == 0;
}

bool gn_views_addr_valid(const char *addr) {
  if (!addr)
    return false;
  size_t n = strnlen(addr, GN_VIEWS_ADDR_MAX);
  if (n == 0 || n >= GN_VIEWS_ADDR_MAX)
    return false;
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr)
    return false;
  const char *p = colon + 1;
  size_t plen = strlen(p);
  if (plen == 0 || plen > 5)
    return false;
  unsigned port = 0;
  for (; *p; p++) {
    if (*p < '0' || *p > '9')
      return false;
    port = port * 10 + (unsigned)(*p - '0');
  }
  if (port == 0 || port > 65535)
    return false;
  char host[GN_VIEWS_ADDR_MAX];
  size_t hl = (size_t)(colon - addr);
  if (addr[0] == '[') {
    if (hl < 3 || addr[hl - 1] != ']')
      return false;
    memcpy(host, addr + 1, hl - 2);
    host[hl - 2] = 0;
    struct in6_addr a6;
    if (inet_pton(AF_INET6, host, &a6) != 1)
      return false;
    static const uint8_t zero[16];
    return memcmp(&a6, zero, 16) != 0 && a6.s6_addr[0] != 0xff; /* not :: nor multicast */
  }
  memcpy(host, addr, hl);
  host[hl] = 0;
  struct in_addr a4;
  if (inet_pton(AF_INET, host, &a4) != 1)
    return false;
  uint32_t h = ntohl(a4.s_addr);
  return h != 0 && h != 0xffffffffu && (h >> 28) != 0xe; /* not 0.0.0.0, broadcast, multicast */
}

static int find_member(const member *m, size_t n, const uint8_t id[GN_PK_LEN]) {
  for (size_t i = 0; i < n; i++)
    if (id_eq(m[i].id, id))
      return (int)i;
  return -1;
}

static int find_addr(const member *m, size_t n, const char *addr) {
  for (size_t i = 0; i < n; i++)
    if (m[i].addr[0] && strcmp(m[i].addr, addr) == 0)
      return (int)i;
  return -1;
}

static int find_pending(const gn_views *v, const uint8_t id[GN_PK_LEN], pend_kind kind) {
  for (size_t i = 0; i < v->npend; i++)
    if (v->pend[i].kind == kind && id_eq(v->pend[i].id, id))
      return (int)i;
  return -1;
}

static size_t count_pending(const gn_views *v, pend_kind kind) {
  size_t n = 0;
  for (size_t i = 0; i < v->npend; i++)
    n += v->pend[i].kind == kind;
  return n;
}

static void pending_remove(gn_views *v, size_t i) {
  v->pend[i] = v->pend[--v->npend];
}

static bool is_self(const gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr) {
  return id_eq(id, v->self) || (addr && addr[0] && v->self_addr[0] && strcmp(addr, v->self_addr) == 0);
}

/* --- sending --------------------------------------------------------------*/

static int send_writer(gn_views *v, const uint8_t peer[GN_PK_LEN], uint32_t type, gn_wire_writer *w) {
  gn_buf b = {0};
  int r = gn_wire_writer_take(w, &b);
  if (r == 0) {
    r = v->io.send(v->io.ud, peer, type, b.data, b.len);
    if (r >= 0) {
      v->stats.sent_msgs++;
      v->stats.sent_bytes += b.len;
      r = 0;
    }
  }
  gn_buf_done(&b);
  return r;
}

static void put_entries(gn_wire_writer *w, const entry *e, size_t n) {
  gn_wire_put_array(w, (uint32_t)n);
  for (size_t i = 0; i < n; i++) {
    gn_wire_put_map(w, 2);
    gn_wire_put_str(w, "id");
    gn_wire_put_bin(w, e[i].id, GN_PK_LEN);
    gn_wire_put_str(w, "addr");
    gn_wire_put_str(w, e[i].addr);
  }
}

/* The small bodies, written by one function: {} (DISCONNECT), {addr}
 * (JOIN), {high, addr} (NEIGHBOR), {accept} (NEIGHBOR_REPLY). flag_key
 * names the one bool field (NULL: none), with_addr adds our own address
 * after it. */
static int send_small(gn_views *v, const uint8_t peer[GN_PK_LEN], uint32_t type, const char *flag_key, bool flag,
                      bool with_addr) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, (uint32_t)(flag_key != NULL) + (uint32_t)with_addr);
  if (flag_key) {
    gn_wire_put_str(&w, flag_key);
    gn_wire_put_bool(&w, flag);
  }
  if (with_addr) {
    gn_wire_put_str(&w, "addr");
    gn_wire_put_str(&w, v->self_addr);
  }
  int r = send_writer(v, peer, type, &w);
  gn_wire_writer_done(&w);
  return r;
}

static int send_simple(gn_views *v, const uint8_t peer[GN_PK_LEN], uint32_t type) {
  return send_small(v, peer, type, NULL, false, false);
}

static int send_join(gn_views *v, const uint8_t peer[GN_PK_LEN]) {
  return send_small(v, peer, GN_MSG_VIEW_JOIN, NULL, false, true);
}

static int send_neighbor(gn_views *v, const uint8_t peer[GN_PK_LEN], bool high) {
  return send_small(v, peer, GN_MSG_VIEW_NEIGHBOR, "high", high, true);
}

static int send_neighbor_reply(gn_views *v, const uint8_t peer[GN_PK_LEN], bool accept) {
  return send_small(v, peer, GN_MSG_VIEW_NEIGHBOR_REPLY, "accept", accept, false);
}

static int send_forward_join(gn_views *v, const uint8_t peer[GN_PK_LEN], const uint8_t id[GN_PK_LEN], const char *addr,
                             uint32_t ttl) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "id");
  gn_wire_put_bin(&w, id, GN_PK_LEN);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, addr);
  gn_wire_put_str(&w, "ttl");
  gn_wire_put_u64(&w, ttl);
  int r = send_writer(v, peer, GN_MSG_VIEW_FORWARD_JOIN, &w);
  gn_wire_writer_done(&w);
  return r;
}

static int send_shuffle(gn_views *v, const uint8_t peer[GN_PK_LEN], const uint8_t origin[GN_PK_LEN],
                        const char *origin_addr, uint32_t ttl, uint64_t nonce, const entry *e, size_t n) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 5);
  gn_wire_put_str(&w, "origin");
  gn_wire_put_bin(&w, origin, GN_PK_LEN);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, origin_addr);
  gn_wire_put_str(&w, "ttl");
  gn_wire_put_u64(&w, ttl);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_u64(&w, nonce);
  gn_wire_put_str(&w, "entries");
  put_entries(&w, e, n);
  int r = send_writer(v, peer, GN_MSG_VIEW_SHUFFLE, &w);
  gn_wire_writer_done(&w);
  return r;
}

static int send_shuffle_reply(gn_views *v, const uint8_t peer[GN_PK_LEN], uint64_t nonce, const entry *e, size_t n) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_u64(&w, nonce);
  gn_wire_put_str(&w, "entries");
  put_entries(&w, e, n);
  int r = send_writer(v, peer, GN_MSG_VIEW_SHUFFLE_REPLY, &w);
  gn_wire_writer_done(&w);
  return r;
}

static void dial(gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr) {
  v->stats.dials++;
  v->io.connect(v->io.ud, id, addr);
}

/* --- the views ------------------------------------------------------------*/

static void passive_remove_at(gn_views *v, size_t i) {
  v->passive[i] = v->passive[--v->npassive];
}

static void passive_remove(gn_views *v, const uint8_t id[GN_PK_LEN]) {
  int i = find_member(v->passive, v->npassive, id);
  if (i >= 0)
    passive_remove_at(v, (size_t)i);
}

static int random_index_where(gn_views *v, const member *m, size_t n, bool want_verified) {
  size_t cnt = 0;
  for (size_t i = 0; i < n; i++)
    cnt += m[i].verified == want_verified;
  if (!cnt)
    return -1;
  size_t k = rnd_below(v, cnt);
  for (size_t i = 0; i < n; i++)
    if (m[i].verified == want_verified && k-- == 0)
      return (int)i;
  return -1;
}

/* The budget of passive evictions, per shuffle interval. */
static bool replace_budget_take(gn_views *v, uint64_t now_ms) {
  if (now_ms >= v->repl_win_ms + v->cfg.shuffle_interval_ms) {
    v->repl_win_ms = now_ms;
    v->repl_used = 0;
  }
  if (v->repl_used >= v->cfg.replace_per_period)
    return false;
  v->repl_used++;
  return true;
}

/* Frees a passive slot for a newcomer when the view is full, within the
 * period's budget. The victim is a hearsay entry (one of prefer first: the
 * entries we just gave away); for a newcomer we have had a session with, when
 * there is no hearsay left, the verified entry that held an active link for
 * the shortest time, if shorter than the newcomer did. So hearsay never
 * pushes out a peer we know, and an identity that was our neighbour for a
 * moment never pushes out one that was for long. */
static bool passive_make_room(gn_views *v, const entry *prefer, size_t nprefer, bool verified, uint64_t score_ms,
                              uint64_t now_ms) {
  if (v->npassive < v->cfg.passive_size)
    return true;
  int k = -1;
  for (size_t i = 0; i < nprefer && k < 0; i++) {
    int j = find_member(v->passive, v->npassive, prefer[i].id);
    if (j >= 0 && !v->passive[j].verified)
      k = j;
  }
  if (k < 0)
    k = random_index_where(v, v->passive, v->npassive, false);
  if (k < 0 && verified) {
    for (size_t i = 0; i < v->npassive; i++)
      if (v->passive[i].score_ms < score_ms && (k < 0 || v->passive[i].score_ms < v->passive[k].score_ms))
        k = (int)i;
  }
  if (k < 0 || !replace_budget_take(v, now_ms))
    return false;
  passive_remove_at(v, (size_t)k);
  v->stats.passive_replaced++;
  return true;
}

/* Puts a peer we have had a session with into the passive view; score_ms is
 * how long it held an active link with us. */
static void passive_add_verified(gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr, uint64_t retry_ms,
                                 uint64_t score_ms, uint64_t now_ms) {
  if (is_self(v, id, addr) || !gn_views_addr_valid(addr) || find_member(v->active, v->nactive, id) >= 0)
    return;
  int i = find_member(v->passive, v->npassive, id);
  if (i < 0) {
    int j = find_addr(v->passive, v->npassive, addr);
    if (j >= 0) {
      /* An address is one entry: a known peer's claim beats hearsay's. */
      if (v->passive[j].verified || !replace_budget_take(v, now_ms))
        return;
      passive_remove_at(v, (size_t)j);
      v->stats.passive_replaced++;
    }
    if (!passive_make_room(v, NULL, 0, true, score_ms, now_ms))
      return;
    i = (int)v->npassive++;
    memset(&v->passive[i], 0, sizeof(v->passive[i]));
    memcpy(v->passive[i].id, id, GN_PK_LEN);
    snprintf(v->passive[i].addr, sizeof(v->passive[i].addr), "%s", addr);
  }
  v->passive[i].verified = true;
  if (score_ms > v->passive[i].score_ms)
    v->passive[i].score_ms = score_ms;
  if (retry_ms > v->passive[i].retry_ms)
    v->passive[i].retry_ms = retry_ms;
}

static bool pending_for(const gn_views *v, const uint8_t id[GN_PK_LEN]) {
  for (size_t i = 0; i < v->npend; i++)
    if (v->pend[i].kind == PEND_NEIGHBOR && id_eq(v->pend[i].id, id))
      return true;
  return false;
}

/* Puts an entry we were told about into the passive view. When full it may
 * evict only hearsay (passive_make_room), at most *evict_left times for this
 * message. Returns true when the entry went in. */
static bool passive_add_hearsay(gn_views *v, const entry *e, const entry *prefer, size_t nprefer, uint32_t *evict_left,
                                uint64_t now_ms) {
  if (is_self(v, e->id, e->addr) || find_member(v->active, v->nactive, e->id) >= 0 || pending_for(v, e->id) ||
      find_member(v->passive, v->npassive, e->id) >= 0 || find_addr(v->passive, v->npassive, e->addr) >= 0 ||
      find_addr(v->active, v->nactive, e->addr) >= 0)
    return false;
  if (v->npassive == v->cfg.passive_size) {
    if (*evict_left == 0 || !passive_make_room(v, prefer, nprefer, false, 0, now_ms))
      return false;
    (*evict_left)--;
  }
  member *m = &v->passive[v->npassive++];
  memset(m, 0, sizeof(*m));
  memcpy(m->id, e->id, GN_PK_LEN);
  snprintf(m->addr, sizeof(m->addr), "%s", e->addr);
  return true;
}

/* How long an active member has held a link with us, all told. */
static uint64_t held_ms(const member *m, uint64_t now_ms) {
  return m->score_ms + (now_ms > m->since_ms ? now_ms - m->since_ms : 0);
}

/* Takes member i out of the active view. The last one leaving starts the
 * rejoin clock: the passive view gets one rejoin_interval_ms to refill the
 * view before the node JOINs a contact again. */
static void active_remove_at(gn_views *v, size_t i, uint64_t now_ms) {
  uint8_t id[GN_PK_LEN];
  memcpy(id, v->active[i].id, GN_PK_LEN);
  v->active[i] = v->active[--v->nactive];
  if (!v->nactive && v->npassive && v->next_rejoin_ms < now_ms + v->cfg.rejoin_interval_ms)
    v->next_rejoin_ms = now_ms + v->cfg.rejoin_interval_ms;
  if (v->io.event)
    v->io.event(v->io.ud, id, GN_VIEWS_EV_REMOVED);
}

/* Drops an active member other than keep to make room: it is told with
 * DISCONNECT and kept as passive, not asked again for a while. The victim is
 * drawn from the newer half of the view only, so a crowd of fresh identities
 * sending JOIN or high-priority NEIGHBOR can only push each other out, never
 * the links that have lasted longest. */
static void evict_one(gn_views *v, const uint8_t *keep, uint64_t now_ms) {
  size_t cand[GN_VIEWS_ACTIVE_MAX], n = 0;
  for (size_t i = 0; i < v->nactive; i++)
    if (!keep || !id_eq(v->active[i].id, keep))
      cand[n++] = i;
  if (!n)
    return;
  /* Newest first (insertion sort: n is at most GN_VIEWS_ACTIVE_MAX). */
  for (size_t a = 1; a < n; a++)
    for (size_t b = a; b > 0 && v->active[cand[b]].seq > v->active[cand[b - 1]].seq; b--) {
      size_t t = cand[b];
      cand[b] = cand[b - 1];
      cand[b - 1] = t;
    }
  size_t i = cand[rnd_below(v, (n + 1) / 2)];
  member m = v->active[i];
  send_simple(v, m.id, GN_MSG_VIEW_DISCONNECT);
  active_remove_at(v, i, now_ms);
  if (v->io.disconnect)
    v->io.disconnect(v->io.ud, m.id);
  passive_add_verified(v, m.id, m.addr, now_ms + v->cfg.backoff_ms, held_ms(&m, now_ms), now_ms);
  v->stats.evictions++;
}

/* Whether id may hold addr in our views: not when another active member or a
 * peer we have had a session with holds it (an address is one entry, and a
 * node cannot take over another's by claiming it). A hearsay entry holding it
 * gives way. */
static bool addr_claim(gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr) {
  int j = find_addr(v->active, v->nactive, addr);
  if (j >= 0 && !id_eq(v->active[j].id, id))
    return false;
  j = find_addr(v->passive, v->npassive, addr);
  if (j < 0 || id_eq(v->passive[j].id, id))
    return true;
  if (v->passive[j].verified)
    return false;
  passive_remove_at(v, (size_t)j);
  return true;
}

/* Adds id to the active view (the caller made room). */
static void active_add(gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr, uint64_t now_ms) {
  if (v->nactive >= v->cfg.active_size || find_member(v->active, v->nactive, id) >= 0)
    return;
  char a[GN_VIEWS_ADDR_MAX] = "";
  uint64_t score = 0;
  int p = find_member(v->passive, v->npassive, id);
  if (addr && gn_views_addr_valid(addr) && addr_claim(v, id, addr))
    snprintf(a, sizeof(a), "%s", addr);
  else if (p >= 0)
    snprintf(a, sizeof(a), "%s", v->passive[p].addr);
  p = find_member(v->passive, v->npassive, id); /* addr_claim may have moved it */
  if (p >= 0) {
    score = v->passive[p].score_ms;
    passive_remove_at(v, (size_t)p);
  }
  member *m = &v->active[v->nactive++];
  memset(m, 0, sizeof(*m));
  m->since_ms = now_ms;
  m->score_ms = score;
  memcpy(m->id, id, GN_PK_LEN);
  snprintf(m->addr, sizeof(m->addr), "%s", a);
  m->verified = true;
  m->seq = ++v->active_seq;
  if (v->io.event)
    v->io.event(v->io.ud, id, GN_VIEWS_EV_ADDED);
}

/* A NEIGHBOR request to id failed (refused, timed out, or its session went
 * down): back off from it, or forget it when it could not even be reached. */
static void neighbor_failed(gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr, bool unreachable,
                            uint64_t now_ms) {
  if (unreachable) {
    passive_remove(v, id);
    return;
  }
  int i = find_member(v->passive, v->npassive, id);
  if (i < 0) {
    passive_add_verified(v, id, addr, 0, 0, now_ms);
    i = find_member(v->passive, v->npassive, id);
    if (i < 0)
      return;
  }
  member *m = &v->passive[i];
  uint32_t shift = m->fails < 16 ? m->fails : 16;
  uint64_t b = (uint64_t)v->cfg.backoff_ms << shift;
  if (b > v->cfg.backoff_max_ms)
    b = v->cfg.backoff_max_ms;
  m->fails++;
  m->retry_ms = now_ms + b;
}

static pending *pending_new(gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr, pend_kind kind,
                            uint64_t now_ms) {
  if (v->npend == GN_VIEWS_PENDING_MAX)
    return NULL;
  pending *p = &v->pend[v->npend++];
  memset(p, 0, sizeof(*p));
  memcpy(p->id, id, GN_PK_LEN);
  snprintf(p->addr, sizeof(p->addr), "%s", addr ? addr : "");
  p->kind = kind;
  p->deadline_ms = now_ms + v->cfg.request_timeout_ms;
  return p;
}

/* Starts a NEIGHBOR request: sent at once over an existing session, or after
 * a dial. Returns false when the pending table is full or one is already out. */
static bool request_neighbor(gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr, bool high, uint64_t now_ms) {
  if (find_pending(v, id, PEND_NEIGHBOR) >= 0 || !gn_views_addr_valid(addr))
    return false;
  pending *p = pending_new(v, id, addr, PEND_NEIGHBOR, now_ms);
  if (!p)
    return false;
  p->high = high;
  if (send_neighbor(v, id, high) < 0) {
    p->dialling = true;
    dial(v, id, addr);
  }
  return true;
}

static void joined_contact(gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr, uint64_t now_ms) {
  if (find_member(v->active, v->nactive, id) >= 0)
    return;
  if (v->nactive == v->cfg.active_size)
    evict_one(v, id, now_ms);
  active_add(v, id, addr, now_ms);
}

/* JOIN to a contact: it enters our active view as the JOIN goes out (the
 * contact takes us in, or says DISCONNECT). */
static void join_contact(gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr, uint64_t now_ms) {
  if (send_join(v, id) < 0) {
    if (find_pending(v, id, PEND_JOIN) >= 0)
      return;
    pending *p = pending_new(v, id, addr, PEND_JOIN, now_ms);
    if (!p)
      return;
    p->dialling = true;
    dial(v, id, addr);
    return;
  }
  joined_contact(v, id, addr, now_ms);
}

/* --- rate state -----------------------------------------------------------*/

static uint64_t rate_keep_ms(const gn_views *v) {
  return v->cfg.join_interval_ms > v->cfg.shuffle_interval_ms ? v->cfg.join_interval_ms : v->cfg.shuffle_interval_ms;
}

/* The rate state of peer, made if needed. When the table is full the record
 * seen least recently is reused: a crowd of identities that pushes a peer's
 * record out gains nothing it could not get by using one more identity, while
 * refusing newcomers instead would let that crowd lock out honest joiners. */
static rate *rate_get(gn_views *v, const uint8_t peer[GN_PK_LEN], uint64_t now_ms) {
  for (size_t i = 0; i < v->nrates; i++)
    if (id_eq(v->rates[i].id, peer)) {
      v->rates[i].seen_ms = now_ms;
      return &v->rates[i];
    }
  rate *r = NULL;
  if (v->nrates == v->rates_cap && v->rates_cap < GN_VIEWS_RATE_MAX) {
    size_t cap = v->rates_cap ? v->rates_cap * 2 : 8;
    rate *nr = realloc(v->rates, (cap < GN_VIEWS_RATE_MAX ? cap : GN_VIEWS_RATE_MAX) * sizeof(*nr));
    if (nr) { /* out of memory: the table stays as it is, and reuses a record */
      v->rates = nr;
      v->rates_cap = cap < GN_VIEWS_RATE_MAX ? cap : GN_VIEWS_RATE_MAX;
    }
  }
  if (v->nrates < v->rates_cap) {
    r = &v->rates[v->nrates++];
  } else if (v->nrates) {
    r = &v->rates[0];
    for (size_t i = 1; i < v->nrates; i++)
      if (v->rates[i].seen_ms < r->seen_ms)
        r = &v->rates[i];
  } else {
    return NULL;
  }
  memset(r, 0, sizeof(*r));
  memcpy(r->id, peer, GN_PK_LEN);
  r->win_ms = now_ms;
  r->seen_ms = now_ms;
  return r;
}

static void rate_window(const gn_views *v, rate *r, uint64_t now_ms) {
  if (now_ms >= r->win_ms + v->cfg.shuffle_interval_ms) {
    r->win_ms = now_ms;
    r->shuffles = r->fjoins = 0;
  }
}

static void rate_expire(gn_views *v, uint64_t now_ms) {
  for (size_t i = 0; i < v->nrates;)
    if (v->rates[i].seen_ms + rate_keep_ms(v) <= now_ms)
      v->rates[i] = v->rates[--v->nrates];
    else
      i++;
}

/* --- decoding -------------------------------------------------------------*/

/* Reads an "entries" array: at most max maps {id: bin 32, addr: valid}. Any
 * bad entry fails the whole message. Duplicates are kept here and skipped by
 * the merge. */
static int get_entries(const msgpack_object *map, size_t max, entry *out, size_t *ret_n) {
  const msgpack_object_array *a;
  int r = gn_wire_get_array(map, "entries", max, &a);
  if (r < 0)
    return r;
  for (uint32_t i = 0; i < a->size; i++) {
    const msgpack_object *o = &a->ptr[i];
    if (o->type != MSGPACK_OBJECT_MAP)
      return GN_EINVAL;
    if ((r = gn_wire_get_bin_exact(o, "id", out[i].id, GN_PK_LEN)) < 0 ||
        (r = gn_wire_get_str(o, "addr", out[i].addr, sizeof(out[i].addr))) < 0)
      return r == GN_ETOOBIG ? GN_EINVAL : r;
    if (!gn_views_addr_valid(out[i].addr))
      return GN_EINVAL;
  }
  *ret_n = a->size;
  return 0;
}

static int get_addr(const msgpack_object *map, const char *key, char *out, bool allow_empty) {
  int r = gn_wire_get_str(map, key, out, GN_VIEWS_ADDR_MAX);
  if (r < 0)
    return GN_EINVAL;
  if (out[0] == 0 ? !allow_empty : !gn_views_addr_valid(out))
    return GN_EINVAL;
  return 0;
}

static size_t shuffle_max(const gn_views *v) {
  return (size_t)v->cfg.shuffle_ka + v->cfg.shuffle_kp + 1;
}

/* A reply slot no pending SHUFFLE_REPLY holds, or MAX_REPLY_PENDING. */
static size_t free_reply_slot(const gn_views *v) {
  bool used[MAX_REPLY_PENDING] = {false};
  for (size_t i = 0; i < v->npend; i++)
    if (v->pend[i].kind == PEND_REPLY)
      used[v->pend[i].slot] = true;
  for (size_t i = 0; i < MAX_REPLY_PENDING; i++)
    if (!used[i])
      return i;
  return MAX_REPLY_PENDING;
}

/* --- messages -------------------------------------------------------------*/

static int on_join(gn_views *v, const uint8_t peer[GN_PK_LEN], const msgpack_object *m, uint64_t now_ms) {
  char addr[GN_VIEWS_ADDR_MAX];
  if (get_addr(m, "addr", addr, false) < 0)
    return GN_EINVAL;
  if (is_self(v, peer, addr))
    return GN_EPERM;
  rate *r = rate_get(v, peer, now_ms);
  if (!r || (r->asked && now_ms < r->ask_ms + v->cfg.join_interval_ms)) {
    v->stats.rate_limited++;
    /* The joiner took us in optimistically: tell it we did not. */
    if (find_member(v->active, v->nactive, peer) < 0)
      send_simple(v, peer, GN_MSG_VIEW_DISCONNECT);
    return GN_EBUSY;
  }
  r->asked = true;
  r->ask_ms = now_ms;
  if (find_member(v->active, v->nactive, peer) >= 0)
    return 0; /* already a neighbour: no new walk */
  if (v->nactive == v->cfg.active_size)
    evict_one(v, peer, now_ms);
  active_add(v, peer, addr, now_ms);
  v->stats.joins++;
  member others[GN_VIEWS_ACTIVE_MAX];
  size_t n = 0;
  for (size_t i = 0; i < v->nactive; i++)
    if (!id_eq(v->active[i].id, peer))
      others[n++] = v->active[i];
  for (size_t i = 0; i < n; i++)
    send_forward_join(v, others[i].id, peer, addr, v->cfg.arwl);
  return 0;
}

static int on_forward_join(gn_views *v, const uint8_t peer[GN_PK_LEN], const msgpack_object *m, uint64_t now_ms) {
  entry e;
  uint32_t ttl;
  if (gn_wire_get_bin_exact(m, "id", e.id, GN_PK_LEN) < 0 || get_addr(m, "addr", e.addr, false) < 0)
    return GN_EINVAL;
  int r = gn_wire_get_u32(m, "ttl", &ttl);
  if (r == GN_ETOOBIG)
    ttl = v->cfg.arwl;
  else if (r < 0)
    return GN_EINVAL;
  if (ttl > v->cfg.arwl)
    ttl = v->cfg.arwl; /* a walk is never longer than ours */
  if (id_eq(e.id, peer))
    return GN_EINVAL;
  if (find_member(v->active, v->nactive, peer) < 0)
    return GN_EPERM;
  rate *rt = rate_get(v, peer, now_ms);
  if (!rt) {
    v->stats.rate_limited++;
    return GN_EBUSY;
  }
  rate_window(v, rt, now_ms);
  if (rt->fjoins >= v->cfg.fjoin_per_peer) {
    v->stats.rate_limited++;
    return GN_EBUSY;
  }
  rt->fjoins++;
  v->stats.forward_joins++;
  if (is_self(v, e.id, e.addr) || find_member(v->active, v->nactive, e.id) >= 0)
    return 0;
  size_t cand[GN_VIEWS_ACTIVE_MAX], n = 0;
  for (size_t i = 0; i < v->nactive; i++)
    if (!id_eq(v->active[i].id, peer) && !id_eq(v->active[i].id, e.id))
      cand[n++] = i;
  if (ttl == 0 || v->nactive <= 1 || n == 0) {
    /* The walk ends here: take the joiner in, with high priority since it
     * joined through the walk and may have room only for us. */
    request_neighbor(v, e.id, e.addr, true, now_ms);
    return 0;
  }
  if (ttl == v->cfg.prwl) {
    uint32_t one = 1;
    passive_add_hearsay(v, &e, NULL, 0, &one, now_ms);
  }
  send_forward_join(v, v->active[cand[rnd_below(v, n)]].id, e.id, e.addr, ttl - 1);
  return 0;
}

/* A session the views hold no member or request for is of no more use to
 * them: the caller may close it (a refused NEIGHBOR would otherwise keep a
 * session per refusal until an idle timeout, and a node whose view stays
 * below its size asks every second). */
static void release_if_unused(gn_views *v, const uint8_t peer[GN_PK_LEN]) {
  if (!v->io.disconnect || find_member(v->active, v->nactive, peer) >= 0)
    return;
  for (size_t i = 0; i < v->npend; i++)
    if (id_eq(v->pend[i].id, peer))
      return;
  v->io.disconnect(v->io.ud, peer);
}

static int on_neighbor(gn_views *v, const uint8_t peer[GN_PK_LEN], const msgpack_object *m, uint64_t now_ms) {
  bool high;
  char addr[GN_VIEWS_ADDR_MAX];
  if (gn_wire_get_bool(m, "high", &high) < 0 || get_addr(m, "addr", addr, true) < 0)
    return GN_EINVAL;
  if (is_self(v, peer, addr))
    return GN_EPERM;
  rate *r = rate_get(v, peer, now_ms);
  if (!r || (r->asked && now_ms < r->ask_ms + v->cfg.join_interval_ms)) {
    v->stats.rate_limited++;
    /* Answered all the same, so an honest requester moves on at once; a
     * member already active is told it is. */
    bool member = find_member(v->active, v->nactive, peer) >= 0;
    if (!member)
      v->stats.neighbor_refused++;
    send_neighbor_reply(v, peer, member);
    release_if_unused(v, peer);
    return GN_EBUSY;
  }
  r->asked = true;
  r->ask_ms = now_ms;
  bool accept = find_member(v->active, v->nactive, peer) >= 0 || v->nactive < v->cfg.active_size || high;
  if (accept && find_member(v->active, v->nactive, peer) < 0) {
    if (v->nactive == v->cfg.active_size)
      evict_one(v, peer, now_ms);
    active_add(v, peer, addr, now_ms);
  }
  if (accept)
    v->stats.neighbor_accepted++;
  else
    v->stats.neighbor_refused++;
  send_neighbor_reply(v, peer, accept);
  if (!accept)
    release_if_unused(v, peer);
  return 0;
}

static int on_neighbor_reply(gn_views *v, const uint8_t peer[GN_PK_LEN], const msgpack_object *m, uint64_t now_ms) {
  bool accept;
  if (gn_wire_get_bool(m, "accept", &accept) < 0)
    return GN_EINVAL;
  int pi = find_pending(v, peer, PEND_NEIGHBOR);
  if (pi < 0 || v->pend[pi].dialling) {
    if (accept && find_member(v->active, v->nactive, peer) < 0)
      send_simple(v, peer, GN_MSG_VIEW_DISCONNECT); /* it took us in; we no longer want it */
    return find_member(v->active, v->nactive, peer) >= 0 ? 0 : GN_ESTATE;
  }
  pending p = v->pend[pi];
  pending_remove(v, (size_t)pi);
  if (!accept) {
    neighbor_failed(v, peer, p.addr, false, now_ms);
    release_if_unused(v, peer);
    return 0;
  }
  if (find_member(v->active, v->nactive, peer) >= 0)
    return 0;
  if (v->nactive == v->cfg.active_size) {
    if (!p.high) {
      /* Filled meanwhile by JOINs or NEIGHBORs from others. */
      send_simple(v, peer, GN_MSG_VIEW_DISCONNECT);
      if (v->io.disconnect)
        v->io.disconnect(v->io.ud, peer);
      passive_add_verified(v, peer, p.addr, now_ms + v->cfg.backoff_ms, 0, now_ms);
      return 0;
    }
    evict_one(v, peer, now_ms);
  }
  active_add(v, peer, p.addr, now_ms);
  return 0;
}

static int on_disconnect(gn_views *v, const uint8_t peer[GN_PK_LEN], uint64_t now_ms) {
  int i = find_member(v->active, v->nactive, peer);
  if (i < 0)
    return 0;
  member mb = v->active[i];
  active_remove_at(v, (size_t)i, now_ms);
  if (v->io.disconnect)
    v->io.disconnect(v->io.ud, peer);
  passive_add_verified(v, mb.id, mb.addr, now_ms + v->cfg.backoff_ms, held_ms(&mb, now_ms), now_ms);
  v->next_fill_ms = now_ms;
  return 0;
}

/* Merges entries into the passive view, each id and address once. */
static void merge(gn_views *v, const entry *e, size_t n, const entry *prefer, size_t nprefer, uint64_t now_ms) {
  uint32_t evict_left = v->cfg.shuffle_kp;
  for (size_t i = 0; i < n; i++) {
    bool dup = false;
    for (size_t j = 0; j < i && !dup; j++)
      dup = id_eq(e[j].id, e[i].id) || strcmp(e[j].addr, e[i].addr) == 0;
    if (!dup)
      passive_add_hearsay(v, &e[i], prefer, nprefer, &evict_left, now_ms);
  }
}

/* A sample of up to n passive entries, none of them for skip (may be NULL). */
static size_t sample_passive(gn_views *v, size_t n, const uint8_t *skip, entry *out) {
  size_t idx[GN_VIEWS_PASSIVE_MAX], cnt = 0, k = 0;
  for (size_t i = 0; i < v->npassive; i++)
    if (!skip || !id_eq(v->passive[i].id, skip))
      idx[cnt++] = i;
  while (k < n && cnt) {
    size_t j = rnd_below(v, cnt);
    memcpy(out[k].id, v->passive[idx[j]].id, GN_PK_LEN);
    snprintf(out[k].addr, sizeof(out[k].addr), "%s", v->passive[idx[j]].addr);
    k++;
    idx[j] = idx[--cnt];
  }
  return k;
}

static int on_shuffle(gn_views *v, const uint8_t peer[GN_PK_LEN], const msgpack_object *m, uint64_t now_ms) {
  uint8_t origin[GN_PK_LEN];
  char oaddr[GN_VIEWS_ADDR_MAX];
  uint32_t ttl;
  uint64_t nonce;
  entry e[GN_VIEWS_SHUFFLE_MAX];
  size_t n = 0;
  int r = get_entries(m, shuffle_max(v), e, &n);
  if (r < 0)
    return r;
  if (gn_wire_get_bin_exact(m, "origin", origin, GN_PK_LEN) < 0 || get_addr(m, "addr", oaddr, false) < 0 ||
      gn_wire_get_u64(m, "nonce", &nonce) < 0)
    return GN_EINVAL;
  r = gn_wire_get_u32(m, "ttl", &ttl);
  if (r == GN_ETOOBIG)
    ttl = v->cfg.shuffle_ttl;
  else if (r < 0)
    return GN_EINVAL;
  if (ttl > v->cfg.shuffle_ttl)
    ttl = v->cfg.shuffle_ttl;
  if (find_member(v->active, v->nactive, peer) < 0)
    return GN_EPERM; /* walks travel over active links only */
  rate *rt = rate_get(v, peer, now_ms);
  if (!rt) {
    v->stats.rate_limited++;
    return GN_EBUSY;
  }
  rate_window(v, rt, now_ms);
  if (rt->shuffles >= v->cfg.shuffle_per_peer) {
    v->stats.rate_limited++;
    return GN_EBUSY;
  }
  rt->shuffles++;
  if (is_self(v, origin, oaddr))
    return 0; /* our own walk came back */
  ttl = ttl ? ttl - 1 : 0;
  size_t cand[GN_VIEWS_ACTIVE_MAX], nc = 0;
  for (size_t i = 0; i < v->nactive; i++)
    if (!id_eq(v->active[i].id, peer) && !id_eq(v->active[i].id, origin))
      cand[nc++] = i;
  if (ttl > 0 && v->nactive > 1 && nc > 0) {
    send_shuffle(v, v->active[cand[rnd_below(v, nc)]].id, origin, oaddr, ttl, nonce, e, n);
    return 0;
  }
  /* The walk ends here: answer the origin with as many of ours, then keep
   * theirs in place of the ones we gave away. */
  v->stats.shuffles_taken++;
  entry reply[GN_VIEWS_SHUFFLE_MAX];
  size_t nr = sample_passive(v, n, origin, reply);
  size_t slot = free_reply_slot(v);
  if (send_shuffle_reply(v, origin, nonce, reply, nr) < 0 && slot < MAX_REPLY_PENDING &&
      find_pending(v, origin, PEND_REPLY) < 0) {
    pending *p = pending_new(v, origin, oaddr, PEND_REPLY, now_ms);
    if (p) {
      p->dialling = true;
      p->nonce = nonce;
      p->slot = slot;
      p->nentries = nr;
      memcpy(&v->replies[slot * shuffle_max(v)], reply, nr * sizeof(reply[0]));
      dial(v, origin, oaddr);
    }
  }
  merge(v, e, n, reply, nr, now_ms);
  return 0;
}

static int on_shuffle_reply(gn_views *v, const uint8_t peer[GN_PK_LEN], const msgpack_object *m, uint64_t now_ms) {
  (void)peer;
  uint64_t nonce;
  entry e[GN_VIEWS_SHUFFLE_MAX];
  size_t n = 0;
  int r = get_entries(m, shuffle_max(v), e, &n);
  if (r < 0)
    return r;
  if (gn_wire_get_u64(m, "nonce", &nonce) < 0)
    return GN_EINVAL;
  if (!v->shuffle_on || nonce != v->shuffle_nonce || now_ms > v->shuffle_deadline_ms)
    return GN_ESTATE;
  v->shuffle_on = false;
  merge(v, e, n, v->shuffle_sent, v->shuffle_nsent, now_ms);
  return 0;
}

int gn_views_on_message(gn_views *v, const uint8_t peer[GN_PK_LEN], uint32_t type, const uint8_t *body, size_t len,
                        uint64_t now_ms) {
  if (type < GN_MSG_VIEW_JOIN || type > GN_MSG_VIEW_SHUFFLE_REPLY)
    return GN_ENOTFOUND;
  v->stats.recv_msgs++;
  int r;
  gn_wire_doc doc;
  bool have_doc = false;
  if (!peer || (len && !body)) {
    r = GN_EINVAL;
    goto out;
  }
  if (id_eq(peer, v->self)) {
    r = GN_EPERM;
    goto out;
  }
  if (len > GN_VIEWS_BODY_MAX) {
    r = GN_ETOOBIG;
    goto out;
  }
  if ((r = gn_wire_decode(body, len, &doc)) < 0)
    goto out;
  have_doc = true;
  if (doc.root->type != MSGPACK_OBJECT_MAP) {
    r = GN_EINVAL;
    goto out;
  }
  switch (type) {
  case GN_MSG_VIEW_JOIN:
    r = on_join(v, peer, doc.root, now_ms);
    break;
  case GN_MSG_VIEW_FORWARD_JOIN:
    r = on_forward_join(v, peer, doc.root, now_ms);
    break;
  case GN_MSG_VIEW_NEIGHBOR:
    r = on_neighbor(v, peer, doc.root, now_ms);
    break;
  case GN_MSG_VIEW_NEIGHBOR_REPLY:
    r = on_neighbor_reply(v, peer, doc.root, now_ms);
    break;
  case GN_MSG_VIEW_DISCONNECT:
    r = on_disconnect(v, peer, now_ms);
    break;
  case GN_MSG_VIEW_SHUFFLE:
    r = on_shuffle(v, peer, doc.root, now_ms);
    break;
  default:
    r = on_shuffle_reply(v, peer, doc.root, now_ms);
    break;
  }
out:
  if (have_doc)
    gn_wire_doc_done(&doc);
  if (r < 0)
    v->stats.recv_bad++;
  return r;
}

/* --- sessions and timers --------------------------------------------------*/

void gn_views_peer_up(gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr, uint64_t now_ms) {
  if (!id || id_eq(id, v->self))
    return;
  /* The session's advertised address replaces what a view held for it, if no
   * other peer holds that address (only for peers in the views: a session
   * from anyone else changes nothing here). */
  bool known = find_member(v->active, v->nactive, id) >= 0 || find_member(v->passive, v->npassive, id) >= 0;
  bool addr_ok = known && addr && gn_views_addr_valid(addr) && !is_self(v, id, addr) && addr_claim(v, id, addr);
  int a = find_member(v->active, v->nactive, id);
  if (a >= 0 && addr_ok)
    snprintf(v->active[a].addr, sizeof(v->active[a].addr), "%s", addr);
  int p = find_member(v->passive, v->npassive, id);
  if (p >= 0) {
    v->passive[p].verified = true;
    if (addr_ok)
      snprintf(v->passive[p].addr, sizeof(v->passive[p].addr), "%s", addr);
  }
  /* Take out what waited for this session first: sending may queue more. */
  pending ready[GN_VIEWS_PENDING_MAX];
  size_t nready = 0;
  for (size_t i = 0; i < v->npend;) {
    if (v->pend[i].dialling && id_eq(v->pend[i].id, id)) {
      ready[nready++] = v->pend[i];
      pending_remove(v, i);
    } else {
      i++;
    }
  }
  for (size_t i = 0; i < nready; i++) {
    pending *pd = &ready[i];
    if (pd->kind == PEND_NEIGHBOR) {
      if (send_neighbor(v, id, pd->high) == 0 && v->npend < GN_VIEWS_PENDING_MAX) {
        pd->dialling = false;
        pd->deadline_ms = now_ms + v->cfg.request_timeout_ms;
        v->pend[v->npend++] = *pd;
      }
    } else if (pd->kind == PEND_JOIN) {
      if (send_join(v, id) == 0)
        joined_contact(v, id, pd->addr, now_ms);
    } else {
      send_shuffle_reply(v, id, pd->nonce, &v->replies[pd->slot * shuffle_max(v)], pd->nentries);
      if (v->io.disconnect && find_member(v->active, v->nactive, id) < 0 && find_pending(v, id, PEND_NEIGHBOR) < 0)
        v->io.disconnect(v->io.ud, id); /* dialled only for the reply */
    }
  }
}

void gn_views_peer_down(gn_views *v, const uint8_t id[GN_PK_LEN], uint64_t now_ms) {
  if (!id)
    return;
  int a = find_member(v->active, v->nactive, id);
  if (a >= 0) {
    active_remove_at(v, (size_t)a, now_ms);
    v->next_fill_ms = now_ms;
  }
  for (size_t i = 0; i < v->npend;) {
    pending *pd = &v->pend[i];
    if (pd->kind == PEND_NEIGHBOR && !pd->dialling && id_eq(pd->id, id)) {
      pending p = *pd;
      pending_remove(v, i);
      neighbor_failed(v, p.id, p.addr, false, now_ms);
      continue;
    }
    i++;
  }
}

/* Starts one SHUFFLE: ourselves, ka active and kp passive entries, to a
 * random active member. */
static void start_shuffle(gn_views *v, uint64_t now_ms) {
  if (!v->nactive)
    return;
  entry e[GN_VIEWS_SHUFFLE_MAX];
  size_t n = 0;
  if (v->self_addr[0]) {
    memcpy(e[n].id, v->self, GN_PK_LEN);
    snprintf(e[n].addr, sizeof(e[n].addr), "%s", v->self_addr);
    n++;
  }
  size_t target = rnd_below(v, v->nactive);
  size_t idx[GN_VIEWS_ACTIVE_MAX], cnt = 0;
  for (size_t i = 0; i < v->nactive; i++)
    if (i != target && v->active[i].addr[0])
      idx[cnt++] = i;
  for (uint32_t k = 0; k < v->cfg.shuffle_ka && cnt; k++) {
    size_t j = rnd_below(v, cnt);
    memcpy(e[n].id, v->active[idx[j]].id, GN_PK_LEN);
    snprintf(e[n].addr, sizeof(e[n].addr), "%s", v->active[idx[j]].addr);
    n++;
    idx[j] = idx[--cnt];
  }
  size_t first_passive = n;
  n += sample_passive(v, v->cfg.shuffle_kp, v->active[target].id, e + n);
  uint64_t nonce = rnd(v);
  if (send_shuffle(v, v->active[target].id, v->self, v->self_addr, v->cfg.shuffle_ttl, nonce, e, n) < 0)
    return;
  v->stats.shuffles_sent++;
  v->shuffle_on = true;
  v->shuffle_nonce = nonce;
  v->shuffle_deadline_ms = now_ms + v->cfg.shuffle_interval_ms;
  v->shuffle_nsent = n - first_passive;
  memcpy(v->shuffle_sent, e + first_passive, v->shuffle_nsent * sizeof(e[0]));
}

static void fill_active(gn_views *v, uint64_t now_ms) {
  uint32_t started = 0;
  while (started < v->cfg.fill_burst && v->nactive + count_pending(v, PEND_NEIGHBOR) < v->cfg.active_size) {
    size_t idx[GN_VIEWS_PASSIVE_MAX], cnt = 0;
    for (size_t i = 0; i < v->npassive; i++)
      if (v->passive[i].retry_ms <= now_ms && find_pending(v, v->passive[i].id, PEND_NEIGHBOR) < 0)
        idx[cnt++] = i;
    if (!cnt)
      break;
    member *m = &v->passive[idx[rnd_below(v, cnt)]];
    if (!request_neighbor(v, m->id, m->addr, v->nactive <= 1, now_ms))
      break;
    v->stats.promotions++;
    started++;
  }
}

void gn_views_tick(gn_views *v, uint64_t now_ms) {
  for (size_t i = 0; i < v->npend;) {
    pending *pd = &v->pend[i];
    if (pd->deadline_ms > now_ms) {
      i++;
      continue;
    }
    pending p = *pd;
    pending_remove(v, i);
    if (p.kind == PEND_NEIGHBOR)
      neighbor_failed(v, p.id, p.addr, p.dialling, now_ms);
  }
  if (v->shuffle_on && now_ms > v->shuffle_deadline_ms)
    v->shuffle_on = false;
  rate_expire(v, now_ms);
  if (now_ms >= v->next_shuffle_ms) {
    start_shuffle(v, now_ms);
    v->next_shuffle_ms = now_ms + v->cfg.shuffle_interval_ms - v->cfg.shuffle_interval_ms / 10 +
                         rnd_below(v, v->cfg.shuffle_interval_ms / 5 + 1);
  }
  if (v->nactive < v->cfg.active_size && now_ms >= v->next_fill_ms) {
    fill_active(v, now_ms);
    v->next_fill_ms = now_ms + v->cfg.fill_interval_ms;
  }
  if (!v->nactive && v->ncontacts && now_ms >= v->next_rejoin_ms) {
    const entry *c = &v->contacts[rnd_below(v, v->ncontacts)];
    join_contact(v, c->id, c->addr, now_ms);
    v->next_rejoin_ms = now_ms + v->cfg.rejoin_interval_ms;
  }
}

uint64_t gn_views_next_deadline_ms(const gn_views *v) {
  uint64_t d = v->next_shuffle_ms;
  for (size_t i = 0; i < v->npend; i++)
    if (v->pend[i].deadline_ms < d)
      d = v->pend[i].deadline_ms;
  if (v->nactive < v->cfg.active_size && v->npassive && v->next_fill_ms < d)
    d = v->next_fill_ms;
  if (!v->nactive && v->ncontacts && v->next_rejoin_ms < d)
    d = v->next_rejoin_ms;
  return d;
}

/* --- setup and queries ----------------------------------------------------*/

int gn_views_new(const uint8_t self_id[GN_PK_LEN], const char *self_addr, const gn_views_config *cfg,
                 const gn_views_io *io, uint64_t seed, uint64_t now_ms, gn_views **ret_v) {
  gn_views_config c;
  if (cfg)
    c = *cfg;
  else
    gn_views_config_default(&c);
  if (!self_id || !io || !io->send || !io->connect || !ret_v || !self_addr ||
      (self_addr[0] && !gn_views_addr_valid(self_addr)))
    return GN_EINVAL;
  if (c.active_size == 0 || c.active_size > GN_VIEWS_ACTIVE_MAX || c.passive_size == 0 ||
      c.passive_size > GN_VIEWS_PASSIVE_MAX || c.prwl > c.arwl || c.arwl > 64 || c.shuffle_ttl > 64 ||
      (size_t)c.shuffle_ka + c.shuffle_kp + 1 > GN_VIEWS_SHUFFLE_MAX || c.shuffle_interval_ms == 0 ||
      c.fill_burst == 0 || c.backoff_max_ms < c.backoff_ms)
    return GN_EINVAL;
  size_t smax = (size_t)c.shuffle_ka + c.shuffle_kp + 1;
  gn_views *v = calloc(1, sizeof(*v));
  if (!v)
    return GN_ENOMEM;
  v->active = calloc(c.active_size, sizeof(member));
  v->passive = calloc(c.passive_size, sizeof(member));
  v->replies = calloc(MAX_REPLY_PENDING * smax, sizeof(entry));
  v->shuffle_sent = calloc(smax, sizeof(entry));
  if (!v->active || !v->passive || !v->replies || !v->shuffle_sent) {
    gn_views_free(v);
    return GN_ENOMEM;
  }
  memcpy(v->self, self_id, GN_PK_LEN);
  snprintf(v->self_addr, sizeof(v->self_addr), "%s", self_addr);
  v->cfg = c;
  v->io = *io;
  v->rng = seed;
  v->repl_win_ms = now_ms;
  /* The first shuffle comes after a random part of an interval, so nodes
   * started together do not shuffle in step. */
  v->next_shuffle_ms = now_ms + rnd_below(v, c.shuffle_interval_ms) + 1;
  v->next_fill_ms = now_ms;
  v->next_rejoin_ms = now_ms + c.rejoin_interval_ms;
  *ret_v = v;
  return 0;
}

gn_views *gn_views_free(gn_views *v) {
  if (v) {
    free(v->active);
    free(v->passive);
    free(v->replies);
    free(v->shuffle_sent);
    free(v->rates);
    free(v);
  }
  return NULL;
}

int gn_views_add_contact(gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr, uint64_t now_ms) {
  if (!id || !gn_views_addr_valid(addr) || is_self(v, id, addr))
    return GN_EINVAL;
  int r = 0;
  size_t i = 0;
  while (i < v->ncontacts && !id_eq(v->contacts[i].id, id))
    i++;
  if (i == v->ncontacts) {
    if (v->ncontacts < GN_VIEWS_CONTACTS_MAX) {
      memcpy(v->contacts[i].id, id, GN_PK_LEN);
      v->ncontacts++;
    } else {
      r = GN_ETOOBIG;
    }
  }
  if (i < v->ncontacts)
    snprintf(v->contacts[i].addr, sizeof(v->contacts[i].addr), "%s", addr);
  join_contact(v, id, addr, now_ms);
  v->next_rejoin_ms = now_ms + v->cfg.rejoin_interval_ms;
  return r;
}

int gn_views_add_passive(gn_views *v, const uint8_t id[GN_PK_LEN], const char *addr, uint64_t now_ms) {
  if (!id || !gn_views_addr_valid(addr) || is_self(v, id, addr))
    return GN_EINVAL;
  if (find_member(v->active, v->nactive, id) >= 0 || find_member(v->passive, v->npassive, id) >= 0)
    return GN_EEXIST;
  entry e;
  memcpy(e.id, id, GN_PK_LEN);
  snprintf(e.addr, sizeof(e.addr), "%s", addr);
  uint32_t one = 1;
  return passive_add_hearsay(v, &e, NULL, 0, &one, now_ms) ? 0 : GN_EBUSY;
}

static size_t copy_members(const member *m, size_t n, gn_views_peer *out, size_t cap) {
  for (size_t i = 0; i < n && i < cap; i++) {
    memcpy(out[i].id, m[i].id, GN_PK_LEN);
    snprintf(out[i].addr, sizeof(out[i].addr), "%s", m[i].addr);
    out[i].verified = m[i].verified;
  }
  return n;
}

size_t gn_views_active(const gn_views *v, gn_views_peer *out, size_t cap) {
  return copy_members(v->active, v->nactive, out, cap);
}

size_t gn_views_passive(const gn_views *v, gn_views_peer *out, size_t cap) {
  return copy_members(v->passive, v->npassive, out, cap);
}

size_t gn_views_active_count(const gn_views *v) {
  return v->nactive;
}

size_t gn_views_passive_count(const gn_views *v) {
  return v->npassive;
}

size_t gn_views_pending_count(const gn_views *v) {
  return v->npend;
}

size_t gn_views_rate_count(const gn_views *v) {
  return v->nrates;
}

bool gn_views_is_active(const gn_views *v, const uint8_t id[GN_PK_LEN]) {
  return find_member(v->active, v->nactive, id) >= 0;
}

bool gn_views_is_passive(const gn_views *v, const uint8_t id[GN_PK_LEN]) {
  return find_member(v->passive, v->npassive, id) >= 0;
}

bool gn_views_is_contact(const gn_views *v, const uint8_t id[GN_PK_LEN]) {
  for (size_t i = 0; v && id && i < v->ncontacts; i++)
    if (id_eq(v->contacts[i].id, id))
      return true;
  return false;
}

void gn_views_stats_get(const gn_views *v, gn_views_stats *ret) {
  *ret = v->stats;
}
