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
  gn_wire_put_map(w, u->by ? 5 : 4);
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

static void solo_new(solo *so, const gn_swim_config *cfg, uint64_t seed) {
  memset(so, 0, sizeof *so);
  mkid(so->id, 0);
  gn_swim_io io = {solo_send, solo_event, so};
  assert_int_equal(gn_swim_new(so->id, "10.9.0.1:7946", cfg, &io, seed, 0, &so->s), 0);
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
  if (getenv("SWIM_DEBUG")) {
    for (uint32_t i = 0; i < net->nev; i++)
      fprintf(stderr, "ev t=%llu obs=%u tgt=%u kind=%d local=%d inc=%u\n", (unsigned long long)(net->ev[i].at - t0),
              net->ev[i].obs, net->ev[i].target, net->ev[i].kind, net->ev[i].local, net->ev[i].inc);
    gn_swim_stats st;
    gn_swim_stats_get(net->nodes[0].s, &st);
    fprintf(stderr, "sent %llu/%llu recv %llu bad %llu probes %llu failed %llu health %u\n",
            (unsigned long long)st.sent_msgs, (unsigned long long)st.sent_bytes, (unsigned long long)st.recv_msgs,
            (unsigned long long)st.recv_bad, (unsigned long long)st.probes, (unsigned long long)st.probes_failed,
            gn_swim_health(net->nodes[0].s));
  }
  assert_int_equal(count_events(net, GN_SWIM_EV_DEAD, victim), 11);
  /* With confirmations from 10 others, it is far faster than the maximum. */
  assert_true(last - t0 < 12 * cfg.probe_interval_ms + cfg.suspicion_alpha * cfg.suspicion_beta * 1000 / 2);
  net_done(net);
  free(net);
}

int main(void) {
  (void)peer_addr, (void)solo_new, (void)body_seq, (void)body_has, (void)build;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_join_converges),
      cmocka_unit_test(test_killed_node_dead_everywhere),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
