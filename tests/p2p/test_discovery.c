/* A deterministic simulator for discovery: up to MAXN in-memory nodes whose
 * io callbacks go through one message queue, delivered in an order drawn
 * from a seeded PRNG, with time advanced by the test; and single nodes
 * driven by hand for the limits (fanout, PEERS, digest and want bodies). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/discovery.h>

#include <stdio.h>

#define MAXN 50
#define NOW 1700000000
#define QMAX 400000

typedef struct simnode {
  gn_identity *id;
  gn_offer_table *table;
  gn_discovery *d;
  char addr[32];
  bool up_with[MAXN];
  bool alive;
  int bad_msgs;
  uint64_t bytes_out;
  uint64_t msgs_by_type[8]; /* sent, by envelope type (discovery's are 1..5) */
} simnode;

typedef enum { EV_MSG, EV_CONNECT } ev_kind;

typedef struct simev {
  ev_kind kind;
  int from, to;
  uint8_t *data;
  size_t len;
} simev;

static simnode nodes[MAXN];
static int N = 20; /* nodes in use */
static int64_t now_s = NOW;
static simev *queue;
static size_t qlen;
static uint64_t rng_state;
static size_t delivered;
static int drop_withdraw_to = -1; /* withdrawals to this node are lost on the way */
static bool dials_off;            /* PEERS entries are not dialled: the test's links only */

static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static int index_of_pk(const uint8_t pk[GN_PK_LEN]) {
  for (int i = 0; i < N; i++)
    if (memcmp(nodes[i].id->pk, pk, GN_PK_LEN) == 0)
      return i;
  return -1;
}

static int index_of_addr(const char *addr) {
  for (int i = 0; i < N; i++)
    if (strcmp(nodes[i].addr, addr) == 0)
      return i;
  return -1;
}

static void push(simev e) {
  assert_true(qlen < QMAX);
  queue[qlen++] = e;
}

static int sim_send(void *ud, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len) {
  int from = (int)(intptr_t)ud, to = index_of_pk(peer);
  assert_true(to >= 0);
  if (!nodes[from].up_with[to])
    return GN_ENOTFOUND;
  simev e = {EV_MSG, from, to, malloc(len), len};
  memcpy(e.data, env, len);
  push(e);
  /* An envelope is [1, type, ...]: its type is the third byte. */
  nodes[from].bytes_out += len;
  if (len > 2 && env[2] < 8)
    nodes[from].msgs_by_type[env[2]]++;
  return 0;
}

static int sim_connect(void *ud, const char *addr) {
  int from = (int)(intptr_t)ud, to = index_of_addr(addr);
  if (to < 0)
    return GN_EINVAL;
  if (dials_off)
    return 0;
  push((simev){EV_CONNECT, from, to, NULL, 0});
  return 0;
}

static void link_up(int a, int b) {
  if (a == b || nodes[a].up_with[b] || !nodes[a].alive || !nodes[b].alive)
    return;
  nodes[a].up_with[b] = nodes[b].up_with[a] = true;
  assert_int_equal(gn_discovery_peer_up(nodes[a].d, nodes[b].id->pk, nodes[b].addr, now_s), 0);
  assert_int_equal(gn_discovery_peer_up(nodes[b].d, nodes[a].id->pk, nodes[a].addr, now_s), 0);
}

/* Delivers queued events in random order until none are left. */
static void run(void) {
  while (qlen) {
    size_t i = (size_t)(rnd() % qlen);
    simev e = queue[i];
    queue[i] = queue[--qlen];
    delivered++;
    if (e.kind == EV_CONNECT) {
      link_up(e.from, e.to);
      continue;
    }
    bool lost = e.to == drop_withdraw_to && e.len > 2 && e.data[2] == GN_MSG_OFFER_WITHDRAW;
    if (!lost && nodes[e.to].alive && nodes[e.to].up_with[e.from]) {
      gn_envelope env;
      /* The transport only hands over envelopes that verify. */
      if (gn_envelope_open(e.data, e.len, &env) == 0) {
        int r = gn_discovery_on_message(nodes[e.to].d, nodes[e.from].id->pk, &env, e.data, e.len, now_s);
        if (r < 0)
          nodes[e.to].bad_msgs++;
      }
    }
    free(e.data);
  }
}

/* n nodes; with bootstrap, everyone knows node 0 and the rest is learnt
 * from PEERS; without, the test links them. */
static void sim_start_n(int n_nodes, uint64_t seed, bool bootstrap) {
  N = n_nodes;
  now_s = NOW;
  rng_state = seed;
  queue = calloc(QMAX, sizeof(*queue));
  qlen = delivered = 0;
  drop_withdraw_to = -1;
  dials_off = false;
  for (int i = 0; i < N; i++) {
    simnode *n = &nodes[i];
    memset(n, 0, sizeof(*n));
    assert_int_equal(gn_identity_generate(&n->id), 0);
    n->table = gn_offer_table_new(256);
    snprintf(n->addr, sizeof(n->addr), "10.0.0.%d:7400", i + 1);
    gn_discovery_io io = {sim_send, sim_connect, (void *)(intptr_t)i};
    assert_int_equal(gn_discovery_new(n->id, &io, n->table, &n->d), 0);
    gn_discovery_seed(n->d, seed * 1000 + (uint64_t)i);
    assert_int_equal(gn_discovery_set_self_addr(n->d, n->addr), 0);
    n->alive = true;
  }
  for (int i = 1; bootstrap && i < N; i++) {
    assert_int_equal(gn_discovery_add_bootstrap(nodes[i].d, nodes[0].addr), 0);
    gn_discovery_tick(nodes[i].d, now_s);
  }
  run();
}

static void sim_start(uint64_t seed) {
  sim_start_n(20, seed, true);
}

/* One anti-entropy period: time moves on, every node ticks (one summary
 * digest each), and everything sent is delivered. */
static void sim_round(void) {
  now_s += GN_DISCOVERY_DIGEST_S;
  for (int i = 0; i < N; i++)
    if (nodes[i].alive)
      gn_discovery_tick(nodes[i].d, now_s);
  run();
}

static void counters_reset(void) {
  for (int i = 0; i < N; i++) {
    nodes[i].bytes_out = 0;
    memset(nodes[i].msgs_by_type, 0, sizeof(nodes[i].msgs_by_type));
  }
}

static uint64_t bytes_total(void) {
  uint64_t b = 0;
  for (int i = 0; i < N; i++)
    b += nodes[i].bytes_out;
  return b;
}

static void sim_stop(void) {
  for (size_t i = 0; i < qlen; i++)
    free(queue[i].data);
  free(queue);
  for (int i = 0; i < N; i++) {
    gn_discovery_free(nodes[i].d);
    gn_offer_table_free(nodes[i].table);
    gn_identity_free(nodes[i].id);
  }
}

static gn_offer offer_of(int i, uint64_t seq) {
  gn_offer o;
  memset(&o, 0, sizeof(o));
  o.seq = seq;
  o.issued_s = now_s;
  o.expires_s = now_s + 600;
  snprintf(o.addr, sizeof(o.addr), "%s", nodes[i].addr);
  snprintf(o.gpu_model, sizeof(o.gpu_model), "NVIDIA GeForce RTX 4090");
  o.vram_mib = 24564;
  o.gpus_free = o.gpus_total = 1;
  o.price_uper_hour = 300000 + seq;
  snprintf(o.currency, sizeof(o.currency), "EUR");
  o.max_hours = 10;
  return o;
}

static int nodes_with_offer_from(int provider, uint64_t seq) {
  int n = 0;
  for (int i = 0; i < N; i++) {
    for (size_t k = 0; k < gn_offer_table_count(nodes[i].table); k++) {
      const gn_offer_entry *e = gn_offer_table_at(nodes[i].table, k);
      if (memcmp(e->offer.provider, nodes[provider].id->pk, GN_PK_LEN) == 0 && e->offer.seq == seq)
        n++;
    }
  }
  return n;
}

/* Anti-entropy periods until every node holds provider's offer seq, at most
 * max_rounds; returns how many it took. */
static int converge(int provider, uint64_t seq, int max_rounds) {
  int rounds = 0;
  while (nodes_with_offer_from(provider, seq) < N && rounds < max_rounds) {
    sim_round();
    rounds++;
  }
  assert_int_equal(nodes_with_offer_from(provider, seq), N);
  return rounds;
}

static void test_discovery_overlay_forms_from_one_bootstrap(void **state) {
  (void)state;
  sim_start(1);
  /* every node is connected, and beyond the bootstrap for most */
  int beyond = 0;
  for (int i = 0; i < N; i++) {
    assert_true(gn_discovery_up_count(nodes[i].d) >= 1);
    if (i && gn_discovery_up_count(nodes[i].d) > 1)
      beyond++;
    assert_int_equal(nodes[i].bad_msgs, 0);
  }
  assert_true(beyond >= N / 2);
  sim_stop();
}

static void test_discovery_offer_reaches_every_node_and_withdraw_follows(void **state) {
  (void)state;
  for (uint64_t seed = 1; seed <= 5; seed++) {
    sim_start(seed * 7919);
    int p = (int)(seed % N);
    gn_buf env = {0};
    gn_offer o = offer_of(p, 1);
    assert_int_equal(gn_offer_seal(nodes[p].id, &o, &env), 0);
    assert_int_equal(gn_discovery_publish(nodes[p].d, env.data, env.len, now_s), 0);
    size_t before = delivered;
    run();
    /* push gossip with dedupe: each node pushes once, to at most
     * GN_DISCOVERY_FANOUT, so messages stay within N * fanout */
    assert_true(delivered - before <= (size_t)N * GN_DISCOVERY_FANOUT);
    /* most nodes have it from the push, the rest within a few digests */
    assert_true(nodes_with_offer_from(p, 1) >= N * 3 / 4);
    converge(p, 1, 6);
    /* a relayed copy at a node far from p verifies by the issuer's key */
    int far = (p + N / 2) % N;
    const gn_offer_entry *e = gn_offer_table_at(nodes[far].table, 0);
    assert_non_null(e);
    gn_envelope opened;
    assert_int_equal(gn_envelope_open(e->raw, e->raw_len, &opened), 0);
    assert_memory_equal(opened.signer, nodes[p].id->pk, GN_PK_LEN);
    /* ... and the table remembers the neighbour that handed it over (the
     * issuer itself at the issuer) */
    int via = index_of_pk(e->relayer);
    assert_true(via >= 0 && via != far && nodes[far].up_with[via]);
    assert_memory_equal(gn_offer_table_at(nodes[p].table, 0)->relayer, nodes[p].id->pk, GN_PK_LEN);
    /* a newer seq replaces everywhere */
    env.len = 0;
    o = offer_of(p, 2);
    assert_int_equal(gn_offer_seal(nodes[p].id, &o, &env), 0);
    assert_int_equal(gn_discovery_publish(nodes[p].d, env.data, env.len, now_s), 0);
    run();
    converge(p, 2, 6);
    assert_int_equal(nodes_with_offer_from(p, 1), 0);
    /* withdraw propagates */
    env.len = 0;
    assert_int_equal(gn_offer_withdraw_seal(nodes[p].id, 2, &env), 0);
    assert_int_equal(gn_discovery_publish(nodes[p].d, env.data, env.len, now_s), 0);
    run();
    assert_int_equal(nodes_with_offer_from(p, 2), 0);
    for (int i = 0; i < N; i++)
      assert_int_equal(nodes[i].bad_msgs, 0);
    gn_buf_done(&env);
    sim_stop();
  }
}

static void test_discovery_drops_forged_offers(void **state) {
  (void)state;
  sim_start(99);
  int victim = 5, forger = 3;
  /* forger signs an offer naming the victim as provider */
  gn_offer o = offer_of(victim, 1);
  memcpy(o.provider, nodes[victim].id->pk, GN_PK_LEN);
  gn_buf body = {0}, env = {0};
  assert_int_equal(gn_offer_encode(&o, &body), 0);
  assert_int_equal(gn_envelope_seal(nodes[forger].id, GN_MSG_OFFER, body.data, body.len, &env), 0);
  for (int i = 0; i < N; i++)
    if (nodes[forger].up_with[i])
      sim_send((void *)(intptr_t)forger, nodes[i].id->pk, env.data, env.len);
  run();
  assert_int_equal(nodes_with_offer_from(victim, 1), 0);
  int rejecting = 0;
  for (int i = 0; i < N; i++)
    rejecting += nodes[i].bad_msgs;
  assert_true(rejecting >= 1);

  /* a genuine offer with one flipped signature bit, handed straight to
   * discovery (as if a transport skipped verification): dropped too */
  env.len = 0;
  assert_int_equal(gn_offer_seal(nodes[victim].id, &o, &env), 0);
  gn_envelope parsed;
  assert_int_equal(gn_envelope_open(env.data, env.len, &parsed), 0);
  env.data[env.len - 1] ^= 1;
  int to = 0;
  while (!nodes[forger].up_with[to])
    to++;
  assert_int_equal(gn_discovery_on_message(nodes[to].d, nodes[forger].id->pk, &parsed, env.data, env.len, now_s),
                   GN_ESIG);
  run();
  assert_int_equal(nodes_with_offer_from(victim, 1), 0);
  gn_buf_done(&body);
  gn_buf_done(&env);
  sim_stop();
}

static void test_discovery_peer_down_drops_only_its_own_offers(void **state) {
  (void)state;
  sim_start(4242);
  gn_buf e1 = {0}, e2 = {0};
  gn_offer a = offer_of(7, 1), b = offer_of(8, 1);
  assert_int_equal(gn_offer_seal(nodes[7].id, &a, &e1), 0);
  assert_int_equal(gn_offer_seal(nodes[8].id, &b, &e2), 0);
  assert_int_equal(gn_discovery_publish(nodes[7].d, e1.data, e1.len, now_s), 0);
  assert_int_equal(gn_discovery_publish(nodes[8].d, e2.data, e2.len, now_s), 0);
  run();
  converge(7, 1, 6);
  converge(8, 1, 6);
  /* node 7 leaves: its neighbours drop its offer, keep node 8's */
  nodes[7].alive = false;
  int neighbours = 0;
  for (int i = 0; i < N; i++) {
    if (!nodes[7].up_with[i])
      continue;
    neighbours++;
    nodes[i].up_with[7] = nodes[7].up_with[i] = false;
    gn_discovery_peer_down(nodes[i].d, nodes[7].id->pk, now_s);
    char id[GN_OFFER_ID_STRLEN];
    memcpy(a.provider, nodes[7].id->pk, GN_PK_LEN);
    gn_offer_id(&a, id);
    assert_null(gn_offer_table_find(nodes[i].table, id));
    memcpy(b.provider, nodes[8].id->pk, GN_PK_LEN);
    gn_offer_id(&b, id);
    assert_non_null(gn_offer_table_find(nodes[i].table, id));
  }
  assert_true(neighbours >= 1);
  gn_buf_done(&e1);
  gn_buf_done(&e2);
  sim_stop();
}

static void test_discovery_rejects_bad_peers_messages(void **state) {
  (void)state;
  sim_start(5);
  int from = 1, to = 0;
  assert_true(nodes[from].up_with[to]);
  /* past the one PEERS a peer may send per period (each sent one at link-up) */
  now_s += GN_DISCOVERY_PEERS_EVERY_S;
  /* too many entries */
  gn_wire_writer w;
  gn_buf body = {0}, env = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 1);
  gn_wire_put_str(&w, "peers");
  gn_wire_put_array(&w, GN_DISCOVERY_MAX_PEERS_MSG + 1);
  for (int i = 0; i < GN_DISCOVERY_MAX_PEERS_MSG + 1; i++) {
    gn_wire_put_map(&w, 2);
    gn_wire_put_str(&w, "id");
    gn_wire_put_bin(&w, nodes[2].id->pk, GN_PK_LEN);
    gn_wire_put_str(&w, "addr");
    gn_wire_put_str(&w, "10.9.9.9:1");
  }
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(nodes[from].id, GN_MSG_PEERS, body.data, body.len, &env), 0);
  gn_envelope parsed;
  assert_int_equal(gn_envelope_open(env.data, env.len, &parsed), 0);
  assert_int_equal(gn_discovery_on_message(nodes[to].d, nodes[from].id->pk, &parsed, env.data, env.len, now_s),
                   GN_ETOOBIG);
  /* a PEERS relayed from someone else */
  env.len = 0;
  assert_int_equal(gn_envelope_seal(nodes[2].id, GN_MSG_PEERS, (const uint8_t *)"\x81\xa5peers\x90", 8, &env), 0);
  assert_int_equal(gn_envelope_open(env.data, env.len, &parsed), 0);
  assert_int_equal(gn_discovery_on_message(nodes[to].d, nodes[from].id->pk, &parsed, env.data, env.len, now_s),
                   GN_EPERM);
  /* not a discovery message at all */
  env.len = 0;
  assert_int_equal(gn_envelope_seal(nodes[from].id, GN_MSG_LEASE_REQUEST, (const uint8_t *)"\x80", 1, &env), 0);
  assert_int_equal(gn_envelope_open(env.data, env.len, &parsed), 0);
  assert_int_equal(gn_discovery_on_message(nodes[to].d, nodes[from].id->pk, &parsed, env.data, env.len, now_s),
                   GN_ENOTFOUND);
  assert_int_equal(qlen, 0); /* nothing was dialled or sent */
  gn_buf_done(&body);
  gn_buf_done(&env);
  sim_stop();
}

static int connects;
static int count_connect(void *ud, const char *addr) {
  (void)ud;
  (void)addr;
  connects++;
  return 0;
}
static int no_send(void *ud, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len) {
  (void)ud;
  (void)peer;
  (void)env;
  (void)len;
  return 0;
}

static void test_discovery_tick_redials_bootstraps_every_5s(void **state) {
  (void)state;
  gn_identity *id;
  gn_discovery *d;
  assert_int_equal(gn_identity_generate(&id), 0);
  gn_offer_table *t = gn_offer_table_new(8);
  gn_discovery_io io = {no_send, count_connect, NULL};
  assert_int_equal(gn_discovery_new(id, &io, t, &d), 0);
  assert_int_equal(gn_discovery_add_bootstrap(d, "127.0.0.1:7400"), 0);
  connects = 0;
  gn_discovery_tick(d, 100);
  gn_discovery_tick(d, 104);
  assert_int_equal(connects, 1);
  gn_discovery_tick(d, 105);
  assert_int_equal(connects, 2);
  /* up through that address: no more dials */
  uint8_t pk[GN_PK_LEN] = {1};
  assert_int_equal(gn_discovery_peer_up(d, pk, "127.0.0.1:7400", 106), 0);
  gn_discovery_tick(d, 200);
  assert_int_equal(connects, 2);
  gn_discovery_peer_down(d, pk, 201);
  gn_discovery_tick(d, 202);
  assert_int_equal(connects, 3);
  gn_discovery_free(d);
  gn_offer_table_free(t);
  gn_identity_free(id);
}

static int plain_dials;
static uint8_t dialled_key[4][GN_PK_LEN];
static char dialled_addr[4][64];
static int keyed_dials;
static int plain_connect(void *ud, const char *addr) {
  (void)ud;
  (void)addr;
  plain_dials++;
  return 0;
}
static int keyed_connect(void *ud, const char *addr, const uint8_t expect[GN_PK_LEN]) {
  (void)ud;
  if (keyed_dials < 4) {
    memcpy(dialled_key[keyed_dials], expect, GN_PK_LEN);
    snprintf(dialled_addr[keyed_dials], sizeof(dialled_addr[0]), "%s", addr);
  }
  keyed_dials++;
  return 0;
}

/* An address from a PEERS entry is dialled together with the key it was
 * advertised with, so the transport can refuse another node answering
 * there; bootstraps (no key known) are dialled plainly. */
static void test_discovery_dials_peers_entries_with_their_key(void **state) {
  (void)state;
  gn_identity *self, *sender;
  gn_discovery *d;
  assert_int_equal(gn_identity_generate(&self), 0);
  assert_int_equal(gn_identity_generate(&sender), 0);
  gn_offer_table *t = gn_offer_table_new(8);
  gn_discovery_io io = {no_send, plain_connect, NULL};
  assert_int_equal(gn_discovery_new(self, &io, t, &d), 0);
  gn_discovery_set_connect_peer(d, keyed_connect);
  assert_int_equal(gn_discovery_add_bootstrap(d, "127.0.0.1:7400"), 0);
  plain_dials = keyed_dials = 0;
  gn_discovery_tick(d, 100);
  assert_int_equal(plain_dials, 1);
  assert_int_equal(keyed_dials, 0);
  assert_int_equal(gn_discovery_peer_up(d, sender->pk, "127.0.0.1:7400", 100), 0);
  uint8_t k1[GN_PK_LEN], k2[GN_PK_LEN];
  memset(k1, 0x11, sizeof(k1));
  memset(k2, 0x22, sizeof(k2));
  gn_wire_writer w;
  gn_buf body = {0}, env = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 1);
  gn_wire_put_str(&w, "peers");
  gn_wire_put_array(&w, 2);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "id");
  gn_wire_put_bin(&w, k1, GN_PK_LEN);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, "10.0.0.1:7400");
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "id");
  gn_wire_put_bin(&w, k2, GN_PK_LEN);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, "10.0.0.2:7400");
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(sender, GN_MSG_PEERS, body.data, body.len, &env), 0);
  gn_envelope parsed;
  assert_int_equal(gn_envelope_open(env.data, env.len, &parsed), 0);
  assert_int_equal(gn_discovery_on_message(d, sender->pk, &parsed, env.data, env.len, 101), 0);
  assert_int_equal(plain_dials, 1);
  assert_int_equal(keyed_dials, 2);
  assert_string_equal(dialled_addr[0], "10.0.0.1:7400");
  assert_memory_equal(dialled_key[0], k1, GN_PK_LEN);
  assert_string_equal(dialled_addr[1], "10.0.0.2:7400");
  assert_memory_equal(dialled_key[1], k2, GN_PK_LEN);
  gn_buf_done(&body);
  gn_buf_done(&env);
  gn_discovery_free(d);
  gn_offer_table_free(t);
  gn_identity_free(self);
  gn_identity_free(sender);
}

static int heard_n;
static uint8_t heard_key[4][GN_PK_LEN];
static void count_heard(void *ud, const uint8_t id[GN_PK_LEN], const char *addr) {
  (void)ud;
  (void)addr;
  if (heard_n < 4)
    memcpy(heard_key[heard_n], id, GN_PK_LEN);
  heard_n++;
}

/* With partial views (a heard hook set), PEERS entries are names handed
 * to the peer table, never dialled: not ours, not up already. */
static void test_discovery_peers_entries_heard_not_dialled_with_views(void **state) {
  (void)state;
  gn_identity *self, *sender;
  gn_discovery *d;
  assert_int_equal(gn_identity_generate(&self), 0);
  assert_int_equal(gn_identity_generate(&sender), 0);
  gn_offer_table *t = gn_offer_table_new(8);
  gn_discovery_io io = {no_send, plain_connect, NULL};
  assert_int_equal(gn_discovery_new(self, &io, t, &d), 0);
  gn_discovery_set_connect_peer(d, keyed_connect);
  gn_discovery_set_heard(d, count_heard);
  assert_int_equal(gn_discovery_set_self_addr(d, "10.0.0.9:7400"), 0);
  assert_int_equal(gn_discovery_peer_up(d, sender->pk, "10.0.0.5:7400", 100), 0);
  uint8_t k1[GN_PK_LEN];
  memset(k1, 0x11, sizeof(k1));
  const uint8_t *ids[3] = {k1, self->pk, sender->pk};
  const char *addrs[3] = {"10.0.0.1:7400", "10.0.0.9:7400", "10.0.0.5:7400"};
  gn_wire_writer w;
  gn_buf body = {0}, env = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 1);
  gn_wire_put_str(&w, "peers");
  gn_wire_put_array(&w, 3);
  for (int i = 0; i < 3; i++) {
    gn_wire_put_map(&w, 2);
    gn_wire_put_str(&w, "id");
    gn_wire_put_bin(&w, ids[i], GN_PK_LEN);
    gn_wire_put_str(&w, "addr");
    gn_wire_put_str(&w, addrs[i]);
  }
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(sender, GN_MSG_PEERS, body.data, body.len, &env), 0);
  gn_envelope parsed;
  assert_int_equal(gn_envelope_open(env.data, env.len, &parsed), 0);
  plain_dials = keyed_dials = heard_n = 0;
  assert_int_equal(gn_discovery_on_message(d, sender->pk, &parsed, env.data, env.len, 101), 0);
  assert_int_equal(heard_n, 1); /* ourselves and the sender (up) left out */
  assert_memory_equal(heard_key[0], k1, GN_PK_LEN);
  assert_int_equal(plain_dials + keyed_dials, 0);
  gn_buf_done(&body);
  gn_buf_done(&env);
  gn_discovery_free(d);
  gn_offer_table_free(t);
  gn_identity_free(self);
  gn_identity_free(sender);
}

/* With partial views a bootstrap is dialled until its session was up once:
 * when the views close that session, discovery does not bring it back
 * (the views rejoin through it when they run empty). */
static void test_discovery_bootstrap_reached_once_not_redialled_with_views(void **state) {
  (void)state;
  gn_identity *id;
  gn_discovery *d;
  assert_int_equal(gn_identity_generate(&id), 0);
  gn_offer_table *t = gn_offer_table_new(8);
  gn_discovery_io io = {no_send, count_connect, NULL};
  assert_int_equal(gn_discovery_new(id, &io, t, &d), 0);
  gn_discovery_neighbours_only(d, true);
  assert_int_equal(gn_discovery_add_bootstrap(d, "127.0.0.1:7400"), 0);
  connects = 0;
  gn_discovery_tick(d, 100);
  gn_discovery_tick(d, 105);
  assert_int_equal(connects, 2); /* not reached yet: redialled */
  uint8_t pk[GN_PK_LEN] = {1};
  assert_int_equal(gn_discovery_peer_up(d, pk, "127.0.0.1:7400", 106), 0);
  gn_discovery_peer_down(d, pk, 107);
  for (int64_t s = 108; s < 200; s++)
    gn_discovery_tick(d, s);
  assert_int_equal(connects, 2);
  gn_discovery_free(d);
  gn_offer_table_free(t);
  gn_identity_free(id);
}

/* --- gossip and anti-entropy in the simulator -------------------------------*/

/* Puts provider i's offer for model m (seq) straight into node `at`'s table,
 * as if it had been heard long ago. */
static void table_put(int at, const gn_identity *prov, int m, uint64_t seq) {
  gn_offer o;
  memset(&o, 0, sizeof(o));
  o.seq = seq;
  o.issued_s = now_s;
  o.expires_s = now_s + 600;
  snprintf(o.addr, sizeof(o.addr), "10.1.0.1:7400");
  snprintf(o.gpu_model, sizeof(o.gpu_model), "GPU model %d", m);
  o.vram_mib = 24564;
  o.gpus_free = o.gpus_total = 1;
  o.price_uper_hour = 300000;
  snprintf(o.currency, sizeof(o.currency), "EUR");
  o.max_hours = 10;
  gn_buf env = {0};
  assert_int_equal(gn_offer_seal(prov, &o, &env), 0);
  assert_int_equal(gn_offer_table_put(nodes[at].table, env.data, env.len, now_s), 1);
  gn_buf_done(&env);
}

/* Do a and b hold the same offers, seq for seq? */
static bool tables_equal(int a, int b) {
  size_t n = gn_offer_table_count(nodes[a].table);
  if (n != gn_offer_table_count(nodes[b].table))
    return false;
  for (size_t i = 0; i < n; i++) {
    const gn_offer_entry *x = gn_offer_table_at(nodes[a].table, i);
    const gn_offer_entry *y = gn_offer_table_find(nodes[b].table, x->id);
    if (!y || y->offer.seq != x->offer.seq)
      return false;
  }
  return true;
}

static size_t table_bytes(int a) {
  size_t b = 0;
  for (size_t i = 0; i < gn_offer_table_count(nodes[a].table); i++)
    b += gn_offer_table_at(nodes[a].table, i)->raw_len;
  return b;
}

#define SYNC_PROVIDERS 200

/* A node joining a neighbour that holds 200 offers is sent a digest, not the
 * table: it asks for what it lacks and ends with exactly the same offers,
 * each sent once. A node that already held 150 of them (one older) is sent
 * only the 50 it lacked and the newer one. */
static void test_discovery_joining_peer_syncs_by_digest(void **state) {
  (void)state;
  gn_identity *prov[SYNC_PROVIDERS];
  for (int k = 0; k < 2; k++) {
    sim_start_n(2, 77 + (uint64_t)k, false);
    for (int i = 0; i < SYNC_PROVIDERS; i++) {
      assert_int_equal(gn_identity_generate(&prov[i]), 0);
      table_put(0, prov[i], i % 3, 2);
      if (k == 1 && i < 150)
        table_put(1, prov[i], i % 3, i == 0 ? 1 : 2);
    }
    size_t lacking = k == 0 ? SYNC_PROVIDERS : 51;
    nodes[0].up_with[1] = nodes[1].up_with[0] = true;
    assert_int_equal(gn_discovery_peer_up(nodes[0].d, nodes[1].id->pk, nodes[1].addr, now_s), 0);
    /* what node 0 sends when the session comes up: PEERS and a digest */
    assert_int_equal(qlen, 2);
    assert_int_equal(nodes[0].msgs_by_type[GN_MSG_PEERS], 1);
    assert_int_equal(nodes[0].msgs_by_type[GN_MSG_OFFER_DIGEST], 1);
    assert_int_equal(nodes[0].msgs_by_type[GN_MSG_OFFER], 0);
    assert_int_equal(gn_discovery_peer_up(nodes[1].d, nodes[0].id->pk, nodes[0].addr, now_s), 0);
    run();
    assert_true(tables_equal(0, 1));
    /* each lacking offer once (the older one may come twice: asked for,
     * and pushed as newer when node 0 saw node 1's digest) */
    assert_true(nodes[0].msgs_by_type[GN_MSG_OFFER] >= lacking);
    assert_true(nodes[0].msgs_by_type[GN_MSG_OFFER] <= lacking + (k == 1));
    assert_int_equal(nodes[1].msgs_by_type[GN_MSG_OFFER], 0);
    assert_int_equal(nodes[0].bad_msgs + nodes[1].bad_msgs, 0);
    /* nothing pulled was pushed on: neither node gossiped it */
    print_message("join with %zu of %d offers lacking: %llu bytes sent to the joiner (%llu messages), the table is %zu "
                  "bytes\n",
                  lacking, SYNC_PROVIDERS, (unsigned long long)nodes[0].bytes_out,
                  (unsigned long long)(nodes[0].msgs_by_type[1] + nodes[0].msgs_by_type[2] + nodes[0].msgs_by_type[4] +
                                       nodes[0].msgs_by_type[5]),
                  table_bytes(0));
    if (k == 1)
      assert_true(nodes[0].bytes_out < table_bytes(0) / 2);
    /* in sync: the next digests ask for nothing */
    counters_reset();
    sim_round();
    assert_int_equal(nodes[0].msgs_by_type[GN_MSG_OFFER_WANT] + nodes[1].msgs_by_type[GN_MSG_OFFER_WANT], 0);
    assert_int_equal(nodes[0].msgs_by_type[GN_MSG_OFFER] + nodes[1].msgs_by_type[GN_MSG_OFFER], 0);
    for (int i = 0; i < SYNC_PROVIDERS; i++)
      gn_identity_free(prov[i]);
    sim_stop();
  }
}

/* 50 nodes, each linked to 3 random others (and whom PEERS then adds), 5
 * providers refreshing their offers every 20 s for a minute: every refresh
 * reaches every node by fanout push and anti-entropy within 4 periods, and
 * costs each node fewer bytes than the flood did (fanout = every neighbour,
 * no digests: the protocol before gossip). */
static uint64_t minute_of_refreshes(uint64_t seed, bool flood, int *ret_worst_rounds, int *ret_after_push) {
  sim_start_n(MAXN, seed, false);
  for (int i = 0; i < N; i++) {
    if (flood)
      gn_discovery_set_fanout(nodes[i].d, GN_DISCOVERY_MAX_UP);
    for (int k = 0; k < 3; k++) {
      int j = (int)(rnd() % (uint64_t)N);
      if (j != i && !nodes[i].up_with[j])
        push((simev){EV_CONNECT, i, j, NULL, 0});
    }
  }
  run();
  counters_reset();
  int worst = 0, after_push = N;
  const int providers[5] = {3, 11, 19, 27, 42};
  for (uint64_t seq = 1; seq <= 3; seq++) {
    for (int k = 0; k < 5; k++) {
      gn_buf env = {0};
      gn_offer o = offer_of(providers[k], seq);
      assert_int_equal(gn_offer_seal(nodes[providers[k]].id, &o, &env), 0);
      assert_int_equal(gn_discovery_publish(nodes[providers[k]].d, env.data, env.len, now_s), 0);
      gn_buf_done(&env);
    }
    run();
    int rounds = 0;
    for (int k = 0; k < 5; k++) {
      int reached = nodes_with_offer_from(providers[k], seq);
      after_push = reached < after_push ? reached : after_push;
      if (flood) {
        assert_int_equal(reached, N);
        continue;
      }
      int r = converge(providers[k], seq, 4);
      rounds += r;
      worst = r > worst ? r : worst;
    }
    /* the rest of the 20 s between refreshes: digests go on (not flooding) */
    for (int r = rounds; r < 4; r++) {
      if (flood)
        now_s += GN_DISCOVERY_DIGEST_S;
      else
        sim_round();
    }
  }
  for (int i = 0; i < N; i++)
    assert_int_equal(nodes[i].bad_msgs, 0);
  uint64_t per_node = bytes_total() / (uint64_t)N;
  sim_stop();
  *ret_worst_rounds = worst;
  *ret_after_push = after_push;
  return per_node;
}

static void test_discovery_50_nodes_converge_with_fewer_bytes_than_flood(void **state) {
  (void)state;
  for (uint64_t seed = 1; seed <= 3; seed++) {
    int worst, after_push, fworst, fafter;
    uint64_t gossip = minute_of_refreshes(seed * 104729, false, &worst, &after_push);
    uint64_t flood = minute_of_refreshes(seed * 104729, true, &fworst, &fafter);
    print_message(
        "50 nodes, 5 providers x 3 refreshes: gossip %llu bytes/node (fanout %d, digests every %d s; %d of 50 "
        "reached by the push alone at worst, all within %d periods), flood %llu bytes/node\n",
        (unsigned long long)gossip, GN_DISCOVERY_FANOUT, GN_DISCOVERY_DIGEST_S, after_push, worst,
        (unsigned long long)flood);
    assert_true(after_push >= 40);
    assert_true(worst <= 4);
    assert_true(gossip < flood);
  }
}

/* --- withdrawals repaired by anti-entropy ----------------------------------*/

/* Three nodes in a chain 0 - 1 - 2 (no other links), node 0 providing offer seq (held by
 * all), digests started at every node. */
static void chain_with_offer(uint64_t seed, uint64_t seq) {
  sim_start_n(3, seed, false);
  dials_off = true; /* 2 reaches 0 only through 1 */
  link_up(0, 1);
  link_up(1, 2);
  run();
  gn_buf env = {0};
  gn_offer o = offer_of(0, seq);
  assert_int_equal(gn_offer_seal(nodes[0].id, &o, &env), 0);
  assert_int_equal(gn_discovery_publish(nodes[0].d, env.data, env.len, now_s), 0);
  gn_buf_done(&env);
  run();
  sim_round(); /* the first tick of each node only schedules its digests */
  sim_round();
  assert_int_equal(nodes_with_offer_from(0, seq), 3);
}

/* Node 0 withdraws its offers up to seq; node 2 loses the withdrawal. */
static void withdraw_missed_by_2(uint64_t seq) {
  gn_buf env = {0};
  drop_withdraw_to = 2;
  assert_int_equal(gn_offer_withdraw_seal(nodes[0].id, seq, &env), 0);
  assert_int_equal(gn_discovery_publish(nodes[0].d, env.data, env.len, now_s), 0);
  run();
  drop_withdraw_to = -1;
  gn_buf_done(&env);
}

/* A node that missed a withdrawal (every copy pushed to it was lost) holds
 * the offer no longer after one anti-entropy period: its neighbour, which
 * keeps the signed withdrawal, sees the offer in its detail digest and hands
 * it the withdrawal. Before, it held the offer until it expired (600 s
 * here). */
static void test_discovery_missed_withdrawal_repaired_by_one_digest_exchange(void **state) {
  (void)state;
  for (uint64_t seed = 1; seed <= 8; seed++) {
    chain_with_offer(seed * 31337, 4);
    withdraw_missed_by_2(4);
    assert_int_equal(nodes_with_offer_from(0, 4), 1); /* node 2 only */
    counters_reset();
    sim_round();
    assert_int_equal(nodes_with_offer_from(0, 4), 0);
    /* node 1 sent it, once */
    assert_int_equal(nodes[1].msgs_by_type[GN_MSG_OFFER_WITHDRAW], 1);
    for (int i = 0; i < N; i++)
      assert_int_equal(nodes[i].bad_msgs, 0);
    /* the repaired node keeps it too: a copy of the offer arriving late
     * is refused there as well */
    assert_true(gn_offer_table_withdrawn(nodes[2].table, nodes[0].id->pk, 4));
    sim_stop();
  }
}

/* A withdrawal signed by anyone but the provider is refused where it
 * arrives, is kept nowhere, and later digests change nothing. */
static void test_discovery_forged_withdrawal_changes_nothing(void **state) {
  (void)state;
  chain_with_offer(4242, 2);
  gn_identity *x;
  assert_int_equal(gn_identity_generate(&x), 0);
  gn_wire_writer w;
  gn_buf body = {0}, env = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "provider");
  gn_wire_put_bin(&w, nodes[0].id->pk, GN_PK_LEN);
  gn_wire_put_str(&w, "seq");
  gn_wire_put_u64(&w, 99);
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(x, GN_MSG_OFFER_WITHDRAW, body.data, body.len, &env), 0);
  gn_envelope parsed;
  assert_int_equal(gn_envelope_open(env.data, env.len, &parsed), 0);
  for (int at = 1; at <= 2; at++)
    assert_int_equal(
        gn_discovery_on_message(nodes[at].d, nodes[at == 1 ? 0 : 1].id->pk, &parsed, env.data, env.len, now_s),
        GN_EPERM);
  run();
  for (int r = 0; r < 3; r++)
    sim_round();
  assert_int_equal(nodes_with_offer_from(0, 2), 3);
  assert_false(gn_offer_table_withdrawn(nodes[1].table, nodes[0].id->pk, 2));
  gn_identity_free(x);
  gn_buf_done(&body);
  gn_buf_done(&env);
  sim_stop();
}

/* The provider's own withdrawal of an older seq drops nothing newer, here
 * or by anti-entropy; and after a withdrawal a newer offer spreads and
 * stays: a withdrawal never suppresses an offer above its seq. */
static void test_discovery_old_withdrawal_never_suppresses_a_newer_offer(void **state) {
  (void)state;
  chain_with_offer(777, 5);
  gn_buf env = {0};
  assert_int_equal(gn_offer_withdraw_seal(nodes[0].id, 3, &env), 0);
  gn_envelope parsed;
  assert_int_equal(gn_envelope_open(env.data, env.len, &parsed), 0);
  assert_int_equal(gn_discovery_on_message(nodes[1].d, nodes[0].id->pk, &parsed, env.data, env.len, now_s), 0);
  run();
  for (int r = 0; r < 3; r++)
    sim_round();
  assert_int_equal(nodes_with_offer_from(0, 5), 3);
  /* withdrawn at 5 (node 2 misses it and is repaired), then offered at 6 */
  withdraw_missed_by_2(5);
  sim_round();
  assert_int_equal(nodes_with_offer_from(0, 5), 0);
  env.len = 0;
  gn_offer o = offer_of(0, 6);
  assert_int_equal(gn_offer_seal(nodes[0].id, &o, &env), 0);
  assert_int_equal(gn_discovery_publish(nodes[0].d, env.data, env.len, now_s), 0);
  run();
  converge(0, 6, 4);
  for (int r = 0; r < 3; r++)
    sim_round();
  assert_int_equal(nodes_with_offer_from(0, 6), 3);
  for (int i = 0; i < N; i++)
    assert_int_equal(nodes[i].bad_msgs, 0);
  gn_buf_done(&env);
  sim_stop();
}

/* Withdrawals are kept in a bounded store (256); 600 valid withdrawals from
 * fresh identities that dropped nothing (identities cost nothing) do not
 * push out the one that dropped a real offer, so the repair still works. */
static void test_discovery_withdrawal_flood_does_not_evict_a_repair(void **state) {
  (void)state;
  chain_with_offer(99991, 7);
  withdraw_missed_by_2(7);
  for (int i = 0; i < 600; i++) {
    gn_identity *x;
    gn_buf env = {0};
    assert_int_equal(gn_identity_generate(&x), 0);
    assert_int_equal(gn_offer_withdraw_seal(x, 1000 + (uint64_t)i, &env), 0);
    gn_envelope parsed;
    assert_int_equal(gn_envelope_open(env.data, env.len, &parsed), 0);
    assert_int_equal(gn_discovery_on_message(nodes[1].d, nodes[0].id->pk, &parsed, env.data, env.len, now_s), 0);
    gn_identity_free(x);
    gn_buf_done(&env);
  }
  run();
  assert_int_equal(nodes_with_offer_from(0, 7), 1);
  sim_round();
  assert_int_equal(nodes_with_offer_from(0, 7), 0);
  sim_stop();
}

/* --- limits, on one node driven by hand -------------------------------------*/

typedef struct sent {
  uint8_t peer[GN_PK_LEN];
  uint32_t type;
} sent;
static sent sends[4096];
static size_t nsends;
static int dials;
static char dialled[2048][64];

static int rec_send(void *ud, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len) {
  (void)ud;
  if (nsends < GN_ARRAY_SIZE(sends)) {
    memcpy(sends[nsends].peer, peer, GN_PK_LEN);
    sends[nsends].type = len > 2 ? env[2] : 0;
    nsends++;
  }
  return 0;
}

static int rec_connect(void *ud, const char *addr) {
  (void)ud;
  if (dials < (int)GN_ARRAY_SIZE(dialled))
    snprintf(dialled[dials], sizeof(dialled[0]), "%s", addr);
  dials++;
  return 0;
}

static size_t sends_of(uint32_t type) {
  size_t n = 0;
  for (size_t i = 0; i < nsends; i++)
    n += sends[i].type == type;
  return n;
}

#define HAND_PEERS 30

typedef struct hand {
  gn_identity *self, *peer[HAND_PEERS];
  gn_offer_table *table;
  gn_discovery *d;
} hand;

static void hand_start(hand *h, int npeers) {
  memset(h, 0, sizeof(*h));
  assert_int_equal(gn_identity_generate(&h->self), 0);
  h->table = gn_offer_table_new(64);
  gn_discovery_io io = {rec_send, rec_connect, NULL};
  assert_int_equal(gn_discovery_new(h->self, &io, h->table, &h->d), 0);
  gn_discovery_seed(h->d, 12345);
  for (int i = 0; i < npeers; i++) {
    char addr[32];
    assert_int_equal(gn_identity_generate(&h->peer[i]), 0);
    snprintf(addr, sizeof(addr), "10.2.0.%d:7400", i + 1);
    assert_int_equal(gn_discovery_peer_up(h->d, h->peer[i]->pk, addr, NOW), 0);
  }
  nsends = 0;
  dials = 0;
}

static void hand_stop(hand *h) {
  gn_discovery_free(h->d);
  gn_offer_table_free(h->table);
  gn_identity_free(h->self);
  for (int i = 0; i < HAND_PEERS; i++)
    gn_identity_free(h->peer[i]);
}

static int hand_deliver(hand *h, int from, const gn_buf *env, int64_t at_s) {
  gn_envelope parsed;
  assert_int_equal(gn_envelope_open(env->data, env->len, &parsed), 0);
  return gn_discovery_on_message(h->d, h->peer[from]->pk, &parsed, env->data, env->len, at_s);
}

static int sent_to(const hand *h, int peer) {
  int n = 0;
  for (size_t i = 0; i < nsends; i++)
    n += memcmp(sends[i].peer, h->peer[peer]->pk, GN_PK_LEN) == 0;
  return n;
}

/* With 30 up peers, a new offer goes to 6 of them, never back to the peer
 * it came from; a copy heard again goes nowhere; with neighbours_only, only
 * to the neighbours marked. */
static void test_discovery_push_fanout_is_bounded(void **state) {
  (void)state;
  hand h;
  hand_start(&h, HAND_PEERS);
  gn_identity *prov;
  assert_int_equal(gn_identity_generate(&prov), 0);
  gn_offer o;
  memset(&o, 0, sizeof(o));
  o.seq = 1;
  o.issued_s = NOW;
  o.expires_s = NOW + 60;
  snprintf(o.addr, sizeof(o.addr), "10.3.0.1:7400");
  snprintf(o.gpu_model, sizeof(o.gpu_model), "RTX 4090");
  o.gpus_free = o.gpus_total = 1;
  snprintf(o.currency, sizeof(o.currency), "EUR");
  gn_buf env = {0};
  /* our own offer */
  assert_int_equal(gn_offer_seal(h.self, &o, &env), 0);
  assert_int_equal(gn_discovery_publish(h.d, env.data, env.len, NOW), 0);
  assert_int_equal(nsends, GN_DISCOVERY_FANOUT);
  int distinct = 0;
  for (int i = 0; i < HAND_PEERS; i++) {
    assert_true(sent_to(&h, i) <= 1);
    distinct += sent_to(&h, i);
  }
  assert_int_equal(distinct, GN_DISCOVERY_FANOUT);
  /* a relayed one from peer 4: 6 others, not peer 4 */
  nsends = 0;
  env.len = 0;
  assert_int_equal(gn_offer_seal(prov, &o, &env), 0);
  assert_int_equal(hand_deliver(&h, 4, &env, NOW), 0);
  assert_int_equal(nsends, GN_DISCOVERY_FANOUT);
  assert_int_equal(sent_to(&h, 4), 0);
  /* the same offer again, from peer 5: a duplicate goes nowhere */
  nsends = 0;
  assert_int_equal(hand_deliver(&h, 5, &env, NOW), 0);
  assert_int_equal(nsends, 0);
  /* neighbours only: a newer seq goes to the two marked ones */
  gn_discovery_neighbours_only(h.d, true);
  assert_int_equal(gn_discovery_set_neighbour(h.d, h.peer[7]->pk, true), 0);
  assert_int_equal(gn_discovery_set_neighbour(h.d, h.peer[9]->pk, true), 0);
  assert_int_equal(gn_discovery_set_neighbour(h.d, prov->pk, true), GN_ENOTFOUND);
  o.seq = 2;
  env.len = 0;
  assert_int_equal(gn_offer_seal(prov, &o, &env), 0);
  assert_int_equal(hand_deliver(&h, 4, &env, NOW), 0);
  assert_int_equal(nsends, 2);
  assert_int_equal(sent_to(&h, 7) + sent_to(&h, 9), 2);
  gn_discovery_neighbours_only(h.d, false);
  /* a withdrawal that dropped something goes to every peer but its sender */
  nsends = 0;
  env.len = 0;
  assert_int_equal(gn_offer_withdraw_seal(prov, 2, &env), 0);
  assert_int_equal(hand_deliver(&h, 4, &env, NOW), 0);
  assert_int_equal(nsends, HAND_PEERS - 1);
  assert_int_equal(sent_to(&h, 4), 0);
  gn_buf_done(&env);
  gn_identity_free(prov);
  hand_stop(&h);
}

/* {peers: [8 fresh addresses]} signed by `by`, numbered from base. */
static void peers_msg(const gn_identity *by, int base, gn_buf *ret) {
  gn_wire_writer w;
  gn_buf body = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 1);
  gn_wire_put_str(&w, "peers");
  gn_wire_put_array(&w, 8);
  for (int i = 0; i < 8; i++) {
    uint8_t id[GN_PK_LEN];
    char addr[32];
    memset(id, 0, sizeof(id));
    memcpy(id, &(int){base + i}, sizeof(int));
    id[31] = 0xee;
    snprintf(addr, sizeof(addr), "10.%d.%d.%d:7400", (base + i) >> 16 & 255, (base + i) >> 8 & 255, (base + i) & 255);
    gn_wire_put_map(&w, 2);
    gn_wire_put_str(&w, "id");
    gn_wire_put_bin(&w, id, GN_PK_LEN);
    gn_wire_put_str(&w, "addr");
    gn_wire_put_str(&w, addr);
  }
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  ret->len = 0;
  assert_int_equal(gn_envelope_seal(by, GN_MSG_PEERS, body.data, body.len, ret), 0);
  gn_buf_done(&body);
}

/* Issue 9: "PEERS is unsigned and unlimited over time: each message makes
 * the victim dial 8 attacker-chosen addresses". 1,000 PEERS of 8 fresh
 * addresses each made 8,000 dials; now one PEERS per peer per 30 s is taken
 * and dials from hearsay share a bucket of 8 a minute. */
static void test_discovery_peers_flood_makes_bounded_dials(void **state) {
  (void)state;
  hand h;
  gn_buf env = {0};
  /* all at once: the first message's 8 dials, nothing more */
  hand_start(&h, 2);
  int refused = 0;
  for (int i = 0; i < 1000; i++) {
    peers_msg(h.peer[0], 8 * i, &env);
    refused += hand_deliver(&h, 0, &env, NOW) == GN_EBUSY;
  }
  assert_int_equal(dials, GN_DISCOVERY_PEERS_DIALS);
  assert_int_equal(refused, 999);
  hand_stop(&h);
  /* one a second for 1,000 s, from two peers: at most 8 + 8 a minute */
  hand_start(&h, 2);
  for (int i = 0; i < 1000; i++) {
    peers_msg(h.peer[i % 2], 8 * i, &env);
    hand_deliver(&h, i % 2, &env, NOW + i);
  }
  int bound = GN_DISCOVERY_DIALS_PER_MIN + GN_DISCOVERY_DIALS_PER_MIN * (1000 + 59) / 60;
  print_message("1,000 PEERS in 1,000 s from 2 peers: %d dials (bound %d; 8,000 before)\n", dials, bound);
  assert_true(dials <= bound);
  assert_true(dials >= GN_DISCOVERY_DIALS_PER_MIN); /* hearsay is still used */
  /* an address is never dialled twice within the back-off: peer 1 repeats
   * what peer 0 said, later */
  int before = dials;
  char first[64];
  snprintf(first, sizeof(first), "%s", dialled[0]);
  hand_stop(&h);
  hand_start(&h, 2);
  peers_msg(h.peer[0], 0, &env);
  assert_int_equal(hand_deliver(&h, 0, &env, NOW), 0);
  assert_int_equal(dials, 8);
  peers_msg(h.peer[1], 0, &env);
  assert_int_equal(hand_deliver(&h, 1, &env, NOW + 200), 0);
  assert_int_equal(dials, 8);
  peers_msg(h.peer[1], 0, &env);
  assert_int_equal(hand_deliver(&h, 1, &env, NOW + 200 + GN_DISCOVERY_REDIAL_AFTER_S), 0);
  assert_int_equal(dials, 16); /* after the back-off, again */
  (void)before;
  (void)first;
  gn_buf_done(&env);
  hand_stop(&h);
}

/* A body for a digest or want test, built by fn. */
typedef void (*body_fn)(gn_wire_writer *w);

static const uint8_t SALT[16] = {1, 2, 3};

static void b_summary_b3(gn_wire_writer *w) {
  uint8_t h[24] = {0};
  gn_wire_put_map(w, 3);
  gn_wire_put_str(w, "salt");
  gn_wire_put_bin(w, SALT, 16);
  gn_wire_put_str(w, "b");
  gn_wire_put_u64(w, 3);
  gn_wire_put_str(w, "h");
  gn_wire_put_bin(w, h, sizeof(h));
}
static void summary_b(gn_wire_writer *w, uint64_t b, size_t hlen, size_t saltlen) {
  static uint8_t h[1 << 20];
  memset(h, 0x11, sizeof(h));
  gn_wire_put_map(w, 3);
  gn_wire_put_str(w, "salt");
  gn_wire_put_bin(w, SALT, saltlen);
  gn_wire_put_str(w, "b");
  gn_wire_put_u64(w, b);
  gn_wire_put_str(w, "h");
  gn_wire_put_bin(w, h, hlen);
}
static void b_summary_b1024(gn_wire_writer *w) {
  summary_b(w, 1024, 8192, 16);
}
static void b_summary_b0(gn_wire_writer *w) {
  summary_b(w, 0, 0, 16);
}
static void b_summary_h_short(gn_wire_writer *w) {
  summary_b(w, 4, 31, 16);
}
static void b_summary_h_long(gn_wire_writer *w) {
  summary_b(w, 4, 40, 16);
}
static void b_summary_h_huge(gn_wire_writer *w) {
  summary_b(w, 512, 1 << 20, 16);
}
static void b_summary_salt_short(gn_wire_writer *w) {
  summary_b(w, 4, 32, 15);
}
static void b_summary_b_str(gn_wire_writer *w) {
  gn_wire_put_map(w, 3);
  gn_wire_put_str(w, "salt");
  gn_wire_put_bin(w, SALT, 16);
  gn_wire_put_str(w, "b");
  gn_wire_put_str(w, "4");
  gn_wire_put_str(w, "h");
  gn_wire_put_bin(w, SALT, 16);
}
static void b_digest_both(gn_wire_writer *w) {
  gn_wire_put_map(w, 4);
  gn_wire_put_str(w, "salt");
  gn_wire_put_bin(w, SALT, 16);
  gn_wire_put_str(w, "b");
  gn_wire_put_u64(w, 1);
  gn_wire_put_str(w, "h");
  gn_wire_put_bin(w, SALT, 8);
  gn_wire_put_str(w, "e");
  gn_wire_put_array(w, 0);
}
static void b_empty_map(gn_wire_writer *w) {
  gn_wire_put_map(w, 0);
}
static void b_not_a_map(gn_wire_writer *w) {
  gn_wire_put_array(w, 1);
  gn_wire_put_u64(w, 1);
}
static void detail(gn_wire_writer *w, uint32_t n, uint32_t arity, size_t idlen) {
  uint8_t pk[GN_PK_LEN] = {7}, id[8] = {1};
  gn_wire_put_map(w, 1);
  gn_wire_put_str(w, "e");
  gn_wire_put_array(w, n);
  for (uint32_t i = 0; i < n; i++) {
    gn_wire_put_array(w, arity);
    gn_wire_put_bin(w, pk, GN_PK_LEN);
    gn_wire_put_bin(w, id, idlen);
    gn_wire_put_u64(w, 5);
    if (arity > 3)
      gn_wire_put_i64(w, NOW + 60);
  }
}
static void b_detail_ok(gn_wire_writer *w) {
  detail(w, 1, 4, 6);
}
static void b_detail_too_many(gn_wire_writer *w) {
  detail(w, GN_DISCOVERY_DIGEST_ENTRIES + 1, 4, 6);
}
static void b_detail_arity(gn_wire_writer *w) {
  detail(w, 2, 3, 6);
}
static void b_detail_id_len(gn_wire_writer *w) {
  detail(w, 1, 4, 7);
}
static void want_buckets(gn_wire_writer *w, uint64_t b, const uint64_t *v, uint32_t n) {
  gn_wire_put_map(w, 3);
  gn_wire_put_str(w, "salt");
  gn_wire_put_bin(w, SALT, 16);
  gn_wire_put_str(w, "b");
  gn_wire_put_u64(w, b);
  gn_wire_put_str(w, "buckets");
  gn_wire_put_array(w, n);
  for (uint32_t i = 0; i < n; i++)
    gn_wire_put_u64(w, v[i]);
}
static void b_want_not_increasing(gn_wire_writer *w) {
  want_buckets(w, 8, (const uint64_t[]){1, 3, 3}, 3);
}
static void b_want_out_of_range(gn_wire_writer *w) {
  want_buckets(w, 8, (const uint64_t[]){1, 8}, 2);
}
static void b_want_too_many_buckets(gn_wire_writer *w) {
  want_buckets(w, 2, (const uint64_t[]){0, 1, 2}, 3);
}
static void b_want_bucket_str(gn_wire_writer *w) {
  gn_wire_put_map(w, 3);
  gn_wire_put_str(w, "salt");
  gn_wire_put_bin(w, SALT, 16);
  gn_wire_put_str(w, "b");
  gn_wire_put_u64(w, 8);
  gn_wire_put_str(w, "buckets");
  gn_wire_put_array(w, 1);
  gn_wire_put_str(w, "1");
}
static void want_offers(gn_wire_writer *w, uint32_t n, size_t idlen) {
  uint8_t pk[GN_PK_LEN] = {7}, id[8] = {1};
  gn_wire_put_map(w, 1);
  gn_wire_put_str(w, "offers");
  gn_wire_put_array(w, n);
  for (uint32_t i = 0; i < n; i++) {
    gn_wire_put_array(w, 2);
    gn_wire_put_bin(w, pk, GN_PK_LEN);
    gn_wire_put_bin(w, id, idlen);
  }
}
static void b_want_offers_id_len(gn_wire_writer *w) {
  want_offers(w, 1, 5);
}
static void b_want_offers_too_many(gn_wire_writer *w) {
  want_offers(w, GN_DISCOVERY_WANT_ENTRIES + 1, 6);
}
static void b_want_both(gn_wire_writer *w) {
  gn_wire_put_map(w, 4);
  gn_wire_put_str(w, "salt");
  gn_wire_put_bin(w, SALT, 16);
  gn_wire_put_str(w, "b");
  gn_wire_put_u64(w, 1);
  gn_wire_put_str(w, "buckets");
  gn_wire_put_array(w, 0);
  gn_wire_put_str(w, "offers");
  gn_wire_put_array(w, 0);
}

/* Hostile OFFER_DIGEST and OFFER_WANT bodies: each refused with its code,
 * and nothing is sent and the table is unchanged; truncated bodies too. */
static void test_discovery_refuses_hostile_digest_and_want_bodies(void **state) {
  (void)state;
  static const struct {
    const char *name;
    uint32_t type;
    body_fn fn;
    int code;
  } cases[] = {
      {"b not a power of two", GN_MSG_OFFER_DIGEST, b_summary_b3, GN_EINVAL},
      {"b over 512", GN_MSG_OFFER_DIGEST, b_summary_b1024, GN_EINVAL},
      {"b zero", GN_MSG_OFFER_DIGEST, b_summary_b0, GN_EINVAL},
      {"h shorter than 8 b", GN_MSG_OFFER_DIGEST, b_summary_h_short, GN_EINVAL},
      {"h longer than 8 b", GN_MSG_OFFER_DIGEST, b_summary_h_long, GN_ETOOBIG},
      {"h of 1 MiB", GN_MSG_OFFER_DIGEST, b_summary_h_huge, GN_ETOOBIG},
      {"salt of 15 bytes", GN_MSG_OFFER_DIGEST, b_summary_salt_short, GN_EINVAL},
      {"b a string", GN_MSG_OFFER_DIGEST, b_summary_b_str, GN_EINVAL},
      {"digest with h and e", GN_MSG_OFFER_DIGEST, b_digest_both, GN_EINVAL},
      {"digest empty map", GN_MSG_OFFER_DIGEST, b_empty_map, GN_EINVAL},
      {"digest not a map", GN_MSG_OFFER_DIGEST, b_not_a_map, GN_EINVAL},
      {"detail nobody asked for", GN_MSG_OFFER_DIGEST, b_detail_ok, GN_ESTATE},
      {"detail of 513 entries", GN_MSG_OFFER_DIGEST, b_detail_too_many, GN_ETOOBIG},
      {"detail entry of 3", GN_MSG_OFFER_DIGEST, b_detail_arity, GN_EINVAL},
      {"detail id of 7 bytes", GN_MSG_OFFER_DIGEST, b_detail_id_len, GN_EINVAL},
      {"want buckets repeated", GN_MSG_OFFER_WANT, b_want_not_increasing, GN_EINVAL},
      {"want bucket >= b", GN_MSG_OFFER_WANT, b_want_out_of_range, GN_EINVAL},
      {"want more buckets than b", GN_MSG_OFFER_WANT, b_want_too_many_buckets, GN_ETOOBIG},
      {"want bucket a string", GN_MSG_OFFER_WANT, b_want_bucket_str, GN_EINVAL},
      {"want offer id of 5 bytes", GN_MSG_OFFER_WANT, b_want_offers_id_len, GN_EINVAL},
      {"want 513 offers", GN_MSG_OFFER_WANT, b_want_offers_too_many, GN_ETOOBIG},
      {"want buckets and offers", GN_MSG_OFFER_WANT, b_want_both, GN_EINVAL},
      {"want empty map", GN_MSG_OFFER_WANT, b_empty_map, GN_EINVAL},
  };
  hand h;
  hand_start(&h, 2);
  /* something in the table, so that a wrongly taken want would send it */
  gn_offer o;
  memset(&o, 0, sizeof(o));
  o.seq = 1;
  o.issued_s = NOW;
  o.expires_s = NOW + 60;
  snprintf(o.gpu_model, sizeof(o.gpu_model), "RTX 4090");
  o.gpus_free = o.gpus_total = 1;
  snprintf(o.currency, sizeof(o.currency), "EUR");
  gn_buf env = {0}, body = {0};
  assert_int_equal(gn_offer_seal(h.peer[1], &o, &env), 0);
  assert_int_equal(gn_offer_table_put(h.table, env.data, env.len, NOW), 1);
  for (size_t c = 0; c < GN_ARRAY_SIZE(cases); c++) {
    gn_wire_writer w;
    gn_wire_writer_init(&w);
    cases[c].fn(&w);
    body.len = 0;
    assert_int_equal(gn_wire_writer_take(&w, &body), 0);
    gn_wire_writer_done(&w);
    for (int cut = 0; cut < 2; cut++) {
      if (cut && body.len < 2)
        continue;
      env.len = 0;
      assert_int_equal(gn_envelope_seal(h.peer[0], cases[c].type, body.data, body.len - (size_t)cut, &env), 0);
      nsends = 0;
      int r = hand_deliver(&h, 0, &env, NOW);
      if (r != (cut ? GN_EINVAL : cases[c].code))
        print_error("case '%s'%s: got %d\n", cases[c].name, cut ? " (truncated)" : "", r);
      assert_int_equal(r, cut ? GN_EINVAL : cases[c].code);
      assert_int_equal(nsends, 0);
      assert_int_equal(gn_offer_table_count(h.table), 1);
    }
  }
  /* relayed: a digest must be signed by the peer that sends it */
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  summary_b(&w, 4, 32, 16);
  body.len = 0;
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  env.len = 0;
  assert_int_equal(gn_envelope_seal(h.peer[1], GN_MSG_OFFER_DIGEST, body.data, body.len, &env), 0);
  assert_int_equal(hand_deliver(&h, 0, &env, NOW), GN_EPERM);
  assert_int_equal(nsends, 0);
  gn_buf_done(&env);
  gn_buf_done(&body);
  hand_stop(&h);
}

/* One peer's digests and wants are rationed per period, and answers to it
 * are capped in bytes; the next period it is served again. */
static void test_discovery_digests_and_wants_are_rate_limited(void **state) {
  (void)state;
  hand h;
  hand_start(&h, 2);
  gn_buf env = {0}, body = {0};
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  summary_b(&w, 4, 32, 16); /* differs from our empty table: we answer each */
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(h.peer[0], GN_MSG_OFFER_DIGEST, body.data, body.len, &env), 0);
  int taken = 0;
  for (int i = 0; i < 100; i++)
    taken += hand_deliver(&h, 0, &env, NOW) == 0;
  assert_int_equal(taken, GN_DISCOVERY_PEER_DIGESTS);
  assert_int_equal(sends_of(GN_MSG_OFFER_WANT), GN_DISCOVERY_PEER_DIGESTS);
  assert_int_equal(hand_deliver(&h, 0, &env, NOW + GN_DISCOVERY_DIGEST_S), 0);
  /* wants: the same, per period */
  gn_wire_writer_init(&w);
  want_offers(&w, 1, 6);
  body.len = 0;
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  env.len = 0;
  assert_int_equal(gn_envelope_seal(h.peer[1], GN_MSG_OFFER_WANT, body.data, body.len, &env), 0);
  taken = 0;
  for (int i = 0; i < 100; i++)
    taken += hand_deliver(&h, 1, &env, NOW) == 0;
  assert_int_equal(taken, GN_DISCOVERY_PEER_WANTS);
  gn_buf_done(&env);
  gn_buf_done(&body);
  hand_stop(&h);
}

/* gn_discovery_set_config: a peer's digests and wants are rationed at the
 * configured numbers, not the compiled ones; a contradictory config is
 * refused and changes nothing. */
static void test_discovery_configured_budgets_take_effect(void **state) {
  (void)state;
  hand h;
  hand_start(&h, 2);
  gn_discovery_config c;
  gn_discovery_config_default(&c);
  assert_int_equal(c.peer_digests, GN_DISCOVERY_PEER_DIGESTS);
  gn_discovery_config bad = c;
  bad.peer_digests = 0;
  assert_int_equal(gn_discovery_set_config(h.d, &bad), GN_EINVAL);
  bad = c;
  bad.peer_sync_bytes = bad.sync_bytes + 1;
  assert_int_equal(gn_discovery_set_config(h.d, &bad), GN_EINVAL);
  c.peer_digests = 3;
  c.peer_wants = 2;
  assert_int_equal(gn_discovery_set_config(h.d, &c), 0);
  gn_buf env = {0}, body = {0};
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  summary_b(&w, 4, 32, 16);
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(h.peer[0], GN_MSG_OFFER_DIGEST, body.data, body.len, &env), 0);
  int taken = 0;
  for (int i = 0; i < 20; i++)
    taken += hand_deliver(&h, 0, &env, NOW) == 0;
  assert_int_equal(taken, 3);
  gn_wire_writer_init(&w);
  want_offers(&w, 1, 6);
  body.len = 0;
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  env.len = 0;
  assert_int_equal(gn_envelope_seal(h.peer[1], GN_MSG_OFFER_WANT, body.data, body.len, &env), 0);
  taken = 0;
  for (int i = 0; i < 20; i++)
    taken += hand_deliver(&h, 1, &env, NOW) == 0;
  assert_int_equal(taken, 2);
  gn_buf_done(&env);
  gn_buf_done(&body);
  hand_stop(&h);
}

/* A hub tracks 64 peers; the 65th, untracked, still gets the offers it asks
 * for, within the budget all untracked peers share. */
static void test_discovery_untracked_peer_is_served_within_shared_budget(void **state) {
  (void)state;
  hand h;
  hand_start(&h, 1);
  for (int i = 1; i < GN_DISCOVERY_MAX_UP; i++) {
    uint8_t pk[GN_PK_LEN];
    memset(pk, 0, sizeof(pk));
    memcpy(pk, &i, sizeof(i));
    pk[31] = 0x77;
    assert_int_equal(gn_discovery_peer_up(h.d, pk, "", NOW), 0);
  }
  assert_int_equal(gn_discovery_up_count(h.d), GN_DISCOVERY_MAX_UP);
  gn_identity *x;
  assert_int_equal(gn_identity_generate(&x), 0);
  assert_int_equal(gn_discovery_peer_up(h.d, x->pk, "10.5.0.1:7400", NOW), 0);
  assert_int_equal(gn_discovery_up_count(h.d), GN_DISCOVERY_MAX_UP);
  gn_offer o;
  memset(&o, 0, sizeof(o));
  o.seq = 1;
  o.issued_s = NOW;
  o.expires_s = NOW + 60;
  snprintf(o.gpu_model, sizeof(o.gpu_model), "RTX 4090");
  o.gpus_free = o.gpus_total = 1;
  snprintf(o.currency, sizeof(o.currency), "EUR");
  gn_buf env = {0}, body = {0};
  assert_int_equal(gn_offer_seal(h.peer[0], &o, &env), 0);
  assert_int_equal(gn_offer_table_put(h.table, env.data, env.len, NOW), 1);
  char id[GN_OFFER_ID_STRLEN];
  uint8_t idb[6];
  gn_offer_id(&gn_offer_table_at(h.table, 0)->offer, id);
  for (int i = 0; i < 6; i++)
    sscanf(id + 2 + 2 * i, "%2hhx", &idb[i]);
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 1);
  gn_wire_put_str(&w, "offers");
  gn_wire_put_array(&w, 1);
  gn_wire_put_array(&w, 2);
  gn_wire_put_bin(&w, h.peer[0]->pk, GN_PK_LEN);
  gn_wire_put_bin(&w, idb, sizeof(idb));
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  env.len = 0;
  assert_int_equal(gn_envelope_seal(x, GN_MSG_OFFER_WANT, body.data, body.len, &env), 0);
  gn_envelope parsed;
  assert_int_equal(gn_envelope_open(env.data, env.len, &parsed), 0);
  nsends = 0;
  int taken = 0;
  for (int i = 0; i < 100; i++)
    taken += gn_discovery_on_message(h.d, x->pk, &parsed, env.data, env.len, NOW) == 0;
  assert_int_equal(taken, GN_DISCOVERY_PEER_WANTS);
  assert_int_equal(sends_of(GN_MSG_OFFER), GN_DISCOVERY_PEER_WANTS);
  assert_memory_equal(sends[0].peer, x->pk, GN_PK_LEN);
  gn_identity_free(x);
  gn_buf_done(&env);
  gn_buf_done(&body);
  hand_stop(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_discovery_overlay_forms_from_one_bootstrap),
      cmocka_unit_test(test_discovery_offer_reaches_every_node_and_withdraw_follows),
      cmocka_unit_test(test_discovery_drops_forged_offers),
      cmocka_unit_test(test_discovery_peer_down_drops_only_its_own_offers),
      cmocka_unit_test(test_discovery_rejects_bad_peers_messages),
      cmocka_unit_test(test_discovery_tick_redials_bootstraps_every_5s),
      cmocka_unit_test(test_discovery_dials_peers_entries_with_their_key),
      cmocka_unit_test(test_discovery_peers_entries_heard_not_dialled_with_views),
      cmocka_unit_test(test_discovery_bootstrap_reached_once_not_redialled_with_views),
      cmocka_unit_test(test_discovery_joining_peer_syncs_by_digest),
      cmocka_unit_test(test_discovery_50_nodes_converge_with_fewer_bytes_than_flood),
      cmocka_unit_test(test_discovery_push_fanout_is_bounded),
      cmocka_unit_test(test_discovery_peers_flood_makes_bounded_dials),
      cmocka_unit_test(test_discovery_refuses_hostile_digest_and_want_bodies),
      cmocka_unit_test(test_discovery_digests_and_wants_are_rate_limited),
      cmocka_unit_test(test_discovery_untracked_peer_is_served_within_shared_budget),
      cmocka_unit_test(test_discovery_configured_budgets_take_effect),
      cmocka_unit_test(test_discovery_missed_withdrawal_repaired_by_one_digest_exchange),
      cmocka_unit_test(test_discovery_forged_withdrawal_changes_nothing),
      cmocka_unit_test(test_discovery_old_withdrawal_never_suppresses_a_newer_offer),
      cmocka_unit_test(test_discovery_withdrawal_flood_does_not_evict_a_repair),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
