/* Integration test of the dialled key: a real requester gpunetd dials an
 * address it learnt together with a node key (an offer's provider, a PEERS
 * entry) and must take up the session only if the node there proves that
 * key. This test plays three nodes on its own loop: R, a peer already
 * connected to the daemon that relays offers and PEERS to it; B, a node
 * listening on an address; and A, a key without any listener. An offer
 * signed by A that names B's address, or a PEERS entry naming A at B's
 * address, must be refused with a clear error, quickly, with nothing sent to
 * B and no lease made; an offer of B's own at B's address is rented as
 * before. The control API is driven with libcurl. */
#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <gpunet/offer.h>
#include <gpunet/transport.h>
#include <gpunet/wire.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "node/helpers.h"

/* The daemon's rent and attestation timeouts: a refusal must come well
 * before either, so that a dial that merely waited could not pass. */
#define RENT_TIMEOUT_MS 8000
#define ATTEST_TIMEOUT_MS 8000
#define REFUSED_WITHIN_MS 4000

typedef tn_msg msg;

typedef tn_call call;

typedef struct world {
  char dir[PATH_MAX];
  char sock[PATH_MAX + 16];
  char addr[64];
  pid_t daemon;
  uv_loop_t loop;
  gn_identity *req_id, *r_id, *a_id, *b_id;
  gn_transport *r_tp, *b_tp;
  int r_up;
  int b_sessions; /* sessions of B that came up with the daemon */
  tn_inbox r_in, b_in;
} world;

static world W;

/* ud: the inbox of the transport (R's or B's). */
static void on_up(gn_transport *t, const uint8_t peer[GN_PK_LEN], const char *addr, void *ud) {
  (void)t, (void)addr;
  if (memcmp(peer, W.req_id->pk, GN_PK_LEN) != 0)
    return;
  if (ud == &W.r_in)
    W.r_up = 1;
  else
    W.b_sessions++;
}

static void on_down(gn_transport *t, const uint8_t peer[GN_PK_LEN], void *ud) {
  (void)t;
  if (ud == &W.r_in && memcmp(peer, W.req_id->pk, GN_PK_LEN) == 0)
    W.r_up = 0;
}

static void on_msg(gn_transport *t, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                   size_t len, void *ud) {
  (void)t;
  tn_inbox_add(ud, peer, env, raw, len);
}

static bool never(void *ud) {
  (void)ud;
  return false;
}

/* Runs the test's loop (R and B) for ms. */
static void spin(uint64_t ms) {
  tn_run_until(&W.loop, never, NULL, ms);
}

/* --- the control API --------------------------------------------------------*/

static void call_start(call *c, const char *path, const char *body) {
  tn_call_start(c, W.sock, path, body);
}

/* Keeps the test's loop (R and B) running until the call returns. */
static void call_finish(call *c, uint64_t timeout_ms) {
  tn_call_finish(&W.loop, c, timeout_ms);
}

/* A GET answered 200: its JSON (the caller decrefs). */
static json_t *get_json(const char *path) {
  call c;
  call_start(&c, path, NULL);
  call_finish(&c, 10000);
  assert_int_equal(c.status, 200);
  json_t *o = json_loads((const char *)c.out.data, 0, NULL);
  assert_non_null(o);
  gn_buf_done(&c.out);
  return o;
}

/* No lease of any state on the daemon. */
static void expect_no_lease(void) {
  json_t *o = get_json("/v1/leases");
  assert_int_equal(json_array_size(json_object_get(o, "leases")), 0);
  json_decref(o);
}

/* Whether the daemon lists a peer session with id. */
static bool daemon_has_peer(const gn_identity *id) {
  char want[GN_NODE_ID_STRLEN];
  gn_node_id_format(id->pk, want);
  json_t *o = get_json("/v1/peers"), *p;
  size_t i;
  bool found = false;
  json_array_foreach(json_object_get(o, "peers"), i, p) {
    if (strcmp(json_string_value(json_object_get(p, "node_id")), want) == 0)
      found = true;
  }
  json_decref(o);
  return found;
}

/* --- what R tells the daemon -------------------------------------------------*/

/* An offer signed by `by` naming address addr, relayed to the daemon by R;
 * its id in ret_id. */
static void relay_offer(const gn_identity *by, const char *addr, bool simulated, char ret_id[GN_OFFER_ID_STRLEN]) {
  gn_offer o;
  gn_buf env = {0};
  tn_offer(&o, by->pk, addr, 1, 60, simulated);
  gn_offer_id(&o, ret_id);
  assert_int_equal(gn_offer_seal(by, &o, &env), 0);
  assert_int_equal(gn_transport_send(W.r_tp, W.req_id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
  /* The daemon takes it in on receipt; wait until its table shows it. */
  bool seen = false;
  for (int i = 0; i < 50 && !seen; i++) {
    json_t *t = get_json("/v1/offers"), *e;
    size_t k;
    json_array_foreach(json_object_get(t, "offers"), k, e) {
      const char *id = json_string_value(json_object_get(e, "id"));
      if (id && strcmp(id, ret_id) == 0)
        seen = true;
    }
    json_decref(t);
  }
  assert_true(seen);
}

/* R's PEERS message to the daemon: one entry, id at addr. */
static void send_peers(const uint8_t id[GN_PK_LEN], const char *addr) {
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
  tn_send(W.r_tp, W.r_id, GN_MSG_PEERS, &body, W.req_id->pk);
  gn_buf_done(&body);
}

static const char *b_addr(void) {
  return gn_transport_listen_addr(W.b_tp);
}

/* --- setup ------------------------------------------------------------------*/

static void start_daemon(void) {
  char t1[48], t2[48];
  tn_identity_for(W.dir, &W.req_id);
  snprintf(W.addr, sizeof W.addr, "127.0.0.1:%d", tn_free_port());
  snprintf(W.sock, sizeof W.sock, "%s/gpunetd.sock", W.dir);
  snprintf(t1, sizeof t1, "GN_ATTEST_TIMEOUT_MS=%d", ATTEST_TIMEOUT_MS);
  snprintf(t2, sizeof t2, "GN_RENT_TIMEOUT_MS=%d", RENT_TIMEOUT_MS);
  const char *const env[] = {t1, t2, NULL};
  W.daemon = tn_daemon_spawnv(W.dir, "w", env, (const char *const[]){"--data-dir", W.dir, "--listen", W.addr, NULL});
}

static int setup(void **state) {
  (void)state;
  memset(&W, 0, sizeof W);
  snprintf(W.dir, sizeof W.dir, "/tmp/gn-dialled-key-XXXXXX");
  assert_non_null(mkdtemp(W.dir));
  start_daemon();
  uv_loop_init(&W.loop);
  gn_transport_cbs cbs = {on_up, on_down, on_msg};
  assert_int_equal(gn_identity_generate(&W.r_id), 0);
  assert_int_equal(gn_identity_generate(&W.a_id), 0);
  assert_int_equal(gn_identity_generate(&W.b_id), 0);
  assert_int_equal(gn_transport_new(&W.loop, W.r_id, &cbs, &W.r_in, &W.r_tp), 0);
  assert_int_equal(gn_transport_listen(W.r_tp, "127.0.0.1:0"), 0);
  assert_int_equal(gn_transport_new(&W.loop, W.b_id, &cbs, &W.b_in, &W.b_tp), 0);
  assert_int_equal(gn_transport_listen(W.b_tp, "127.0.0.1:0"), 0);
  /* The daemon needs a moment to listen; R retries its connection. */
  tn_dial(&W.loop, W.r_tp, W.addr, &W.r_up, NULL);
  for (int i = 0; i < 50 && access(W.sock, F_OK) != 0; i++)
    usleep(100000);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  gn_transport *tps[] = {W.r_tp, W.b_tp};
  tn_inbox_done(&W.r_in);
  int rc = tn_world_end(&W.loop, tps, 2, W.daemon, &W.b_in, W.dir);
  W.req_id = gn_identity_free(W.req_id);
  W.r_id = gn_identity_free(W.r_id);
  W.a_id = gn_identity_free(W.a_id);
  W.b_id = gn_identity_free(W.b_id);
  return rc;
}

/* --- tests ------------------------------------------------------------------*/

/* The control: B's own offer at B's address is dialled and asked. */
static void test_rent_dials_the_provider_its_offer_names(void **state) {
  (void)state;
  char offer[GN_OFFER_ID_STRLEN], body[256];
  call c;
  msg m;
  relay_offer(W.b_id, b_addr(), true, offer);
  snprintf(body, sizeof body, "{\"offer\": \"%s\", \"hours\": 1, \"attest\": false, \"allow_simulated\": true}", offer);
  call_start(&c, "/v1/leases", body);
  assert_true(tn_wait_msg(&W.loop, &W.b_in, GN_MSG_LEASE_REQUEST, tn_call_done, &c, 10000, &m));
  assert_memory_equal(m.peer, W.req_id->pk, GN_PK_LEN);
  gn_lease_terms t;
  assert_int_equal(gn_lease_request_open(m.raw.data, m.raw.len, &t), 0);
  assert_memory_equal(t.provider, W.b_id->pk, GN_PK_LEN);
  /* B says no; the call ends with its reason. */
  tn_send_lease_end(W.b_tp, W.b_id, GN_MSG_LEASE_REJECT, t.lease_id, "B says no", W.req_id->pk);
  call_finish(&c, 10000);
  tn_call_expect(&c, 409, "B says no");
  assert_true(daemon_has_peer(W.b_id));
  gn_buf_done(&m.raw);
  gn_buf_done(&c.out);
}

/* A's offer names B's address: the session with B is refused, the rent fails
 * at once saying so, B is sent nothing and no lease exists. */
static void test_rent_refuses_node_answering_under_another_key(void **state) {
  (void)state;
  char offer[GN_OFFER_ID_STRLEN], body[256], a[GN_NODE_ID_STRLEN], b[GN_NODE_ID_STRLEN];
  call c;
  relay_offer(W.a_id, b_addr(), true, offer);
  snprintf(body, sizeof body, "{\"offer\": \"%s\", \"hours\": 1, \"attest\": false, \"allow_simulated\": true}", offer);
  uint64_t t0 = gn_mono_ms();
  call_start(&c, "/v1/leases", body);
  call_finish(&c, 20000);
  uint64_t took = gn_mono_ms() - t0;
  tn_call_expect(&c, 502, "not the provider its offer names");
  gn_node_id_format(W.a_id->pk, a);
  gn_node_id_format(W.b_id->pk, b);
  tn_call_expect(&c, 502, a);
  tn_call_expect(&c, 502, b);
  assert_true(took < REFUSED_WITHIN_MS);
  /* B may have seen the handshake; it was never sent a lease request, and
   * the daemon keeps no session with it. */
  spin(300);
  assert_false(tn_inbox_has(&W.b_in, GN_MSG_LEASE_REQUEST));
  assert_false(daemon_has_peer(W.b_id));
  assert_true(tn_log_has(W.dir, "refused the session with"));
  expect_no_lease();
  gn_buf_done(&c.out);
}

/* The same offer through the attestation a rent starts with, and through
 * POST /v1/attest: no challenge reaches B, each call fails at once. */
static void test_attest_refuses_node_answering_under_another_key(void **state) {
  (void)state;
  char offer[GN_OFFER_ID_STRLEN], body[256];
  call c;
  relay_offer(W.a_id, b_addr(), true, offer);
  snprintf(body, sizeof body, "{\"offer\": \"%s\", \"hours\": 1, \"attest\": true, \"allow_simulated\": true}", offer);
  uint64_t t0 = gn_mono_ms();
  call_start(&c, "/v1/leases", body);
  call_finish(&c, 20000);
  tn_call_expect(&c, 502, "not the provider its offer names");
  assert_true(gn_mono_ms() - t0 < REFUSED_WITHIN_MS);
  gn_buf_done(&c.out);

  snprintf(body, sizeof body, "{\"target\": \"%s\"}", offer);
  t0 = gn_mono_ms();
  call_start(&c, "/v1/attest", body);
  call_finish(&c, 20000);
  tn_call_expect(&c, 502, "not the provider its offer names");
  assert_true(gn_mono_ms() - t0 < REFUSED_WITHIN_MS);
  gn_buf_done(&c.out);

  assert_false(tn_inbox_has(&W.b_in, GN_MSG_ATTEST_CHALLENGE));
  assert_false(tn_inbox_has(&W.b_in, GN_MSG_LEASE_REQUEST));
  assert_false(daemon_has_peer(W.b_id));
  expect_no_lease();
}

/* B is up with the daemon already (R's PEERS named it honestly): A's offer
 * at B's address is refused at once, without another dial. */
static void test_rent_refuses_address_up_under_another_key(void **state) {
  (void)state;
  char offer[GN_OFFER_ID_STRLEN], body[256];
  call c;
  send_peers(W.b_id->pk, b_addr());
  for (int i = 0; i < 50 && !W.b_sessions; i++)
    tn_run_until_flag(&W.loop, &W.b_sessions, 100);
  assert_true(W.b_sessions > 0);
  assert_true(daemon_has_peer(W.b_id));
  relay_offer(W.a_id, b_addr(), true, offer);
  snprintf(body, sizeof body, "{\"offer\": \"%s\", \"hours\": 1, \"attest\": false, \"allow_simulated\": true}", offer);
  call_start(&c, "/v1/leases", body);
  call_finish(&c, 20000);
  tn_call_expect(&c, 502, "not the provider its offer names");
  assert_false(tn_inbox_has(&W.b_in, GN_MSG_LEASE_REQUEST));
  expect_no_lease();
  gn_buf_done(&c.out);
}

/* A PEERS entry naming A at B's address: the daemon dials B, refuses the
 * session and says so in its log. (An honest entry for B is taken up:
 * test_rent_refuses_address_up_under_another_key starts from one.) */
static void test_peers_entry_under_another_key_is_refused(void **state) {
  (void)state;
  send_peers(W.a_id->pk, b_addr());
  /* Until the daemon says it refused, or took B up (what an unchecked dial
   * does). */
  for (int i = 0; i < 100 && !tn_log_has(W.dir, "refused the session with") && !daemon_has_peer(W.b_id); i++)
    spin(50);
  spin(300);
  assert_false(daemon_has_peer(W.b_id));
  assert_false(daemon_has_peer(W.a_id));
  assert_true(tn_log_has(W.dir, "refused the session with"));
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_rent_dials_the_provider_its_offer_names, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rent_refuses_node_answering_under_another_key, setup, teardown),
      cmocka_unit_test_setup_teardown(test_attest_refuses_node_answering_under_another_key, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rent_refuses_address_up_under_another_key, setup, teardown),
      cmocka_unit_test_setup_teardown(test_peers_entry_under_another_key_is_refused, setup, teardown),
  };
  int r = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return r;
}
