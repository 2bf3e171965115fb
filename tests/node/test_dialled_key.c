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

typedef struct call {
  char path[64];
  char body[256];
  bool get;
  pthread_t thread;
  atomic_int done;
  long status;
  gn_buf out;
} call;

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

static bool call_done(void *ud) {
  const call *c = ud;
  return c && atomic_load(&c->done);
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

static size_t on_data(char *p, size_t size, size_t nmemb, void *ud) {
  gn_buf_append(ud, (const uint8_t *)p, size * nmemb);
  return size * nmemb;
}

static void *call_main(void *ud) {
  call *c = ud;
  char url[128];
  snprintf(url, sizeof url, "http://x%s", c->path);
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, W.sock);
  curl_easy_setopt(h, CURLOPT_URL, url);
  if (!c->get)
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, c->body);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &c->out);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
  if (curl_easy_perform(h) == CURLE_OK)
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &c->status);
  curl_easy_cleanup(h);
  gn_buf_append(&c->out, (const uint8_t *)"", 1);
  atomic_store(&c->done, 1);
  return NULL;
}

static void call_start(call *c, const char *path, const char *body) {
  memset(c, 0, sizeof *c);
  snprintf(c->path, sizeof c->path, "%s", path);
  snprintf(c->body, sizeof c->body, "%s", body ? body : "");
  c->get = body == NULL;
  assert_int_equal(pthread_create(&c->thread, NULL, call_main, c), 0);
}

/* Keeps the test's loop (R and B) running until the call returns. */
static void call_finish(call *c, uint64_t timeout_ms) {
  tn_run_until(&W.loop, call_done, c, timeout_ms);
  pthread_join(c->thread, NULL);
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

static void expect_error(const call *c, long status, const char *part) {
  const char *body = (const char *)c->out.data;
  if (getenv("GN_TEST_VERBOSE"))
    printf("%ld %s\n", c->status, body);
  if (c->status != status || !strstr(body, part))
    fail_msg("expected %ld mentioning '%s', got %ld: %s", status, part, c->status, body);
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

/* Whether the daemon's log has a line with part. */
static bool log_has(const char *part) {
  char path[PATH_MAX + 32], line[2048];
  snprintf(path, sizeof path, "%s/gpunetd.log", W.dir);
  FILE *f = fopen(path, "r");
  bool found = false;
  while (f && !found && fgets(line, sizeof line, f))
    found = strstr(line, part) != NULL;
  if (f)
    fclose(f);
  return found;
}

/* --- what R tells the daemon -------------------------------------------------*/

/* An offer signed by `by` naming address addr, relayed to the daemon by R;
 * its id in ret_id. */
static void relay_offer(const gn_identity *by, const char *addr, bool simulated, char ret_id[GN_OFFER_ID_STRLEN]) {
  gn_offer o;
  gn_buf env = {0};
  memset(&o, 0, sizeof o);
  memcpy(o.provider, by->pk, GN_PK_LEN);
  o.seq = 1;
  o.issued_s = gn_unix_s();
  o.expires_s = o.issued_s + 60;
  snprintf(o.addr, sizeof o.addr, "%s", addr);
  snprintf(o.gpu_model, sizeof o.gpu_model, "NVIDIA GeForce RTX 4090");
  o.vram_mib = 24564;
  o.gpus_free = 1;
  o.gpus_total = 1;
  o.price_uper_hour = 400000;
  snprintf(o.currency, sizeof o.currency, "EUR");
  o.max_hours = 2;
  o.simulated = simulated;
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
  gn_buf body = {0}, env = {0};
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
  assert_int_equal(gn_envelope_seal(W.r_id, GN_MSG_PEERS, body.data, body.len, &env), 0);
  assert_int_equal(gn_transport_send(W.r_tp, W.req_id->pk, env.data, env.len), 0);
  gn_buf_done(&body);
  gn_buf_done(&env);
}

static const char *b_addr(void) {
  return gn_transport_listen_addr(W.b_tp);
}

/* --- setup ------------------------------------------------------------------*/

static void start_daemon(void) {
  char bin[PATH_MAX];
  tn_gpunetd_path(bin, sizeof bin);
  tn_identity_for(W.dir, &W.req_id);
  snprintf(W.addr, sizeof W.addr, "127.0.0.1:%d", tn_free_port());
  snprintf(W.sock, sizeof W.sock, "%s/gpunetd.sock", W.dir);
  W.daemon = fork();
  assert_true(W.daemon >= 0);
  if (W.daemon == 0) {
    char log[PATH_MAX + 32], t[16];
    snprintf(log, sizeof log, "%s/gpunetd.log", W.dir);
    snprintf(t, sizeof t, "%d", ATTEST_TIMEOUT_MS);
    setenv("GN_ATTEST_TIMEOUT_MS", t, 1);
    snprintf(t, sizeof t, "%d", RENT_TIMEOUT_MS);
    setenv("GN_RENT_TIMEOUT_MS", t, 1);
    if (!freopen(log, "w", stderr))
      _exit(127);
    execl(bin, bin, "--data-dir", W.dir, "--listen", W.addr, (char *)NULL);
    _exit(127);
  }
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
  for (int i = 0; i < 50 && !W.r_up; i++) {
    usleep(100000);
    gn_transport_connect(W.r_tp, W.addr);
    tn_run_until_flag(&W.loop, &W.r_up, 300);
  }
  assert_true(W.r_up);
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
  assert_true(tn_wait_msg(&W.loop, &W.b_in, GN_MSG_LEASE_REQUEST, call_done, &c, 10000, &m));
  assert_memory_equal(m.peer, W.req_id->pk, GN_PK_LEN);
  gn_lease_terms t;
  assert_int_equal(gn_lease_request_open(m.raw.data, m.raw.len, &t), 0);
  assert_memory_equal(t.provider, W.b_id->pk, GN_PK_LEN);
  /* B says no; the call ends with its reason. */
  gn_wire_writer w;
  gn_buf b = {0}, env = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, t.lease_id);
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, "B says no");
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(W.b_id, GN_MSG_LEASE_REJECT, b.data, b.len, &env), 0);
  assert_int_equal(gn_transport_send(W.b_tp, W.req_id->pk, env.data, env.len), 0);
  call_finish(&c, 10000);
  expect_error(&c, 409, "B says no");
  assert_true(daemon_has_peer(W.b_id));
  gn_buf_done(&b);
  gn_buf_done(&env);
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
  expect_error(&c, 502, "not the provider its offer names");
  gn_node_id_format(W.a_id->pk, a);
  gn_node_id_format(W.b_id->pk, b);
  expect_error(&c, 502, a);
  expect_error(&c, 502, b);
  assert_true(took < REFUSED_WITHIN_MS);
  /* B may have seen the handshake; it was never sent a lease request, and
   * the daemon keeps no session with it. */
  spin(300);
  assert_false(tn_inbox_has(&W.b_in, GN_MSG_LEASE_REQUEST));
  assert_false(daemon_has_peer(W.b_id));
  assert_true(log_has("refused the session with"));
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
  expect_error(&c, 502, "not the provider its offer names");
  assert_true(gn_mono_ms() - t0 < REFUSED_WITHIN_MS);
  gn_buf_done(&c.out);

  snprintf(body, sizeof body, "{\"target\": \"%s\"}", offer);
  t0 = gn_mono_ms();
  call_start(&c, "/v1/attest", body);
  call_finish(&c, 20000);
  expect_error(&c, 502, "not the provider its offer names");
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
  expect_error(&c, 502, "not the provider its offer names");
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
  for (int i = 0; i < 100 && !log_has("refused the session with") && !daemon_has_peer(W.b_id); i++)
    spin(50);
  spin(300);
  assert_false(daemon_has_peer(W.b_id));
  assert_false(daemon_has_peer(W.a_id));
  assert_true(log_has("refused the session with"));
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
