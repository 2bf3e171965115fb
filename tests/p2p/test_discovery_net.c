/* Discovery over the real transport (TCP on 127.0.0.1): a PEERS entry is
 * dialled holding the session to the key it advertised, so an address
 * advertised under one id and answered by a node with another key is
 * refused, while a truthful entry comes up (docs/protocol.md §1.3, §1.6);
 * and a joining node syncs the offers it lacks by digests. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/discovery.h>
#include <gpunet/transport.h>
#include <gpunet/uvutil.h>

#define NOW 1767225600

static uv_loop_t loop;
static uv_timer_t ticker;

/* A node: a transport, and for the one under test a discovery wired to it
 * the way gpunetd wires its own. */
typedef struct node {
  gn_identity *id;
  gn_transport *t;
  gn_offer_table *table;
  gn_discovery *d;
  int ups, refused;
  uint8_t refused_expected[GN_PK_LEN], refused_got[GN_PK_LEN];
  const gn_buf *peers_to_send; /* sent to every peer that comes up (the "relay") */
  bool closed;
} node;

static int io_send(void *ud, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len) {
  return gn_transport_send(((node *)ud)->t, peer, env, len);
}

static int io_connect(void *ud, const char *addr) {
  return gn_transport_connect(((node *)ud)->t, addr);
}

static int io_connect_peer(void *ud, const char *addr, const uint8_t expect[GN_PK_LEN]) {
  return gn_transport_connect_peer(((node *)ud)->t, addr, expect);
}

static void on_up(gn_transport *t, const uint8_t peer[GN_PK_LEN], const char *addr, void *ud) {
  node *n = ud;
  n->ups++;
  if (n->d)
    gn_discovery_peer_up(n->d, peer, addr, NOW);
  if (n->peers_to_send)
    gn_transport_send(t, peer, n->peers_to_send->data, n->peers_to_send->len);
}

static void on_down(gn_transport *t, const uint8_t peer[GN_PK_LEN], void *ud) {
  (void)t;
  node *n = ud;
  if (n->d)
    gn_discovery_peer_down(n->d, peer, NOW);
}

static void on_msg(gn_transport *t, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                   size_t raw_len, void *ud) {
  (void)t;
  node *n = ud;
  if (n->d)
    gn_discovery_on_message(n->d, peer, env, raw, raw_len, NOW);
}

static void on_refused(gn_transport *t, const char *addr, const uint8_t expected[GN_PK_LEN],
                       const uint8_t got[GN_PK_LEN], void *ud) {
  (void)t;
  (void)addr;
  node *n = ud;
  n->refused++;
  memcpy(n->refused_expected, expected, GN_PK_LEN);
  memcpy(n->refused_got, got, GN_PK_LEN);
}

static void on_closed(void *ud) {
  ((node *)ud)->closed = true;
}

static void node_init(node *n, bool with_discovery) {
  memset(n, 0, sizeof(*n));
  assert_int_equal(gn_identity_generate(&n->id), 0);
  gn_transport_cbs cbs = {on_up, on_down, on_msg};
  assert_int_equal(gn_transport_new(&loop, n->id, &cbs, n, &n->t), 0);
  gn_transport_set_refused_cb(n->t, on_refused);
  assert_int_equal(gn_transport_listen(n->t, "127.0.0.1:0"), 0);
  if (with_discovery) {
    n->table = gn_offer_table_new(16);
    gn_discovery_io io = {io_send, io_connect, n};
    assert_int_equal(gn_discovery_new(n->id, &io, n->table, &n->d), 0);
    gn_discovery_set_connect_peer(n->d, io_connect_peer);
    assert_int_equal(gn_discovery_set_self_addr(n->d, gn_transport_listen_addr(n->t)), 0);
  }
}

static bool all_closed(void *arg) {
  node **ns = arg;
  for (int i = 0; ns[i]; i++)
    if (!ns[i]->closed)
      return false;
  return true;
}

static void noop_tick(uv_timer_t *t) {
  (void)t;
}

static bool run_until(bool (*cond)(void *), void *arg) {
  uint64_t end = gn_mono_ms() + 5000;
  while (!cond(arg)) {
    if (gn_mono_ms() > end)
      return false;
    uv_run(&loop, UV_RUN_ONCE);
  }
  return true;
}

static void settle(uint64_t ms) {
  uint64_t end = gn_mono_ms() + ms;
  while (gn_mono_ms() < end)
    uv_run(&loop, UV_RUN_ONCE);
}

static void nodes_done(node **ns) {
  for (int i = 0; ns[i]; i++)
    gn_transport_close(ns[i]->t, on_closed, ns[i]);
  assert_true(run_until(all_closed, ns));
  for (int i = 0; ns[i]; i++) {
    gn_discovery_free(ns[i]->d);
    gn_offer_table_free(ns[i]->table);
    gn_identity_free(ns[i]->id);
  }
}

/* {peers: [{id, addr}]} signed by `by`. */
static void peers_env(const gn_identity *by, const uint8_t id[GN_PK_LEN], const char *addr, gn_buf *ret) {
  gn_wire_writer w;
  gn_buf body = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 1);
  gn_wire_put_str(&w, "peers");
  gn_wire_put_array(&w, 1);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "id");
  gn_wire_put_bin(&w, id, GN_PK_LEN);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, addr);
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(by, GN_MSG_PEERS, body.data, body.len, ret), 0);
  gn_buf_done(&body);
}

static bool c_refused(void *arg) {
  return ((node *)arg)->refused >= 1;
}

static bool c_up_with_a(void *arg) {
  node **ns = arg; /* {c, a} */
  return gn_transport_is_up(ns[0]->t, ns[1]->id->pk);
}

/* B tells C that node X lives at A's address. C dials it for X, A answers
 * with its own key: C refuses the session and never takes A up. */
static void test_peers_entry_answered_by_another_key_is_refused(void **state) {
  (void)state;
  node a, b, c;
  node_init(&a, false);
  node_init(&b, false);
  node_init(&c, true);
  gn_identity *x;
  assert_int_equal(gn_identity_generate(&x), 0);
  gn_buf lie = {0};
  peers_env(b.id, x->pk, gn_transport_listen_addr(a.t), &lie);
  b.peers_to_send = &lie;
  assert_int_equal(gn_discovery_add_bootstrap(c.d, gn_transport_listen_addr(b.t)), 0);
  gn_discovery_tick(c.d, NOW);
  assert_true(run_until(c_refused, &c));
  assert_memory_equal(c.refused_expected, x->pk, GN_PK_LEN);
  assert_memory_equal(c.refused_got, a.id->pk, GN_PK_LEN);
  settle(100);
  assert_false(gn_transport_is_up(c.t, a.id->pk));
  assert_true(gn_transport_is_up(c.t, b.id->pk));
  assert_int_equal(gn_discovery_up_count(c.d), 1); /* only B */
  node *ns[] = {&a, &b, &c, NULL};
  nodes_done(ns);
  gn_identity_free(x);
  gn_buf_done(&lie);
}

/* The same PEERS with A's true key: C dials A and the session comes up. */
static void test_peers_entry_with_the_true_key_comes_up(void **state) {
  (void)state;
  node a, b, c;
  node_init(&a, false);
  node_init(&b, false);
  node_init(&c, true);
  gn_buf truth = {0};
  peers_env(b.id, a.id->pk, gn_transport_listen_addr(a.t), &truth);
  b.peers_to_send = &truth;
  assert_int_equal(gn_discovery_add_bootstrap(c.d, gn_transport_listen_addr(b.t)), 0);
  gn_discovery_tick(c.d, NOW);
  node *ca[] = {&c, &a};
  assert_true(run_until(c_up_with_a, ca));
  assert_int_equal(c.refused, 0);
  assert_int_equal(gn_discovery_up_count(c.d), 2);
  node *ns[] = {&a, &b, &c, NULL};
  nodes_done(ns);
  gn_buf_done(&truth);
}

static bool c_has_all(void *arg) {
  node **ns = arg; /* {c, a} */
  return gn_offer_table_count(ns[0]->table) == gn_offer_table_count(ns[1]->table);
}

/* Over TCP: A holds 12 offers of 12 providers (its table's 16 slots minus
 * room); C bootstraps to A and syncs them by digest, summary, detail and
 * want, through real sessions. */
static void test_joining_node_syncs_offers_by_digest_over_tcp(void **state) {
  (void)state;
  node a, c;
  node_init(&a, true);
  node_init(&c, true);
  for (int i = 0; i < 12; i++) {
    gn_identity *p;
    assert_int_equal(gn_identity_generate(&p), 0);
    gn_offer o;
    memset(&o, 0, sizeof(o));
    o.seq = 1;
    o.issued_s = NOW;
    o.expires_s = NOW + 60;
    snprintf(o.addr, sizeof(o.addr), "10.4.0.%d:7400", i + 1);
    snprintf(o.gpu_model, sizeof(o.gpu_model), "RTX 4090");
    o.gpus_free = o.gpus_total = 1;
    snprintf(o.currency, sizeof(o.currency), "EUR");
    gn_buf env = {0};
    assert_int_equal(gn_offer_seal(p, &o, &env), 0);
    assert_int_equal(gn_offer_table_put(a.table, env.data, env.len, NOW), 1);
    gn_buf_done(&env);
    gn_identity_free(p);
  }
  assert_int_equal(gn_discovery_add_bootstrap(c.d, gn_transport_listen_addr(a.t)), 0);
  gn_discovery_tick(c.d, NOW);
  node *ca[] = {&c, &a};
  assert_true(run_until(c_has_all, ca));
  assert_int_equal(gn_offer_table_count(c.table), 12);
  for (size_t i = 0; i < 12; i++) {
    const gn_offer_entry *e = gn_offer_table_at(a.table, i);
    assert_non_null(gn_offer_table_find(c.table, e->id));
  }
  node *ns[] = {&a, &c, NULL};
  nodes_done(ns);
}

static int setup(void **state) {
  (void)state;
  uv_loop_init(&loop);
  uv_timer_init(&loop, &ticker);
  uv_timer_start(&ticker, noop_tick, 10, 10);
  return 0;
}

static void close_left(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

static int teardown(void **state) {
  (void)state;
  /* After a passing test only the ticker is left. A failing one jumps out
   * with its transports open: close what is left (leaking it) so that the
   * failure is reported instead of the loop running forever. */
  uv_walk(&loop, close_left, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  return uv_loop_close(&loop) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_peers_entry_answered_by_another_key_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_peers_entry_with_the_true_key_comes_up, setup, teardown),
      cmocka_unit_test_setup_teardown(test_joining_node_syncs_offers_by_digest_over_tcp, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
