/* Tests for the membership state machine (p2p/swim.c): N instances driven
 * in-process through a small deterministic fake network (a queue of
 * datagrams with injected loss, delay and partitions), and hostile bodies
 * written by hand. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/swim.h>
#include <gpunet/wire.h>

#include <stdio.h>

#define MAXN 32
#define MAXEV 4096

/* --- the fake network -------------------------------------------------------*/

typedef struct pkt {
  uint64_t at;
  uint32_t from, to, type;
  size_t len;
  uint8_t *body;
} pkt;

typedef struct tnet tnet;

typedef struct tnode {
  tnet *net;
  uint32_t idx;
  gn_swim *s;
  uint8_t id[GN_PK_LEN];
  char addr[GN_SWIM_ADDR_MAX];
  bool up;
  bool drop_in; /* its inbound datagrams are lost */
  bool side;    /* which side of a partition */
  uint64_t last_tick;
} tnode;

typedef struct tev {
  uint64_t at;
  uint32_t obs, target; /* target MAXN when not one of ours */
  gn_swim_event_kind kind;
  bool local;
  uint32_t inc;
} tev;

/* A datagram sent by a node that a test wants to look at. */
typedef void (*tap_fn)(tnet *net, uint32_t from, const char *to, uint32_t type, const uint8_t *body, size_t len);

struct tnet {
  uint32_t n;
  tnode nodes[MAXN];
  pkt *q;
  size_t qlen, qcap;
  uint64_t now, rng;
  uint32_t loss_permille;
  uint32_t delay_min_ms, delay_max_ms;
  bool partitioned;
  tev ev[MAXEV];
  uint32_t nev;
  tap_fn tap;
  void *tap_ud;
};

static uint64_t rnd(uint64_t *st) {
  uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint32_t node_of_id(const tnet *net, const uint8_t *id) {
  for (uint32_t i = 0; i < net->n; i++)
    if (memcmp(net->nodes[i].id, id, GN_PK_LEN) == 0)
      return i;
  return MAXN;
}

static uint32_t node_of_addr(const tnet *net, const char *addr) {
  for (uint32_t i = 0; i < net->n; i++)
    if (strcmp(net->nodes[i].addr, addr) == 0)
      return i;
  return MAXN;
}

static void on_send(void *ud, const char *addr, uint32_t type, const uint8_t *body, size_t len) {
  tnode *nd = ud;
  tnet *net = nd->net;
  assert_true(len <= 1200);
  if (net->tap)
    net->tap(net, nd->idx, addr, type, body, len);
  uint32_t to = node_of_addr(net, addr);
  /* Both draws are taken for every datagram so a loss rate does not shift
   * the delays of the others. */
  uint64_t u = rnd(&net->rng) % 1000, d = rnd(&net->rng);
  if (to == MAXN || u < net->loss_permille || !nd->up)
    return;
  if (net->partitioned && nd->side != net->nodes[to].side)
    return;
  if (net->qlen == net->qcap) {
    net->qcap = net->qcap ? net->qcap * 2 : 256;
    net->q = realloc(net->q, net->qcap * sizeof *net->q);
    assert_non_null(net->q);
  }
  uint32_t span = net->delay_max_ms - net->delay_min_ms + 1;
  pkt *p = &net->q[net->qlen++];
  p->at = net->now + net->delay_min_ms + d % span;
  p->from = nd->idx;
  p->to = to;
  p->type = type;
  p->len = len;
  p->body = malloc(len ? len : 1);
  assert_non_null(p->body);
  memcpy(p->body, body, len);
}

static void on_event(void *ud, const gn_swim_event *e) {
  tnode *nd = ud;
  tnet *net = nd->net;
  if (net->nev == MAXEV)
    return;
  tev *t = &net->ev[net->nev++];
  t->at = net->now;
  t->obs = nd->idx;
  t->target = node_of_id(net, e->member.id);
  t->kind = e->kind;
  t->local = e->local;
  t->inc = e->member.incarnation;
}

static void net_init(tnet *net, uint32_t n, const gn_swim_config *cfg, uint64_t seed) {
  memset(net, 0, sizeof *net);
  net->n = n;
  net->rng = seed;
  net->delay_min_ms = 1;
  net->delay_max_ms = 20;
  for (uint32_t i = 0; i < n; i++) {
    tnode *nd = &net->nodes[i];
    nd->net = net;
    nd->idx = i;
    nd->up = true;
    for (int j = 0; j < GN_PK_LEN; j += 8) {
      uint64_t v = rnd(&net->rng);
      memcpy(nd->id + j, &v, 8);
    }
    snprintf(nd->addr, sizeof nd->addr, "10.0.%u.%u:7946", i / 200, i % 200 + 1);
    gn_swim_io io = {on_send, on_event, nd};
    assert_int_equal(gn_swim_new(nd->id, nd->addr, cfg, &io, seed * 1000 + i, 0, &nd->s), 0);
  }
}

static void net_done(tnet *net) {
  for (uint32_t i = 0; i < net->n; i++)
    net->nodes[i].s = gn_swim_free(net->nodes[i].s);
  for (size_t i = 0; i < net->qlen; i++)
    free(net->q[i].body);
  free(net->q);
}

/* Every node learns of node 0 only. */
static void net_join_all(tnet *net) {
  for (uint32_t i = 1; i < net->n; i++)
    assert_int_equal(gn_swim_add(net->nodes[i].s, net->nodes[0].id, net->nodes[0].addr, net->now), 0);
}

static uint64_t node_deadline(const tnode *nd) {
  uint64_t d = gn_swim_next_deadline_ms(nd->s);
  return d <= nd->last_tick ? nd->last_tick + 1 : d;
}

static void net_run(tnet *net, uint64_t until) {
  for (;;) {
    uint64_t t = UINT64_MAX;
    for (size_t i = 0; i < net->qlen; i++)
      if (net->q[i].at < t)
        t = net->q[i].at;
    for (uint32_t i = 0; i < net->n; i++)
      if (net->nodes[i].up) {
        uint64_t d = node_deadline(&net->nodes[i]);
        if (d < t)
          t = d;
      }
    if (t > until)
      break;
    if (t > net->now)
      net->now = t;
    /* Datagrams due now, in the order they were sent. */
    for (size_t i = 0; i < net->qlen;) {
      pkt p = net->q[i];
      if (p.at > net->now) {
        i++;
        continue;
      }
      memmove(&net->q[i], &net->q[i + 1], (net->qlen - i - 1) * sizeof p);
      net->qlen--;
      tnode *to = &net->nodes[p.to];
      if (to->up && !to->drop_in)
        gn_swim_on_datagram(to->s, net->nodes[p.from].addr, net->nodes[p.from].id, p.type, p.body, p.len, net->now);
      free(p.body);
    }
    for (uint32_t i = 0; i < net->n; i++) {
      tnode *nd = &net->nodes[i];
      if (nd->up && node_deadline(nd) <= net->now) {
        nd->last_tick = net->now;
        gn_swim_tick(nd->s, net->now);
      }
    }
  }
  net->now = until;
}

static gn_swim_state state_at(const tnet *net, uint32_t obs, uint32_t target) {
  gn_swim_member m;
  if (gn_swim_get(net->nodes[obs].s, net->nodes[target].id, &m) < 0)
    return (gn_swim_state)-1;
  return m.state;
}

static uint32_t count_events(const tnet *net, gn_swim_event_kind kind, uint32_t target) {
  uint32_t c = 0;
  for (uint32_t i = 0; i < net->nev; i++)
    if (net->ev[i].kind == kind && (target == MAXN || net->ev[i].target == target))
      c++;
  return c;
}

static bool all_alive(const tnet *net) {
  for (uint32_t i = 0; i < net->n; i++)
    if (gn_swim_count(net->nodes[i].s, GN_SWIM_ALIVE) != net->n - 1)
      return false;
  return true;
}

/* --- bodies written by hand -------------------------------------------------*/

typedef struct tupd {
  const uint8_t *id;
  const char *addr;
  uint32_t inc, st;
  const uint8_t *by;
  uint32_t hop; /* 0: none sent */
} tupd;

typedef struct tbody {
  const uint8_t *from;
  uint32_t inc;
  const char *addr;
  uint64_t seq;
  const uint8_t *to, *target;
  const char *taddr;
  const tupd *g;
  uint32_t ng;
} tbody;

static void put_upd(gn_wire_writer *w, const tupd *u) {
  gn_wire_put_map(w, 4 + (u->by ? 1 : 0) + (u->hop ? 1 : 0));
  gn_wire_put_str(w, "id");
  gn_wire_put_bin(w, u->id, GN_PK_LEN);
  gn_wire_put_str(w, "addr");
  gn_wire_put_str(w, u->addr);
  gn_wire_put_str(w, "inc");
  gn_wire_put_u64(w, u->inc);
  gn_wire_put_str(w, "st");
  gn_wire_put_u64(w, u->st);
  if (u->by) {
    gn_wire_put_str(w, "by");
    gn_wire_put_bin(w, u->by, GN_PK_LEN);
  }
  if (u->hop) {
    gn_wire_put_str(w, "hop");
    gn_wire_put_u64(w, u->hop);
  }
}

static void build(const tbody *b, gn_buf *out) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 4 + !!b->to + !!b->target + !!b->taddr + !!b->ng);
  gn_wire_put_str(&w, "from");
  gn_wire_put_bin(&w, b->from, GN_PK_LEN);
  gn_wire_put_str(&w, "inc");
  gn_wire_put_u64(&w, b->inc);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, b->addr);
  gn_wire_put_str(&w, "seq");
  gn_wire_put_u64(&w, b->seq);
  if (b->to) {
    gn_wire_put_str(&w, "to");
    gn_wire_put_bin(&w, b->to, GN_PK_LEN);
  }
  if (b->target) {
    gn_wire_put_str(&w, "target");
    gn_wire_put_bin(&w, b->target, GN_PK_LEN);
  }
  if (b->taddr) {
    gn_wire_put_str(&w, "taddr");
    gn_wire_put_str(&w, b->taddr);
  }
  if (b->ng) {
    gn_wire_put_str(&w, "g");
    gn_wire_put_array(&w, b->ng);
    for (uint32_t i = 0; i < b->ng; i++)
      put_upd(&w, &b->g[i]);
  }
  out->len = 0;
  assert_int_equal(gn_wire_writer_take(&w, out), 0);
  gn_wire_writer_done(&w);
}

/* Decoded view of a body a node sent, for looking at its updates. */
typedef struct seen {
  uint32_t type;
  char to[GN_SWIM_ADDR_MAX];
  uint8_t body[1200];
  size_t len;
} seen;

static int upd_count(const uint8_t *body, size_t len) {
  gn_wire_doc doc;
  if (gn_wire_decode(body, len, &doc) < 0)
    return -1;
  const msgpack_object_array *g;
  int n = gn_wire_get_array(doc.root, "g", 1000, &g) < 0 ? 0 : (int)g->size;
  gn_wire_doc_done(&doc);
  return n;
}

/* Reads update i of a body: its id, state and incarnation. */
static bool upd_at(const uint8_t *body, size_t len, uint32_t i, uint8_t id[GN_PK_LEN], uint32_t *st, uint32_t *inc) {
  gn_wire_doc doc;
  bool ok = false;
  if (gn_wire_decode(body, len, &doc) < 0)
    return false;
  const msgpack_object_array *g;
  if (gn_wire_get_array(doc.root, "g", 1000, &g) == 0 && i < g->size) {
    uint64_t s64;
    ok = gn_wire_get_bin_exact(&g->ptr[i], "id", id, GN_PK_LEN) == 0 && gn_wire_get_u64(&g->ptr[i], "st", &s64) == 0 &&
         gn_wire_get_u32(&g->ptr[i], "inc", inc) == 0;
    *st = (uint32_t)s64;
  }
  gn_wire_doc_done(&doc);
  return ok;
}

static bool body_has(const uint8_t *body, size_t len, const uint8_t *id, uint32_t st) {
  int n = upd_count(body, len);
  for (int i = 0; i < n; i++) {
    uint8_t uid[GN_PK_LEN];
    uint32_t ust, uinc;
    if (upd_at(body, len, (uint32_t)i, uid, &ust, &uinc) && memcmp(uid, id, GN_PK_LEN) == 0 && ust == st)
      return true;
  }
  return false;
}

static uint64_t body_seq(const uint8_t *body, size_t len) {
  gn_wire_doc doc;
  uint64_t seq = 0;
  if (gn_wire_decode(body, len, &doc) == 0) {
    gn_wire_get_u64(doc.root, "seq", &seq);
    gn_wire_doc_done(&doc);
  }
  return seq;
}

/* A single instance whose sends are captured. */
typedef struct solo {
  gn_swim *s;
  uint8_t id[GN_PK_LEN];
  seen out[256];
  uint32_t nout;
  uint32_t nev;
  gn_swim_event ev[256];
} solo;

static void solo_send(void *ud, const char *addr, uint32_t type, const uint8_t *body, size_t len) {
  solo *so = ud;
  if (so->nout == 256)
    return;
  seen *x = &so->out[so->nout++];
  x->type = type;
  snprintf(x->to, sizeof x->to, "%s", addr);
  assert_true(len <= sizeof x->body);
  memcpy(x->body, body, len);
  x->len = len;
}

static void solo_event(void *ud, const gn_swim_event *ev) {
  solo *so = ud;
  if (so->nev < 256)
    so->ev[so->nev++] = *ev;
}

static void mkid(uint8_t id[GN_PK_LEN], uint32_t n) {
  memset(id, 0, GN_PK_LEN);
  id[0] = 0xee;
  memcpy(id + 1, &n, sizeof n);
}

#define SOLO_ADDR "10.9.0.1:7946"

/* A lone instance, id n (0 unless it stands in for a peer), at addr. */
static void solo_new_as(solo *so, const gn_swim_config *cfg, uint64_t seed, uint32_t n, const char *addr) {
  memset(so, 0, sizeof *so);
  mkid(so->id, n);
  gn_swim_io io = {solo_send, solo_event, so};
  assert_int_equal(gn_swim_new(so->id, addr, cfg, &io, seed, 0, &so->s), 0);
}

static void solo_new(solo *so, const gn_swim_config *cfg, uint64_t seed) {
  solo_new_as(so, cfg, seed, 0, SOLO_ADDR);
}

static char *peer_addr(uint32_t i, char buf[GN_SWIM_ADDR_MAX]) {
  snprintf(buf, GN_SWIM_ADDR_MAX, "10.8.%u.%u:7946", (i >> 8) & 0xff, i & 0xff);
  return buf;
}

/* --- behaviour --------------------------------------------------------------*/

static void test_join_converges(void **state) {
  (void)state;
  tnet *net = calloc(1, sizeof *net);
  net_init(net, 16, NULL, 1);
  net_join_all(net);
  net_run(net, 30000);
  assert_true(all_alive(net));
  assert_int_equal(count_events(net, GN_SWIM_EV_SUSPECT, MAXN), 0);
  assert_int_equal(count_events(net, GN_SWIM_EV_JOIN, MAXN), 16 * 15);
  net_done(net);
  free(net);
}

/* The bound on detection: a probe round, then the longest suspicion. */
static uint64_t detect_bound(const gn_swim_config *c, uint32_t n) {
  return (uint64_t)n * c->probe_interval_ms * 2 +
         (uint64_t)c->suspicion_alpha * c->suspicion_beta * c->probe_interval_ms * 2;
}

static void test_killed_node_dead_everywhere(void **state) {
  (void)state;
  tnet *net = calloc(1, sizeof *net);
  gn_swim_config cfg;
  gn_swim_config_default(&cfg);
  net_init(net, 12, &cfg, 2);
  net_join_all(net);
  net_run(net, 20000);
  assert_true(all_alive(net));
  uint32_t victim = 5;
  net->nodes[victim].up = false;
  uint64_t t0 = net->now;
  net_run(net, t0 + detect_bound(&cfg, 12));
  for (uint32_t i = 0; i < net->n; i++) {
    if (i == victim)
      continue;
    assert_int_equal(state_at(net, i, victim), GN_SWIM_DEAD);
    assert_int_equal(gn_swim_count(net->nodes[i].s, GN_SWIM_ALIVE), 10);
  }
  /* Someone's own suspicion timed out; the rest may have heard it. */
  bool local = false;
  uint64_t last = 0;
  for (uint32_t i = 0; i < net->nev; i++)
    if (net->ev[i].kind == GN_SWIM_EV_DEAD) {
      assert_int_equal(net->ev[i].target, victim);
      local |= net->ev[i].local;
      last = net->ev[i].at;
    }
  assert_true(local);
  assert_int_equal(count_events(net, GN_SWIM_EV_DEAD, victim), 11);
  /* With confirmations from 10 others, it is far faster than the maximum. */
  assert_true(last - t0 < 12 * cfg.probe_interval_ms + cfg.suspicion_alpha * cfg.suspicion_beta * 1000 / 2);
  net_done(net);
  free(net);
}

/* The time the first event of kind about target happened at obs (0 if none). */
static const tev *find_event(const tnet *net, uint32_t obs, uint32_t target, gn_swim_event_kind kind) {
  for (uint32_t i = 0; i < net->nev; i++)
    if (net->ev[i].obs == obs && net->ev[i].target == target && net->ev[i].kind == kind)
      return &net->ev[i];
  return NULL;
}

static void test_suspected_live_node_refutes_under_loss(void **state) {
  (void)state;
  tnet *net = calloc(1, sizeof *net);
  net_init(net, 10, NULL, 3);
  net_join_all(net);
  net_run(net, 20000);
  assert_true(all_alive(net));
  net->loss_permille = 100;
  net_run(net, 30000);
  /* Node 4 hears nothing for 3 s (the shortest suspicion here is 5 s):
   * the others suspect it. */
  net->nodes[4].drop_in = true;
  net_run(net, 33000);
  net->nodes[4].drop_in = false;
  net_run(net, 120000);
  net->loss_permille = 0;
  net_run(net, 135000);
  bool suspected = false;
  for (uint32_t i = 0; i < net->nev; i++)
    if (net->ev[i].kind == GN_SWIM_EV_SUSPECT && net->ev[i].target == 4 && net->ev[i].at >= 30000 &&
        net->ev[i].at <= 33500)
      suspected = true;
  assert_true(suspected);
  assert_true(count_events(net, GN_SWIM_EV_ALIVE, 4) >= 1);
  assert_true(gn_swim_incarnation(net->nodes[4].s) >= 1);
  /* Under 10 % loss for 90 s, no live node was ever declared dead, and
   * every suspicion was refuted. */
  assert_int_equal(count_events(net, GN_SWIM_EV_DEAD, MAXN), 0);
  assert_true(all_alive(net));
  net_done(net);
  free(net);
}

/* Feeds a PING from peer n (a stranger or member) carrying updates g to so. */
static int solo_ping_from(solo *so, uint32_t n, uint32_t inc, const tupd *g, uint32_t ng, uint64_t now) {
  uint8_t id[GN_PK_LEN];
  char a[GN_SWIM_ADDR_MAX];
  mkid(id, n);
  tbody b = {.from = id, .inc = inc, .addr = peer_addr(n, a), .seq = 1000 + n, .to = so->id, .g = g, .ng = ng};
  gn_buf buf = {0};
  build(&b, &buf);
  int r = gn_swim_on_datagram(so->s, a, id, GN_MSG_SWIM_PING, buf.data, buf.len, now);
  gn_buf_done(&buf);
  return r;
}

static void solo_add_peers(solo *so, uint32_t first, uint32_t count) {
  for (uint32_t i = first; i < first + count; i++) {
    uint8_t id[GN_PK_LEN];
    char a[GN_SWIM_ADDR_MAX];
    mkid(id, i);
    assert_int_equal(gn_swim_add(so->s, id, peer_addr(i, a), 0), 0);
  }
}

/* Ticks so every 10 ms until X (peer 1) is dead; returns when. */
static uint64_t solo_time_to_dead(solo *so, uint64_t from, uint64_t until) {
  uint8_t x[GN_PK_LEN];
  mkid(x, 1);
  for (uint64_t t = from; t <= until; t += 10) {
    gn_swim_tick(so->s, t);
    gn_swim_member m;
    assert_int_equal(gn_swim_get(so->s, x, &m), 0);
    if (m.state == GN_SWIM_DEAD)
      return t;
  }
  return UINT64_MAX;
}

static void test_confirmations_shorten_suspicion(void **state) {
  (void)state;
  solo *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
  uint8_t x[GN_PK_LEN], by[4][GN_PK_LEN];
  char xa[GN_SWIM_ADDR_MAX];
  mkid(x, 1);
  peer_addr(1, xa);
  for (uint32_t i = 0; i < 4; i++)
    mkid(by[i], 2 + i);
  /* n = 9 (8 members and itself): min 4 s, max 24 s, k = 2. */
  solo_new(a, NULL, 7);
  solo_new(b, NULL, 7);
  solo_add_peers(a, 1, 8);
  solo_add_peers(b, 1, 8);
  tupd u = {.id = x, .addr = xa, .inc = 0, .st = GN_SWIM_SUSPECT, .by = by[0]};
  assert_int_equal(solo_ping_from(a, 2, 0, &u, 1, 0), 0);
  assert_int_equal(solo_ping_from(b, 2, 0, &u, 1, 0), 0);
  /* b hears three more, independent accusers at the same incarnation (two
   * count: k = 2); a repeated accuser does not count twice. */
  assert_int_equal(solo_ping_from(b, 2, 0, &u, 1, 0), 0);
  for (uint32_t i = 1; i < 4; i++) {
    u.by = by[i];
    assert_int_equal(solo_ping_from(b, 2 + i, 0, &u, 1, 0), 0);
  }
  uint64_t ta = solo_time_to_dead(a, 0, 60000), tb = solo_time_to_dead(b, 0, 60000);
  assert_true(tb >= 4000 && tb <= 4010);
  /* a's only possible confirmation is its own failed probe of x: at least
   * max - (max - min) ln 2 / ln 3 = 11.4 s. */
  assert_true(ta >= 11300 && ta <= 24010);
  a->s = gn_swim_free(a->s);
  b->s = gn_swim_free(b->s);
  free(a);
  free(b);
}

static void test_local_health_rises_when_slow(void **state) {
  (void)state;
  tnet *net = calloc(1, sizeof *net);
  net_init(net, 8, NULL, 4);
  net_join_all(net);
  net_run(net, 15000);
  assert_true(all_alive(net));
  for (uint32_t i = 0; i < net->n; i++)
    assert_int_equal(gn_swim_health(net->nodes[i].s), 0);
  uint32_t slow = 3;
  gn_swim_stats s0, s1, h0, h1;
  gn_swim_stats_get(net->nodes[slow].s, &s0);
  gn_swim_stats_get(net->nodes[0].s, &h0);
  net->nodes[slow].drop_in = true;
  net_run(net, 35000);
  gn_swim_stats_get(net->nodes[slow].s, &s1);
  gn_swim_stats_get(net->nodes[0].s, &h1);
  assert_true(gn_swim_health(net->nodes[slow].s) >= 4);
  assert_true(gn_swim_health(net->nodes[0].s) <= 1);
  /* The slow node probes, and so suspects, far less often than a healthy
   * one (which probes once a second). */
  assert_true(h1.probes - h0.probes >= 18);
  assert_true(s1.probes - s0.probes <= 7);
  assert_true(s1.suspicions_local - s0.suspicions_local <= 7);
  net_done(net);
  free(net);
}

static void test_buddy_suspect_hears_in_first_ping(void **state) {
  (void)state;
  solo *a = calloc(1, sizeof *a), *x = calloc(1, sizeof *x);
  char xa[GN_SWIM_ADDR_MAX];
  solo_new(a, NULL, 9);
  solo_add_peers(a, 1, 2);
  solo_new_as(x, NULL, 10, 1, peer_addr(1, xa));
  uint8_t by[GN_PK_LEN];
  mkid(by, 2);
  tupd u = {.id = x->id, .addr = xa, .inc = 0, .st = GN_SWIM_SUSPECT, .by = by};
  assert_int_equal(solo_ping_from(a, 2, 0, &u, 1, 0), 0);
  a->nout = 0;
  const seen *ping = NULL;
  for (uint64_t t = 0; t < 5000 && !ping; t += 10) {
    gn_swim_tick(a->s, t);
    for (uint32_t i = 0; i < a->nout && !ping; i++)
      if (a->out[i].type == GN_MSG_SWIM_PING && strcmp(a->out[i].to, xa) == 0)
        ping = &a->out[i];
  }
  assert_non_null(ping);
  uint8_t id[GN_PK_LEN];
  uint32_t st, inc;
  assert_true(upd_at(ping->body, ping->len, 0, id, &st, &inc));
  assert_memory_equal(id, x->id, GN_PK_LEN);
  assert_int_equal(st, GN_SWIM_SUSPECT);
  /* x gets that ping: it refutes at once, and its ack says so. */
  assert_int_equal(gn_swim_on_datagram(x->s, SOLO_ADDR, a->id, GN_MSG_SWIM_PING, ping->body, ping->len, 3000), 0);
  assert_int_equal(gn_swim_incarnation(x->s), 1);
  assert_int_equal(x->nout, 1);
  assert_int_equal(x->out[0].type, GN_MSG_SWIM_ACK);
  assert_true(body_has(x->out[0].body, x->out[0].len, x->id, GN_SWIM_ALIVE));
  /* And a takes the ack back: x is alive at incarnation 1. */
  assert_int_equal(gn_swim_on_datagram(a->s, xa, x->id, GN_MSG_SWIM_ACK, x->out[0].body, x->out[0].len, 3010), 0);
  gn_swim_member m;
  assert_int_equal(gn_swim_get(a->s, x->id, &m), 0);
  assert_int_equal(m.state, GN_SWIM_ALIVE);
  assert_int_equal(m.incarnation, 1);
  assert_true(gn_swim_verified(a->s, x->id));
  a->s = gn_swim_free(a->s);
  x->s = gn_swim_free(x->s);
  free(a);
  free(x);
}

static void test_missed_deaths_repaired_after_partition(void **state) {
  (void)state;
  tnet *net = calloc(1, sizeof *net);
  gn_swim_config cfg;
  gn_swim_config_default(&cfg);
  /* A lone node's own suspicion (no confirmations reach it) takes 100 s,
   * far past the end of this test: it can only learn the death from others. */
  cfg.suspicion_beta = 20;
  net_init(net, 10, &cfg, 5);
  net_join_all(net);
  net_run(net, 20000);
  assert_true(all_alive(net));
  uint32_t p = 9, v = 4;
  net->nodes[p].side = true;
  net->partitioned = true;
  net->nodes[v].up = false;
  net_run(net, 50000);
  /* The others declared v dead, and their gossip of it ran out, while p
   * could hear none of it. */
  for (uint32_t i = 0; i < net->n; i++)
    if (i != p && i != v)
      assert_int_equal(state_at(net, i, v), GN_SWIM_DEAD);
  assert_int_not_equal(state_at(net, p, v), GN_SWIM_DEAD);
  net->partitioned = false;
  uint64_t heal = net->now;
  net_run(net, heal + 30000);
  assert_int_equal(state_at(net, p, v), GN_SWIM_DEAD);
  const tev *e = find_event(net, p, v, GN_SWIM_EV_DEAD);
  assert_non_null(e);
  assert_false(e->local);
  assert_true(e->at > heal);
  /* And p is back among the living everywhere. */
  for (uint32_t i = 0; i < net->n; i++)
    if (i != p && i != v)
      assert_int_equal(state_at(net, i, p), GN_SWIM_ALIVE);
  net_done(net);
  free(net);
}

static void test_leave_is_gossiped(void **state) {
  (void)state;
  tnet *net = calloc(1, sizeof *net);
  net_init(net, 8, NULL, 6);
  net_join_all(net);
  net_run(net, 15000);
  gn_swim_leave(net->nodes[2].s, net->now);
  net_run(net, 25000);
  for (uint32_t i = 0; i < net->n; i++)
    if (i != 2)
      assert_int_equal(state_at(net, i, 2), GN_SWIM_LEFT);
  assert_int_equal(count_events(net, GN_SWIM_EV_DEAD, MAXN), 0);
  net_done(net);
  free(net);
}

/* A leaver that goes away as soon as one member answered the pings that
 * carry its leave (as gpunetd does on SIGTERM), before anyone probed it:
 * every other member still counts it left, none dead. Before, the leave
 * only rode on answers to others' probes, so it was lost and the node
 * declared dead. */
static void test_leave_told_before_going_away(void **state) {
  (void)state;
  tnet *net = calloc(1, sizeof *net);
  net_init(net, 8, NULL, 9);
  net_join_all(net);
  net_run(net, 15000);
  uint64_t t0 = net->now;
  gn_swim_leave(net->nodes[2].s, net->now);
  while (gn_swim_leave_acks(net->nodes[2].s) == 0 && net->now < t0 + 3000)
    net_run(net, net->now + 5);
  assert_true(gn_swim_leave_acks(net->nodes[2].s) > 0);
  assert_true(net->now - t0 <= 100); /* answered within a round trip, not a probe round */
  net->nodes[2].up = false;
  net_run(net, net->now + 30000);
  for (uint32_t i = 0; i < net->n; i++)
    if (i != 2)
      assert_int_equal(state_at(net, i, 2), GN_SWIM_LEFT);
  assert_int_equal(count_events(net, GN_SWIM_EV_DEAD, 2), 0);
  net_done(net);
  free(net);
}

/* A node learns it is reached at another address (its NAT's outside one):
 * every member moves it there from its next signed datagram, with a new
 * incarnation, and none declares it dead meanwhile; a bad address or the
 * same one changes nothing. */
static void test_set_addr_moves_the_member_everywhere(void **state) {
  (void)state;
  tnet *net = calloc(1, sizeof *net);
  net_init(net, 8, NULL, 11);
  net_join_all(net);
  net_run(net, 15000);
  gn_swim *s3 = net->nodes[3].s;
  uint32_t inc = gn_swim_incarnation(s3);
  assert_int_equal(gn_swim_set_addr(s3, "not an address", net->now), GN_EINVAL);
  assert_int_equal(gn_swim_set_addr(s3, net->nodes[3].addr, net->now), 0);
  assert_int_equal(gn_swim_incarnation(s3), inc);
  /* The network now reaches node 3 only at its new address. */
  const char *outside = "198.51.100.7:40000";
  assert_int_equal(gn_swim_set_addr(s3, outside, net->now), 0);
  assert_int_equal(gn_swim_incarnation(s3), inc + 1);
  snprintf(net->nodes[3].addr, sizeof net->nodes[3].addr, "%s", outside);
  net_run(net, net->now + 20000);
  for (uint32_t i = 0; i < net->n; i++) {
    if (i == 3)
      continue;
    gn_swim_member m;
    assert_int_equal(gn_swim_get(net->nodes[i].s, net->nodes[3].id, &m), 0);
    assert_string_equal(m.addr, outside);
    assert_int_equal(m.state, GN_SWIM_ALIVE);
  }
  assert_int_equal(count_events(net, GN_SWIM_EV_DEAD, 3), 0);
  gn_swim_leave(s3, net->now);
  assert_int_equal(gn_swim_set_addr(s3, "198.51.100.8:40000", net->now), GN_ESTATE);
  net_done(net);
  free(net);
}

/* --- hostile peers ----------------------------------------------------------*/

typedef struct snap {
  size_t members;
  gn_swim_member m[16];
  uint32_t inc, health;
  uint64_t probes, sent;
} snap;

static void take_snap(const solo *so, snap *sn) {
  memset(sn, 0, sizeof *sn);
  sn->members = gn_swim_members(so->s, sn->m, 16);
  sn->inc = gn_swim_incarnation(so->s);
  sn->health = gn_swim_health(so->s);
  gn_swim_stats st;
  gn_swim_stats_get(so->s, &st);
  sn->probes = st.probes;
  sn->sent = st.sent_msgs;
}

static void test_forged_sender_refused(void **state) {
  (void)state;
  solo *a = calloc(1, sizeof *a);
  solo_new(a, NULL, 11);
  uint8_t b[GN_PK_LEN], c[GN_PK_LEN];
  char ba[GN_SWIM_ADDR_MAX];
  mkid(b, 2);
  mkid(c, 3);
  tupd u = {.id = a->id, .addr = SOLO_ADDR, .inc = 0, .st = GN_SWIM_DEAD};
  tbody tb = {.from = b, .inc = 0, .addr = peer_addr(2, ba), .seq = 5, .to = a->id, .g = &u, .ng = 1};
  gn_buf buf = {0};
  build(&tb, &buf);
  /* Signed by c, naming b as its sender. */
  assert_int_equal(gn_swim_on_datagram(a->s, ba, c, GN_MSG_SWIM_PING, buf.data, buf.len, 0), GN_EPERM);
  assert_int_equal(gn_swim_members(a->s, NULL, 0), 0);
  assert_int_equal(gn_swim_incarnation(a->s), 0);
  assert_int_equal(a->nout, 0);
  /* The same body signed by b is taken (and refuted). */
  assert_int_equal(gn_swim_on_datagram(a->s, ba, b, GN_MSG_SWIM_PING, buf.data, buf.len, 0), 0);
  assert_int_equal(gn_swim_members(a->s, NULL, 0), 1);
  assert_int_equal(gn_swim_incarnation(a->s), 1);
  gn_buf_done(&buf);
  a->s = gn_swim_free(a->s);
  free(a);
}

static void deliver_ack(solo *so, uint32_t from_n, uint64_t seq, int want, uint64_t now) {
  uint8_t id[GN_PK_LEN];
  char a[GN_SWIM_ADDR_MAX];
  mkid(id, from_n);
  tbody b = {.from = id, .inc = 0, .addr = peer_addr(from_n, a), .seq = seq};
  gn_buf buf = {0};
  build(&b, &buf);
  assert_int_equal(gn_swim_on_datagram(so->s, a, id, GN_MSG_SWIM_ACK, buf.data, buf.len, now), want);
  gn_buf_done(&buf);
}

static void test_ack_with_unknown_seq_or_signer_ignored(void **state) {
  (void)state;
  solo *a = calloc(1, sizeof *a);
  solo_new(a, NULL, 12);
  solo_add_peers(a, 1, 2);
  gn_swim_tick(a->s, 0);
  /* The probe's ping first, then a gossip round's (our own join is news). */
  assert_true(a->nout >= 1);
  assert_int_equal(a->out[0].type, GN_MSG_SWIM_PING);
  uint32_t target = strcmp(a->out[0].to, "10.8.0.1:7946") == 0 ? 1 : 2, other = 3 - target;
  uint64_t seq = body_seq(a->out[0].body, a->out[0].len);
  uint8_t tid[GN_PK_LEN];
  mkid(tid, target);
  snap before, after;
  take_snap(a, &before);
  deliver_ack(a, target, seq + 1, GN_EPROTO, 10);
  deliver_ack(a, other, seq, GN_EPROTO, 10);
  take_snap(a, &after);
  assert_memory_equal(&before, &after, sizeof before);
  assert_false(gn_swim_verified(a->s, tid));
  /* The right seq from the right signer completes the probe. */
  deliver_ack(a, target, seq, 0, 20);
  assert_true(gn_swim_verified(a->s, tid));
  /* And the same ack again is not taken twice. */
  deliver_ack(a, target, seq, GN_EPROTO, 30);
  gn_swim_tick(a->s, 1000);
  gn_swim_stats st;
  gn_swim_stats_get(a->s, &st);
  assert_int_equal(st.probes_failed, 0);
  a->s = gn_swim_free(a->s);
  free(a);
}

/* Answers every ping so sent since *done with the right ack. */
static void solo_answer_pings(solo *so, uint32_t *done, uint64_t now) {
  for (; *done < so->nout; (*done)++) {
    const seen *x = &so->out[*done];
    unsigned b, c;
    if (x->type != GN_MSG_SWIM_PING || sscanf(x->to, "10.8.%u.%u:7946", &b, &c) != 2)
      continue;
    deliver_ack(so, b << 8 | c, body_seq(x->body, x->len), 0, now);
  }
}

static void test_gossip_flood_keeps_table_bounded_and_verified(void **state) {
  (void)state;
  solo *a = calloc(1, sizeof *a);
  gn_swim_config cfg;
  gn_swim_config_default(&cfg);
  cfg.max_members = 64;
  solo_new(a, &cfg, 13);
  solo_add_peers(a, 1, 4);
  uint32_t done = 0;
  for (uint64_t t = 0; t <= 8000; t += 10) {
    gn_swim_tick(a->s, t);
    solo_answer_pings(a, &done, t);
    if (a->nout > 200)
      a->nout = done = 0;
  }
  for (uint32_t i = 1; i <= 4; i++) {
    uint8_t id[GN_PK_LEN];
    mkid(id, i);
    assert_true(gn_swim_verified(a->s, id));
  }
  /* A stranger (id 100) gossips 100,000 fake members, 64 a ping. */
  static tupd g[GN_SWIM_UPDATES_MAX];
  static uint8_t ids[GN_SWIM_UPDATES_MAX][GN_PK_LEN];
  static char addrs[GN_SWIM_UPDATES_MAX][GN_SWIM_ADDR_MAX];
  for (uint32_t k = 0; k < 100000; k += GN_SWIM_UPDATES_MAX) {
    uint32_t n = 100000 - k < GN_SWIM_UPDATES_MAX ? 100000 - k : GN_SWIM_UPDATES_MAX;
    for (uint32_t j = 0; j < n; j++) {
      mkid(ids[j], 1000000 + k + j);
      snprintf(addrs[j], sizeof addrs[j], "10.66.%u.%u:7946", (k + j) >> 8 & 0xff, (k + j) & 0xff);
      g[j] = (tupd){.id = ids[j], .addr = addrs[j], .inc = 0, .st = GN_SWIM_ALIVE};
    }
    a->nout = 0;
    assert_int_equal(solo_ping_from(a, 100, 0, g, n, 8000), 0);
  }
  assert_true(gn_swim_members(a->s, NULL, 0) <= 64);
  for (uint32_t i = 1; i <= 4; i++) {
    uint8_t id[GN_PK_LEN];
    gn_swim_member m;
    mkid(id, i);
    assert_int_equal(gn_swim_get(a->s, id, &m), 0);
    assert_int_equal(m.state, GN_SWIM_ALIVE);
  }
  /* Hearsay filled at most three quarters of the table, so a newcomer
   * speaking for itself still gets in. */
  assert_true(gn_swim_members(a->s, NULL, 0) <= 4 + 48);
  uint8_t z[GN_PK_LEN];
  gn_swim_member m;
  mkid(z, 200);
  assert_int_equal(solo_ping_from(a, 200, 0, NULL, 0, 8000), 0);
  assert_int_equal(gn_swim_get(a->s, z, &m), 0);
  assert_true(gn_swim_members(a->s, NULL, 0) <= 64);
  a->s = gn_swim_free(a->s);
  free(a);
}

static void test_dead_about_self_refuted(void **state) {
  (void)state;
  solo *a = calloc(1, sizeof *a);
  solo_new(a, NULL, 14);
  uint8_t by[GN_PK_LEN];
  mkid(by, 77);
  tupd u = {.id = a->id, .addr = SOLO_ADDR, .inc = 0, .st = GN_SWIM_DEAD, .by = by};
  /* A stranger says we are dead. */
  assert_int_equal(solo_ping_from(a, 50, 0, &u, 1, 0), 0);
  assert_int_equal(gn_swim_incarnation(a->s), 1);
  gn_swim_member self;
  assert_int_equal(gn_swim_get(a->s, a->id, &self), 0);
  assert_int_equal(self.state, GN_SWIM_ALIVE);
  assert_int_equal(self.incarnation, 1);
  assert_int_equal(gn_swim_health(a->s), 1);
  /* Its answer carries the refutation. */
  assert_int_equal(a->nout, 1);
  assert_true(body_has(a->out[0].body, a->out[0].len, a->id, GN_SWIM_ALIVE));
  /* A stale accusation (an older incarnation) changes nothing. */
  assert_int_equal(solo_ping_from(a, 51, 0, &u, 1, 10), 0);
  assert_int_equal(gn_swim_incarnation(a->s), 1);
  a->s = gn_swim_free(a->s);
  free(a);
}

static void test_hearsay_cannot_move_a_live_member(void **state) {
  (void)state;
  solo *a = calloc(1, sizeof *a);
  solo_new(a, NULL, 15);
  solo_add_peers(a, 1, 1);
  uint8_t x[GN_PK_LEN];
  mkid(x, 1);
  tupd u = {.id = x, .addr = "10.66.6.6:7946", .inc = 5, .st = GN_SWIM_ALIVE};
  assert_int_equal(solo_ping_from(a, 2, 0, &u, 1, 0), 0);
  gn_swim_member m;
  assert_int_equal(gn_swim_get(a->s, x, &m), 0);
  assert_int_equal(m.incarnation, 5);
  assert_string_equal(m.addr, "10.8.0.1:7946");
  /* x itself may move. */
  tbody b = {.from = x, .inc = 6, .addr = "10.7.7.7:7946", .seq = 1, .to = a->id};
  gn_buf buf = {0};
  build(&b, &buf);
  assert_int_equal(gn_swim_on_datagram(a->s, "10.7.7.7:7946", x, GN_MSG_SWIM_PING, buf.data, buf.len, 0), 0);
  assert_int_equal(gn_swim_get(a->s, x, &m), 0);
  assert_string_equal(m.addr, "10.7.7.7:7946");
  gn_buf_done(&buf);
  a->s = gn_swim_free(a->s);
  free(a);
}

static void test_ping_req_relays_bounded(void **state) {
  (void)state;
  solo *a = calloc(1, sizeof *a);
  solo_new(a, NULL, 16);
  gn_buf buf = {0};
  /* 40 strangers ask for 10 relays each. */
  for (uint32_t p = 0; p < 40; p++) {
    uint8_t from[GN_PK_LEN], t[GN_PK_LEN];
    char fa[GN_SWIM_ADDR_MAX], ta[GN_SWIM_ADDR_MAX];
    mkid(from, 300 + p);
    peer_addr(300 + p, fa);
    for (uint32_t k = 0; k < 10; k++) {
      mkid(t, 5000 + p * 10 + k);
      tbody b = {.from = from, .addr = fa, .seq = k + 1, .target = t, .taddr = peer_addr(5000 + p * 10 + k, ta)};
      build(&b, &buf);
      assert_int_equal(gn_swim_on_datagram(a->s, fa, from, GN_MSG_SWIM_PING_REQ, buf.data, buf.len, 0), 0);
    }
    if (p == 0) {
      uint32_t pings = 0;
      for (uint32_t i = 0; i < a->nout; i++)
        pings += a->out[i].type == GN_MSG_SWIM_PING;
      assert_int_equal(pings, 2); /* per requester */
    }
  }
  uint32_t pings = 0, nacks = 0;
  for (uint32_t i = 0; i < a->nout; i++)
    pings += a->out[i].type == GN_MSG_SWIM_PING;
  assert_int_equal(pings, 16); /* in all */
  gn_swim_tick(a->s, 1000);
  for (uint32_t i = 0; i < a->nout; i++)
    nacks += a->out[i].type == GN_MSG_SWIM_NACK;
  assert_int_equal(nacks, 16);
  gn_buf_done(&buf);
  a->s = gn_swim_free(a->s);
  free(a);
}

typedef struct badcase {
  const char *name;
  uint32_t type;
  int want;
} badcase;

static void test_bad_bodies_refused_without_change(void **state) {
  (void)state;
  solo *a = calloc(1, sizeof *a);
  solo_new(a, NULL, 17);
  solo_add_peers(a, 1, 3);
  uint8_t b[GN_PK_LEN], x[GN_PK_LEN], short_id[GN_PK_LEN];
  char ba[GN_SWIM_ADDR_MAX];
  mkid(b, 2);
  mkid(x, 1);
  memset(short_id, 1, sizeof short_id);
  peer_addr(2, ba);
  snap before, after;
  take_snap(a, &before);
  gn_buf buf = {0};
  tupd good = {.id = x, .addr = "10.8.0.1:7946", .inc = 9, .st = GN_SWIM_DEAD};
  static tupd many[GN_SWIM_UPDATES_MAX + 1];
  for (uint32_t i = 0; i <= GN_SWIM_UPDATES_MAX; i++)
    many[i] = good;
  const char *bad_addrs[] = {"example.com:7946", "10.0.0.1:0", "10.0.0.1:65536", "10.0.0.1",         "[::1:7946",
                             "10.0.0.1:79x6",    ":7946",      "10.0.0.256:1",   "10.0.0.1:1234567", "[]:80"};
  char longaddr[80];
  memset(longaddr, '1', sizeof longaddr);
  memcpy(longaddr + 60, ":7946", 6);
  for (int c = 0; c < 40; c++) {
    uint32_t type = GN_MSG_SWIM_PING;
    int want = GN_EINVAL;
    tbody tb = {.from = b, .inc = 3, .addr = ba, .seq = 1, .to = a->id, .g = &good, .ng = 1};
    tupd u = good;
    bool raw = false;
    buf.len = 0;
    if (c < 10) {
      tb.addr = bad_addrs[c];
    } else if (c == 10) {
      tb.addr = longaddr;
      want = GN_ETOOBIG;
    } else if (c < 21) {
      u.addr = bad_addrs[c - 11];
      tb.g = &u;
    } else if (c == 21) {
      u.st = 4;
      tb.g = &u;
    } else if (c == 22) {
      tb.g = many;
      tb.ng = GN_SWIM_UPDATES_MAX + 1;
      want = GN_ETOOBIG;
    } else if (c == 23) {
      tb.to = b; /* for someone else */
      want = GN_EPROTO;
    } else if (c == 24) {
      type = GN_MSG_SWIM_PING_REQ; /* about ourselves */
      tb.to = NULL;
      tb.target = a->id;
      tb.taddr = SOLO_ADDR;
      want = GN_EPROTO;
    } else if (c == 25) {
      type = GN_MSG_SWIM_NACK; /* for nothing we asked */
      tb.to = NULL;
      tb.target = x;
      want = GN_EPROTO;
    } else if (c == 26) {
      type = 74;
    } else if (c == 27) {
      type = GN_MSG_SWIM_PING_REQ; /* no taddr */
      tb.to = NULL;
      tb.target = x;
    } else if (c == 28) {
      tb.to = NULL; /* a ping without "to" */
    } else if (c == 29) {
      raw = true; /* garbage */
      gn_buf_append(&buf, "\xc1\xff\x00garbage", 10);
    } else if (c == 30) {
      raw = true; /* empty */
    } else if (c == 31) {
      raw = true; /* truncated */
      build(&tb, &buf);
      buf.len -= 3;
    } else if (c == 32) {
      raw = true; /* oversized */
      build(&tb, &buf);
      uint8_t zero[1024] = {0};
      while (buf.len <= GN_SWIM_BODY_MAX)
        gn_buf_append(&buf, zero, sizeof zero);
      want = GN_ETOOBIG;
    } else if (c == 33) {
      raw = true; /* a valid body with an extra key */
      gn_wire_writer w;
      gn_wire_writer_init(&w);
      gn_wire_put_map(&w, 6);
      gn_wire_put_str(&w, "from");
      gn_wire_put_bin(&w, b, GN_PK_LEN);
      gn_wire_put_str(&w, "inc");
      gn_wire_put_u64(&w, 3);
      gn_wire_put_str(&w, "addr");
      gn_wire_put_str(&w, ba);
      gn_wire_put_str(&w, "seq");
      gn_wire_put_u64(&w, 1);
      gn_wire_put_str(&w, "to");
      gn_wire_put_bin(&w, a->id, GN_PK_LEN);
      gn_wire_put_str(&w, "evil");
      gn_wire_put_u64(&w, 1);
      gn_wire_writer_take(&w, &buf);
      gn_wire_writer_done(&w);
    } else if (c == 34) {
      raw = true; /* from of 31 bytes */
      gn_wire_writer w;
      gn_wire_writer_init(&w);
      gn_wire_put_map(&w, 5);
      gn_wire_put_str(&w, "from");
      gn_wire_put_bin(&w, b, GN_PK_LEN - 1);
      gn_wire_put_str(&w, "inc");
      gn_wire_put_u64(&w, 3);
      gn_wire_put_str(&w, "addr");
      gn_wire_put_str(&w, ba);
      gn_wire_put_str(&w, "seq");
      gn_wire_put_u64(&w, 1);
      gn_wire_put_str(&w, "to");
      gn_wire_put_bin(&w, a->id, GN_PK_LEN);
      gn_wire_writer_take(&w, &buf);
      gn_wire_writer_done(&w);
    } else if (c == 35) {
      raw = true; /* an incarnation over 32 bits */
      gn_wire_writer w;
      gn_wire_writer_init(&w);
      gn_wire_put_map(&w, 5);
      gn_wire_put_str(&w, "from");
      gn_wire_put_bin(&w, b, GN_PK_LEN);
      gn_wire_put_str(&w, "inc");
      gn_wire_put_u64(&w, 1ull << 40);
      gn_wire_put_str(&w, "addr");
      gn_wire_put_str(&w, ba);
      gn_wire_put_str(&w, "seq");
      gn_wire_put_u64(&w, 1);
      gn_wire_put_str(&w, "to");
      gn_wire_put_bin(&w, a->id, GN_PK_LEN);
      gn_wire_writer_take(&w, &buf);
      gn_wire_writer_done(&w);
      want = GN_ETOOBIG;
    } else if (c == 36) {
      raw = true; /* not a map */
      gn_wire_writer w;
      gn_wire_writer_init(&w);
      gn_wire_put_array(&w, 1);
      gn_wire_put_u64(&w, 1);
      gn_wire_writer_take(&w, &buf);
      gn_wire_writer_done(&w);
    } else if (c == 37) {
      type = GN_MSG_SWIM_ACK; /* an ack for nothing we sent */
      tb.to = NULL;
      want = GN_EPROTO;
    } else if (c == 38) {
      tb.from = a->id; /* our own id, sent back */
      want = GN_EPROTO;
      raw = true;
      build(&tb, &buf);
      assert_int_equal(gn_swim_on_datagram(a->s, ba, a->id, type, buf.data, buf.len, 100), want);
      continue;
    } else {
      u.by = short_id;
      tb.g = &u;
      raw = true; /* an update's "by" of 31 bytes: write it by hand */
      gn_wire_writer w;
      gn_wire_writer_init(&w);
      gn_wire_put_map(&w, 6);
      gn_wire_put_str(&w, "from");
      gn_wire_put_bin(&w, b, GN_PK_LEN);
      gn_wire_put_str(&w, "inc");
      gn_wire_put_u64(&w, 3);
      gn_wire_put_str(&w, "addr");
      gn_wire_put_str(&w, ba);
      gn_wire_put_str(&w, "seq");
      gn_wire_put_u64(&w, 1);
      gn_wire_put_str(&w, "to");
      gn_wire_put_bin(&w, a->id, GN_PK_LEN);
      gn_wire_put_str(&w, "g");
      gn_wire_put_array(&w, 1);
      gn_wire_put_map(&w, 5);
      gn_wire_put_str(&w, "id");
      gn_wire_put_bin(&w, x, GN_PK_LEN);
      gn_wire_put_str(&w, "addr");
      gn_wire_put_str(&w, "10.8.0.1:7946");
      gn_wire_put_str(&w, "inc");
      gn_wire_put_u64(&w, 9);
      gn_wire_put_str(&w, "st");
      gn_wire_put_u64(&w, 2);
      gn_wire_put_str(&w, "by");
      gn_wire_put_bin(&w, x, GN_PK_LEN - 1);
      gn_wire_writer_take(&w, &buf);
      gn_wire_writer_done(&w);
    }
    if (!raw)
      build(&tb, &buf);
    int r = gn_swim_on_datagram(a->s, ba, b, type, buf.data, buf.len, 100);
    if (r != want)
      fail_msg("case %d: got %d, want %d", c, r, want);
  }
  take_snap(a, &after);
  assert_memory_equal(&before, &after, sizeof before);
  assert_int_equal(a->nout, 0);
  gn_swim_stats st;
  gn_swim_stats_get(a->s, &st);
  assert_int_equal(st.recv_bad, 40);
  /* The good body these were made from is taken: x is dead at 9. */
  tbody tb = {.from = b, .inc = 3, .addr = ba, .seq = 1, .to = a->id, .g = &good, .ng = 1};
  build(&tb, &buf);
  assert_int_equal(gn_swim_on_datagram(a->s, ba, b, GN_MSG_SWIM_PING, buf.data, buf.len, 100), 0);
  gn_swim_member m;
  assert_int_equal(gn_swim_get(a->s, x, &m), 0);
  assert_int_equal(m.state, GN_SWIM_DEAD);
  gn_buf_done(&buf);
  a->s = gn_swim_free(a->s);
  free(a);
}

static void test_addresses_validated(void **state) {
  (void)state;
  assert_true(gn_swim_addr_valid("10.0.0.1:7946"));
  assert_true(gn_swim_addr_valid("[2001:db8::1]:65535"));
  assert_false(gn_swim_addr_valid("localhost:7946"));
  assert_false(gn_swim_addr_valid("10.0.0.1:0"));
  assert_false(gn_swim_addr_valid("2001:db8::1:7946"));
  assert_false(gn_swim_addr_valid(""));
  assert_false(gn_swim_addr_valid(NULL));
}

static void test_news_about_non_members_passed_on_once(void **state) {
  (void)state;
  solo *a = calloc(1, sizeof *a);
  solo_new(a, NULL, 18);
  solo_add_peers(a, 1, 1);
  uint8_t x[GN_PK_LEN], y[GN_PK_LEN], z[GN_PK_LEN], by[GN_PK_LEN];
  mkid(x, 500);
  mkid(y, 501);
  mkid(z, 502);
  mkid(by, 503);
  /* a does not keep x (suspect and dead news never adds a member), yet
   * passes the suspicion on. */
  tupd u = {.id = x, .addr = "10.66.0.1:7946", .inc = 3, .st = GN_SWIM_SUSPECT, .by = by};
  assert_int_equal(solo_ping_from(a, 2, 0, &u, 1, 0), 0);
  gn_swim_member m;
  assert_int_equal(gn_swim_get(a->s, x, &m), GN_ENOTFOUND);
  assert_int_equal(a->nout, 1);
  assert_true(body_has(a->out[0].body, a->out[0].len, x, GN_SWIM_SUSPECT));
  /* Sent its share of times, it is not taken up again when it comes back. */
  for (int i = 0; i < 20; i++)
    assert_int_equal(solo_ping_from(a, 2, 0, NULL, 0, 10 + i), 0);
  a->nout = 0;
  assert_int_equal(solo_ping_from(a, 2, 0, &u, 1, 100), 0);
  assert_false(body_has(a->out[0].body, a->out[0].len, x, GN_SWIM_SUSPECT));
  /* News about it (its death) is. */
  u.st = GN_SWIM_DEAD;
  a->nout = 0;
  assert_int_equal(solo_ping_from(a, 2, 0, &u, 1, 110), 0);
  assert_true(body_has(a->out[0].body, a->out[0].len, x, GN_SWIM_DEAD));
  /* A record that has come 8 relays is not passed on. */
  gn_buf buf = {0};
  gn_wire_writer w;
  char ba[GN_SWIM_ADDR_MAX];
  uint8_t b[GN_PK_LEN];
  mkid(b, 2);
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 6);
  gn_wire_put_str(&w, "from");
  gn_wire_put_bin(&w, b, GN_PK_LEN);
  gn_wire_put_str(&w, "inc");
  gn_wire_put_u64(&w, 0);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, peer_addr(2, ba));
  gn_wire_put_str(&w, "seq");
  gn_wire_put_u64(&w, 9);
  gn_wire_put_str(&w, "to");
  gn_wire_put_bin(&w, a->id, GN_PK_LEN);
  gn_wire_put_str(&w, "g");
  gn_wire_put_array(&w, 1);
  gn_wire_put_map(&w, 5);
  gn_wire_put_str(&w, "id");
  gn_wire_put_bin(&w, y, GN_PK_LEN);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, "10.66.0.2:7946");
  gn_wire_put_str(&w, "inc");
  gn_wire_put_u64(&w, 0);
  gn_wire_put_str(&w, "st");
  gn_wire_put_u64(&w, GN_SWIM_DEAD);
  gn_wire_put_str(&w, "hop");
  gn_wire_put_u64(&w, 8);
  assert_int_equal(gn_wire_writer_take(&w, &buf), 0);
  gn_wire_writer_done(&w);
  a->nout = 0;
  assert_int_equal(gn_swim_on_datagram(a->s, ba, b, GN_MSG_SWIM_PING, buf.data, buf.len, 120), 0);
  assert_false(body_has(a->out[0].body, a->out[0].len, y, GN_SWIM_DEAD));
  gn_buf_done(&buf);
  a->s = gn_swim_free(a->s);
  free(a);
}

static void test_small_tables_fill_through_offered_members(void **state) {
  (void)state;
  tnet *net = calloc(1, sizeof *net);
  gn_swim_config cfg;
  gn_swim_config_default(&cfg);
  cfg.max_members = 8;
  net_init(net, 30, &cfg, 19);
  /* Each joins through node 0 alone, 2 s apart: the last ones come long
   * after the gossip of the first joins has run out. */
  for (uint32_t i = 1; i < net->n; i++) {
    assert_int_equal(gn_swim_add(net->nodes[i].s, net->nodes[0].id, net->nodes[0].addr, net->now), 0);
    net_run(net, net->now + 2000);
  }
  net_run(net, net->now + 60000);
  for (uint32_t i = 0; i < net->n; i++)
    assert_true(gn_swim_count(net->nodes[i].s, GN_SWIM_ALIVE) >= 6);
  assert_int_equal(count_events(net, GN_SWIM_EV_DEAD, MAXN), 0);
  net_done(net);
  free(net);
}

static void test_suspect_pinged_by_its_accuser(void **state) {
  (void)state;
  solo *a = calloc(1, sizeof *a);
  uint8_t x[GN_PK_LEN];
  char xa[GN_SWIM_ADDR_MAX];
  mkid(x, 1);
  peer_addr(1, xa);
  solo_new(a, NULL, 21);
  solo_add_peers(a, 1, 60);
  /* Nobody answers: tick until a's own probe of x fails. */
  uint64_t t = 0, tf = 0;
  gn_swim_member m = {0};
  for (; t <= 120000 && !tf; t += 10) {
    a->nout = 0;
    gn_swim_tick(a->s, t);
    assert_int_equal(gn_swim_get(a->s, x, &m), 0);
    if (m.state == GN_SWIM_SUSPECT)
      tf = t;
  }
  assert_true(tf > 0);
  /* The suspect is pinged with its suspicion at once, and again two
   * intervals later, not only when the round-robin probe (61 members)
   * comes back to it. */
  uint32_t at_once = 0, later = 0;
  for (uint32_t i = 0; i < a->nout; i++)
    at_once += a->out[i].type == GN_MSG_SWIM_PING && strcmp(a->out[i].to, xa) == 0 &&
               body_has(a->out[i].body, a->out[i].len, x, GN_SWIM_SUSPECT);
  a->nout = 0;
  for (; t <= tf + 2010; t += 10)
    gn_swim_tick(a->s, t);
  for (uint32_t i = 0; i < a->nout; i++)
    later += a->out[i].type == GN_MSG_SWIM_PING && strcmp(a->out[i].to, xa) == 0 &&
             body_has(a->out[i].body, a->out[i].len, x, GN_SWIM_SUSPECT);
  assert_int_equal(at_once, 1);
  assert_true(later >= 1);
  a->s = gn_swim_free(a->s);
  free(a);
}

static void test_plain_joins_passed_on_at_most_one_an_interval(void **state) {
  (void)state;
  gn_swim_config cfg;
  gn_swim_config_default(&cfg);
  cfg.max_members = 64;
  solo *a = calloc(1, sizeof *a);
  solo_new(a, &cfg, 22);
  solo_add_peers(a, 1, 64);
  /* A full table (with room for 32 ghosts): 20 fresh joins about nodes a
   * does not keep arrive at once. Passed on unbounded, each would cost
   * every node lambda log n records. */
  enum { NJ = 20 };
  uint8_t ids[NJ][GN_PK_LEN];
  char addrs[NJ][GN_SWIM_ADDR_MAX];
  tupd g[NJ];
  for (uint32_t i = 0; i < NJ; i++) {
    mkid(ids[i], 600 + i);
    peer_addr(600 + i, addrs[i]);
    g[i] = (tupd){.id = ids[i], .addr = addrs[i], .inc = 0, .st = GN_SWIM_ALIVE};
  }
  a->nout = 0;
  assert_int_equal(solo_ping_from(a, 1, 0, g, NJ, 10000), 0);
  for (uint64_t t = 10000; t <= 10500; t += 10)
    gn_swim_tick(a->s, t);
  uint32_t passed = 0;
  for (uint32_t i = 0; i < NJ; i++) {
    bool seen_it = false;
    for (uint32_t k = 0; k < a->nout && !seen_it; k++)
      seen_it = body_has(a->out[k].body, a->out[k].len, ids[i], GN_SWIM_ALIVE);
    passed += seen_it;
  }
  /* The burst (4), and no more within the same interval. */
  assert_true(passed >= 1);
  assert_true(passed <= 4);
  a->s = gn_swim_free(a->s);
  free(a);
}

/* The "hop" of the record about id in a body (-1: no such record; 0: none
 * given). */
static int body_hop(const uint8_t *body, size_t len, const uint8_t *id) {
  gn_wire_doc doc;
  int hop = -1;
  if (gn_wire_decode(body, len, &doc) < 0)
    return -1;
  const msgpack_object_array *g;
  if (gn_wire_get_array(doc.root, "g", 1000, &g) == 0)
    for (uint32_t i = 0; i < g->size && hop < 0; i++) {
      uint8_t uid[GN_PK_LEN];
      uint32_t h = 0;
      if (gn_wire_get_bin_exact(&g->ptr[i], "id", uid, GN_PK_LEN) == 0 && memcmp(uid, id, GN_PK_LEN) == 0)
        hop = gn_wire_get(&g->ptr[i], "hop") && gn_wire_get_u32(&g->ptr[i], "hop", &h) == 0 ? (int)h : 0;
    }
  gn_wire_doc_done(&doc);
  return hop;
}

/* The ACK a pings us back with (-1: none). */
static int last_ack(const solo *so) {
  for (uint32_t k = so->nout; k-- > 0;)
    if (so->out[k].type == GN_MSG_SWIM_ACK)
      return (int)k;
  return -1;
}

/* Pings a from peers first.. with nothing of their own (pulls) at now;
 * returns how many of their ACKs carried id, and the least hop seen (hop). */
static int pulls_carrying(solo *a, uint32_t first, uint32_t count, const uint8_t *id, uint64_t now, int *hop) {
  int found = 0;
  *hop = 255;
  for (uint32_t n = first; n < first + count; n++) {
    a->nout = 0;
    assert_int_equal(solo_ping_from(a, n, 0, NULL, 0, now), 0);
    int k = last_ack(a);
    assert_true(k >= 0);
    int h = body_hop(a->out[k].body, a->out[k].len, id);
    if (h >= 0) {
      found++;
      if (h < *hop)
        *hop = h;
    }
  }
  return found;
}

#define PULL_T0 (4 * 60000 + 10000)

/* A node with a full table of 64 silent peers, ticked to PULL_T0. Probes
 * are rare, so that no suspicion of the silent peers crowds in (the join
 * tokens come one a probe interval: by PULL_T0 the bucket is full). */
static solo *pull_node(uint64_t seed) {
  gn_swim_config cfg;
  gn_swim_config_default(&cfg);
  cfg.max_members = 64;
  cfg.probe_interval_ms = 60000;
  cfg.probe_timeout_ms = 30000;
  solo *a = calloc(1, sizeof *a);
  solo_new(a, &cfg, seed);
  solo_add_peers(a, 1, 64);
  for (uint64_t t = 0; t < PULL_T0; t += 10)
    gn_swim_tick(a->s, t);
  return a;
}

static void test_pull_hears_what_spread_lately(void **state) {
  (void)state;
  solo *a = pull_node(23);
  uint64_t t = PULL_T0, t0 = PULL_T0;
  /* A fresh join about a node a does not keep (its table is full): passed
   * on until its gossip runs out. */
  uint8_t nid[GN_PK_LEN];
  char naddr[GN_SWIM_ADDR_MAX];
  mkid(nid, 700);
  tupd g = {.id = nid, .addr = peer_addr(700, naddr), .inc = 0, .st = GN_SWIM_ALIVE};
  assert_int_equal(solo_ping_from(a, 1, 0, &g, 1, t), 0);
  for (; t <= t0 + 3000; t += 10)
    gn_swim_tick(a->s, t);
  /* Its gossip has run out: pings with a record of their own (pushes) are
   * answered without it... */
  uint8_t oid[GN_PK_LEN];
  char oaddr[GN_SWIM_ADDR_MAX];
  mkid(oid, 3);
  tupd other = {.id = oid, .addr = peer_addr(3, oaddr), .inc = 0, .st = GN_SWIM_ALIVE};
  for (uint32_t n = 20; n < 28; n++) {
    a->nout = 0;
    assert_int_equal(solo_ping_from(a, n, 0, &other, 1, t), 0);
    int k = last_ack(a);
    assert_true(k >= 0);
    assert_int_equal(body_hop(a->out[k].body, a->out[k].len, nid), -1);
  }
  /* ... pings with nothing (pulls, from nodes that pushes may miss) get it,
   * up to three records of the lately ended ones each, round robin, marked not
   * fresh so that it is not pushed on as a join... */
  int hop;
  assert_true(pulls_carrying(a, 30, 8, nid, t, &hop) >= 1);
  assert_true(hop >= 5);
  /* ... until it ended 5 probe intervals ago. */
  for (; t <= t0 + 3000 + 5 * 60000 + 1000; t += 10)
    gn_swim_tick(a->s, t);
  assert_int_equal(pulls_carrying(a, 40, 8, nid, t, &hop), 0);
  a->s = gn_swim_free(a->s);
  free(a);
}

/* A join heard too far from the newcomer to be pushed on (or without a join
 * token) is not gossiped, but a pull still gets it for a while. */
static void test_pull_hears_joins_not_passed_on(void **state) {
  (void)state;
  solo *a = pull_node(24);
  uint64_t t = PULL_T0, t0 = PULL_T0;
  uint8_t nid[GN_PK_LEN];
  char naddr[GN_SWIM_ADDR_MAX];
  mkid(nid, 710);
  /* Five relays from the newcomer: no longer a fresh join. */
  tupd g = {.id = nid, .addr = peer_addr(710, naddr), .inc = 0, .st = GN_SWIM_ALIVE, .hop = 5};
  a->nout = 0;
  assert_int_equal(solo_ping_from(a, 1, 0, &g, 1, t), 0);
  for (; t <= t0 + 3000; t += 10)
    gn_swim_tick(a->s, t);
  for (uint32_t k = 0; k < a->nout; k++)
    assert_int_equal(body_hop(a->out[k].body, a->out[k].len, nid), -1); /* not pushed on */
  int hop;
  assert_true(pulls_carrying(a, 30, 8, nid, t, &hop) >= 1);
  assert_true(hop >= 5);
  for (; t <= t0 + 3000 + 5 * 60000 + 1000; t += 10)
    gn_swim_tick(a->s, t);
  assert_int_equal(pulls_carrying(a, 40, 8, nid, t, &hop), 0);
  a->s = gn_swim_free(a->s);
  free(a);
}

/* A peer floods forged joins (hearsay is not signed by its subject) about
 * 200 made-up nodes: the heard ring keeps 8, so pulls carry at most three
 * records each and at most 8 of the forged ids in all, and none is pushed. */
static void test_forged_join_flood_bounded_in_pulls(void **state) {
  (void)state;
  solo *a = pull_node(25);
  uint64_t t = PULL_T0;
  enum { NF = 200, BATCH = 10 };
  static uint8_t ids[NF][GN_PK_LEN];
  static char addrs[NF][GN_SWIM_ADDR_MAX];
  for (uint32_t b = 0; b < NF / BATCH; b++) {
    tupd g[BATCH];
    for (uint32_t i = 0; i < BATCH; i++) {
      uint32_t k = b * BATCH + i;
      mkid(ids[k], 900 + k);
      g[i] = (tupd){.id = ids[k], .addr = peer_addr(900 + k, addrs[k]), .inc = 0, .st = GN_SWIM_ALIVE, .hop = 5};
    }
    assert_int_equal(solo_ping_from(a, 1, 0, g, BATCH, t), 0);
  }
  a->nout = 0;
  for (uint64_t end = t + 2000; t < end; t += 10)
    gn_swim_tick(a->s, t);
  bool carried[NF] = {false};
  int most = 0;
  for (uint32_t k = 0; k < a->nout; k++)
    for (uint32_t i = 0; i < NF; i++)
      assert_int_equal(body_hop(a->out[k].body, a->out[k].len, ids[i]), -1); /* not pushed */
  for (uint32_t n = 30; n < 62; n++) {
    a->nout = 0;
    assert_int_equal(solo_ping_from(a, n, 0, NULL, 0, t), 0);
    int k = last_ack(a);
    assert_true(k >= 0);
    int in_ack = 0;
    for (uint32_t i = 0; i < NF; i++)
      if (body_hop(a->out[k].body, a->out[k].len, ids[i]) >= 0) {
        in_ack++;
        carried[i] = true;
      }
    assert_true(in_ack <= 3);
    most = in_ack > most ? in_ack : most;
  }
  assert_int_equal(most, 3);
  int distinct = 0;
  for (uint32_t i = 0; i < NF; i++)
    distinct += carried[i];
  assert_true(distinct >= 1);
  assert_true(distinct <= 8);
  a->s = gn_swim_free(a->s);
  free(a);
}

static void test_refutation_sent_to_the_accuser(void **state) {
  (void)state;
  solo *a = calloc(1, sizeof *a);
  solo_new(a, NULL, 20);
  solo_add_peers(a, 1, 3);
  uint8_t c[GN_PK_LEN];
  mkid(c, 3);
  /* Member 2 passes on member 3's suspicion of a. */
  tupd u = {.id = a->id, .addr = SOLO_ADDR, .inc = 0, .st = GN_SWIM_SUSPECT, .by = c};
  assert_int_equal(solo_ping_from(a, 2, 0, &u, 1, 0), 0);
  assert_int_equal(gn_swim_incarnation(a->s), 1);
  /* The ack to 2, and a ping to the accuser 3 with the refutation first. */
  assert_int_equal(a->nout, 2);
  const seen *ping = a->out[0].type == GN_MSG_SWIM_PING ? &a->out[0] : &a->out[1];
  assert_int_equal(ping->type, GN_MSG_SWIM_PING);
  assert_string_equal(ping->to, "10.8.0.3:7946");
  uint8_t id[GN_PK_LEN];
  uint32_t st, inc;
  assert_true(upd_at(ping->body, ping->len, 0, id, &st, &inc));
  assert_memory_equal(id, a->id, GN_PK_LEN);
  assert_int_equal(st, GN_SWIM_ALIVE);
  assert_int_equal(inc, 1);
  /* Another accusation within the probe interval sends no second ping. */
  u.inc = 1;
  a->nout = 0;
  assert_int_equal(solo_ping_from(a, 2, 0, &u, 1, 10), 0);
  assert_int_equal(gn_swim_incarnation(a->s), 2);
  assert_int_equal(a->nout, 1);
  a->s = gn_swim_free(a->s);
  free(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_join_converges),
      cmocka_unit_test(test_killed_node_dead_everywhere),
      cmocka_unit_test(test_suspected_live_node_refutes_under_loss),
      cmocka_unit_test(test_confirmations_shorten_suspicion),
      cmocka_unit_test(test_local_health_rises_when_slow),
      cmocka_unit_test(test_buddy_suspect_hears_in_first_ping),
      cmocka_unit_test(test_missed_deaths_repaired_after_partition),
      cmocka_unit_test(test_leave_is_gossiped),
      cmocka_unit_test(test_leave_told_before_going_away),
      cmocka_unit_test(test_set_addr_moves_the_member_everywhere),
      cmocka_unit_test(test_forged_sender_refused),
      cmocka_unit_test(test_ack_with_unknown_seq_or_signer_ignored),
      cmocka_unit_test(test_gossip_flood_keeps_table_bounded_and_verified),
      cmocka_unit_test(test_dead_about_self_refuted),
      cmocka_unit_test(test_hearsay_cannot_move_a_live_member),
      cmocka_unit_test(test_ping_req_relays_bounded),
      cmocka_unit_test(test_bad_bodies_refused_without_change),
      cmocka_unit_test(test_addresses_validated),
      cmocka_unit_test(test_news_about_non_members_passed_on_once),
      cmocka_unit_test(test_small_tables_fill_through_offered_members),
      cmocka_unit_test(test_refutation_sent_to_the_accuser),
      cmocka_unit_test(test_suspect_pinged_by_its_accuser),
      cmocka_unit_test(test_plain_joins_passed_on_at_most_one_an_interval),
      cmocka_unit_test(test_pull_hears_what_spread_lately),
      cmocka_unit_test(test_pull_hears_joins_not_passed_on),
      cmocka_unit_test(test_forged_join_flood_bounded_in_pulls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
