/* A deterministic simulator for discovery: N in-memory nodes whose io
 * callbacks go through one message queue, delivered in an order drawn from a
 * seeded PRNG. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/discovery.h>

#include <stdio.h>

#define N 20
#define NOW 1700000000
#define QMAX 100000

typedef struct simnode {
  gn_identity *id;
  gn_offer_table *table;
  gn_discovery *d;
  char addr[32];
  bool up_with[N];
  bool alive;
  int bad_msgs;
} simnode;

typedef enum { EV_MSG, EV_CONNECT } ev_kind;

typedef struct simev {
  ev_kind kind;
  int from, to;
  uint8_t *data;
  size_t len;
} simev;

static simnode nodes[N];
static simev *queue;
static size_t qlen;
static uint64_t rng_state;
static size_t delivered;

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
  return 0;
}

static int sim_connect(void *ud, const char *addr) {
  int from = (int)(intptr_t)ud, to = index_of_addr(addr);
  if (to < 0)
    return GN_EINVAL;
  push((simev){EV_CONNECT, from, to, NULL, 0});
  return 0;
}

static void link_up(int a, int b) {
  if (a == b || nodes[a].up_with[b] || !nodes[a].alive || !nodes[b].alive)
    return;
  nodes[a].up_with[b] = nodes[b].up_with[a] = true;
  assert_int_equal(gn_discovery_peer_up(nodes[a].d, nodes[b].id->pk, nodes[b].addr, NOW), 0);
  assert_int_equal(gn_discovery_peer_up(nodes[b].d, nodes[a].id->pk, nodes[a].addr, NOW), 0);
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
    if (nodes[e.to].alive && nodes[e.to].up_with[e.from]) {
      gn_envelope env;
      /* The transport only hands over envelopes that verify. */
      if (gn_envelope_open(e.data, e.len, &env) == 0) {
        int r = gn_discovery_on_message(nodes[e.to].d, nodes[e.from].id->pk, &env, e.data, e.len, NOW);
        if (r < 0)
          nodes[e.to].bad_msgs++;
      }
    }
    free(e.data);
  }
}

static void sim_start(uint64_t seed) {
  rng_state = seed;
  queue = calloc(QMAX, sizeof(*queue));
  qlen = delivered = 0;
  for (int i = 0; i < N; i++) {
    simnode *n = &nodes[i];
    memset(n, 0, sizeof(*n));
    assert_int_equal(gn_identity_generate(&n->id), 0);
    n->table = gn_offer_table_new(256);
    snprintf(n->addr, sizeof(n->addr), "10.0.0.%d:7400", i + 1);
    gn_discovery_io io = {sim_send, sim_connect, (void *)(intptr_t)i};
    assert_int_equal(gn_discovery_new(n->id, &io, n->table, &n->d), 0);
    assert_int_equal(gn_discovery_set_self_addr(n->d, n->addr), 0);
    n->alive = true;
  }
  /* Everyone knows node 0 as bootstrap; the rest is learnt from PEERS. */
  for (int i = 1; i < N; i++) {
    assert_int_equal(gn_discovery_add_bootstrap(nodes[i].d, nodes[0].addr), 0);
    gn_discovery_tick(nodes[i].d, NOW);
  }
  run();
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
  o.issued_s = NOW;
  o.expires_s = NOW + 600;
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
    assert_int_equal(gn_discovery_publish(nodes[p].d, env.data, env.len, NOW), 0);
    size_t before = delivered;
    run();
    assert_int_equal(nodes_with_offer_from(p, 1), N);
    /* flooding with dedupe: each node forwards once, so messages stay
     * within (edges * 2) */
    assert_true(delivered - before < (size_t)N * N);
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
    assert_int_equal(gn_discovery_publish(nodes[p].d, env.data, env.len, NOW), 0);
    run();
    assert_int_equal(nodes_with_offer_from(p, 2), N);
    assert_int_equal(nodes_with_offer_from(p, 1), 0);
    /* withdraw propagates */
    env.len = 0;
    assert_int_equal(gn_offer_withdraw_seal(nodes[p].id, 2, &env), 0);
    assert_int_equal(gn_discovery_publish(nodes[p].d, env.data, env.len, NOW), 0);
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
  assert_int_equal(gn_discovery_on_message(nodes[to].d, nodes[forger].id->pk, &parsed, env.data, env.len, NOW),
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
  assert_int_equal(gn_discovery_publish(nodes[7].d, e1.data, e1.len, NOW), 0);
  assert_int_equal(gn_discovery_publish(nodes[8].d, e2.data, e2.len, NOW), 0);
  run();
  assert_int_equal(nodes_with_offer_from(7, 1), N);
  assert_int_equal(nodes_with_offer_from(8, 1), N);
  /* node 7 leaves: its neighbours drop its offer, keep node 8's */
  nodes[7].alive = false;
  int neighbours = 0;
  for (int i = 0; i < N; i++) {
    if (!nodes[7].up_with[i])
      continue;
    neighbours++;
    nodes[i].up_with[7] = nodes[7].up_with[i] = false;
    gn_discovery_peer_down(nodes[i].d, nodes[7].id->pk, NOW);
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
  assert_int_equal(gn_discovery_on_message(nodes[to].d, nodes[from].id->pk, &parsed, env.data, env.len, NOW),
                   GN_ETOOBIG);
  /* a PEERS relayed from someone else */
  env.len = 0;
  assert_int_equal(gn_envelope_seal(nodes[2].id, GN_MSG_PEERS, (const uint8_t *)"\x81\xa5peers\x90", 8, &env), 0);
  assert_int_equal(gn_envelope_open(env.data, env.len, &parsed), 0);
  assert_int_equal(gn_discovery_on_message(nodes[to].d, nodes[from].id->pk, &parsed, env.data, env.len, NOW), GN_EPERM);
  /* not a discovery message at all */
  env.len = 0;
  assert_int_equal(gn_envelope_seal(nodes[from].id, GN_MSG_LEASE_REQUEST, (const uint8_t *)"\x80", 1, &env), 0);
  assert_int_equal(gn_envelope_open(env.data, env.len, &parsed), 0);
  assert_int_equal(gn_discovery_on_message(nodes[to].d, nodes[from].id->pk, &parsed, env.data, env.len, NOW),
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_discovery_overlay_forms_from_one_bootstrap),
      cmocka_unit_test(test_discovery_offer_reaches_every_node_and_withdraw_follows),
      cmocka_unit_test(test_discovery_drops_forged_offers),
      cmocka_unit_test(test_discovery_peer_down_drops_only_its_own_offers),
      cmocka_unit_test(test_discovery_rejects_bad_peers_messages),
      cmocka_unit_test(test_discovery_tick_redials_bootstraps_every_5s),
      cmocka_unit_test(test_discovery_dials_peers_entries_with_their_key),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
